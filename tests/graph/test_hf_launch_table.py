"""The Hugging Face-built launchers' files train the plan's model and batch (issue 29, Done when).

DeepSpeed (train.py under the DeepSpeed launcher with ds_config.json), PyTorch FSDP (train.py's
FSDP2 mode under torchrun) and DeepSpeed AutoTP (the DeepSpeed launch with a tensor degree), each
for a dense Llama, a mixture of experts (Mixtral), a long context (Llama 3.1 at 32k) and a
fine-tune (Llama 2 13B): the CLI plans each in process; the test reads launch.sh and
train.sbatch as bash does (tools/review/launch_script.py) and checks their train.py arguments,
ds_config.json and model_config.json against the plan JSON and the model catalog: the model
(its config, or the weights' hub id), the sequence length, the batch identity (global = micro x
accumulation x data parallel, the data-parallel degree the launcher's world over the tensor
degree; DeepSpeed's own DeepSpeedConfig accepts ds_config.json at that size), the learning-rate schedule (tools/planning/lr_schedule.py's rules for the planned run),
and what the launcher cannot express (pipeline, context and expert parallelism: the plan has
none of them, and a mixture of experts says that train.py turns its router loss on).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tools.artifacts.ds_validate import validate_deepspeed_config
from tools.planning.lr_schedule import plan_schedule
from tools.research.model_catalog import lookup_model, weights_location
from tools.review.launch_script import command_argv

JOB = "trainer/train.py"


@dataclass(frozen=True)
class Case:
    model: str
    task: str
    seq_len: int
    batch: int
    hardware: str


CASES = {
    "dense-llama": Case("llama-3-8b", "pretrain", 4096, 64, "1x8xH100-80GB"),
    "moe-mixtral": Case("mixtral-8x7b", "pretrain", 4096, 256, "4x8xH100-80GB"),
    "long-context": Case("llama-3.1-8b", "pretrain", 32768, 32, "1x8xH100-80GB"),
    "fine-tune": Case("llama-2-13b", "finetune", 4096, 64, "1x8xH100-80GB"),
}
# launcher -> (the brief's framework, its pinned tensor degree)
LAUNCHERS = {
    "deepspeed": ("deepspeed", None),
    "fsdp": ("pytorch_fsdp", None),
    "autotp": ("deepspeed", 2),
}
_AUTOTP_MOE = "DeepSpeed AutoTP does not split a mixture of experts' experts"
# train.py's FSDP sharding for the plan's strategy (tools/core/strategies.py train_py_fsdp).
FSDP_SHARDING = {"zero2": "grad-op", "zero3": "full", "zero3_offload_all": "full"}


@dataclass
class Files:
    plan: dict[str, Any]
    out: Path
    launch: str
    sbatch: str
    ds_config: dict[str, Any] | None
    model_config: dict[str, Any]


def _build(cli_main: Any, tmp_path: Path, case: Case, launcher: str) -> Files:
    framework, tensor = LAUNCHERS[launcher]
    brief = tmp_path / "brief.yaml"
    brief.write_text(
        f"goal: {launcher} plan for {case.model}\nmodel: {case.model}\ntask: {case.task}\n"
        f"seq_len: {case.seq_len}\nglobal_batch_size: {case.batch}\nhardware: {case.hardware}\n"
        f"precision: bf16\nframework: {framework}\ndeployment: none\nsmoke: false\n"
        + (f"pins: {{tensor_parallel: {tensor}}}\n" if tensor else "")
    )
    out = tmp_path / "plan"
    res = cli_main("plan", "--brief", str(brief), "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    ds = out / "ds_config.json"
    return Files(
        plan=json.loads((out / "plan.json").read_text()),
        out=out,
        launch=(out / "launch.sh").read_text(),
        sbatch=(out / "train.sbatch").read_text(),
        ds_config=json.loads(ds.read_text()) if ds.exists() else None,
        model_config=json.loads((out / "model_config.json").read_text()),
    )


def _flag(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} given {argv.count(name)} times in {argv}"
    return argv[argv.index(name) + 1]


def _launcher_argv(files: Files) -> tuple[list[str], list[str]]:
    """launch.sh's launcher arguments (before train.py) and train.py's own, as bash reads them."""
    command = files.plan["launch"]["command"]
    argv = command_argv(files.launch, command[0])
    assert argv is not None and argv == command, "launch.sh does not run the plan's command"
    job = argv.index(JOB)
    # train.sbatch runs train.py with the same arguments (its launcher part is SLURM's own).
    assert command_argv(files.sbatch, JOB) == argv[job:]
    return argv[:job], argv[job + 1 :]


def _world(launcher: list[str], files: Files) -> int:
    """The ranks the launcher starts: nodes x processes per node, as each launcher counts."""
    nodes, gpus = (int(n) for n in re.findall(r"(\d+)x(\d+)x", files.plan["brief"]["hardware"])[0])
    if launcher[0] == "deepspeed":
        per_node = int(_flag(launcher, "--num_gpus"))
        started = int(_flag(launcher, "--num_nodes")) if nodes > 1 else 1
        if nodes > 1:  # the hostfile lists every node with its slots
            slots = [
                int(s) for s in re.findall(r"slots=(\d+)", (files.out / "hostfile").read_text())
            ]
            assert slots == [per_node] * nodes
    else:
        assert launcher[0] == "torchrun"
        per_node, started = (
            int(_flag(launcher, "--nproc_per_node")),
            int(_flag(launcher, "--nnodes")),
        )
    assert (started, per_node) == (nodes, gpus)
    assert f"#SBATCH --nodes={nodes}\n" in files.sbatch
    assert f"#SBATCH --gpus-per-node={gpus}\n" in files.sbatch
    return nodes * per_node


def _check_model(args: list[str], files: Files, case: Case) -> None:
    """The job builds the catalog's model: its config (pretraining) or its weights (fine-tune)."""
    catalog = lookup_model(case.model, case.seq_len)
    assert files.plan["model"]["name"] == catalog.name
    assert files.model_config == catalog.hf_config  # the model's own config, unchanged
    if case.task == "pretrain":
        assert _flag(args, "--model-config") == "model_config.json"
        assert "--model-path" not in args and "--init" not in args
    else:
        assert _flag(args, "--init") == "pretrained" and "--model-config" not in args
        hub_id = weights_location(catalog)
        assert hub_id is not None and _flag(args, "--model-path") == hub_id
        assert f"MODEL_PATH={hub_id}\n" in files.launch
    assert "--lora-rank" not in args
    seq = int(_flag(args, "--seq-len"))
    assert seq == case.seq_len <= files.model_config["max_position_embeddings"]


