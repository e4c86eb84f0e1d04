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
from tools.core.strategies import OFFLOAD_STRATEGIES, base_strategy, check_strategy
from tools.planning.parallel import check_model_parallel, model_parallel_params
from tools.planning.states import resolve_precision
from tools.research.hardware import CatalogGPU, find_gpu

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

# Inter-node links, GB/s per direction per node: 400/200/100/25 Gb/s divided by 8. We assume
# one NIC per node, shared by its GPUs; DGX/HGX nodes with one NIC per GPU have 8x this (pass
# inter_node_gbs).
INTERCONNECT_GBS: dict[str, float] = {
    "ib400": 50.0,
    "ib200": 25.0,
    "roce100": 12.5,
    "eth25": 3.125,
}
# Multi-node spec without a named network: a middle-of-the-road RDMA fabric.
DEFAULT_INTERCONNECT = "roce100"
# Achieved fraction of link bandwidth for NCCL collectives on large messages: nccl-tests bus
# bandwidth on A100 NVLink is ~230 of 300 GB/s; RDMA fabrics reach 80-90% of line rate; plain
# Ethernet goes through NCCL's socket transport (TCP), which reaches far less.
LINK_EFFICIENCY: dict[str, float] = {
    "nvlink": 0.75,
    "infinity_fabric": 0.75,
    "pcie": 0.70,
    "ib400": 0.85,
    "ib200": 0.85,
    "roce100": 0.80,
    "eth25": 0.60,
}
# A GPU not in the catalog: assume its PCIe Gen4 x16 slot (64 GB/s bidirectional).
DEFAULT_GPU_TO_GPU_GBS = 64.0

# Share of the communication that could hide behind compute and does. DDP and ZeRO bucket
# gradients and reduce them while backward still runs (Li et al. 2020 sec. 3.2.3), and ZeRO-3
# prefetches parameters; but the first bucket waits for the last layer's gradients, ZeRO-1/2's
# parameter all-gather after the optimizer step cannot overlap, and NCCL kernels take SMs from
# compute. Half is the assumption.
OVERLAP_FRACTION = 0.5

# PCIe Gen4 x16: 32 GB/s per direction theoretical, ~25 GB/s achieved with pinned memory; each
# GPU is assumed to have its own x16 link to the host.
PCIE_GBS = 25.0
# DeepSpeed's vectorized CPU Adam (Ren et al. 2021 sec. 4.2): parameters updated per second by
# all cores of one node. An assumption: it scales with cores and memory bandwidth.
CPU_ADAM_PARAMS_PER_S = 1e9


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
    forward = 2 * n + 4 * model.layers * model.hidden * seq_len
    return float((4 if activation_checkpointing else 3) * forward)


def _catalog_gpu(gpu: GPUSpec) -> CatalogGPU | None:
    if isinstance(gpu, CatalogGPU):
        return gpu
    try:
        return find_gpu(gpu.name)
    except InputError:
        return None


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


def _comm_units(base: str, accumulation: int) -> tuple[float, str]:
    """Model-sized collectives per optimizer step (each moves (n-1)/n·Ψ per GPU), and why.

    ZeRO paper sec. 7: all-reduce = reduce-scatter + all-gather = 2Ψ for DDP and stages 1-2;
    stage 3 adds an all-gather of parameters in forward and again in backward, 3Ψ. DeepSpeed's
    ``engine.allreduce_gradients``: DDP and stage 1 reduce only at the accumulation boundary,
    stages 2-3 reduce-scatter in every micro step ("ZeRO stage >= 2 communicates during non
    gradient accumulation boundaries as well"), and stage 3 gathers parameters every micro step.
    """
    if base in ("ddp", "zero1"):
        return 2.0, "gradients reduced once per optimizer step (2Ψ: reduce-scatter + all-gather)"
    if base == "zero2":
        return (
            accumulation + 1.0,
            "ZeRO-2 reduce-scatters gradients every micro step (DeepSpeed engine."
            "allreduce_gradients) and all-gathers updated parameters once per step: "
            f"({accumulation} + 1)Ψ",
        )
    return (
        3.0 * accumulation,
        "ZeRO-3 all-gathers parameters in forward and backward and reduce-scatters gradients "
        f"every micro step: 3Ψ x {accumulation} micro steps",
    )


