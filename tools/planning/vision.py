"""Image models' speed: a convolutional network's micro-batch, images/s, the input pipeline.

A convolutional network (tools/research/vision_shapes.py) runs each convolution as an implicit
GEMM of (images x output positions) x output channels x (kernel area x input channels): its
time is ``kernels.matmul_s`` of that shape, so the small channel counts of the early layers
(K = 64 for a 1x1 over 64 channels) run far below the GEMM plateau through the short-k and
tile losses, and backward runs the input-gradient and weight-gradient GEMMs. Depthwise
convolutions (ConvNeXt) have too little reuse for tensor cores: they are timed by the bytes
they move. The BatchNorm, activation, pooling and residual layers between them move their
feature maps through HBM (``vision_shapes.PASSES``), at the GPU's streaming bandwidth.

A vision transformer is timed as the transformer it is (tools/planning/compute.py), over its
patches. For both, a sample is one image: images/s = samples/s, and the host's input pipeline
(JPEG decode and augmentation on CPU cores) is a ceiling stated as an assumption.
"""

from __future__ import annotations

import math
from typing import Any

from tools.core.schemas import HardwareSpec, ModelSpec
from tools.planning.conv_algos import (
    DEFAULT_MODE,
    WINOGRAD_REDUCTION,
    ConvMode,
    conv_mode_notes,
    transpose_bytes,
    winograd,
)
from tools.planning.kernels import Device, matmul_s, memory_s
from tools.research.vision_shapes import ConvNet, conv_net, is_image_model

# JPEG decode + random-resized crop + flip of one ImageNet training image on one host core, an
# assumption (PIL/libjpeg-turbo class decoders; DALI moves this to the GPU): the images/s one
# core feeds.
IMAGES_PER_CORE_S = 200.0


def conv_net_of(model: ModelSpec) -> ConvNet | None:
    """The model's convolutional layers, None for anything else."""
    return conv_net(model.hf_config or {})


def image_model(model: ModelSpec) -> bool:
    """Whether a sample is an image (a convolutional network or a vision transformer)."""
    return is_image_model(model.hf_config or {})


