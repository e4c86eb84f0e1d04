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

from specs import GPT2_TINY, LLAMA3_70B, model_parallel_plan, tiny_spec

from tools.artifacts.launch import emit_launch
from tools.core.schemas import FrameworkChoice, GPUSpec, HardwareSpec, TrainingBrief
from tools.intake.brief import brief_from_dict

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
    args = command[command.index("train.py") + 1 :]
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
    brief = _continued(model="llama-3-70b")
    memory = model_parallel_plan("zero1", 8, 2, accumulation=4)
    emit_launch(tmp_path, brief, hw, LLAMA3_70B, TORCHTITAN, None, memory=memory)
    job = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
    assert job["checkpoint"]["initial_load_in_hf"] and job["checkpoint"]["initial_load_path"]