def estimate_speed(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    *,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    activation_checkpointing: bool,
    precision: str = "bf16",
    dataset_tokens: float | None = None,
    seq_len: int | None = None,
    inter_node_gbs: float | None = None,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
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
            the pipeline's micro-batches per step, m. Data parallel is world / (t x p).
    """
    check_strategy(strategy)
    if micro_batch_size < 1:
        raise InputError("micro_batch_size", "must be at least 1")
    if gradient_accumulation_steps < 1:
        raise InputError("gradient_accumulation_steps", "must be at least 1")
    if dataset_tokens is not None and dataset_tokens <= 0:
        raise InputError("dataset_tokens", "must be positive")
    gpu = hardware.gpu
    if gpu is None and strategy in OFFLOAD_STRATEGIES:
        raise InputError("strategy", f"{strategy} offloads GPU memory to CPU and needs a GPU")

    resolved = resolve_precision(precision, hardware)
    seq = seq_len or model.seq_len
    world = hardware.world_size
    tp, pp = tensor_parallel, pipeline_parallel
    dp = check_model_parallel(model, hardware, strategy, tp, pp)
    accumulation = gradient_accumulation_steps
    # Model FLOPs each GPU does per step: its data-parallel replica's tokens, split t x p ways.
    tokens_per_gpu = micro_batch_size * accumulation * seq / (tp * pp)
    if tp * pp == 1:
        tokens_per_gpu = micro_batch_size * accumulation * seq
    tokens_per_step = micro_batch_size * accumulation * seq * dp
    flops = training_flops_per_token(model, seq, activation_checkpointing=activation_checkpointing)
    model_flops = training_flops_per_token(model, seq, activation_checkpointing=False)
    assumptions = [
        f"FLOPs per token {flops:.3e}: PaLM appendix B, 6N + 12·L·h·s with N = "
        f"{model.active_params or model.params:,}"
        + (
            " active (mixture of experts)"
            if model.active_params and model.active_params != model.params
            else ""
        )
        + (
            "; full activation checkpointing adds one forward: 8N + 16·L·h·s "
            "(MFU still counts 6N + 12·L·h·s)"
            if activation_checkpointing
            else ""
        ),
        f"{tokens_per_step:,} tokens per step = micro {micro_batch_size} x accumulation "
        f"{accumulation} x {dp} {'data-parallel ' if tp * pp > 1 else ''}rank(s) x seq {seq}",
    ]
    if tp * pp > 1:
        assumptions.append(
            f"tensor parallel {tp} x pipeline {pp} x data parallel {dp}: each GPU computes "
            f"1/{tp * pp} of its replica's FLOPs (Narayanan et al. 2021)"
        )

    # Compute.
    peak: float | None = None
    efficiency: float | None = None
    compute_s: float | None = None
    cluster_peak_flops = 0.0
    if gpu is None:
        assumptions.append(
            "no GPU: no peak FLOP/s in the catalog for a CPU, so no step time, tokens/s or MFU"
        )
    else:
        peak = _peak_tflops(gpu, resolved, assumptions)
        cls = gpu_class(gpu)
        efficiency, why = EFFICIENCY_BY_CLASS[cls]
        if peak is None:
            assumptions.append(f"{gpu.name}: no {resolved} peak known, so no step time or MFU")
        else:
            # Time = FLOPs / (peak x achieved fraction), per GPU per step.
            compute_s = tokens_per_gpu * flops / (peak * 1e12 * efficiency)
            cluster_peak_flops = world * peak * 1e12
            assumptions.append(
                f"compute at {efficiency:.0%} of {peak:g} TFLOP/s dense {resolved} peak: {why}"
            )

    # Communication: bytes each GPU sends per step (ring), and the time on the slowest link.
    base = base_strategy(strategy)
    grad_bytes = 4 if resolved == "fp32" else 2
    units, why_units = _comm_units(base, accumulation)
    # All experts' gradients, not only the active ones; under t x p, this GPU's share.
    params_here = model_parallel_params(model, tp, pp)[0]
    model_bytes = params_here * grad_bytes
    comm_bytes = int(units * (dp - 1) / dp * model_bytes)
    comm_s = 0.0
    catalog = _catalog_gpu(gpu) if gpu is not None else None
    link = catalog.link if catalog is not None else "pcie"
    g2g = catalog.gpu_to_gpu_gbs if catalog and catalog.gpu_to_gpu_gbs else None
    # The catalog quotes bidirectional totals; a ring sends and receives at once, so each
    # direction gets half.
    intra_gbs = (g2g or DEFAULT_GPU_TO_GPU_GBS) / 2 * LINK_EFFICIENCY[link]
    network = (hardware.interconnect or "").lower()
    if hardware.nodes > 1 and network != "nvlink" and network not in INTERCONNECT_GBS:
        assumptions.append(
            f"interconnect {'unknown' if not network else repr(network)} between "
            f"{hardware.nodes} nodes: {DEFAULT_INTERCONNECT} assumed"
        )
        network = DEFAULT_INTERCONNECT
    line_gbs = inter_node_gbs or INTERCONNECT_GBS.get(network, 0.0)
    inter_gbs = line_gbs * LINK_EFFICIENCY.get(network, 1.0)
    if world > 1 and g2g is None:
        assumptions.append(
            f"GPU-to-GPU bandwidth unknown: PCIe Gen4 x16 ({DEFAULT_GPU_TO_GPU_GBS:g} GB/s "
            "bidirectional) assumed"
        )
    if dp > 1:
        assumptions.append(
            f"communication {comm_bytes / 1e9:.1f} GB per GPU per step: {why_units}; ring "
            f"collectives send (n-1)/n of the {grad_bytes}-byte model per GPU (ZeRO paper sec. 7)"
            + (
                f", n = {dp} data-parallel ranks holding {params_here:,} parameters"
                if tp * pp > 1
                else ""
            )
        )
        if hardware.nodes == 1 or network == "nvlink":
            # One NVLink/PCIe domain: a flat ring over all ranks.
            comm_s = comm_bytes / (intra_gbs * 1e9)
            assumptions.append(
                f"one {link} domain: {intra_gbs:.0f} GB/s per direction per GPU achieved "
                f"({LINK_EFFICIENCY[link]:.0%} of half the catalog's "
                f"{g2g or DEFAULT_GPU_TO_GPU_GBS:g} GB/s bidirectional)"
            )
        else:
            g = max(1, hardware.gpus_per_node)
            # Megatron orders ranks tensor first, then data: a node holds r replicas of each of
            # its g/r model-parallel shards (r = g for plain data parallelism), and a shard's
            # data-parallel group spans n = dp/r nodes. Hierarchical collectives (NCCL's tree/
            # ring across nodes): the intra-node legs move (r-1)/r of the shard per GPU; the
            # node's NIC carries (n-1)/n of every shard on the node. The NIC is the bottleneck.
            replicas = max(1, min(dp, g // tp))
            shards = max(1, g // replicas)
            spanned = max(1, dp // replicas)
            intra_s = units * (replicas - 1) / replicas * model_bytes / (intra_gbs * 1e9)
            inter_s = units * shards * (spanned - 1) / spanned * model_bytes / (inter_gbs * 1e9)
            comm_s = intra_s + inter_s
            assumptions.append(
                f"{hardware.nodes} nodes over {network}: {line_gbs:g} GB/s per direction per node"
                + (" (given)" if inter_node_gbs else " (one NIC per node, shared by its GPUs)")
                + f" at {LINK_EFFICIENCY[network]:.0%}; hierarchical collectives, "
                f"{inter_s:.2f} s on the network + {intra_s:.2f} s inside nodes"
            )

    # Tensor parallelism (Narayanan et al. 2021 sec. 2.3; Shoeybi et al. 2019 fig. 4): per layer
    # and micro-batch, two all-reduces of the s·b·h activations in forward and two in backward
    # (sequence parallelism swaps each for an all-gather plus a reduce-scatter, the same bytes:
    # Korthikanti et al. 2022 sec. 4.2.2); full recomputation repeats the forward's two. They sit
    # on the critical path, so none of it overlaps. Tensor groups stay inside a node.
    tp_bytes = 0
    tp_s = 0.0
    micro_bytes = micro_batch_size * seq * model.hidden * grad_bytes
    layers_here = model.layers // pp
    if tp > 1:
        per_layer = 6 if activation_checkpointing else 4
        tp_bytes = int(per_layer * layers_here * accumulation * 2 * (tp - 1) / tp * micro_bytes)
        tp_s = tp_bytes / (intra_gbs * 1e9)
        assumptions.append(
            f"tensor parallel: {per_layer} all-reduces of s·b·h per layer per micro-batch "
            f"(2 forward, 2 backward{', 2 recomputed' if activation_checkpointing else ''}) x "
            f"{layers_here} layers x {accumulation} micro-batches, ring 2(t-1)/t: "
            f"{tp_bytes / 1e9:.1f} GB per GPU over {link} at {intra_gbs:.0f} GB/s: "
            f"{tp_s:.2f} s, not overlapped"
        )
    # Pipeline: each stage boundary sends a micro-batch's activations forward and its gradient
    # back, split over the t GPUs of a stage (Narayanan et al. 2021 sec. 4.1 scatter/gather);
    # the 1F1B bubble leaves (p-1)/(m+p-1) of the step idle (sec. 2.2.1: (p-1)/m of the ideal).
    pp_bytes = 0
    pp_s = 0.0
    bubble_fraction = 0.0
    if pp > 1:
        pp_bytes = int(2 * accumulation * micro_bytes / tp)
        crosses_nodes = hardware.nodes > 1 and tp * pp > max(1, hardware.gpus_per_node)
        # Across a node boundary the t GPUs of the boundary stage share the node's NIC.
        pp_gbs = inter_gbs / tp if crosses_nodes and network != "nvlink" else intra_gbs
        pp_s = pp_bytes / (pp_gbs * 1e9)
        bubble_fraction = (pp - 1) / (accumulation + pp - 1)
        assumptions.append(
            f"pipeline: 1F1B bubble (p-1)/(m+p-1) = ({pp}-1)/({accumulation}+{pp}-1) = "
            f"{bubble_fraction:.1%} of the step idle (Narayanan et al. 2021 sec. 2.2.1); "
            f"{pp_bytes / 1e9:.2f} GB of activations and gradients sent per GPU "
            f"{'between nodes' if crosses_nodes else 'inside the node'}: {pp_s:.2f} s"
        )
    comm_bytes += tp_bytes + pp_bytes

    # Offload: PCIe traffic per GPU and the CPU optimizer step (Ren et al. 2021 sec. 4).
    offload_bytes = 0
    offload_s = 0.0
    if strategy in OFFLOAD_STRATEGIES:
        partition = model.params / world
        # Gradients go down once per reduction (every micro step for ZeRO-2/3) and updated
        # 16-bit parameters come back once per step (ZeRO-Offload sec. 4.1: 2Ψ + 2Ψ).
        moved = (accumulation + 1) * partition * grad_bytes
        what = f"gradients x{accumulation} micro steps down, parameters once up"
        if strategy == "zero3_offload_all":
            # Parameters live on CPU: each micro step fetches the partition for forward and
            # again for backward before the all-gather.
            moved += 2 * accumulation * partition * grad_bytes
            what += ", parameters fetched for forward and backward every micro step"
        offload_bytes = int(moved)
        pcie_s = offload_bytes / (PCIE_GBS * 1e9)
        adam_s = model.params / hardware.nodes / CPU_ADAM_PARAMS_PER_S
        offload_s = pcie_s + adam_s
        assumptions.append(
            f"offload: {offload_bytes / 1e9:.1f} GB per GPU over PCIe at {PCIE_GBS:g} GB/s "
            f"(Gen4 x16 achieved) ({what}): {pcie_s:.2f} s; CPU Adam at "
            f"{CPU_ADAM_PARAMS_PER_S:.0e} params/s per node (DeepSpeed CPU Adam, an assumption) "
            f"on {model.params / hardware.nodes:.2e} params: {adam_s:.2f} s; not overlapped"
        )

    # Step: compute (stretched by the pipeline bubble) + the communication that does not hide
    # behind it + offload.
    bubble_s = (compute_s or 0.0) * bubble_fraction / (1 - bubble_fraction)
    exposed_s = comm_s - OVERLAP_FRACTION * min(comm_s, compute_s or 0.0) + tp_s + pp_s
    comm_s += tp_s + pp_s
    if dp > 1:
        assumptions.append(
            f"overlap: {OVERLAP_FRACTION:.0%} of the communication that could hide behind "
            "compute does (bucketed reduction during backward, Li et al. 2020 sec. 3.2.3; "
            "the post-step all-gather and SM contention keep the rest exposed)"
        )
    step_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    time_to_train: float | None = None
    if compute_s is not None:
        step_s = compute_s + bubble_s + exposed_s + offload_s
        tokens_per_s = tokens_per_step / step_s
        # PaLM appendix B: MFU = observed tokens/s x 6N + 12·L·h·s over the cluster's peak.
        mfu = tokens_per_s * model_flops / cluster_peak_flops
        if dataset_tokens is not None:
            time_to_train = dataset_tokens / tokens_per_s
            assumptions.append(
                f"time to train: {dataset_tokens:.3g} tokens / {tokens_per_s:,.0f} tokens/s"
            )
    elif dataset_tokens is not None:
        assumptions.append("time to train unknown: no step time")

    bottleneck: Bottleneck = "unknown"
    if compute_s is not None:
        # The largest raw time names the bottleneck, before overlap hides any of it.
        bottleneck = "compute"
        if comm_s > compute_s and comm_s >= offload_s:
            bottleneck = "communication"
        elif offload_s > compute_s and offload_s > comm_s:
            bottleneck = "offload"

    return SpeedEstimate(
        strategy=strategy,
        precision=resolved,
        seq_len=seq,
        tokens_per_step=tokens_per_step,
        flops_per_token=flops,
        model_flops_per_token=model_flops,
        peak_tflops=peak,
        efficiency=efficiency,
        compute_time_s=compute_s,
        comm_bytes_per_step=comm_bytes,
        comm_time_s=comm_s,
        exposed_comm_time_s=exposed_s,
        offload_bytes_per_step=offload_bytes,
        offload_time_s=offload_s,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        data_parallel=dp,
        tp_comm_time_s=tp_s,
        pp_comm_time_s=pp_s,
        bubble_fraction=bubble_fraction,
        bubble_time_s=bubble_s,
        step_time_s=step_s,
        tokens_per_s=tokens_per_s,
        mfu=mfu,
        time_to_train_s=time_to_train,
        bottleneck=bottleneck,
        assumptions=assumptions,
    )
