"""Step time, throughput and MFU for DDP, ZeRO-1/2/3, ZeRO-Offload and tensor/pipeline parallelism.

Data-parallel strategies alone, or under Megatron-style tensor and pipeline parallelism.

Pure arithmetic on a ``ModelSpec`` and a ``HardwareSpec``, like ``tools.planning.memory``: no torch, no
DeepSpeed, microseconds per call. Every number is a model of the run, not a measurement; the
assumptions that drive it (efficiency per GPU class, link speeds, overlap) are tables below and
are repeated in each estimate's ``assumptions``.

Sources, cited again at each formula:

- FLOPs: Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", appendix B
  (6N + 12·L·H·Q·T per token, and the definition of MFU); Korthikanti et al. 2022, sec. 4.1
  (full recomputation re-runs the forward pass).
- Communication: Rajbhandari et al. 2020, "ZeRO", sec. 7 (DDP and stages 1-2 move 2Ψ per GPU,
  stage 3 moves 3Ψ); ring all-reduce = reduce-scatter + all-gather, each (n-1)/n·Ψ per GPU
  (Patarasuk & Yuan 2009); DeepSpeed ``runtime/engine.py`` ``allreduce_gradients`` for when
  each stage communicates under gradient accumulation.
- Overlap: Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
  Training" (VLDB), sec. 3.2.3 (bucketed all-reduce overlapping backward).
- Offload: Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training",
  sec. 4 (what crosses PCIe, and the CPU-side Adam step).
- Tensor and pipeline parallelism: Narayanan et al. 2021, "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", sec. 2.2.1 (1F1B pipeline bubble (p-1)/m of the
  ideal time), sec. 2.3 and Shoeybi et al. 2019 fig. 4 (two all-reduces per layer in forward
  and two in backward), sec. 4.1 (scatter/gather of pipeline messages over t GPUs);
  Korthikanti et al. 2022 sec. 4.2.2 (sequence parallelism moves the same bytes).
"""

from __future__ import annotations

import re

from tools.core.errors import InputError
from tools.core.schemas import (
    Bottleneck,
    GPUSpec,
    HardwareSpec,
    ModelSpec,
    ResolvedPrecision,
    SpeedEstimate,
    StrategyName,
)
from tools.core.strategies import OFFLOAD_STRATEGIES, Recompute, check_recompute, check_strategy
from tools.planning.comm import (
    OVERLAP_FRACTION,
    StepSetup,
    data_parallel_comm,
    offload_cost,
    pipeline_comm,
    step_links,
    tensor_parallel_comm,
)
from tools.planning.parallel import check_model_parallel
from tools.planning.states import resolve_precision
from tools.research.architectures import is_convolutional

# Achieved fraction of dense peak for LLM training, by GPU class: (efficiency, why). The first
# pattern found in the GPU's normalized name picks the class; order matters ("a100" before
# "a10"). These are typical achieved MFU figures, not ceilings.
EFFICIENCY_BY_CLASS: dict[str, tuple[float, str]] = {
    "hopper": (
        0.40,
        "Hopper (H100/H200): Llama 3 reports 38-43% BF16 MFU on H100 (Dubey et al. 2024, "
        "Table 4); well-tuned DeepSpeed/FSDP fine-tunes land near 40%",
    ),
    "blackwell": (
        0.35,
        "Blackwell (B200): higher peak than Hopper with less mature kernels; assumed below "
        "Hopper until published training MFU says otherwise",
    ),
    "ampere_datacenter": (
        0.45,
        "datacenter Ampere (A100/A800/A30): Megatron-LM reaches 52% of peak on A100 "
        "(Narayanan et al. 2021); 45% is common for DeepSpeed/FSDP LLM training",
    ),
    "volta": (
        0.30,
        "Volta (V100): Megatron-LM sustained ~30% of fp16 peak (Shoeybi et al. 2019, "
        "39 TFLOP/s per GPU of 125)",
    ),
    "amd_instinct": (
        0.30,
        "AMD Instinct (MI250X/MI300X): ~32% of peak reported for 1T-parameter training on "
        "Frontier's MI250X (Dash et al. 2023); ROCm kernels trail CUDA's",
    ),
    "workstation": (
        0.30,
        "consumer/workstation and inference parts (RTX 3090/4090, L4, L40S, A10G): power and "
        "clock limits under sustained load, smaller caches and lower memory bandwidth per FLOP",
    ),
    "turing": (
        0.20,
        "T4: a 70 W part that throttles well below its boost-clock peak in training",
    ),
    "unknown": (0.30, "unknown GPU class: a conservative 30% of peak"),
}
_CLASS_PATTERNS: tuple[tuple[str, str], ...] = (
    ("h100", "hopper"),
    ("h200", "hopper"),
    ("h800", "hopper"),
    ("gh200", "hopper"),
    ("b200", "blackwell"),
    ("b100", "blackwell"),
    ("a100", "ampere_datacenter"),
    ("a800", "ampere_datacenter"),
    ("a30", "ampere_datacenter"),
    ("v100", "volta"),
    ("mi2", "amd_instinct"),
    ("mi3", "amd_instinct"),
    ("rtx", "workstation"),
    ("l40", "workstation"),
    ("l4", "workstation"),
    ("a10", "workstation"),
    ("t4", "turing"),
)


