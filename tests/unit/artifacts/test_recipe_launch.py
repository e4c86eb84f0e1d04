"""The request's optimizer, schedule and evaluation settings reach every launch file, or are said.

Each launch is read back as its framework reads it: ds_config.json through DeepSpeed's own
scheduler classes, train.py's command through train.py's parser, Megatron's through
Megatron-DeepSpeed's argument parser (tests/data), torchtitan's TOML against 0.2.2's JobConfig.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from launch_checks import megatron_parser, torchtitan_key_errors
from specs import LLAMA3_8B, model_parallel_plan

from tools.artifacts import megatron
from tools.artifacts.deepspeed_config import emit_deepspeed_config
from tools.artifacts.ds_validate import validate_deepspeed_config
from tools.artifacts.launch import emit_launch
from tools.artifacts.recipe_launch import DEFAULT_EVAL_HOLDOUT, TRAIN_PY_DEFAULTS
from tools.core.schemas import FrameworkChoice, GPUSpec, HardwareSpec, TrainingBrief
from tools.planning.lr_schedule import brief_schedule
from tools.research.model_catalog import lookup_model

H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989)
HW = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=H100)
ASKED: dict[str, Any] = {
    "weight_decay": 0.05,
    "max_grad_norm": 0.5,
    "adam_beta1": 0.85,
    "adam_beta2": 0.98,
    "adam_eps": 1e-6,
    "min_lr": 1e-5,
    "warmup_ratio": 0.1,
}


def _brief(task: str = "pretrain", **fields: Any) -> TrainingBrief:
    return TrainingBrief(goal="x", model=LLAMA3_8B.name, task=task, global_batch_size=64,  # type: ignore[arg-type]
                         precision="bf16", learning_rate=1e-4, train_steps=1000, **fields)  # fmt: skip


def _config(brief: TrainingBrief, memory: Any, dp: int) -> dict[str, Any]:
    config = emit_deepspeed_config(memory, LLAMA3_8B, HW, brief, total_steps=1000)
    validate_deepspeed_config(config, dp)  # DeepSpeed's own DeepSpeedConfig accepts it
    return config


def _deepspeed_rates(config: dict[str, Any]) -> list[float]:
    import torch
    from deepspeed.runtime import lr_schedules

    peak = config["optimizer"]["params"]["lr"]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = getattr(lr_schedules, config["scheduler"]["type"])(
        optimizer, **config["scheduler"]["params"]
    )
    rates = []
    for _ in range(1000):
        rates.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    return rates


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_ds_config_runs_the_asked_recipe_and_schedule(decay: str) -> None:
    brief = _brief(**ASKED, lr_schedule=decay)
    config = _config(brief, model_parallel_plan("zero1", 1, 1, 1, 8), 8)
    params = config["optimizer"]["params"]
    assert params["betas"] == [0.85, 0.98] and params["eps"] == 1e-6
    assert params["weight_decay"] == 0.05 and config["gradient_clipping"] == 0.5
    schedule = brief_schedule(brief, LLAMA3_8B.params, 64 * brief.seq_len, 1000)
    assert schedule.warmup_steps == 100 and schedule.decay == decay
    rates = _deepspeed_rates(config)
    # After the warm-up DeepSpeed's own scheduler follows the plan's curve to its floor.
    for step in (150, 500, 999):
        assert rates[step] == pytest.approx(schedule.lr_at(step), rel=2e-2, abs=1e-9), step
    floor = 1e-4 if decay == "constant" else 1e-5
    assert rates[-1] == pytest.approx(floor, rel=2e-2)


def test_without_the_words_every_launch_keeps_the_task_recipe() -> None:
    config = _config(_brief(), model_parallel_plan("zero1", 1, 1, 1, 8), 8)
    assert config["optimizer"]["params"]["betas"] == [0.9, 0.95]
    assert config["optimizer"]["params"]["weight_decay"] == 0.1
    assert config["gradient_clipping"] == 1.0 and config["scheduler"]["type"] == "WarmupCosineLR"
    fine = _config(_brief("finetune"), model_parallel_plan("zero1", 1, 1, 1, 8), 8)
    assert fine["optimizer"]["params"]["betas"] == [0.9, 0.999]


def _train_py_args(command: list[str]) -> Any:
    import train

    start = next(i for i, a in enumerate(command) if str(a).endswith("train.py"))
    return train.parse_args([str(a) for a in command[start + 1 :]])


def test_train_py_takes_the_recipe_as_flags(tmp_path: Path) -> None:
    brief = _brief(**ASKED, lr_schedule="linear", eval_every=200)
    choice = FrameworkChoice(primary="pytorch_ddp", stack=["pytorch"], rationale="x")
    memory = model_parallel_plan("ddp", 1, 1, 1, 8)
    spec = emit_launch(tmp_path, brief, HW, LLAMA3_8B, choice, None, memory=memory, steps=1000)
    args = _train_py_args(spec.command)
    assert (args.weight_decay, args.max_grad_norm, args.adam_eps) == (0.05, 0.5, 1e-6)
    assert list(args.adam_betas) == [0.85, 0.98]
    assert (args.lr_schedule, args.warmup_steps, args.min_lr_ratio) == ("linear", 100, 0.1)
    # The cadence reaches train.py, with its default 1% holdout passed and said.
    assert (args.eval_every, args.eval_holdout) == (200, DEFAULT_EVAL_HOLDOUT)
    assert not any("not applied" in note for note in spec.notes), spec.notes
    assert any("eval holdout: the last 1% of the data's" in note for note in spec.notes)
    # Without the words: the task's recipe, as ds_config.json, Megatron and torchtitan run it.
    # Pretraining's betas are not train.py's (torch's) default, so they are passed; a
    # fine-tune's recipe is train.py's defaults, so its command is as before.
    plain = emit_launch(tmp_path / "plain", _brief(), HW, LLAMA3_8B, choice, None, memory=memory)
    pre = _train_py_args(plain.command)
    assert list(pre.adam_betas) == [0.9, 0.95] and pre.weight_decay == 0.1
    assert "--max-grad-norm" not in plain.command and "--adam-eps" not in plain.command
    fine = emit_launch(
        tmp_path / "fine", _brief("finetune"), HW, LLAMA3_8B, choice, None, memory=memory
    )
    assert "--adam-betas" not in fine.command and "--max-grad-norm" not in fine.command
    assert list(_train_py_args(fine.command).adam_betas) == [0.9, 0.999]


def test_train_py_defaults_are_the_ones_the_launch_leaves_out() -> None:
    import train

    args = train.parse_args(["--model-path", "x", "--metrics-dir", "m"])
    assert args.max_grad_norm == TRAIN_PY_DEFAULTS["max_grad_norm"]
    assert list(args.adam_betas) == TRAIN_PY_DEFAULTS["betas"]
    assert args.adam_eps == TRAIN_PY_DEFAULTS["eps"]


_TRAIN_PY = {"deepspeed": "zero1", "pytorch_ddp": "ddp", "pytorch_fsdp": "zero3"}


def _train_py_launch(out: Path, primary: str, nodes: int, **fields: Any) -> Any:
    brief = _brief(**fields)
    hardware = HardwareSpec(source="described", nodes=nodes, gpus_per_node=8, gpu=H100)
    memory = model_parallel_plan(_TRAIN_PY[primary], 1, 1, 1, 8 // nodes)
    choice = FrameworkChoice(primary=primary, stack=["pytorch", primary], rationale="x")
    config = None
    if primary == "deepspeed":
        config = emit_deepspeed_config(memory, LLAMA3_8B, hardware, brief, total_steps=1000)
    return emit_launch(out, brief, hardware, LLAMA3_8B, choice, config, memory=memory, steps=1000)


def _scripts(spec: Any) -> list[Path]:
    """The launch's shell scripts: launch.sh, train.sbatch, launch_node{R}.sh."""
    return [Path(p) for p in spec.files.values() if p.endswith((".sh", ".sbatch"))]


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("primary", sorted(_TRAIN_PY))
def test_every_train_py_launch_file_carries_the_evaluation(
    tmp_path: Path, primary: str, nodes: int
) -> None:
    spec = _train_py_launch(tmp_path / "eval", primary, nodes, eval_every=250, eval_holdout=0.05)
    args = _train_py_args(spec.command)
    assert (args.eval_every, args.eval_holdout, args.eval_holdout_given) == (250, 0.05, True)
    scripts = _scripts(spec)
    # launch.sh and train.sbatch, and a 2-node DeepSpeed plan's launch_node{R}.sh too.
    assert len(scripts) == (4 if (primary, nodes) == ("deepspeed", 2) else 2), scripts
    for script in scripts:
        assert "--eval-every 250 --eval-holdout 0.05" in script.read_text(), script.name
    assert not any("eval" in note for note in spec.notes), spec.notes  # nothing to say
    plain = _train_py_launch(tmp_path / "plain", primary, nodes)
    assert not any("--eval" in p.read_text() for p in _scripts(plain))
    assert _train_py_args(plain.command).eval_holdout is None


