"""Which attention kernel a framework's launch runs on a GPU: what the plan prices and says.

The speed and memory models know three kernels (tools/planning/kernels.py ``attention_s``,
tools/planning/activations.py): ``sdpa`` (FlashAttention-2 and PyTorch's scaled-dot-product
kernels: no score matrix in memory), ``cudnn`` (cuDNN's fused attention, faster on Hopper and
Blackwell) and ``eager`` (the s x s scores materialized, as attention ran before FlashAttention).

Most launches run ``sdpa``: Hugging Face models under DeepSpeed, FSDP and torchrun pick PyTorch's
scaled_dot_product_attention, torchtitan and torchtune call it themselves. Megatron-DeepSpeed
(the Megatron launch, tools/artifacts/megatron.py) is the exception: its ``ParallelAttention``
computes the scores unfused (``CoreAttention``) unless a FlashAttention flag is given
(megatron/model/transformer.py at microsoft/Megatron-DeepSpeed@f4157bea), so the launch passes
``--use-flash-attn-v2`` where FlashAttention-2 runs (NVIDIA Ampere or newer: the flash-attn
README) and the plan prices the unfused scores where it does not (V100, T4). With fp8 linears
the launch builds Transformer Engine's layers (``--transformer-impl transformer_engine``), whose
DotProductAttention prefers its cuDNN FusedAttention on Hopper and later ("Disabling
FlashAttention to give FusedAttention preference on Hopper+ for performance reasons",
transformer_engine/pytorch/attention/dot_product_attention/utils.py ``get_attention_backend``
at NVIDIA/TransformerEngine@a0b36d0c).
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.core.schemas import GPUSpec
from tools.planning.kernels import KERNEL_FACTS, kernel_class

# Kernel classes (tools/planning/kernels.py) FlashAttention-2 does not run on: Volta and Turing.
NO_FLASH2 = frozenset({"v100", "t4"})
# The flag that makes Megatron-DeepSpeed's attention FlashAttention-2.
FLASH2_FLAG = "--use-flash-attn-v2"


@dataclass(frozen=True)
class LaunchAttention:
    """The kernel a launch's attention runs, the flags that select it and the plan's line."""

    kernel: str
    flags: tuple[str, ...]
    note: str


def flash2_runs(gpu: GPUSpec | None) -> bool:
    """Whether FlashAttention-2 runs on ``gpu`` (Ampere or newer; AMD through its ROCm port)."""
    return gpu is None or kernel_class(gpu) not in NO_FLASH2


def cudnn_faster(gpu: GPUSpec | None) -> bool:
    """Whether cuDNN's fused attention is priced faster than FlashAttention-2 on ``gpu``."""
    return gpu is not None and KERNEL_FACTS[kernel_class(gpu)].cudnn_attention > 1.0


def megatron_attention(gpu: GPUSpec | None, *, fp8: bool) -> LaunchAttention:
    """What the Megatron-DeepSpeed launch's attention runs on ``gpu`` (fp8: Transformer Engine)."""
    name = gpu.name if gpu is not None else "this GPU"
    if fp8 and gpu is not None and cudnn_faster(gpu):
        faster = KERNEL_FACTS[kernel_class(gpu)].cudnn_attention
        return LaunchAttention(
            "cudnn",
            (),
            "attention: Transformer Engine's cuDNN fused attention (its layers run with fp8 "
            f"linears; it prefers cuDNN over FlashAttention on {name}), priced at {faster:g}x "
            "the FlashAttention-2 rate (Shah et al. 2024, FlashAttention-3, figs. 5-6)",
        )
    if flash2_runs(gpu):
        return LaunchAttention(
            "sdpa",
            (FLASH2_FLAG,),
            f"attention: FlashAttention-2 (`{FLASH2_FLAG}`: Megatron-DeepSpeed computes the "
            "scores unfused without it; the flash-attn package must be installed)",
        )
    return LaunchAttention(
        "eager",
        (),
        f"attention: unfused, the scores of every head kept in memory (FlashAttention-2 needs "
        f"an Ampere or newer GPU, {name} is not): priced as Megatron-DeepSpeed runs it",
    )


def launch_attention(framework: str | None, gpu: GPUSpec | None, *, fp8: bool) -> LaunchAttention:
    """The attention the launch for ``framework`` runs on ``gpu``; ``sdpa`` with no line for most."""
    if framework == "megatron":
        return megatron_attention(gpu, fp8=fp8)
    return LaunchAttention("sdpa", (), "")
