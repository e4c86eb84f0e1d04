"""The strategy search's words: what it assumed, what it searched, and why each setup lost.

Only text from numbers the estimates already hold; nothing here decides anything.
"""

from __future__ import annotations

from collections.abc import Collection

from tools.core.schemas import HardwareSpec, ModelSpec, StrategyEstimate, TrainingBrief
from tools.core.strategies import MIN_HEADROOM, OFFLOAD_STRATEGIES
from tools.core.units import GB, gb_text
from tools.planning.overheads import (
    CPU_RAM_HEADROOM,
    CUDA_CONTEXT_BYTES,
    FRAGMENTATION_MARGIN,
    node_ram_bytes,
)
from tools.planning.states import ZERO12_BUCKET_ELEMENTS
from tools.planning.vision import conv_net_of
from tools.research.architectures import is_convolutional, trains_as_causal_lm

MEGATRON_NOTE = (
    "tensor/pipeline parallelism needs Megatron-DeepSpeed (or Megatron-LM/NeMo): DeepSpeed's "
    "engine alone has no Megatron tensor- or pipeline-parallel layers. ds_config.json carries "
    "the ZeRO part with train_batch_size = micro x accumulation x data-parallel ranks, which "
    "DeepSpeed checks against Megatron's data-parallel group (its mpu); the parallel degrees "
    "are Megatron arguments (--tensor-model-parallel-size, --pipeline-model-parallel-size)"
)


def split_note(framework: str | None, tp: int, pp: int, cp: int = 1) -> str:
    """What runs the chosen split, from the framework that implements it (research/splits.py)."""
    if framework == "deepspeed":
        return (
            f"tensor parallel {tp} runs on DeepSpeed AutoTP (tensor_parallel.autotp_size {tp} in "
            "ds_config.json), which shards the Hugging Face model's linear layers; the ZeRO "
            "stage shards the rest across the data-parallel ranks"
        )
    if framework == "torchtitan":
        return (
            f"the split (tensor {tp} x pipeline {pp}"
            + (f" x context {cp}" if cp > 1 else "")
            + ") runs on torchtitan: FSDP2 with tensor, pipeline and context parallelism from "
            "torchtitan.toml"
        )
    return MEGATRON_NOTE


def node_ram_text(hardware: HardwareSpec) -> str:
    """The node's RAM as the reasons quote it: "the node's 2048 GB" (and whether assumed)."""
    ram, assumed = node_ram_bytes(hardware)
    return f"the node's {ram / 1e9:g} GB" + (" (assumed)" if assumed else "")


def batch_line(
    brief: TrainingBrief, micro: int, per_rank: int, dp: int, tp: int = 1, pp: int = 1
) -> str:
    """How the global batch splits: micro x accumulation x data-parallel ranks."""
    split = f"micro {micro} x accumulation {per_rank // micro} x {dp}"
    if tp * pp > 1:
        return (
            f"tensor parallel {tp} x pipeline parallel {pp} x data parallel {dp}; seq_len "
            f"{brief.seq_len}; global batch {brief.batch} = {split}"
        )
    return (
        f"data-parallel world size {dp}; seq_len {brief.seq_len}; global batch "
        f"{brief.batch} = {split}"
    )


def base_assumptions(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    precision: str,
    names: Collection[str],
    chosen: StrategyEstimate,
    *,
    checkpointing_needed: bool,
    attention: str = "sdpa",
) -> list[str]:
    """What every memory estimate of the plan assumed, and how the chosen setup splits the batch.

    ``attention``: the kernel the launch runs (tools/planning/attention_kernels.py); ``eager``
    keeps each head's s x s scores, the others none.
    """
    world = hardware.world_size
    per_rank = brief.batch // world
    device = (
        f"{hardware.gpu.name} {hardware.gpu.memory_gb:g} GB (decimal GB, as vendors quote)"
        if hardware.gpu is not None
        else f"CPU RAM {hardware.ram_gb} GB shared by {world} rank(s)"
    )
    how_precision = (
        f"precision {precision}"
        + (" (auto)" if brief.precision == "auto" else "")
        + (
            f" (asked {brief.precision}; CPU-only runs fp32)"
            if precision != brief.precision and brief.precision != "auto"
            else ""
        )
    )
    lines = [
        f"capacity per device: {device}",
        how_precision,
        batch_line(brief, chosen.micro_batch_size, per_rank, world),
        "model states: ZeRO paper (2+2+12 bytes/param for mixed-precision Adam) plus the "
        "fp32 gradient copy DeepSpeed steps on (4 bytes/param, partitioned like the optimizer)",
        "activations: Korthikanti et al. 2022 eq. 1 "
        + (
            "with unfused attention (each head's s x s scores and softmax kept"
            if attention == "eager"
            else "with a FlashAttention-style kernel (no s x s scores"
        )
        + "; llama-style layers 24 + 8·i/h per s·b·h instead of 34), full "
        "checkpointing keeps 2·s·b·h per layer; activations and gradients are not live "
        "together, so the peak counts the larger",
        "logits: 16-bit logits, the fp32 copy and the fp32 log-softmax cross-entropy saves (s·b·V·(2+4+4) bytes)",
        f"buffers: ZeRO-1/2 reduce bucket {ZERO12_BUCKET_ELEMENTS:.0e} elements x2 with "
        "overlap_comm; ZeRO-3 buckets from hidden size as the HF integration sets them; "
        f"CUDA context {CUDA_CONTEXT_BYTES / GB:.2f} GB; "
        f"fragmentation margin {FRAGMENTATION_MARGIN:.0%} of the total",
        "ZeRO-3 assumes the model is built under deepspeed.zero.Init "
        "(Hugging Face does this for stage 3); its 16-bit gradient partition exists from the "
        "start (live with the activations), and where forward turns into backward the last "
        "stage3_max_reuse_distance/2 parameters are still gathered (all of a smaller model)",
    ]
    if hardware.gpu is not None and any(n in OFFLOAD_STRATEGIES for n in names):
        ram, assumed = node_ram_bytes(hardware)
        lines.append(
            assumed
            or f"offload: CPU states per node (DeepSpeed's estimator figure, x1.5) must fit in "
            f"{1 - CPU_RAM_HEADROOM:.0%} of the node's {ram / GB:g} GB RAM"
        )
    if brief.seq_len > model.seq_len:
        lines.append(f"seq_len {brief.seq_len} exceeds the model's {model.seq_len} positions")
    if checkpointing_needed:
        lines.append("activation checkpointing is needed: nothing fits without it")
    if is_convolutional(model.hf_config or {}):
        lines.insert(0, conv_caveat(model))
    if not trains_as_causal_lm(model.hf_config or {}):
        lines.append(
            f"{model.name} ({model.family}) is not a causal language model: the shipped "
            "train.py (token batches, next-token loss) cannot train it, so its smoke run "
            "checks the parallel setup on a llama-style stand-in of the same shape; train it "
            "with this model's own training loop under the launch files"
        )
    return lines