def _check_batch(args: list[str], world: int, files: Files, case: Case) -> tuple[int, int]:
    """global = micro x accumulation x data parallel, in the launcher's own fields."""
    setup = files.plan["memory"]["setup"]
    micro = int(_flag(args, "--micro-batch"))
    config = files.ds_config
    if config is not None:
        tensor = (config.get("tensor_parallel") or {}).get("autotp_size", 1)
        accumulation = config["gradient_accumulation_steps"]
        assert config["train_micro_batch_size_per_gpu"] == micro
        # AutoTP: DeepSpeedConfig counts every rank (no mpu), the tensor ranks share sequences.
        assert config["train_batch_size"] == micro * accumulation * world
        validate_deepspeed_config(config, world)
        assert "--grad-accum" not in args  # DeepSpeed mode reads the config's
    else:
        tensor = 1
        accumulation = int(_flag(args, "--grad-accum"))
    data_parallel = world // tensor
    assert world % tensor == 0 and tensor == setup["tensor_parallel"]
    assert (micro, accumulation, data_parallel) == (
        setup["micro_batch_size"],
        setup["gradient_accumulation_steps"],
        setup["data_parallel"],
    )
    assert micro * accumulation * data_parallel == case.batch
    return data_parallel, tensor


def _check_schedule(args: list[str], files: Files, case: Case) -> None:
    """The plan's schedule (lr_schedule.py's rules) over the run's steps, in the mode's fields."""
    steps = int(_flag(args, "--steps"))
    want = plan_schedule(case.task, files.plan["model"]["params"], case.batch * case.seq_len, steps)
    assert 1 <= want.warmup_steps < 0.1 * steps
    config = files.ds_config
    if config is not None:
        assert "--lr" not in args and "--warmup-steps" not in args
        scheduler = config["scheduler"]
        assert scheduler["type"] == "WarmupCosineLR"
        params = scheduler["params"]
        assert params["total_num_steps"] == steps
        assert params["warmup_num_steps"] == want.warmup_steps
        assert params["cos_min_ratio"] == want.min_lr_ratio
        assert config["optimizer"]["params"]["lr"] == pytest.approx(want.peak_lr, rel=1e-9)
        return
    from tools.smoke.scripts.job_torch import schedule_factor

    assert float(_flag(args, "--lr")) == pytest.approx(want.peak_lr, rel=1e-5)
    assert int(_flag(args, "--warmup-steps")) == want.warmup_steps
    assert _flag(args, "--lr-schedule") == "cosine"
    floor = float(_flag(args, "--min-lr-ratio")) if "--min-lr-ratio" in args else 0.0
    assert floor == want.min_lr_ratio
    # train.py's own schedule ends where the plan's notes say it does.
    from argparse import Namespace

    run = Namespace(steps=steps, warmup_steps=want.warmup_steps, lr_schedule="cosine")
    run.min_lr_ratio = floor
    assert schedule_factor(run, steps) == pytest.approx(want.min_lr_ratio, abs=1e-12)
    assert schedule_factor(run, want.warmup_steps - 1) == pytest.approx(1.0)


