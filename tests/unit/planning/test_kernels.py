"""The per-operation speed model: kernel times from shapes, and what they do to a step."""

from __future__ import annotations

import pytest
from specs import GPT2, LLAMA3_8B

from tools.planning.compute import micro_batch_compute
from tools.planning.kernels import (
    KERNEL_FACTS,
    LAUNCH_S,
    Device,
    attention_s,
    matmul_s,
    memory_s,
)
from tools.planning.speed import estimate_speed
from tools.research.hardware import find_gpu, parse_hardware

A100 = Device.of(find_gpu("A100-80GB"), 312.0)
H100 = Device.of(find_gpu("H100-80GB"), 989.4)


def _tflops(device: Device, m: int, n: int, k: int) -> float:
    return 2 * m * n * k / matmul_s(device, m, n, k) / 1e12


def test_large_gemm_reaches_the_stated_ceiling_and_no_more() -> None:
    facts = KERNEL_FACTS["a100"]
    achieved = _tflops(A100, 16384, 16384, 8192)
    assert achieved <= 312 * facts.gemm
    assert achieved > 0.95 * 312 * facts.gemm


def test_wave_quantization_one_tile_more_costs_a_whole_wave() -> None:
    """12 x 9 = 108 output tiles fill the A100's 108 SMs once; 13 x 9 need a second wave."""
    tile = KERNEL_FACTS["a100"].tile_m  # 128 x 128 tiles
    full = matmul_s(A100, 12 * tile, 9 * tile, 8192)
    one_more = matmul_s(A100, 13 * tile, 9 * tile, 8192)
    assert one_more > 1.8 * full  # 8% more work, twice the time


def test_small_and_short_gemms_reach_less_of_peak() -> None:
    big = _tflops(H100, 8192, 8192, 8192)
    small = _tflops(H100, 2048, 768, 768)  # a GPT-2 layer's projection at 2k tokens
    short_k = _tflops(H100, 8192, 8192, 128)
    assert small < 0.7 * big
    assert short_k < 0.7 * big


def test_a_matrix_vector_product_is_bound_by_memory_bandwidth() -> None:
    n = k = 8192
    t = matmul_s(A100, 1, n, k)
    weights = 2 * n * k
    assert t == pytest.approx(weights / A100.bandwidth + LAUNCH_S, rel=0.02)
    assert memory_s(A100, weights) == pytest.approx(t, rel=0.05)


def test_attention_causal_eager_and_context_split() -> None:
    kw = {"batch_heads": 32, "q_len": 8192, "kv_len": 8192, "head_dim": 128, "backward": False}
    flash_causal = attention_s(H100, causal=True, kernel="sdpa", **kw)
    flash_full = attention_s(H100, causal=False, kernel="sdpa", **kw)
    eager = attention_s(H100, causal=True, kernel="eager", **kw)
    assert flash_causal == pytest.approx(flash_full / 2, rel=0.01)
    assert eager > flash_causal  # the s x s scores go through HBM
    backward = attention_s(H100, causal=True, kernel="sdpa", **{**kw, "backward": True})
    assert backward > 2.5 * flash_causal  # 2.5x the matmuls at a lower efficiency


def _micro(recompute: str, model=LLAMA3_8B, **kw):
    args = {
        "micro": 1,
        "seq": 4096,
        "tp": 1,
        "pp": 1,
        "cp": 1,
        "attention": "sdpa",
        "sequence_parallel": True,
        "bytes_per": 2,
    }
    args.update(kw)
    return micro_batch_compute(model, H100, recompute=recompute, **args)


def test_recompute_policies_cost_what_they_rerun() -> None:
    none, selective, full = _micro("none"), _micro("selective"), _micro("full")
    assert none.recompute_s == 0
    assert 0 < selective.recompute_s < full.recompute_s
    # Full recomputation re-runs the layers' forward (not the output layer and loss).
    assert full.recompute_s < full.forward_s
    assert full.recompute_s > 0.85 * full.forward_s
    assert none.forward_s == full.forward_s and none.backward_s == full.backward_s
    assert 1.9 < none.backward_s / none.forward_s < 2.6


def test_tensor_and_context_parallelism_divide_the_work() -> None:
    one = _micro("none")
    tp8 = _micro("none", tp=8)
    cp4 = _micro("none", cp=4)
    pp4 = _micro("none", pp=4)
    # Split 8 ways, the matmuls get smaller and lose efficiency: more than 1/8 of the time.
    assert one.total_s / 8 < tp8.total_s < one.total_s / 4
    assert cp4.total_s < one.total_s / 3
    assert pp4.layers == LLAMA3_8B.layers // 4


def test_mfu_depends_on_shape_not_only_on_the_gpu_class() -> None:
    """GPT-2 on an H100 reaches far lower MFU than Llama 3 8B, and a larger micro-batch helps it."""
    hw = parse_hardware("1x8xH100-80GB")

    def mfu(model, micro):
        return estimate_speed(
            model, hw, "zero2", micro_batch_size=micro, gradient_accumulation_steps=1, seq_len=1024
        ).mfu

    assert mfu(GPT2, 1) < mfu(GPT2, 16) < mfu(LLAMA3_8B, 4)
    assert mfu(LLAMA3_8B, 4) < KERNEL_FACTS["h100"].gemm