def test_a_holdout_alone_is_evaluated_at_the_end_and_a_long_cadence_says_so(
    tmp_path: Path,
) -> None:
    spec = _train_py_launch(tmp_path / "end", "pytorch_ddp", 1, eval_holdout=0.02)
    args = _train_py_args(spec.command)
    assert args.eval_every is None and args.eval_holdout == 0.02
    assert (
        spec.notes.count(
            "eval on the 2% holdout at the end of the run only, as the request named no cadence "
            "(train.py's --eval-every N adds one)"
        )
        == 1
    )
    late = _train_py_launch(tmp_path / "late", "deepspeed", 1, eval_every=5000, eval_holdout=0.01)
    assert any("eval every 5000 steps: the run is 1000 steps" in n for n in late.notes)


def test_train_py_takes_the_holdout_the_launch_says_it_defaults_to() -> None:
    import train

    args = train.parse_args(["--model-path", "x", "--metrics-dir", "m", "--eval-every", "9"])
    assert args.eval_holdout == DEFAULT_EVAL_HOLDOUT and not args.eval_holdout_given


def test_megatron_parses_the_recipe_and_the_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    brief = _brief(**ASKED, lr_schedule="linear", eval_every=250, eval_holdout=0.01)
    memory = model_parallel_plan("zero1", 2, 2, 1, 32)  # 1 x 32 x 2 data-parallel ranks
    config = _config(brief, memory, 2)
    argv = megatron.megatron_args(brief, LLAMA3_8B, (2, 2), config, 1000, "bf16")
    argv = [str(a) for a in megatron.first_run(argv)[1:]]
    parser = megatron_parser()
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "0")
    args = parser.validate_args(parser.parse_args())
    assert (args.weight_decay, args.clip_grad, args.adam_eps) == (0.05, 0.5, 1e-6)
    assert (args.adam_beta1, args.adam_beta2) == (0.85, 0.98)
    assert (args.lr_decay_style, args.min_lr, args.lr_warmup_iters) == ("linear", 1e-5, 100)
    assert (args.eval_interval, args.split) == (250, "99,1,0")


