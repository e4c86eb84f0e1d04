"""The plan honours the request (issue 28, item 2): its framework wishes, its refusals and its
objective, in the brief route as in free text; what it cannot plan is said in the headline.

In process, through the planner functions (no graph, no smoke runs): a YAML brief with
``framework: pytorch_fsdp`` and ``avoid_frameworks: [deepspeed]``; "do not use ZeRO-3";
``objective: rl`` (not planned, said so) and ``continued-pretraining`` (loads the weights).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver
from specs import GPT2_TINY, model_parallel_plan, tiny_spec

from graphs import build_graph
from graphs.run import run_plan
from tools.artifacts.headline import headline_caveats, headline_notes, objective_note
from tools.artifacts.launch import emit_launch
from tools.artifacts.text import summary_lines
from tools.core.schemas import FrameworkChoice, GPUSpec, HardwareSpec, LaunchSpec, TrainingBrief
from tools.core.settings import Settings
from tools.intake.brief import brief_from_dict, load_brief, parse_request
from tools.intake.wishes import pin_fields
from tools.planning import search_strategy
from tools.research.framework import select_framework
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import list_models, lookup_model
from tools.review import check_wishes, decide

H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989)
HW = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=H100)
DDP = FrameworkChoice(primary="pytorch_ddp", stack=["pytorch"], rationale="x")
MEGATRON = FrameworkChoice(
    primary="megatron", stack=["pytorch", "megatron", "deepspeed"], rationale="x"
)
TORCHTITAN = FrameworkChoice(primary="torchtitan", stack=["pytorch", "torchtitan"], rationale="x")


# ---- continued pretraining loads the weights ---------------------------------------------------


def _continued(**extra: Any) -> TrainingBrief:
    return brief_from_dict(
        {
            "model": "gpt2",
            "task": "pretrain",
            "objective": "continued-pretraining",
            "seq_len": 128,
            "global_batch_size": 8,
            **extra,
        }
    )


def _ds_config(stage: int, dp: int) -> dict[str, Any]:
    return {
        "train_batch_size": 4 * dp,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 4,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
    }


def test_continued_pretraining_is_pretraining_that_loads_the_weights() -> None:
    brief = _continued()
    assert brief.task == "pretrain" and brief.loads_weights
    # Named as a fine-tune in a brief, it is still pretraining from the weights.
    assert _continued(task="finetune").task == "pretrain"
    scratch = brief_from_dict({"model": "gpt2", "task": "pretrain"})
    assert not scratch.loads_weights


def test_continued_pretraining_train_py_starts_from_the_weights(tmp_path: Path) -> None:
    command = emit_launch(tmp_path, _continued(), HW, tiny_spec(GPT2_TINY), DDP, None).command
    script = next(i for i, word in enumerate(command) if word.endswith("train.py"))
    assert command[script] == "trainer/train.py"  # the plan ships the scripts folder
    args = command[script + 1 :]
    assert args[args.index("--init") + 1] == "pretrained" and "--model-path" in args
    assert "--model-config" not in args
    scratch = brief_from_dict({"model": "gpt2", "task": "pretrain", "seq_len": 128})
    command = emit_launch(tmp_path / "s", scratch, HW, tiny_spec(GPT2_TINY), DDP, None).command
    assert "--init" not in command and "--model-config" in command


def test_continued_pretraining_on_megatron_converts_the_weights(tmp_path: Path) -> None:
    spec = emit_launch(
        tmp_path,
        _continued(),
        HW,
        tiny_spec(GPT2_TINY),
        MEGATRON,
        _ds_config(1, 2),
        memory=model_parallel_plan("zero1", 2, 2, accumulation=4),
    )
    assert "convert_checkpoint.sh" in spec.files
    assert "starts from the weights" in (tmp_path / "launch.sh").read_text()


def test_continued_pretraining_on_torchtitan_loads_the_hf_weights(tmp_path: Path) -> None:
    hw = HardwareSpec(source="described", nodes=2, gpus_per_node=8, gpu=H100)
    # Llama 3.1 70B: the model torchtitan's flavor 70B builds (LLAMA3_70B has no config to
    # show its rotary base and scaling, so torchtitan refuses it: titan_flavors.py).
    brief = _continued(model="llama-3.1-70b")
    memory = model_parallel_plan("zero1", 8, 2, accumulation=4)
    model = lookup_model("llama-3.1-70b", 4096)
    emit_launch(tmp_path, brief, hw, model, TORCHTITAN, None, memory=memory)
    job = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    assert job["checkpoint"]["initial_load_in_hf"] and job["checkpoint"]["initial_load_path"]


def test_continued_pretraining_is_said_in_the_headline_as_a_note() -> None:
    plan = {"brief": {"objective": "continued-pretraining"}, "model": {"name": "llama-3-8b"}}
    assert headline_notes(plan) == []  # honoured: nothing "not as asked"
    (note,) = headline_caveats(plan)
    assert "starts from llama-3-8b's pretrained weights" in note


# ---- a named framework is used, a refused one never appears ------------------------------------

FSDP_NO_DEEPSPEED = """\
goal: Fine-tune Llama-3-8B on long support threads
model: llama-3-8b
task: finetune
seq_len: 8192
global_batch_size: 64
hardware: 1x8xA100-80GB
precision: bf16
framework: pytorch_fsdp
avoid_frameworks: [deepspeed]
smoke: false
"""


def _graph_plan(settings: Settings, brief: TrainingBrief, out: Path) -> dict[str, Any]:
    graph = build_graph(checkpointer=InMemorySaver(), settings=settings)
    inputs = {"brief": brief.model_dump(mode="json"), "out_dir": str(out)}
    result = run_plan(graph, inputs, f"honour-{out.name}")
    assert result.plan is not None
    return result.plan


def test_yaml_fsdp_without_deepspeed_gets_an_fsdp_plan(settings: Settings, tmp_path: Path) -> None:
    """The reproduction: this brief got DeepSpeed AutoTP (tp2) and ds_config.json, approved."""
    path = tmp_path / "brief.yaml"
    path.write_text(FSDP_NO_DEEPSPEED)
    plan = _graph_plan(settings, load_brief(path), tmp_path / "fsdp")
    fw = plan["framework"]
    assert fw["primary"] == "pytorch_fsdp" and "deepspeed" not in fw["stack"]
    assert "deepspeed" not in [a["name"] for a in fw["alternatives"]]
    assert plan["deepspeed_config"] is None
    assert not (tmp_path / "fsdp" / "ds_config.json").exists()
    assert plan["launch"]["command"][0] == "torchrun"
    assert plan["memory"]["tensor_parallel"] == 1 == plan["memory"]["pipeline_parallel"]
    assert plan["review"]["verdict"] == "approved"
    report = Path(plan["report"]["markdown"]).read_text()
    assert "AutoTP" not in report and "**Framework:** pytorch_fsdp." in report
    assert "not searched: the splits that run only on deepspeed" in report


def _planned(brief: TrainingBrief) -> tuple[Any, FrameworkChoice]:
    hw = parse_hardware(brief.hardware)
    spec = lookup_model(brief.model, brief.seq_len)  # type: ignore[arg-type]
    memory = search_strategy(spec, hw, brief)
    return memory, select_framework(brief, hw, spec, memory)


def test_refusing_deepspeed_refuses_megatron_deepspeed_too() -> None:
    # 70B over two nodes: without the refusal the search may split it on Megatron-DeepSpeed.
    brief = brief_from_dict(
        {
            "model": "llama-3-70b",
            "hardware": "2x8xH100-80GB",
            "seq_len": 4096,
            "global_batch_size": 64,
            "avoid_frameworks": ["deepspeed"],
        }
    )
    memory, fw = _planned(brief)
    assert fw.primary not in ("deepspeed", "megatron")
    assert "deepspeed" not in fw.stack
    assert not {"deepspeed", "megatron"} & {a.name for a in fw.alternatives}
    assert any(
        a.startswith("not searched: the splits that run only on") for a in memory.assumptions
    )


def test_a_named_framework_that_cannot_fit_says_why_in_the_headline() -> None:
    # 32k tokens of llama-3-8b on 40 GB GPUs: no data-parallel FSDP setup fits; a split does.
    brief = brief_from_dict(
        {
            "model": "llama-3-8b",
            "hardware": "1x8xA100-40GB",
            "seq_len": 32768,
            "framework": "pytorch_fsdp",
        }
    )
    memory, fw = _planned(brief)
    assert fw.primary != "pytorch_fsdp" and memory.chosen_row is not None and memory.chosen_row.fits
    assert fw.not_honoured is not None and fw.not_honoured.startswith(
        "Wish not honoured: pytorch_fsdp was asked for"
    )
    assert "as the request asks" not in fw.rationale
    assert memory.not_honoured and "pytorch_fsdp was asked for" in memory.not_honoured[0]
    notes = headline_notes(
        {"framework": fw.model_dump(), "memory": memory.model_dump(), "brief": {}}
    )
    assert notes[0] == fw.not_honoured and notes[1].startswith("pytorch_fsdp was asked for, but")


def test_do_not_use_zero3_is_a_refusal_not_a_pin() -> None:
    assert pin_fields("fine-tune llama-2-13b, do not use ZeRO-3") == {"avoid_zero_stages": [3]}
    assert pin_fields("ZeRO-2 please, without ZeRO stage 3") == {
        "avoid_zero_stages": [3],
        "zero_stage": 2,
    }
    free = brief_from_dict({"model": "llama-2-13b", "hardware": "1x8xA100-80GB"})
    refused = brief_from_dict(
        {"model": "llama-2-13b", "hardware": "1x8xA100-80GB", "pins": {"avoid_zero_stages": [3]}}
    )
    memory, _ = _planned(free.model_copy(update={"framework": "pytorch_fsdp"}))
    assert memory.chosen.startswith("zero3")  # what the search picks when it may
    memory, _ = _planned(refused.model_copy(update={"framework": "pytorch_fsdp"}))
    assert not memory.chosen.startswith("zero3") and memory.chosen_row.fits  # type: ignore[union-attr]
    assert "pinned by the request: no ZeRO stage 3" in memory.assumptions


# ---- the reviewer blocks a plan that contradicts the brief -------------------------------------

FSDP = FrameworkChoice(primary="pytorch_fsdp", stack=["pytorch", "pytorch_fsdp"], rationale="x")
AUTOTP = FrameworkChoice(
    primary="deepspeed",
    stack=["pytorch", "deepspeed"],
    rationale="pytorch_fsdp scores 102. The framework is pytorch_fsdp, as the request asks.",
)


def _launch(tmp_path: Path, *names: str, command: str = "torchrun") -> LaunchSpec:
    files = {}
    for name in names:
        (tmp_path / name).write_text("{}")
        files[name] = str(tmp_path / name)
    return LaunchSpec(command=[command, "train.py"], files=files)


def test_reviewer_blocks_a_refused_or_unnamed_framework(tmp_path: Path) -> None:
    brief = brief_from_dict(
        {"model": "llama-3-8b", "framework": "pytorch_fsdp", "avoid_frameworks": ["deepspeed"]}
    )
    # The reproduction's plan: DeepSpeed AutoTP, ds_config.json, "as the request asks".
    ds = _launch(tmp_path, "ds_config.json", command="deepspeed")
    (finding,) = check_wishes(brief, AUTOTP, {"zero_optimization": {"stage": 2}}, ds)
    assert finding.severity == "error"
    assert "refused by the brief's avoid_frameworks" in finding.message
    assert "without saying why" in finding.message and "as the request asks, but" in finding.message
    assert decide([finding], 1, 3).verdict == "changes_requested"
    # An FSDP plan whose files are DeepSpeed's: blocked too.
    (finding,) = check_wishes(brief, FSDP, None, ds)
    assert finding.severity == "error" and "the emitted files run deepspeed" in finding.message
    # The honoured plan passes.
    (finding,) = check_wishes(brief, FSDP, None, _launch(tmp_path, "FSDP.md"))
    assert finding.severity == "info" and "as the brief asks" in finding.message


def test_reviewer_accepts_a_wish_not_honoured_out_loud(tmp_path: Path) -> None:
    brief = brief_from_dict({"model": "llama-3-8b", "framework": "pytorch_fsdp"})
    said = AUTOTP.model_copy(
        update={"rationale": "x", "not_honoured": "Wish not honoured: pytorch_fsdp ..."}
    )
    ds = _launch(tmp_path, "ds_config.json", command="deepspeed")
    (finding,) = check_wishes(brief, said, {"zero_optimization": {"stage": 2}}, ds)
    assert finding.severity == "info" and "Wish not honoured" in finding.message
    silent = said.model_copy(update={"not_honoured": None})
    (finding,) = check_wishes(brief, silent, {"zero_optimization": {"stage": 2}}, ds)
    assert finding.severity == "error"


# ---- the objective: RL is not planned, said first; DPO's reference model is not priced --------


def test_rl_objective_says_in_the_headline_what_was_planned_instead(
    settings: Settings, tmp_path: Path
) -> None:
    brief = brief_from_dict(
        {
            "goal": "GRPO on our math policy",
            "model": "llama-3-8b",
            "hardware": "1x8xH100-80GB",
            "objective": "rl",
            "smoke": False,
        }
    )
    plan = _graph_plan(settings, brief, tmp_path / "rl")
    report = Path(plan["report"]["markdown"]).read_text()
    headline = next(line for line in report.splitlines() if line.startswith("**Not as asked:**"))
    assert "Not planned: RL with rollouts and reward models" in headline
    assert "supervised fine-tune of the policy llama-3-8b" in headline
    label = plan["memory"]["chosen"]
    assert f"({label}, " in headline and "GB per GPU" in headline and "tokens/s" in headline
    for tool in ("TRL", "OpenRLHF", "verl", "NeMo-Aligner"):
        assert tool in headline
    assert "inference engine" in headline and "reward and reference models" in headline
    lines = summary_lines(plan, headline="framework")
    assert lines[1].startswith("not as asked: Not planned: RL with rollouts")


def test_dpo_and_distill_say_what_memory_does_not_price() -> None:
    model = {"name": "llama-3-8b", "params": 8_030_261_248}
    dpo = objective_note({"brief": {"objective": "dpo"}, "model": model})
    assert dpo is not None and "frozen reference model" in dpo and "16.1 GB" in dpo
    assert "not priced" in dpo
    distill = objective_note({"brief": {"objective": "distill"}, "model": model})
    assert distill is not None and "teacher model" in distill and "not priced" in distill
    assert objective_note({"brief": {"objective": "sft"}, "model": model}) is None
    cpt = objective_note({"brief": {"objective": "continued-pretraining"}, "model": model})
    assert cpt is not None and "pretrained weights" in cpt


def test_a_named_replicating_framework_keeps_to_plain_data_parallelism() -> None:
    # gpt2 fits every GPU: a named DDP plans DDP, not a ZeRO stage DDP cannot run.
    fits = brief_from_dict(
        {"model": "gpt2", "hardware": "1x8xA100-80GB", "seq_len": 1024, "framework": "pytorch_ddp"}
    )
    memory, fw = _planned(fits)
    assert memory.chosen == "ddp" and memory.tensor_parallel == 1 and fw.primary == "pytorch_ddp"
    assert fw.not_honoured is None and not memory.not_honoured
    # 70B does not: the plan is the fastest setup that fits, and says why not DDP.
    big = brief_from_dict(
        {"model": "llama-3-70b", "hardware": "2x8xH100-80GB", "framework": "pytorch_ddp"}
    )
    memory, fw = _planned(big)
    assert memory.chosen_row is not None and memory.chosen_row.fits
    assert fw.primary != "pytorch_ddp" and fw.not_honoured is not None
    assert "replicates parameters, gradients and optimizer states" in fw.not_honoured
    assert memory.not_honoured[0].startswith("pytorch_ddp was asked for, but no setup it runs")


def test_free_text_fsdp_no_deepspeed_no_zero3_is_planned_as_asked() -> None:
    brief = parse_request(
        "fine-tune llama-2-13b on 8 A100 80GB with FSDP, no deepspeed, do not use ZeRO-3",
        list_models(),
    )
    assert brief.framework == "pytorch_fsdp" and brief.avoid_frameworks == ["deepspeed"]
    assert brief.pins.avoid_zero_stages == [3] and brief.pins.zero_stage is None
    memory, fw = _planned(brief)
    assert fw.primary == "pytorch_fsdp" and not memory.chosen.startswith("zero3")
    assert memory.chosen_row is not None and memory.chosen_row.fits
