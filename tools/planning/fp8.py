"""fp8 linears: where the FP8 peak applies, what its GEMMs reach, and what the casts cost.

With precision fp8 the transformer layers' linear GEMMs (QKV, attention output, MLP, MoE
experts) run on FP8 tensor cores; everything else stays 16-bit: the attention core, norms,
the router and the output layer (torchtitan's llama3 configs set ``filter_fqns = ["output"]``
and its MX converter skips ``output`` by default, torchtitan/config/job_config.py; Transformer
Engine replaces the transformer layers' linears, not the model's head). Both frameworks keep
16-bit (and fp32 master) weights and cast to fp8 on the fly: torchao ``Float8Linear`` with
dynamic tensorwise scaling (``torchao.float8``), Transformer Engine with delayed scaling
(amax history). The casts are memory-bound passes priced from the bytes they move
(``cast_bytes``); FSDP2's float8 all-gather (torchtitan ``enable_fsdp_float8_all_gather``)
gathers the fp8 weights, half the 16-bit traffic (tools/planning/comm.py).
"""

from __future__ import annotations

from dataclasses import replace

from tools.core.errors import InputError
from tools.core.schemas import GPUSpec, HardwareSpec
from tools.planning.comm import StepSetup
from tools.planning.kernels import Device, kernel_class

# The share of the FP8 dense peak a large fp8 GEMM reaches in training (with the casts priced
# separately), by kernel class. Fitted on the fit split of the published fp8 rows only
# (bench/calibration/published.py, sha256(row_id) % 4 == 0: llm-foundry's amp_fp8 MPT rows and
# torchtitan's Float8 Llama rows on H100); the error on the held-out rows is in
# bench/results/2026-12-05-fp8-published.md. Every Hopper part shares the H100's fit (0.675 of
# 1,979 TFLOP/s, about 1,340, against 62.5% of 989 for bf16 GEMMs); B200 takes it too: its only
# fit row (mxfp8) ran power-limited and the bf16 B200 row is 1.8x over as well, so fitting on it
# would fold the power cap into the GEMM share. Classes with no fp8 row take it, said in notes.
#
# MI300X is not fitted (its published fp8 rows, ROCm/TransformerEngine issues #72 and #76 in
# bench/calibration/published_extra, are 1 fit row): its share is a published GEMM benchmark's.
# Azure's AI-benchmarking-guide (fork samuel-bohman/AI-benchmarking-guide@3de0c294fd10,
# Azure_Results/ND_MI300X_v5_results.md, "GEMM HipBLASLt", FP8, random init) reaches at most
# 1,159.5 TFLOP/s (m, n, k = 6144, 12288, 12288) = 44% of the 2,614.9 dense FP8 peak, where the
# same harness on H100 (ND_H100_v5_results.md, cuBLASLt) reaches 1,351.4 on that shape = 68% of
# 1,979, next to the H100's training fit of 67.5%; the H100 fit scaled by the two GEMM shares
# (0.675 x 0.443 / 0.683) is 0.44. Before: the H100's 0.675 assumed, 1.75-1.90x over the rows.
FP8_GEMM: dict[str, float] = {"h100": 0.675, "h200": 0.675, "b200": 0.675, "mi300": 0.44}
FP8_GEMM_DEFAULT = 0.675
FP8_FIT_CLASSES = ("h100",)
# Classes whose share is a published GEMM benchmark's, not a fit: where it comes from.
FP8_GEMM_CITED = {
    "mi300": "the H100 fit scaled by Azure's hipBLASLt/cuBLASLt FP8 GEMM benchmark, "
    "MI300X 44% against H100 68% of peak on the same shape",
}

# Bytes one dynamic-scaling cast moves per element of a 16-bit tensor: the amax reduction reads
# it (2 bytes), the cast reads it again and writes fp8 (2 + 1); torchao float8 tensorwise.
CAST_BYTES = 5.0
# Backward re-casts the saved 16-bit input and the weight transposed (read 2, write 1: the scale
# is reused) and casts the output gradient with its amax (5) plus a transposed fp8 copy (2).
TRANSPOSE_BYTES = 3.0
GRAD_BYTES = 7.0


def fp8_peak(gpu: GPUSpec | None) -> float | None:
    """The part's dense FP8 tensor-core TFLOP/s from the catalog; None without one."""
    return gpu.fp8_tflops if gpu is not None else None