def conv_caveat(model: ModelSpec) -> str:
    """What the plan can and cannot say about a convolutional network (ResNet, ConvNeXt)."""
    if conv_net_of(model) is None:
        return (
            f"{model.name} is a convolutional network: its parameter, gradient and optimizer "
            "memory are exact (counted on meta), and step time costs each image its published "
            f"forward multiply-accumulates ({model.seq_len} FLOPs-equivalent positions of 6N, "
            "so 'tokens' below are those positions), but the activation memory uses the "
            "transformer formula over those positions, a stand-in that is NOT a model of "
            "feature-map memory: measure the peak with a short run on the target GPU before "
            "trusting the micro-batch"
        )
    return (
        f"{model.name} is a convolutional network: its parameter, gradient and optimizer "
        "memory are exact (counted on meta); step time and activation memory come from its "
        "layer shapes (each convolution an implicit GEMM, the normalization, activation, "
        "pooling and residual layers timed by the feature-map bytes they move and kept for "
        f"backward; one image is {model.seq_len} FLOPs-equivalent positions, so 'tokens' below "
        "are those positions and images/s = tokens/s / "
        f"{model.seq_len}); the memory format is NHWC (channels-last) unless the estimate "
        "says NCHW, whose transposes it prices, and fp32 on CUDA cores runs 3x3 convolutions "
        "with Winograd; FFT algorithms and fused normalization are not modelled, and the "
        "activation memory leaves out the convolutions' workspace: measure the peak with a "
        "short run on the target GPU before trusting the micro-batch"
    )


def cpu_short(est: StrategyEstimate, limit: float) -> bool:
    """Did ``est`` fail on the node's CPU RAM rather than on GPU memory?"""
    return not est.fits and est.per_gpu_bytes.total <= limit and est.cpu_bytes_per_node > 0


def over(
    est: StrategyEstimate, limit: float, capacity: int, node_ram: str, *, split: bool = False
) -> str:
    """Why a row does not fit, when nothing does (every reason says "over 90%")."""
    if cpu_short(est, limit):
        return (
            f"offload needs {gb_text(est.cpu_bytes_per_node)} of CPU RAM per node, over "
            f"{1 - MIN_HEADROOM:.0%} of {node_ram}"
        )
    where = f" (smallest at tensor {est.tensor_parallel} x pipeline {est.pipeline_parallel})"
    return (
        f"needs {gb_text(est.per_gpu_bytes.total)} at best, over {1 - MIN_HEADROOM:.0%} of "
        f"{capacity / 1e9:.0f} GB" + (where if split else "")
    )


def no_fit(
    est: StrategyEstimate, limit: float, capacity: int, node_ram: str, *, split: bool
) -> str:
    """Why a row lost by not fitting, when something else does."""
    if cpu_short(est, limit):
        return (
            f"does not fit in CPU RAM: offload needs {gb_text(est.cpu_bytes_per_node)} per node, "
            f"over {1 - MIN_HEADROOM:.0%} of {node_ram}"
        )
    what = "any tensor/pipeline split or micro-batch" if split else "any micro-batch"
    return (
        f"does not fit with {MIN_HEADROOM:.0%} headroom at {what} (smallest "
        f"{gb_text(est.per_gpu_bytes.total)} of {capacity / 1e9:.0f} GB)"
    )


def nothing_fits_note(bigger: str | None, max_nodes: int, *, splits: bool = True) -> str:
    """The first assumption of a plan on which nothing fits with headroom.

    ``splits``: whether the search priced tensor/pipeline splits (a LoRA job's prices none).
    """
    if bigger:
        return f"nothing fits with {MIN_HEADROOM:.0%} headroom; the same GPU would fit at {bigger}"
    if not splits:
        return (
            f"nothing fits with {MIN_HEADROOM:.0%} headroom, and more GPUs of this type do not "
            f"help up to {max_nodes} nodes with data parallelism alone (the splits are not "
            "searched for this request; see 'not searched'): one sequence's activations or the "
            "model states stay too large on each GPU; this needs a shorter sequence or GPUs "
            "with more memory"
        )
    return (
        f"nothing fits with {MIN_HEADROOM:.0%} headroom, and more GPUs of this type do "
        f"not help up to {max_nodes} nodes, even with tensor (up to one node) and "
        "pipeline parallelism: the activations of one layer or the model states stay too "
        "large; this needs memory-efficient attention (the estimate stores attention "
        "scores, Korthikanti et al. eq. 1), a shorter sequence, or GPUs with more memory"
    )