@pytest.mark.parametrize("decay", ["cosine", "constant"])
def test_torchtitan_toml_holds_the_recipe_in_0_2_2_keys(tmp_path: Path, decay: str) -> None:
    brief = TrainingBrief(goal="x", model="llama-3.1-8b", task="pretrain", seq_len=8192,
                          global_batch_size=32, recipe={"framework": "torchtitan"},  # type: ignore[arg-type]
                          lr_schedule=decay, eval_every=100, eval_holdout=0.01, **ASKED)  # fmt: skip
    hw = HardwareSpec(source="described", nodes=2, gpus_per_node=8, gpu=H100)
    choice = FrameworkChoice(primary="torchtitan", stack=["pytorch", "torchtitan"], rationale="x")
    model = lookup_model("llama-3.1-8b", 8192)
    memory = model_parallel_plan("zero1", 2, 2, 1, 4)
    spec = emit_launch(tmp_path, brief, hw, model, choice, None, memory=memory, steps=1000)
    toml = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    assert not torchtitan_key_errors(toml), torchtitan_key_errors(toml)
    optimizer, scheduler = toml["optimizer"], toml["lr_scheduler"]
    assert (optimizer["beta1"], optimizer["beta2"], optimizer["eps"]) == (0.85, 0.98, 1e-6)
    assert optimizer["weight_decay"] == 0.05 and toml["training"]["max_norm"] == 0.5
    assert scheduler["warmup_steps"] == 100
    if decay == "constant":  # no decay steps: the rate held after the warm-up
        assert scheduler["decay_ratio"] == 0.0 and scheduler["min_lr_factor"] == 0.0
    else:
        assert scheduler["decay_type"] == "cosine" and "decay_ratio" not in scheduler
        assert scheduler["min_lr_factor"] == pytest.approx(1e-5 / optimizer["lr"])
    assert toml["validation"] == {"enable": True, "freq": 100, "steps": 100}
    assert any("1% holdout not applied" in note for note in spec.notes)


def test_a_megatron_holdout_without_a_cadence_says_when_it_evaluates() -> None:
    # A holdout alone: Megatron evaluates at its default --eval-interval (1000) and at the end;
    # the plan said nothing of the cadence.
    from tools.artifacts.recipe_launch import eval_notes
    from tools.core.schemas import TrainingBrief

    brief = TrainingBrief(model="gpt2", eval_holdout=0.02)
    assert eval_notes(brief, "megatron", 5000) == [
        "eval on the 2% holdout every 1000 steps and at the end of the run (Megatron-DeepSpeed's "
        "default --eval-interval 1000), as the request named no cadence"
    ]
    assert "every 1000" not in eval_notes(brief, "megatron", 300)[0]
    assert eval_notes(TrainingBrief(model="gpt2"), "megatron", 300) == []