def require_fp8(hardware: HardwareSpec, field: str = "precision") -> float:
    """The FP8 peak of ``hardware``'s GPU; InputError naming the GPU when it has none."""
    return _checked_peak(hardware.gpu, field)


def _checked_peak(gpu: GPUSpec | None, field: str) -> float:
    peak = fp8_peak(gpu)
    if gpu is None:
        raise InputError(
            field,
            "fp8 needs a GPU with FP8 tensor cores (Hopper, Ada, Blackwell, MI300X); use bf16",
        )
    if not peak:
        raise InputError(
            field,
            f"fp8 needs FP8 tensor cores and {gpu.name} has no FP8 peak in the catalog "
            "(Hopper, Ada, Blackwell and MI300X have one); use bf16",
        )
    return peak


def gemm_efficiency(gpu: GPUSpec) -> tuple[float, str]:
    """The fp8 GEMM share of the FP8 peak for ``gpu``'s kernel class, and where it comes from."""
    cls = kernel_class(gpu)
    if cls in FP8_FIT_CLASSES:
        return FP8_GEMM[cls], "fitted on the fit split of published fp8 training rows"
    if cls in FP8_GEMM_CITED:
        return FP8_GEMM[cls], FP8_GEMM_CITED[cls]
    if cls in FP8_GEMM:
        return FP8_GEMM[cls], "H100's fit (no fp8 row of this class in the fit split)"
    return FP8_GEMM_DEFAULT, "H100's fit assumed (no published fp8 row for this class)"


def fp8_device(gpu: GPUSpec, device: Device) -> tuple[Device, str]:
    """``device`` as the linear GEMMs see it with fp8: the FP8 peak at the fp8 GEMM share."""
    peak = _checked_peak(gpu, "precision")
    share, why = gemm_efficiency(gpu)
    facts = replace(device.facts, gemm=share)
    return Device(facts, peak * 1e12, device.bandwidth), why


def cast_bytes(m: int, n: int, k: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes of one (m x k) @ (k x n) linear's fp8 casts.

    Forward: the input (m x k) and the weight (k x n) get an amax and a cast each. Backward:
    the output gradient (m x n) gets its amax, cast and a transposed fp8 copy; the saved input
    and the weight are cast again transposed for the weight and input gradients.
    """
    forward = CAST_BYTES * (m * k + k * n)
    backward = GRAD_BYTES * m * n + TRANSPOSE_BYTES * (m * k + k * n)
    return forward, backward


def fp8_notes(setup: StepSetup, gpu: GPUSpec | None) -> float | None:
    """What the fp8 path assumed, into ``setup.notes``; the FP8 peak."""
    peak = fp8_peak(gpu)
    if gpu is None or not peak:
        return None
    share, why = gemm_efficiency(gpu)
    setup.notes.append(
        f"fp8 linears: QKV, attention output and MLP (and expert) GEMMs at {share:.0%} of "
        f"{peak:g} TFLOP/s dense FP8 ({why}), each linear's amax and cast passes priced from "
        f"the bytes they move ({CAST_BYTES:g} bytes per element forward); the attention core, "
        "norms, router and output layer stay bf16; weights, gradients and optimizer states are "
        "kept as in bf16 mixed precision (fp8 copies are transient); MFU is against the bf16 "
        "peak, fp8_mfu against the FP8 peak"
        + (
            "; weights all-gathered in fp8 (FSDP2 float8 all-gather)"
            if setup.fp8_all_gather
            else ""
        )
    )
    return peak


def fp8_plan_note(hardware: HardwareSpec, framework: str) -> str:
    """The plan's one line on what fp8 means here: where the FP8 peak applies, memory."""
    peak = require_fp8(hardware)
    assert hardware.gpu is not None  # require_fp8 refuses a machine without a GPU
    share, why = gemm_efficiency(hardware.gpu)
    gather = (
        "; with FSDP2 (zero3) the weights are all-gathered in fp8 (half the 16-bit traffic)"
        if framework == "torchtitan"
        else ""
    )
    return (
        f"fp8 linears: the transformer layers' linear GEMMs at {share:.1%} of {peak:g} TFLOP/s "
        f"dense FP8 ({why}) plus their amax-and-cast passes; attention core, norms and output "
        f"layer in bf16{gather}; memory priced as bf16 mixed precision (torchao keeps bf16 "
        "weights and saves bf16 inputs for backward, with fp32 masters; Transformer Engine's "
        "fp8 saved inputs make this an upper bound there); MFU is against the bf16 peak"
    )