def gpu_class(gpu: GPUSpec) -> str:
    """The ``EFFICIENCY_BY_CLASS`` key for ``gpu``, matched on its normalized name."""
    key = re.sub(r"[^a-z0-9]+", "", f"{getattr(gpu, 'id', '')} {gpu.name}".lower())
    for pattern, name in _CLASS_PATTERNS:
        if pattern in key:
            return name
    return "unknown"


def training_flops_per_token(
    model: ModelSpec, seq_len: int, *, activation_checkpointing: bool
) -> float:
    """Training FLOPs per token: 6N + 12·L·h·s, or 8N + 16·L·h·s with full recomputation.

    PaLM (Chowdhery et al. 2022), appendix B: a forward pass costs 2N per token for the
    matmuls with the weights plus 4·L·h·s for attention scores and their product with values
    (causal masking not discounted); backward costs twice the forward. N is the parameters a
    token passes through: ``active_params`` for a mixture of experts. Full activation
    checkpointing re-runs each layer's forward in backward (Korthikanti et al. 2022 sec. 4.1),
    one more 2N + 4·L·h·s.
    """
    n = model.active_params or model.params
    # A convolutional network has no attention scores: its cost is the weights' 2N per position.
    attention = 0 if is_convolutional(model.hf_config or {}) else 4 * model.layers * model.hidden
    forward = 2 * n + attention * seq_len
    return float((4 if activation_checkpointing else 3) * forward)


def _peak_tflops(gpu: GPUSpec, precision: ResolvedPrecision, notes: list[str]) -> float | None:
    """Dense peak for the precision from the catalog; fp32 where the part lacks that mode."""
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


def _compute(setup: StepSetup, flops: float) -> tuple[float | None, float | None, float | None]:
    """(peak TFLOP/s, achieved fraction, compute seconds per step) on one GPU.

    Time = FLOPs / (peak x achieved fraction); each GPU computes its data-parallel replica's
    tokens split t x p ways.
    """
    gpu = setup.hardware.gpu
    if gpu is None:
        setup.notes.append(
            "no GPU: no peak FLOP/s in the catalog for a CPU, so no step time, tokens/s or MFU"
        )
        return None, None, None
    peak = _peak_tflops(gpu, setup.precision, setup.notes)
    efficiency, why = EFFICIENCY_BY_CLASS[gpu_class(gpu)]
    if peak is None:
        setup.notes.append(f"{gpu.name}: no {setup.precision} peak known, so no step time or MFU")
        return None, efficiency, None
    tokens_per_gpu: float = setup.micro * setup.accumulation * setup.seq
    if setup.tp * setup.pp > 1:
        tokens_per_gpu = tokens_per_gpu / (setup.tp * setup.pp)
    setup.notes.append(
        f"compute at {efficiency:.0%} of {peak:g} TFLOP/s dense {setup.precision} peak: {why}"
    )
    return peak, efficiency, tokens_per_gpu * flops / (peak * 1e12 * efficiency)


