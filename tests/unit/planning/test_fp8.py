"""fp8 linears (tools/planning/fp8.py): the catalog's FP8 peaks, the speed model's fp8 path.

What the path promises: only the transformer layers' linears get the FP8 peak, so fp8 beats
bf16 on a Hopper part by less than 2x; the casts cost time; FSDP2's float8 all-gather halves
the weight gathers; a GPU without FP8 tensor cores is refused by name, never run as bf16.
"""

from __future__ import annotations

from functools import cache

import pytest

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, ModelSpec
from tools.planning import fp8
from tools.planning.compute import micro_batch_compute
from tools.planning.estimate import EstimateRequest, estimate
from tools.planning.kernels import Device, matmul_s
from tools.planning.speed import estimate_speed
from tools.research.hardware import load_gpu_catalog, parse_hardware
from tools.research.model_catalog import lookup_model

CATALOG = load_gpu_catalog()
FP8_GPUS = sorted(g for g, spec in CATALOG.items() if spec.fp8_tflops)
# Parts with no FP8 tensor cores (Volta, Turing, Ampere, CDNA 2).
NO_FP8 = ("V100-16GB", "T4", "A10", "A10G", "A100-40GB", "A100-80GB", "A800-80GB", "RTX-A6000",
          "RTX3090", "MI250X")  # fmt: skip


@cache
def _model(name: str, seq: int) -> ModelSpec:
    return lookup_model(name, seq)


def _speed(gpu: str, precision: str, **kw: object):  # type: ignore[no-untyped-def]
    args = {"micro_batch_size": 2, "gradient_accumulation_steps": 4, "seq_len": 8192,
            "recompute": "selective"} | kw  # fmt: skip
    name = str(args.pop("model", "llama-3-8b"))
    spec = str(args.pop("hardware", f"1x8x{gpu}"))
    strategy = str(args.pop("strategy", "zero3"))
    return estimate_speed(
        _model(name, int(args["seq_len"])),  # type: ignore[arg-type]
        parse_hardware(spec),
        strategy,  # type: ignore[arg-type]
        precision=precision,
        **args,  # type: ignore[arg-type]
    )


def test_the_catalog_has_fp8_peaks_on_fp8_parts_only() -> None:
    for gpu in NO_FP8:
        assert CATALOG[gpu].fp8_tflops is None, gpu
    for gpu in ("H100-80GB", "H100-PCIE", "H200", "B200", "L4", "L40S", "RTX4090", "MI300X"):
        assert gpu in FP8_GPUS, gpu
    for gpu in FP8_GPUS:
        spec = CATALOG[gpu]
        # Dense FP8 is twice dense 16-bit on every part that has it (the L40S datasheet's 733
        # against 362.05 is 2% over: its FP8 and sparse BF16 rows share one figure).
        assert spec.bf16_tflops is not None and spec.fp8_tflops is not None
        assert spec.fp8_tflops == pytest.approx(2 * spec.bf16_tflops, rel=0.025), gpu


@pytest.mark.parametrize(
    ("model", "hardware", "strategy", "tp"),
    [("llama-3-8b", "1x8xH100-80GB", "zero3", 1), ("llama-3-70b", "4x8xH100-80GB", "zero1", 8),
     ("qwen2.5-32b", "1x8xH200", "zero3", 1), ("llama-3-8b", "1x8xB200", "zero3", 1)],
)  # fmt: skip
def test_fp8_is_faster_than_bf16_but_below_twice(
    model: str, hardware: str, strategy: str, tp: int
) -> None:
    kw = {"model": model, "hardware": hardware, "strategy": strategy, "tensor_parallel": tp}
    bf16, f8 = _speed("", "bf16", **kw), _speed("", "fp8", **kw)
    assert bf16.tokens_per_s and f8.tokens_per_s
    assert 1.0 < f8.tokens_per_s / bf16.tokens_per_s < 2.0, (model, hardware)
    assert f8.gemm_precision == "fp8" and bf16.gemm_precision is None
    assert f8.precision == "bf16"  # everything but the linears stays bf16
    assert any(a.startswith("fp8 linears") for a in f8.assumptions)


@pytest.mark.parametrize("gpu", ["H100-80GB", "H200", "B200", "L40S", "MI300X"])
def test_a_large_fp8_gemm_runs_at_the_fp8_share_of_the_fp8_peak(gpu: str) -> None:
    spec = CATALOG[gpu]
    assert spec.bf16_tflops and spec.fp8_tflops
    device = Device.of(spec, spec.bf16_tflops)
    fast, _ = fp8.fp8_device(spec, device)
    share, _ = fp8.gemm_efficiency(spec)
    # Whole waves of whole tiles and a long reduction: the plateau, less the launch.
    tile_m, tile_n, sms = fast.facts.tile_m, fast.facts.tile_n, fast.facts.sms
    m, n, k = tile_m * sms, tile_n * 8, 8192
    rate = 2.0 * m * n * k / matmul_s(fast, m, n, k, 1)
    assert 0.97 * share * spec.fp8_tflops * 1e12 < rate <= share * spec.fp8_tflops * 1e12
    # The same GEMM in bf16 runs at the bf16 plateau, slower.
    slow = 2.0 * m * n * k / matmul_s(device, m, n, k, 2)
    assert slow < rate


