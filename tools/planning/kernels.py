"""Time of one GPU kernel from its shape: matmuls, attention, memory-bound work.

The per-operation half of the speed model (``tools.planning.speed`` adds them up per layer).
Pure arithmetic, microseconds per call. A kernel takes the longer of its math time and its
memory time (the roofline, Williams et al. 2009, "Roofline: an insightful visual performance
model", CACM 52(4)), plus a launch cost; matmuls also lose what their output tiles waste on the
last wave of thread blocks (wave quantization: NVIDIA, "Matrix Multiplication Background User's
Guide", sections "Tile Quantization" and "Wave Quantization", docs.nvidia.com/deeplearning/
performance/dl-performance-matrix-multiplication).

The constants are per GPU architecture and come from kernel measurements, cited below; the few
that no vendor states (how close cuBLAS gets to peak on training shapes, FlashAttention's
backward efficiency on each architecture) were set from those publications and then checked
against the calibration split of published training runs (bench/calibration/published.py, rows with
``sha256(row_id) % 4 == 0``); the error on the other rows is in
bench/results/2026-11-30-suite-full.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from tools.core.schemas import GPUSpec


@dataclass(frozen=True)
class KernelFacts:
    """What a GPU architecture's kernels reach, as fractions of the datasheet figures.

    sms: streaming multiprocessors (compute units on AMD), from the architecture whitepaper.
    tile_m, tile_n: the output tile cuBLAS/hipBLASLt uses for large 16-bit GEMMs on this
        architecture (128x256 on Hopper and Blackwell with warp-group MMA, 128x128 before).
    gemm: the share of dense peak a large, well-shaped 16-bit GEMM reaches.
    attention_fwd / attention_bwd: the share of dense peak FlashAttention-style kernels reach
        in the forward and backward pass (head dim 128, causal, long sequences).
    hbm: the share of datasheet memory bandwidth a streaming kernel reaches.
    why: where the numbers come from.
    cudnn_attention: how much faster cuDNN's fused attention (Transformer Engine's
        FusedAttention, the ``cudnn`` kernel) runs than the FlashAttention-2-class kernels the
        ``attention_*`` fractions were fitted on; 1 where it is not faster or not used.
    """

    sms: int
    tile_m: int
    tile_n: int
    gemm: float
    attention_fwd: float
    attention_bwd: float
    hbm: float
    why: str
    cudnn_attention: float = 1.0


# cuDNN 9's fused attention over FlashAttention-2 on H100, bf16, head dim 128, sequences of 4k
# to 16k: 1.59-1.62x forward (causal) and 1.60-1.63x backward (Shah et al. 2024,
# "FlashAttention-3", figs. 5-6: cuDNN 518-539 vs FlashAttention-2 319-335 TFLOP/s forward,
# 499-518 vs 310-322 backward). Taken for the Hopper parts, and for Blackwell (no published
# Blackwell comparison of the two is at hand: an assumption).
CUDNN_OVER_FLASH2 = 1.6


# By GPU class (the first pattern found in the part's normalized name picks it; order matters).
KERNEL_FACTS: dict[str, KernelFacts] = {
    "h100": KernelFacts(
        sms=132,
        tile_m=128,
        tile_n=256,
        gemm=0.625,
        attention_fwd=0.2,
        attention_bwd=0.16,
        hbm=0.85,
        why="H100 SXM5: 132 SMs (NVIDIA H100 whitepaper); GEMMs at 62.5% and attention at 20% "
        "of the 989 TFLOP/s dense peak, fitted on the calibration split of published runs "
        "(bench/calibration/published.py); FlashAttention-2, the kernel PyTorch SDPA and llm-foundry run, "
        "reaches at most about 35% of peak on H100 (Shah et al. 2024, FlashAttention-3, "
        "abstract), backward taken as 0.8x forward",
        cudnn_attention=CUDNN_OVER_FLASH2,
    ),
    "h200": KernelFacts(
        sms=132,
        tile_m=128,
        tile_n=256,
        gemm=0.625,
        attention_fwd=0.2,
        attention_bwd=0.16,
        hbm=0.85,
        why="H200: the H100's GH100 die (132 SMs) with 4.8 TB/s HBM3e (NVIDIA H200 datasheet); "
        "kernel fractions as fitted for H100 (no bf16 H200 row in the calibration split)",
        cudnn_attention=CUDNN_OVER_FLASH2,
    ),
    "b200": KernelFacts(
        sms=148,
        tile_m=128,
        tile_n=256,
        gemm=0.625,
        attention_fwd=0.2,
        attention_bwd=0.16,
        hbm=0.85,
        why="B200: 148 SMs (NVIDIA Blackwell architecture technical brief); kernel fractions "
        "taken from H100's fit (no bf16 B200 row in the calibration split)",
        cudnn_attention=CUDNN_OVER_FLASH2,
    ),
    "a100": KernelFacts(
        sms=108,
        tile_m=128,
        tile_n=128,
        gemm=0.775,
        attention_fwd=0.35,
        attention_bwd=0.28,
        hbm=0.85,
        why="A100: 108 SMs (NVIDIA A100 whitepaper); GEMMs at 77.5% and attention at 35% of the "
        "312 TFLOP/s dense peak, fitted on the calibration split of published runs "
        "(bench/calibration/published.py); FlashAttention-2 reaches 50-73% of peak forward on A100 in its "
        "own benchmark (Dao 2023, FlashAttention-2, abstract), backward taken as 0.8x forward",
    ),
    "v100": KernelFacts(
        sms=80,
        tile_m=128,
        tile_n=128,
        gemm=0.80,
        attention_fwd=0.40,
        attention_bwd=0.30,
        hbm=0.85,
        why="V100: 80 SMs (NVIDIA Volta whitepaper); fp16 GEMMs assumed at 80% of 125 "
        "TFLOP/s; no FlashAttention-2 on Volta, memory-efficient attention kernels are slower",
    ),
    "mi300": KernelFacts(
        sms=304,
        tile_m=256,
        tile_n=256,
        gemm=0.55,
        attention_fwd=0.35,
        attention_bwd=0.25,
        hbm=0.80,
        why="MI300X: 304 compute units (AMD CDNA 3 whitepaper); bf16 GEMMs assumed at 55% of "
        "the dense peak (no published training row to check it against)",
    ),
    "mi250": KernelFacts(
        sms=220,
        tile_m=256,
        tile_n=128,
        gemm=0.55,
        attention_fwd=0.30,
        attention_bwd=0.22,
        hbm=0.80,
        why="MI250X: 220 compute units over two dies (AMD CDNA 2 whitepaper)",
    ),
    "workstation": KernelFacts(
        sms=82,
        tile_m=128,
        tile_n=128,
        gemm=0.70,
        attention_fwd=0.45,
        attention_bwd=0.35,
        hbm=0.85,
        why="consumer and inference parts (RTX 3090/4090, L4, L40S, A10G): boost clocks drop "
        "under sustained load; 82 SMs is an RTX 3090's, the others are scaled by their peak",
    ),
    "t4": KernelFacts(
        sms=40,
        tile_m=128,
        tile_n=128,
        gemm=0.45,
        attention_fwd=0.25,
        attention_bwd=0.20,
        hbm=0.80,
        why="T4: 40 SMs; a 70 W part that throttles far below its boost-clock peak",
    ),
}
_CLASS_PATTERNS: tuple[tuple[str, str], ...] = (
    ("h200", "h200"),
    ("gh200", "h200"),
    ("h100", "h100"),
    ("h800", "h100"),
    ("b200", "b200"),
    ("b100", "b200"),
    ("a100", "a100"),
    ("a800", "a100"),
    ("a30", "a100"),
    ("v100", "v100"),
    ("mi3", "mi300"),
    ("mi2", "mi250"),
    ("t4", "t4"),
)
# Cost of launching one kernel as PyTorch eager issues them (CPU dispatch plus launch): hidden
# behind the GPU while kernels are large, the floor of a layer's time when they are not. A few
# microseconds per op is the usual figure for eager dispatch (the reason CUDA Graphs exist);
# 5 us per kernel is assumed.
LAUNCH_S = 5e-6
# GEMM efficiency falls when the reduction dimension is short: each output tile streams a k-long
# panel, and below a few hundred the prologue and epilogue are not amortized. Modelled as
# k / (k + K_HALF), normalized to 1 at k = 4096; K_HALF is an assumption.
K_HALF = 256


# The key length at which attention kernels reach half their long-sequence efficiency: the
# ``attention_fwd`` / ``attention_bwd`` fractions are for long sequences. Set on the calibration
# split together with them (bench/calibration/fit_kernels.py).
ATTENTION_S_HALF = 1024


def kernel_class(gpu: GPUSpec) -> str:
    """The ``KERNEL_FACTS`` key of ``gpu``, matched on its normalized catalog id and name."""
    key = re.sub(r"[^a-z0-9]+", "", f"{getattr(gpu, 'id', '')} {gpu.name}".lower())
    for pattern, name in _CLASS_PATTERNS:
        if pattern in key:
            return name
    return "workstation"


@dataclass(frozen=True)
class Device:
    """One GPU as the kernel times see it: peak rates already in FLOP/s and bytes/s."""

    facts: KernelFacts
    peak_flops: float
    bandwidth: float
    # ``K_HALF`` in units of this math mode's k: the short-k loss is a fixed time per output
    # tile (prologue, epilogue), so a mode whose mainloop runs each k-step slower than the
    # 16-bit tensor cores ``K_HALF`` was set on loses fewer k to it (peak / 16-bit peak).
    k_scale: float = 1.0

    @classmethod
    def of(cls, gpu: GPUSpec, peak_tflops: float) -> Device:
        """``gpu`` at ``peak_tflops`` (the precision's dense peak from the catalog)."""
        cls_name = kernel_class(gpu)
        facts = KERNEL_FACTS[cls_name]
        tensor_tflops = gpu.bf16_tflops or gpu.fp16_tflops
        if cls_name == "workstation":
            # Scale the RTX 3090's SM count by its 16-bit peak (71), so a wave fills a bigger
            # or smaller part; the part's, not the math mode's (fp32 and TF32 run on all SMs).
            scale = (tensor_tflops or peak_tflops) / 71
            facts = KernelFacts(**{**facts.__dict__, "sms": max(20, round(82 * scale))})
        bandwidth = (gpu.memory_bandwidth_gbs or 900.0) * 1e9 * facts.hbm
        k_scale = min(1.0, peak_tflops / tensor_tflops) if tensor_tflops else 1.0
        return cls(facts, peak_tflops * 1e12, bandwidth, k_scale)


def _tile(size: int, largest: int) -> int:
    """The tile edge for a dimension of ``size``: the power of two covering it, 16 to ``largest``."""
    return min(largest, max(16, 1 << max(0, size - 1).bit_length()))


@lru_cache(maxsize=1 << 16)  # a search asks for the same shapes thousands of times
def matmul_s(device: Device, m: int, n: int, k: int, bytes_per: int = 2) -> float:
    """Seconds for one (m x k) @ (k x n) GEMM: roofline with tile, wave and short-k losses."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    facts = device.facts
    # Skinny shapes get smaller tiles (the libraries' heuristics pick them; down to 16 rows).
    tile_m, tile_n = _tile(m, facts.tile_m), _tile(n, facts.tile_n)
    tiles = math.ceil(m / tile_m) * math.ceil(n / tile_n)
    waves = math.ceil(tiles / facts.sms)
    # Tile quantization: the padded tiles compute too; wave quantization: the last wave runs
    # with idle SMs. Together, the share of the machine's tile slots doing useful work.
    useful = (m * n) / (tiles * tile_m * tile_n) * tiles / (waves * facts.sms)
    # 1 at k = 4096 (where the ``gemm`` plateau is quoted), less below.
    k_half = K_HALF * device.k_scale
    k_factor = min(1.0, k * (4096 + k_half) / (4096 * (k + k_half)))
    flops = 2.0 * m * n * k
    math_s = flops / (device.peak_flops * facts.gemm * useful * k_factor)
    memory_s = bytes_per * (m * k + k * n + m * n) / device.bandwidth
    return max(math_s, memory_s) + LAUNCH_S


@lru_cache(maxsize=1 << 14)
def attention_s(
    device: Device,
    *,
    batch_heads: int,
    q_len: int,
    kv_len: int,
    head_dim: int,
    causal: bool,
    kernel: str,
    backward: bool,
) -> float:
    """Seconds for the attention core (scores, softmax, product with values) of one layer.

    FLOPs: 4·s_q·s_kv·d per head forward (QK^T and PV, 2 FLOPs per multiply-add), half of it
    under a causal mask for kernels that skip masked blocks (FlashAttention: Dao et al. 2022,
    sec. 3.1); backward runs 2.5x the forward's matmuls (Dao 2023, FlashAttention-2, sec. 3.2:
    five matmuls instead of two). ``eager`` materializes the s x s scores in HBM (about 4
    passes of 2 bytes each forward, twice that backward): the score GEMMs take the larger of
    their math at the GEMM rate and their half of the passes, and the softmax kernel between
    them adds the other half. ``cudnn``: cuDNN's fused attention (what Transformer Engine runs
    on Hopper and later) at ``cudnn_attention`` times the FlashAttention-2-class rate.
    """
    facts = device.facts
    flops = 4.0 * batch_heads * q_len * kv_len * head_dim
    if kernel == "eager":
        mem = 8.0 * batch_heads * q_len * kv_len * (2.0 if backward else 1.0)
        math_s = flops * (2.5 if backward else 1.0) / (device.peak_flops * facts.gemm * 0.7)
        # The score GEMMs write and read the scores while they compute (their share of the
        # passes hides behind the math); the softmax between them is a kernel of its own
        # that only moves the scores, so half of the passes add to the time.
        passes_s = mem / device.bandwidth
        return max(math_s, passes_s / 2) + passes_s / 2 + 4 * LAUNCH_S
    if causal:
        flops *= 0.5
    if kernel == "cudnn":
        flops /= facts.cudnn_attention
    # Short sequences do not fill the machine: one thread block per 128 query rows per head.
    blocks = batch_heads * math.ceil(q_len / 128)
    waves = math.ceil(blocks / facts.sms)
    fill = blocks / (waves * facts.sms)
    # And each block's loop over keys is short: the softmax rescaling, the diagonal block of a
    # causal mask and the prologue weigh more (FlashAttention-2's own benchmarks rise with the
    # sequence length at a fixed batch x heads load, Dao 2023 sec. 4.1, fig. 4-7).
    fill *= kv_len / (kv_len + ATTENTION_S_HALF)
    if backward:
        return flops * 2.5 / (device.peak_flops * facts.attention_bwd * fill) + 2 * LAUNCH_S
    return flops / (device.peak_flops * facts.attention_fwd * fill) + LAUNCH_S


def clear_caches() -> None:
    """Forget cached kernel times: after ``KERNEL_FACTS`` or ``ATTENTION_S_HALF`` change (fits)."""
    matmul_s.cache_clear()
    attention_s.cache_clear()


def memory_s(device: Device, bytes_moved: float, kernels: int = 1) -> float:
    """Seconds for memory-bound work moving ``bytes_moved`` through HBM in ``kernels`` launches."""
    return bytes_moved / device.bandwidth + kernels * LAUNCH_S