def cnn_compute_s(
    net: ConvNet,
    device: Device,
    *,
    images: int,
    tp: int,
    pp: int,
    recompute: str,
    bytes_per: int,
    mode: ConvMode = DEFAULT_MODE,
) -> tuple[float, float, float]:
    """(forward, backward, recompute) seconds of ``images`` images on one GPU.

    Tensor parallelism splits each convolution's output channels; a pipeline stage takes
    1/pp of the layers' time (an even split of the network). ``mode``: tensor cores or not
    and the memory format (tools/planning/conv_algos.py: NCHW transposes, Winograd).
    """
    gemm_fwd = gemm_bwd = 0.0
    mem_bytes_fwd = mem_bytes_bwd = 0.0
    for index, conv in enumerate(net.convs):
        m, n, k = conv.gemm
        m *= images
        if conv.groups > 1:  # depthwise: read the input, write the output; backward twice that
            maps = m * conv.cout
            mem_bytes_fwd += 2 * maps * bytes_per
            mem_bytes_bwd += 4 * maps * bytes_per
            continue
        n = max(1, n // tp)
        # Winograd F(2x2,3x3) runs the same shapes with 2.25x fewer multiplies per output.
        fast = WINOGRAD_REDUCTION if winograd(conv, mode) else 1.0
        gemm_fwd += matmul_s(device, m, n, max(1, round(k / fast)), bytes_per)
        gemm_bwd += weight_grad_s(device, m, n, k, bytes_per)
        if index:  # the pixels need no gradient: the stem convolution has no input gradient
            dm, dn, dk = conv.dgrad_gemm
            dk = max(1, round(dk / tp / fast))
            gemm_bwd += matmul_s(device, dm * images, dn, dk, bytes_per)
        moved_fwd, moved_bwd = transpose_bytes(conv, mode, images, bytes_per)
        mem_bytes_fwd += moved_fwd / tp
        mem_bytes_bwd += moved_bwd / tp
    for layer in net.elementwise:
        elements = layer.elements * images / tp
        mem_bytes_fwd += layer.fwd * elements * bytes_per
        mem_bytes_bwd += layer.bwd * elements * bytes_per
    kernels = len(net.elementwise)
    elem_fwd = memory_s(device, mem_bytes_fwd, kernels)
    elem_bwd = memory_s(device, mem_bytes_bwd, 2 * kernels)
    fwd, bwd = gemm_fwd + elem_fwd, gemm_bwd + elem_bwd
    if recompute == "full":
        re = fwd
    elif recompute == "selective":
        re = 0.5 * gemm_fwd + elem_fwd
    else:
        re = 0.0
    return fwd / pp, bwd / pp, re / pp


def conv_activation_bytes(
    net: ConvNet, *, images: int, act_bytes: int, full_recompute: bool, tp: int, pp: int
) -> int:
    """Feature-map bytes one GPU keeps for backward over a micro-batch of ``images``.

    Each bandwidth-bound layer (normalization, activation, pooling, residual add) keeps its
    input for backward, and a convolution's input is the previous layer's output, so the
    feature maps of ``net.elementwise`` are counted once each. Full recomputation keeps the
    residual blocks' outputs and one block's maps at a time. Tensor parallelism splits
    channels, a pipeline stage holds 1/pp of the layers.
    """
    maps = [layer.elements for layer in net.elementwise]
    if full_recompute:
        kept = sum(layer.elements for layer in net.elementwise if layer.kind == "add")
        kept += 8 * max(maps, default=0)  # the block being recomputed
    else:
        kept = sum(maps)
    return int(kept * images * act_bytes / (tp * pp))


# The shortest reduction a split-K slice keeps (below it the slices' prologues dominate).
SPLIT_K_MIN = 1024


def weight_grad_s(device: Device, m: int, n: int, k: int, bytes_per: int) -> float:
    """A convolution's weight gradient: a small k x n output reduced over m = images x positions.

    Its output fills only a few tiles, so the libraries split the long reduction over the
    SMs (split-K: cuDNN's and CUTLASS's wgrad kernels) and add the slices' fp32 partial sums:
    timed as ``splits`` GEMMs of m / splits side by side, plus that reduction's traffic.
    """
    facts = device.facts
    tiles = math.ceil(k / facts.tile_m) * math.ceil(n / facts.tile_n)
    splits = max(1, min(math.ceil(facts.sms / tiles), m // SPLIT_K_MIN))
    reduce_s = memory_s(device, 2 * splits * k * n * 4.0) if splits > 1 else 0.0
    return matmul_s(device, k * splits, n, -(-m // splits), bytes_per) + reduce_s


# The speed notes an image model's estimate shows beside its images/s: how its convolutions
# were priced (conv_algos.py), the TF32 mode (flops.py) and the input pipeline.
IMAGE_NOTE_PREFIXES = ("memory format", "assumed: cuDNN runs", "tf32:", "input pipeline")


def image_notes(assumptions: list[str]) -> list[str]:
    """The notes of ``assumptions`` that say how an image model's images/s were priced."""
    return [a for a in assumptions if a.startswith(IMAGE_NOTE_PREFIXES)]


def images_per_s(model: ModelSpec, tokens_per_s: float | None, seq_len: int) -> float | None:
    """Images/s of the whole cluster for an image model (one sample is one image), else None."""
    if tokens_per_s is None or not image_model(model) or seq_len < 1:
        return None
    return tokens_per_s / seq_len


def input_pipeline(hardware: HardwareSpec, images_s: float, notes: list[str]) -> float | None:
    """The host input pipeline's ceiling on images/s (cluster), said in ``notes`` as assumed.

    With the host's cores known (this machine), ``IMAGES_PER_CORE_S`` per core; otherwise the
    cores per GPU that the predicted rate needs.
    """
    gpus = hardware.world_size
    per_gpu = images_s / gpus
    need = per_gpu / IMAGES_PER_CORE_S
    if hardware.cpu_cores:
        ceiling = hardware.cpu_cores * hardware.nodes * IMAGES_PER_CORE_S
        binds = ceiling < images_s
        notes.append(
            f"input pipeline (assumed): {hardware.cpu_cores} host cores per node decoding and "
            f"augmenting JPEGs at about {IMAGES_PER_CORE_S:g} images/s each feed "
            f"{ceiling:,.0f} images/s"
            + (
                f", below the GPUs' {images_s:,.0f}: the input pipeline is the ceiling unless "
                "decoding runs on the GPU (NVIDIA DALI) or the data is pre-decoded"
                if binds
                else f", above the GPUs' {images_s:,.0f}"
            )
        )
        return ceiling
    notes.append(
        f"input pipeline (assumed, not in the images/s): {per_gpu:,.0f} images/s per GPU needs "
        f"about {need:.1f} host cores per GPU decoding and augmenting JPEGs at "
        f"{IMAGES_PER_CORE_S:g} images/s per core; with fewer, the host is the ceiling unless "
        "decoding runs on the GPU (NVIDIA DALI)"
    )
    return None


def image_fields(
    model: ModelSpec,
    hardware: HardwareSpec,
    tokens_per_s: float | None,
    seq_len: int,
    mode: ConvMode = DEFAULT_MODE,
) -> dict[str, Any]:
    """``images_per_s`` and ``input_images_per_s`` (the assumed host ceiling) with their notes.

    A convolutional network's notes say how its convolutions were priced (``mode``: the
    memory format assumed or given, Winograd where it applies).
    """
    images = images_per_s(model, tokens_per_s, seq_len)
    if images is None:
        return {}
    net = conv_net_of(model)
    notes: list[str] = conv_mode_notes(net, mode) if net is not None else []
    notes += [
        f"{images:,.0f} images/s ({images / hardware.world_size:,.0f} per GPU): one sample is "
        f"one image ({seq_len} {'patches + class token' if conv_net_of(model) is None else 'FLOPs-equivalent positions'})"
    ]
    ceiling = input_pipeline(hardware, images, notes)
    return {"images_per_s": images, "input_images_per_s": ceiling, "notes": notes}
