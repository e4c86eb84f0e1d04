"""FLOPs per token and the GPU's peak: what the speed model counts and what it runs at.

FLOPs as PaLM defines them (Chowdhery et al. 2022, appendix B: 6N + 12·L·h·s per token; full
recomputation executes 8N + 16·L·h·s, Korthikanti et al. 2022 sec. 4.1); the dense peak for
the precision from the GPU catalog, and the kernel model's device (tools/planning/kernels.py).
tools/planning/speed.py builds a step from these.
"""

from __future__ import annotations

from tools.core.errors import InputError
from tools.core.schemas import GPUSpec, HardwareSpec, ModelSpec, ResolvedPrecision
from tools.planning.comm import StepSetup
from tools.planning.kernels import Device
from tools.planning.states import head_dim
from tools.research.architectures import is_convolutional
from tools.research.vision_shapes import conv_net


def training_flops_per_token(
    model: ModelSpec, seq_len: int, *, activation_checkpointing: bool
) -> float:
    """Training FLOPs per token: 6N + 12·L·h·s, or 8N + 16·L·h·s with full recomputation.

    PaLM (Chowdhery et al. 2022), appendix B: a forward pass costs 2N per token for the
    matmuls with the weights plus 4·L·h·s for attention scores and their product with values
    (h: heads x head width, PaLM's H·Q; causal masking not discounted); backward costs twice the forward. N is the parameters a
    token passes through: ``active_params`` for a mixture of experts. Full activation
    checkpointing re-runs each layer's forward in backward (Korthikanti et al. 2022 sec. 4.1),
    one more 2N + 4·L·h·s.
    """
    n = model.active_params or model.params
    net = conv_net(model.hf_config or {})
    if net is not None:
        # A convolutional network: 2 FLOPs per multiply-accumulate of its layers (one image is
        # ``seq_len`` FLOPs-equivalent positions), no attention.
        forward = 2.0 * net.forward_macs / max(1, seq_len)
        return float((4 if activation_checkpointing else 3) * forward)
    # A convolutional network has no attention scores: its cost is the weights' 2N per position.
    # PaLM's 12·L·H·Q·T: heads x head width, the hidden size unless the config sets head_dim.
    width = model.heads * head_dim(model)
    attention = 0 if is_convolutional(model.hf_config or {}) else 4 * model.layers * width
    forward = 2 * n + attention * seq_len
    return float((4 if activation_checkpointing else 3) * forward)


def require_tf32(hardware: HardwareSpec, field: str = "precision") -> float:
    """The TF32 peak of ``hardware``'s GPU; InputError naming the GPU when it has none."""
    gpu = hardware.gpu
    if gpu is None:
        raise InputError(
            field, "tf32 needs a GPU with TF32 tensor cores (Ampere or later); use fp32"
        )
    if not gpu.tf32_tflops:
        raise InputError(
            field,
            f"tf32 needs TF32 tensor cores and {gpu.name} has no TF32 peak in the catalog "
            "(NVIDIA Ampere, Ada, Hopper and Blackwell have one); use fp32 or fp16",
        )
    return gpu.tf32_tflops


def _peak_tflops(
    gpu: GPUSpec, precision: ResolvedPrecision, notes: list[str], *, tf32: bool = False
) -> float | None:
    """Dense peak for the precision from the catalog; fp32 where the part lacks that mode.

    ``tf32``: fp32 tensors with TF32 tensor-core matmuls and convolutions, at the catalog's
    TF32 peak (``require_tf32`` has checked that the part has one).
    """
    if tf32 and gpu.tf32_tflops:
        notes.append(
            f"tf32: fp32 tensors, matmuls and convolutions on TF32 tensor cores at "
            f"{gpu.tf32_tflops:g} TFLOP/s dense ({gpu.name} datasheet); memory-bound work moves "
            "4-byte elements"
        )
        return gpu.tf32_tflops
    peak = {"bf16": gpu.bf16_tflops, "fp16": gpu.fp16_tflops, "fp32": gpu.fp32_tflops}[precision]
    if peak is None and precision != "fp32" and gpu.fp32_tflops:
        notes.append(
            f"{gpu.name} has no {precision} tensor-core figure: its matmuls run at about the "
            f"fp32 rate, {gpu.fp32_tflops:g} TFLOP/s"
        )
        return gpu.fp32_tflops
    if precision == "fp32" and peak is not None:
        notes.append(
            "fp32 peak is the non-tensor (vector) rate: PyTorch leaves TF32 matmuls off by default"
        )
    return peak


def device_for(setup: StepSetup, flops: float) -> tuple[float | None, Device | None]:
    """(peak TFLOP/s, the kernel model's device) for the setup's GPU and precision."""
    gpu = setup.hardware.gpu
    if gpu is None:
        setup.notes.append(
            "no GPU: no peak FLOP/s in the catalog for a CPU, so no step time, tokens/s or MFU"
        )
        return None, None
    peak = _peak_tflops(gpu, setup.precision, setup.notes, tf32=setup.tf32)
    if peak is None:
        setup.notes.append(f"{gpu.name}: no {setup.precision} peak known, so no step time or MFU")
        return None, None
    device = Device.of(gpu, peak)
    facts = device.facts
    setup.notes.append(
        f"kernels on {gpu.name}: large GEMMs at {facts.gemm:.0%} of {peak:g} TFLOP/s dense "
        f"{'tf32' if setup.tf32 else setup.precision} peak, less for small or badly tiled shapes ({facts.tile_m}x"
        f"{facts.tile_n} tiles over {facts.sms} SMs); attention at {facts.attention_fwd:.0%} "
        f"forward / {facts.attention_bwd:.0%} backward ({setup.attention}); memory-bound ops "
        f"at {facts.hbm:.0%} of {gpu.memory_bandwidth_gbs or 900:g} GB/s: {facts.why}"
    )
    return peak, device


def flops_notes(setup: StepSetup, flops: float) -> None:
    """The FLOPs count, the tokens per step and the model-parallel share, into ``setup.notes``."""
    model = setup.model
    conv = is_convolutional(model.hf_config or {})
    net = conv_net(model.hf_config or {})
    setup.notes += [
        f"FLOPs per token {flops:.3e}: "
        + (
            f"2 FLOPs x 3 (forward and backward) x {net.forward_macs:,} multiply-accumulates "
            "per image (its convolutions' shapes) over its FLOPs-equivalent positions"
            if net is not None
            else "6N per FLOPs-equivalent position (a convolutional network has no attention)"
            if conv
            else "PaLM appendix B, 6N + 12·L·h·s"
        )
        + " with N = "
        f"{model.active_params or model.params:,}"
        + (
            " active (mixture of experts)"
            if model.active_params and model.active_params != model.params
            else ""
        )
        + (
            "; full activation checkpointing adds one forward: 8N + 16·L·h·s "
            "(MFU still counts 6N + 12·L·h·s)"
            if setup.checkpointing
            else ""
        ),
        f"{setup.tokens_per_step:,} tokens per step = micro {setup.micro} x accumulation "
        f"{setup.accumulation} x {setup.dp} {'data-parallel ' if setup.tp * setup.pp > 1 else ''}"
        f"rank(s) x seq {setup.seq}",
    ]
    if setup.tp * setup.pp > 1:
        setup.notes.append(
            f"tensor parallel {setup.tp} x pipeline {setup.pp} x data parallel {setup.dp}: each "
            f"GPU computes 1/{setup.tp * setup.pp} of its replica's FLOPs (Narayanan et al. 2021)"
        )
