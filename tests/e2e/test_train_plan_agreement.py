"""The memory plan's assumptions are what the generated train.py does.

The plan prices LoRA as trainable adapters on a frozen base, ZeRO-3 as parameters partitioned
from construction on, and QLoRA as an NF4 base with double-quantized constants; these tests
read the plan's side (tools/planning) and the script's side (tools/smoke/scripts/train.py, as the
launch files call it) and compare. tests/smoke/test_train_job.py runs the script for real.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import job_deepspeed
import job_model
import pytest
import torch
import train as job
from train_fixture import save_model

from tools.artifacts.launch import JOB_SCRIPT, emit_launch
from tools.core.schemas import (
    FrameworkChoice,
    GPUSpec,
    HardwareSpec,
    MemoryRecipe,
    TrainingBrief,
)
from tools.planning.footprint import NF4_BYTES
from tools.planning.memory import estimate_strategy
from tools.planning.states import DEFAULT_LORA_RANK, lora_adapter_params
from tools.research.model_catalog import lookup_model
from tools.smoke.standalone import TRAIN_SCRIPT

DEEPSPEED = FrameworkChoice(primary="deepspeed", stack=["pytorch", "deepspeed"], rationale="x")
A100 = GPUSpec(name="A100-80GB", memory_gb=80, bf16_tflops=312)


def _script_model(model_id: str, rank: int) -> torch.nn.Module:
    """The model train.py trains for a LoRA plan, built on the meta device (no weights)."""
    spec = lookup_model(model_id, 512)
    args = job.parse_args(
        ["--model-config", "unused.json", "--metrics-dir", "unused", "--lora-rank", str(rank)]
    )
    with torch.device("meta"):
        return job_model.add_lora(args, job_model.build_model(dict(spec.hf_config or {})))


@pytest.mark.parametrize(
    "model_id", ["llama-3-8b", "mistral-7b", "qwen2.5-0.5b", "gpt2", "phi-3-mini", "gemma-2-2b"]
)
def test_lora_adapters_the_script_trains_are_the_ones_the_plan_prices(model_id: str) -> None:
    spec = lookup_model(model_id, 512)
    model = _script_model(model_id, DEFAULT_LORA_RANK)
    trainable = job_model.trainable_params(model)
    assert trainable == lora_adapter_params(spec, DEFAULT_LORA_RANK)
    # The base is frozen: every parameter the adapters did not add keeps requires_grad off.
    assert job_model.total_params(model) - trainable == spec.params
    # And the memory plan states and prices that many trainable parameters.
    hardware = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=A100)
    estimate = estimate_strategy(spec, hardware, "zero2", task="lora", seq_len=512)
    assert f"{trainable:,} trainable parameters" in " ".join(estimate.notes)


def test_zero3_config_makes_the_script_build_inside_zero_init() -> None:
    from transformers.integrations import is_deepspeed_zero3_enabled

    stage3 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    context = job_deepspeed.zero3_context(stage3)
    try:
        # transformers' from_config/from_pretrained now wrap construction in deepspeed.zero.Init.
        assert is_deepspeed_zero3_enabled()
    finally:
        del context
    assert not is_deepspeed_zero3_enabled()


def test_qlora_loads_the_nf4_double_quantized_base_the_plan_prices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 4 bits plus double-quantized block constants (0.127 bits per weight, QLoRA sec. 3).
    assert NF4_BYTES == pytest.approx((4 + 0.127) / 8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "bitsandbytes", types.ModuleType("bitsandbytes"))
    config = job_model.qlora_config(torch.bfloat16)
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4"
    assert config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == torch.bfloat16


def test_qlora_without_cuda_is_one_line_and_exit_2(tmp_path: Path) -> None:
    model_dir = save_model(tmp_path / "model")
    proc = subprocess.run(
        [sys.executable, str(TRAIN_SCRIPT), "--model-path", str(model_dir), "--qlora"]
        + ["--lora-rank", "4", "--metrics-dir", str(tmp_path / "m"), "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train.py: error:")]
    assert errors == [
        "train.py: error: --qlora needs a CUDA GPU (bitsandbytes' 4-bit kernels); "
        "this machine has none"
    ]


def test_a_qlora_plan_launches_with_qlora_and_says_when_the_hardware_cannot(
    tmp_path: Path,
) -> None:
    spec = lookup_model("llama-3-8b", 2048)
    brief = TrainingBrief(
        goal="qlora", model="llama-3-8b", task="lora", recipe=MemoryRecipe(qlora=True, lora_rank=8)
    )
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}}
    gpus = HardwareSpec(source="described", nodes=1, gpus_per_node=1, gpu=A100)
    command = emit_launch(tmp_path / "gpu", brief, gpus, spec, DEEPSPEED, config).command
    args = job.parse_args(command[command.index(JOB_SCRIPT) + 1 :])
    assert args.qlora and args.lora_rank == 8 and args.init == "pretrained"
    assert "refuses --qlora" not in (tmp_path / "gpu" / "launch.sh").read_text()
    cpu = HardwareSpec(source="local", nodes=1, gpus_per_node=0)
    emit_launch(tmp_path / "cpu", brief, cpu, spec, DEEPSPEED, config)
    assert "train.py refuses --qlora here" in (tmp_path / "cpu" / "launch.sh").read_text()