def _check_mode(launcher: str, args: list[str], files: Files, tensor: int) -> None:
    """The launcher runs the plan's parallelism, and only what it can express."""
    plan, setup = files.plan, files.plan["memory"]["setup"]
    framework = LAUNCHERS[launcher][0]
    assert plan["framework"]["primary"] == framework
    # train.py splits no pipeline, context or expert dimension: the plan has none.
    assert (setup["pipeline_parallel"], setup["context_parallel"]) == (1, 1)
    assert setup.get("expert_parallel", 1) == 1
    strategy = plan["memory"]["chosen"]
    if launcher == "fsdp":
        assert files.ds_config is None and "--deepspeed_config" not in args
        assert _flag(args, "--fsdp-sharding") == FSDP_SHARDING[strategy]
        assert ("--fsdp-offload" in args) == strategy.endswith("offload_all")
        assert "--bf16" in args
        recompute = "--gradient-checkpointing" in args
    else:
        config = files.ds_config
        assert config is not None and _flag(args, "--deepspeed_config") == "ds_config.json"
        stage = int(strategy[4]) if strategy.startswith("zero") else 0
        assert config["zero_optimization"]["stage"] == stage
        assert config["bf16"] == {"enabled": True}
        recompute = "activation_checkpointing" in config
        if launcher == "autotp" and files.model_config.get("num_local_experts"):
            # AutoTP splits nn.Linear layers only, not transformers' fused experts: the pin
            # is refused out loud and the plan runs ZeRO without tensor parallelism.
            assert tensor == 1
            assert any(_AUTOTP_MOE in line for line in plan["memory"]["not_honoured"])
        elif launcher == "autotp":
            assert tensor == LAUNCHERS[launcher][1]
    assert recompute == plan["memory"]["activation_checkpointing"]
    assert tensor == 1 or files.model_config["num_key_value_heads"] % tensor == 0


def _check_experts(files: Files, case: Case) -> None:
    """A mixture of experts: its router as configured, and the notes say what train.py does."""
    cfg = files.model_config
    notes = files.plan["launch"]["notes"]
    said = [n for n in notes if "load-balancing loss" in n]
    if not cfg.get("num_local_experts"):
        assert said == []
        return
    catalog = lookup_model(case.model, case.seq_len).hf_config or {}
    for key in ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef"):
        assert cfg[key] == catalog[key]
    (note,) = said
    assert f"router_aux_loss_coef {cfg['router_aux_loss_coef']:g}" in note
    assert "does not split the experts" in note
    from job_model import training_overrides  # the job's own rule

    assert training_overrides(cfg) == {"output_router_logits": True}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
@pytest.mark.parametrize("name", list(CASES))
def test_hf_launch_files_train_the_plans_model_batch_and_schedule(
    cli_main: Any, tmp_path: Path, name: str, launcher: str
) -> None:
    case = CASES[name]
    files = _build(cli_main, tmp_path, case, launcher)
    launcher_args, args = _launcher_argv(files)
    world = _world(launcher_args, files)
    _check_model(args, files, case)
    _, tensor = _check_batch(args, world, files, case)
    _check_schedule(args, files, case)
    _check_mode(launcher, args, files, tensor)
    _check_experts(files, case)
    layout = files.plan["memory"]["setup"]
    assert any(
        f"batch: {case.batch} sequences per step = micro-batch {layout['micro_batch_size']}" in n
        for n in files.plan["launch"]["notes"]
    )


def test_a_mixture_of_experts_without_a_balance_loss_in_transformers_says_so(
    cli_main: Any, tmp_path: Path
) -> None:
    """DeepSeek-V2's transformers model has no load-balancing loss to turn on: the plan says so."""
    case = Case("deepseek-v2-lite", "finetune", 4096, 64, "2x8xH100-80GB")
    files = _build(cli_main, tmp_path, case, "deepspeed")
    assert "output_router_logits" not in files.model_config
    notes = [n for n in files.plan["launch"]["notes"] if n.startswith("mixture of experts")]
    (note,) = notes
    assert f"transformers' {files.model_config['model_type']} computes no load-balancing" in note
    assert "language-model loss alone" in note
    from job_model import training_overrides

    assert training_overrides(files.model_config) == {}