def _bottleneck(compute_s: float | None, comm_s: float, offload_s: float) -> Bottleneck:
    """The largest raw time names the bottleneck, before overlap hides any of it."""
    if compute_s is None:
        return "unknown"
    if comm_s > compute_s and comm_s >= offload_s:
        return "communication"
    if offload_s > compute_s and offload_s > comm_s:
        return "offload"
    return "compute"


def _throughput(
    setup: StepSetup,
    step_s: float | None,
    peak: float | None,
    model_flops: float,
    dataset_tokens: float | None,
) -> tuple[float | None, float | None, float | None]:
    """Tokens/s of the whole cluster, MFU, and the time to train on ``dataset_tokens``."""
    if step_s is None or peak is None:
        if dataset_tokens is not None:
            setup.notes.append("time to train unknown: no step time")
        return None, None, None
    tokens_per_s = setup.tokens_per_step / step_s
    # PaLM appendix B: MFU = observed tokens/s x 6N + 12·L·h·s over the cluster's peak.
    mfu = tokens_per_s * model_flops / (setup.hardware.world_size * peak * 1e12)
    time_to_train = None
    if dataset_tokens is not None:
        time_to_train = dataset_tokens / tokens_per_s
        setup.notes.append(
            f"time to train: {dataset_tokens:.3g} tokens / {tokens_per_s:,.0f} tokens/s"
        )
    return tokens_per_s, mfu, time_to_train


def _check_speed_args(
    strategy: str,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    dataset_tokens: float | None,
    hardware: HardwareSpec,
) -> None:
    check_strategy(strategy)
    if micro_batch_size < 1:
        raise InputError("micro_batch_size", "must be at least 1")
    if gradient_accumulation_steps < 1:
        raise InputError("gradient_accumulation_steps", "must be at least 1")
    if dataset_tokens is not None and dataset_tokens <= 0:
        raise InputError("dataset_tokens", "must be positive")
    if hardware.gpu is None and strategy in OFFLOAD_STRATEGIES:
        raise InputError("strategy", f"{strategy} offloads GPU memory to CPU and needs a GPU")


