"""The attention kernel a launch runs is the one its plan prices (tools/planning/attention_kernels.py)."""

from __future__ import annotations

import pytest

from tools.intake.brief import brief_from_dict
from tools.planning import search_strategy
from tools.planning.attention_kernels import launch_attention
from tools.planning.kernels import CUDNN_OVER_FLASH2, LAUNCH_S, Device, attention_s
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model


def _attention(gpu: str, kernel: str, backward: bool = False) -> float:
    spec = parse_hardware(f"1x1x{gpu}").gpu
    assert spec is not None and spec.bf16_tflops is not None
    device = Device.of(spec, spec.bf16_tflops)
    return attention_s(
        device, batch_heads=32, q_len=8192, kv_len=8192, head_dim=128, causal=True,
        kernel=kernel, backward=backward,
    )  # fmt: skip


@pytest.mark.parametrize("backward", [False, True])
def test_cudnn_attention_is_faster_on_hopper_and_the_same_elsewhere(backward: bool) -> None:
    launches = 2 if backward else 1
    flash, cudnn = (
        _attention("H100-80GB", "sdpa", backward),
        _attention("H100-80GB", "cudnn", backward),
    )
    assert (flash - launches * LAUNCH_S) / (cudnn - launches * LAUNCH_S) == pytest.approx(
        CUDNN_OVER_FLASH2
    )
    assert _attention("A100-80GB", "cudnn", backward) == _attention("A100-80GB", "sdpa", backward)


def test_only_megatron_launches_pick_another_kernel() -> None:
    for gpu in ("V100-32GB", "H100-80GB"):
        spec = parse_hardware(f"1x1x{gpu}").gpu
        for framework in (None, "deepspeed", "fsdp", "torchtitan", "torchtune"):
            got = launch_attention(framework, spec, fp8=gpu == "H100-80GB")
            assert (got.kernel, got.flags, got.note) == ("sdpa", (), "")


def _plan(gpu: str, framework: str) -> list[str]:
    brief = brief_from_dict(
        {"model": "llama-3-8b", "hardware": f"1x8x{gpu}", "seq_len": 4096,
         "global_batch_size": 64, "task": "pretrain", "framework": framework}
    )  # fmt: skip
    plan = search_strategy(lookup_model("llama-3-8b", 4096), parse_hardware(f"1x8x{gpu}"), brief)
    return plan.assumptions


def test_a_megatron_plan_on_v100_prices_and_says_the_unfused_scores() -> None:
    """No FlashAttention-2 before Ampere: Megatron-DeepSpeed keeps every head's scores."""
    megatron = _plan("V100-32GB", "megatron")
    said = [a for a in megatron if a.startswith("attention: unfused")]
    assert said, megatron
    assert any("with unfused attention" in a for a in megatron)
    deepspeed = _plan("V100-32GB", "deepspeed")
    assert not any(a.startswith("attention:") for a in deepspeed)
    assert any("FlashAttention-style kernel" in a for a in deepspeed)


def test_a_megatron_plan_on_ampere_says_the_flash_attention_flag() -> None:
    said = [a for a in _plan("A100-80GB", "megatron") if a.startswith("attention:")]
    assert len(said) == 1 and "--use-flash-attn-v2" in said[0]