def test_mi300x_takes_its_cited_gemm_share_not_the_h100_fit() -> None:
    """MI300X's fp8 share comes from a published hipBLASLt benchmark and says so."""
    mi300, h100 = CATALOG["MI300X"], CATALOG["H100-80GB"]
    share, why = fp8.gemm_efficiency(mi300)
    fitted, _ = fp8.gemm_efficiency(h100)
    assert share < fitted and "benchmark" in why
    # Against the dense peaks, the MI300X fp8 GEMM plateau sits below the H100's.
    assert share * mi300.fp8_tflops < fitted * h100.fp8_tflops


def test_only_the_linears_change_and_the_casts_cost_time() -> None:
    model, gpu = _model("llama-3-8b", 4096), CATALOG["H100-80GB"]
    device = Device.of(gpu, gpu.bf16_tflops or 0)
    args = {"micro": 2, "seq": 4096, "tp": 1, "pp": 1, "cp": 1, "recompute": "none",
            "attention": "sdpa", "sequence_parallel": False, "bytes_per": 2}  # fmt: skip
    bf16 = micro_batch_compute(model, device, **args)  # type: ignore[arg-type]
    fast, _ = fp8.fp8_device(gpu, device)
    f8 = micro_batch_compute(model, device, fp8=fast, **args)  # type: ignore[arg-type]
    assert f8.attention_s == bf16.attention_s  # the attention core stays bf16
    assert f8.forward_s < bf16.forward_s and f8.backward_s < bf16.backward_s
    # Without the casts' cost the linears would be cheaper still.
    original = fp8.CAST_BYTES, fp8.GRAD_BYTES, fp8.TRANSPOSE_BYTES
    try:
        fp8.CAST_BYTES = fp8.GRAD_BYTES = fp8.TRANSPOSE_BYTES = 0.0
        free = micro_batch_compute(model, device, fp8=fast, **args)  # type: ignore[arg-type]
    finally:
        fp8.CAST_BYTES, fp8.GRAD_BYTES, fp8.TRANSPOSE_BYTES = original
    assert free.forward_s < f8.forward_s and free.backward_s < f8.backward_s


def test_fsdp_float8_all_gather_halves_the_weight_gathers() -> None:
    plain = _speed("H100-80GB", "fp8", hardware="2x8xH100-80GB")
    gathered = _speed("H100-80GB", "fp8", hardware="2x8xH100-80GB", fp8_all_gather=True)
    # ZeRO-3 moves 3 model-sized collectives per micro step; two of them now at 1 byte.
    assert gathered.comm_bytes_per_step == pytest.approx(plain.comm_bytes_per_step * 2 / 3, 1e-6)
    assert gathered.tokens_per_s and plain.tokens_per_s
    assert gathered.tokens_per_s >= plain.tokens_per_s
    # Ignored without fp8: a bf16 run gathers bf16 weights.
    bf16 = _speed("H100-80GB", "bf16", hardware="2x8xH100-80GB", fp8_all_gather=True)
    assert bf16.comm_bytes_per_step == plain.comm_bytes_per_step


@pytest.mark.parametrize("gpu", ["A100-80GB", "V100-32GB", "RTX3090"])
def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_by_name(gpu: str) -> None:
    name = CATALOG[gpu].name
    with pytest.raises(InputError, match=f"{name} has no FP8 peak") as info:
        _speed(gpu, "fp8")
    assert info.value.field == "precision"
    request = EstimateRequest(model="llama-3-8b", hardware=f"1x8x{gpu}", precision="fp8",
                              seq_len=4096, global_batch=64)  # fmt: skip
    with pytest.raises(InputError, match=name) as flagged:
        estimate(request)
    assert flagged.value.field == "--precision"


def test_fp8_without_a_gpu_is_refused() -> None:
    cpu = HardwareSpec(source="described", nodes=1, gpus_per_node=0, gpu=None)
    with pytest.raises(InputError, match="fp8 needs a GPU with FP8 tensor cores"):
        fp8.require_fp8(cpu)


def test_an_estimate_with_fp8_says_what_it_assumed_and_takes_the_fp8_band() -> None:
    request = EstimateRequest(model="llama-3-8b", hardware="1x8xH100-80GB", precision="fp8",
                              framework="torchtitan", seq_len=8192, global_batch=64)  # fmt: skip
    plan = estimate(request).memory
    note = next(a for a in plan.assumptions if a.startswith("fp8 linears"))
    assert "1978.9 TFLOP/s dense FP8" in note and "output layer in bf16" in note
    assert "memory priced as bf16 mixed precision" in note
    speed, memory = plan.error_bands
    assert speed.kind == "h100/torchtitan+fp8" and memory.kind == "h100/torchtitan"
    bf16 = estimate(request.model_copy(update={"precision": "bf16"})).memory
    assert plan.setup and bf16.setup and plan.setup.tokens_per_s and bf16.setup.tokens_per_s
    assert plan.setup.tokens_per_s > bf16.setup.tokens_per_s