def _flops_notes(setup: StepSetup, flops: float) -> None:
    model = setup.model
    conv = is_convolutional(model.hf_config or {})
    setup.notes += [
        f"FLOPs per token {flops:.3e}: "
        + (
            "6N per FLOPs-equivalent position (a convolutional network has no attention)"
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


def estimate_speed(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    *,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    activation_checkpointing: bool = False,
    precision: str = "bf16",
    dataset_tokens: float | None = None,
    seq_len: int | None = None,
    inter_node_gbs: float | None = None,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    recompute: Recompute | None = None,
    virtual_stages: int = 1,
    context_parallel: int = 1,
    sequence_parallel: bool = True,
    attention: str = "sdpa",
) -> SpeedEstimate:
    """Estimate step time, tokens/s, MFU and the bottleneck of one training setup.

    Args:
        model: The architecture, with exact sizes (``active_params`` for a mixture of experts).
        hardware: The target machine or cluster; every GPU is a data-parallel rank.
        strategy: ddp, zero1, zero2, zero3, zero2_offload_optimizer, zero3_offload_optimizer or
            zero3_offload_all.
        micro_batch_size: Sequences per GPU per forward pass.
        gradient_accumulation_steps: Micro batches per optimizer step.
        activation_checkpointing: Whether every transformer layer is recomputed in backward.
        precision: bf16, fp16, fp32 or auto (CPU-only machines run fp32).
        dataset_tokens: Tokens to train on; gives ``time_to_train_s`` when set.
        seq_len: Tokens per sequence; defaults to ``model.seq_len``.
        inter_node_gbs: Network GB/s per direction per node, overriding the interconnect table
            (e.g. 400 for eight 400 Gb/s NICs per node).
        tensor_parallel: Megatron tensor-parallel degree t (inside a node).
        pipeline_parallel: Pipeline-parallel degree p; ``gradient_accumulation_steps`` is then
            the pipeline's micro-batches per step, m. Data parallel is world / (t x p x c).
        recompute: none, selective or full; None: full when ``activation_checkpointing``.
        virtual_stages: Interleaved pipeline stages per GPU, v (Narayanan et al. 2021 sec. 2.2.2).
        context_parallel: Context-parallel degree c (the sequence split over c GPUs).
        sequence_parallel: Megatron sequence parallelism with tensor parallelism.
        attention: The attention kernel, sdpa (FlashAttention-style) or eager.
    """
    if recompute is None:
        recompute = "full" if activation_checkpointing else "none"
    check_recompute(recompute, "recompute")
    activation_checkpointing = recompute == "full"
    _check_speed_args(
        strategy, micro_batch_size, gradient_accumulation_steps, dataset_tokens, hardware
    )
    setup = StepSetup(
        model=model,
        hardware=hardware,
        strategy=strategy,
        micro=micro_batch_size,
        accumulation=gradient_accumulation_steps,
        checkpointing=activation_checkpointing,
        precision=resolve_precision(precision, hardware),
        seq=seq_len or model.seq_len,
        tp=tensor_parallel,
        pp=pipeline_parallel,
        dp=check_model_parallel(model, hardware, strategy, tensor_parallel, pipeline_parallel),
    )
    flops = training_flops_per_token(
        model, setup.seq, activation_checkpointing=activation_checkpointing
    )
    model_flops = training_flops_per_token(model, setup.seq, activation_checkpointing=False)
    _flops_notes(setup, flops)
    peak, efficiency, compute_s = _compute(setup, flops)
    if inter_node_gbs is None and hardware.nics_per_node and hardware.nic_gbps:
        # The brief's NICs: each node's line rate, Gb/s to GB/s.
        inter_node_gbs = hardware.nics_per_node * hardware.nic_gbps / 8
    links = step_links(setup, inter_node_gbs)
    dp_bytes, dp_s = data_parallel_comm(setup, links, inter_node_gbs)
    tp_bytes, tp_s = tensor_parallel_comm(setup, links)
    pp_bytes, pp_s, bubble_fraction = pipeline_comm(setup, links)
    offload_bytes, offload_s = offload_cost(setup)

    # Step: compute (stretched by the pipeline bubble) + the communication that does not hide
    # behind it + offload.
    bubble_s = (compute_s or 0.0) * bubble_fraction / (1 - bubble_fraction)
    exposed_s = dp_s - OVERLAP_FRACTION * min(dp_s, compute_s or 0.0) + tp_s + pp_s
    comm_s = dp_s + tp_s + pp_s
    if setup.dp > 1:
        setup.notes.append(
            f"overlap: {OVERLAP_FRACTION:.0%} of the communication that could hide behind "
            "compute does (bucketed reduction during backward, Li et al. 2020 sec. 3.2.3; "
            "the post-step all-gather and SM contention keep the rest exposed)"
        )
    step_s = None
    if compute_s is not None:
        step_s = compute_s + bubble_s + exposed_s + offload_s
    tokens_per_s, mfu, time_to_train = _throughput(setup, step_s, peak, model_flops, dataset_tokens)
    return SpeedEstimate(
        strategy=strategy,
        precision=setup.precision,
        seq_len=setup.seq,
        tokens_per_step=setup.tokens_per_step,
        flops_per_token=flops,
        model_flops_per_token=model_flops,
        peak_tflops=peak,
        efficiency=efficiency,
        compute_time_s=compute_s,
        comm_bytes_per_step=dp_bytes + tp_bytes + pp_bytes,
        comm_time_s=comm_s,
        exposed_comm_time_s=exposed_s,
        offload_bytes_per_step=offload_bytes,
        offload_time_s=offload_s,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        data_parallel=setup.dp,
        tp_comm_time_s=tp_s,
        pp_comm_time_s=pp_s,
        bubble_fraction=bubble_fraction,
        bubble_time_s=bubble_s,
        step_time_s=step_s,
        tokens_per_s=tokens_per_s,
        mfu=mfu,
        time_to_train_s=time_to_train,
        bottleneck=_bottleneck(compute_s, comm_s, offload_s),
        assumptions=setup.notes,
    )
