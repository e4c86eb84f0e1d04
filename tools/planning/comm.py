"""Communication and offload time of one training step: collectives, pipeline sends, PCIe.

Rajbhandari et al. 2020, "ZeRO", sec. 7 (DDP and stages 1-2 move 2Ψ per GPU, stage 3 3Ψ); ring
all-reduce = reduce-scatter + all-gather, each (n-1)/n·Ψ per GPU (Patarasuk & Yuan 2009);
DeepSpeed ``runtime/engine.py`` ``allreduce_gradients`` for when each stage communicates under
gradient accumulation; Narayanan et al. 2021 and Shoeybi et al. 2019 for tensor and pipeline
parallelism; Ren et al. 2021, "ZeRO-Offload", sec. 4 for what crosses PCIe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tools.core.errors import InputError
from tools.core.schemas import GPUSpec, HardwareSpec, ModelSpec, ResolvedPrecision, StrategyName
from tools.core.strategies import OFFLOAD_STRATEGIES, base_strategy
from tools.planning.parallel import heaviest_stage_layers, params_per_rank, stage_expert_params
from tools.planning.states import head_dim
from tools.research.hardware import CatalogGPU, find_gpu

# Inter-node links, GB/s per direction per NIC: 400/200/100/25 Gb/s divided by 8. How many NICs
# a node has: ``nics_per_node`` (``GPU_NIC_GBPS`` below for datacenter 8-GPU nodes).
INTERCONNECT_GBS: dict[str, float] = {
    "ib400": 50.0,
    "ib200": 25.0,
    "roce100": 12.5,
    "eth25": 3.125,
}
# Multi-node spec without a named network, on a node that is not a datacenter 8-GPU node: a
# middle-of-the-road RDMA fabric, one NIC per node.
DEFAULT_INTERCONNECT = "roce100"
# Datacenter 8-GPU nodes are built with one compute NIC per GPU: DGX A100 eight 200 Gb/s HDR
# InfiniBand ports, DGX H100 / H200 eight 400 Gb/s NDR ports, DGX B200 eight 400 Gb/s ports
# (NVIDIA DGX A100 / H100 / B200 user guides, "network ports"; the HGX reference designs cloud
# providers build on are the same). Gb/s per GPU, by catalog id prefix.
GPU_NIC_GBPS: dict[str, tuple[float, str]] = {
    "A100-40GB": (200.0, "ib200"),
    "A100-80GB": (200.0, "ib200"),
    "H100-80GB": (400.0, "ib400"),
    "H200": (400.0, "ib400"),
    "B200": (400.0, "ib400"),
}
# NICs fast enough to be one per GPU on those nodes; slower networks are one per node.
PER_GPU_NETWORKS = frozenset({"ib200", "ib400"})
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

# Communication that overlaps compute still slows it: NCCL kernels occupy SMs and HBM bandwidth
# while the GEMMs run (Rashidi et al. 2021, "Enabling Compute-Communication Overlap in
# Distributed Deep Learning Training Platforms", sec. 2, measure 10-30%). The step pays this
# share of the overlapped communication time; an assumption set on the calibration split.
CONTENTION = 0.15
# Fixed cost of one collective beyond its bytes (NCCL launch and the ring's or tree's first
# hop): nccl-tests report 10-30 us for small messages inside a node and more across nodes.
COLLECTIVE_S = 20e-6

# PCIe Gen4 x16: 32 GB/s per direction theoretical, ~25 GB/s achieved with pinned memory; each
# GPU is assumed to have its own x16 link to the host.
PCIE_GBS = 25.0
# DeepSpeed's vectorized CPU Adam (Ren et al. 2021 sec. 4.2): parameters updated per second by
# all cores of one node. An assumption: it scales with cores and memory bandwidth.
CPU_ADAM_PARAMS_PER_S = 1e9


def catalog_gpu(gpu: GPUSpec) -> CatalogGPU | None:
    """The catalog entry behind ``gpu`` (its link and bandwidth), or None for an unknown part."""
    if isinstance(gpu, CatalogGPU):
        return gpu
    try:
        return find_gpu(gpu.name)
    except InputError:
        return None


def comm_units(base: str, accumulation: int) -> tuple[float, str]:
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


@dataclass
class StepSetup:
    """One training setup as the speed terms see it; ``notes`` collects the assumptions."""

    model: ModelSpec
    hardware: HardwareSpec
    strategy: StrategyName
    micro: int
    accumulation: int
    checkpointing: bool
    precision: ResolvedPrecision
    seq: int
    tp: int
    pp: int
    dp: int
    recompute: str = "none"
    cp: int = 1
    vpp: int = 1
    sequence_parallel: bool = True
    attention: str = "sdpa"
    # Context parallelism by all-to-all of the attention heads (DeepSpeed-Ulysses, what
    # Megatron-DeepSpeed's ``--ds-sequence-parallel-size`` runs) rather than ring attention
    # (torchtitan's); see ``context_parallel_comm``.
    all_to_all_cp: bool = False
    # Expert parallelism of a mixture of experts (DeepSpeed-MoE; see ``expert_parallel_comm``).
    ep: int = 1
    # fp8 linears (tools/planning/fp8.py), and FSDP2's float8 all-gather of their weights.
    fp8: bool = False
    fp8_all_gather: bool = False
    # fp32 tensors with TF32 tensor-core matmuls and convolutions (tools/planning/flops.py).
    tf32: bool = False
    # An image model's tensor layout: nhwc (channels-last) or nchw (tools/planning/conv_algos.py).
    memory_format: str = "nhwc"
    notes: list[str] = field(default_factory=list)

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient (and per activation element) on the wire."""
        return 4 if self.precision == "fp32" else 2

    @property
    def micro_bytes(self) -> int:
        """One micro-batch's s·b·h activations on this GPU's share of the sequence, in bytes."""
        return self.micro * self.seq // self.cp * self.model.hidden * self.grad_bytes

    @property
    def tokens_per_step(self) -> int:
        """Tokens the whole cluster trains on per optimizer step."""
        return self.micro * self.accumulation * self.seq * self.dp


@dataclass(frozen=True)
class Links:
    """Achieved bandwidths, GB/s per direction: inside a node (per GPU) and per node's network."""

    link: str
    g2g: float | None
    intra_gbs: float
    network: str
    line_gbs: float
    inter_gbs: float


def step_links(setup: StepSetup, inter_node_gbs: float | None) -> Links:
    """The GPU link and the inter-node network, with their achieved rates (LINK_EFFICIENCY).

    The network's rate per node: ``inter_node_gbs`` when given (the brief's NICs), else one NIC
    per GPU on datacenter 8-GPU nodes (``GPU_NIC_GBPS``) at the named network's rate or the
    node type's default, else one NIC per node of the named network (``DEFAULT_INTERCONNECT``
    when none is named).
    """
    hardware, gpu = setup.hardware, setup.hardware.gpu
    catalog = catalog_gpu(gpu) if gpu is not None else None
    link = catalog.link if catalog is not None else "pcie"
    g2g = catalog.gpu_to_gpu_gbs if catalog and catalog.gpu_to_gpu_gbs else None
    # The catalog quotes bidirectional totals; a ring sends and receives at once, so each
    # direction gets half.
    intra_gbs = (g2g or DEFAULT_GPU_TO_GPU_GBS) / 2 * LINK_EFFICIENCY[link]
    network = (hardware.interconnect or "").lower()
    per_gpu = GPU_NIC_GBPS.get(catalog.id) if catalog is not None else None
    eight_gpu_node = per_gpu is not None and hardware.gpus_per_node == 8
    line_gbs = inter_node_gbs or 0.0
    if hardware.nodes > 1 and network != "nvlink" and not inter_node_gbs:
        if eight_gpu_node and per_gpu is not None and network in ("", *PER_GPU_NETWORKS):
            network = network or per_gpu[1]
            gbps = INTERCONNECT_GBS[network] * 8
            line_gbs = INTERCONNECT_GBS[network] * hardware.gpus_per_node
            setup.notes.append(
                f"{hardware.nodes} nodes of 8 {gpu.name if gpu else 'GPUs'}: one {gbps:g} Gb/s "
                f"{network[:2].upper()} NIC per GPU "
                f"({'as named' if hardware.interconnect else 'the DGX/HGX reference design, assumed'}"
                f"; give --interconnect or the brief's nics_per_node / nic_gbps to change it)"
            )
        else:
            if network not in INTERCONNECT_GBS:
                setup.notes.append(
                    f"interconnect {'unknown' if not network else repr(network)} between "
                    f"{hardware.nodes} nodes: {DEFAULT_INTERCONNECT} assumed, one NIC per node"
                )
                network = DEFAULT_INTERCONNECT
            line_gbs = INTERCONNECT_GBS[network]
    if inter_node_gbs and network not in LINK_EFFICIENCY:
        network = (
            "ib400"
            if inter_node_gbs / max(1, hardware.gpus_per_node) >= 25
            else (network or DEFAULT_INTERCONNECT)
        )
    inter_gbs = line_gbs * LINK_EFFICIENCY.get(network, 0.85)
    if hardware.world_size > 1 and g2g is None:
        setup.notes.append(
            f"GPU-to-GPU bandwidth unknown: PCIe Gen4 x16 ({DEFAULT_GPU_TO_GPU_GBS:g} GB/s "
            "bidirectional) assumed"
        )
    return Links(link, g2g, intra_gbs, network, line_gbs, inter_gbs)


def data_parallel_comm(
    setup: StepSetup, links: Links, inter_node_gbs: float | None
) -> tuple[int, float]:
    """Bytes each GPU sends per step for the data-parallel collectives, and their time.

    Ring collectives send (n-1)/n of the model per GPU (ZeRO paper sec. 7). Across nodes,
    Megatron orders ranks tensor first, then data: a node holds r replicas of each of its g/r
    model-parallel shards (r = g for plain data parallelism), and a shard's data-parallel group
    spans n = dp/r nodes. Hierarchical collectives (NCCL's tree/ring across nodes): the
    intra-node legs move (r-1)/r of the shard per GPU; the node's NIC carries (n-1)/n of every
    shard on the node. The NIC is the bottleneck.

    Under e-way expert parallelism a rank's experts reduce over their expert-data-parallel
    group of dp/e ranks only. Megatron-Core orders expert ranks tp-ep-dp
    (megatron/core/parallel_state.py, ``RankGenerator(..., order="tp-cp-ep-dp-pp")`` and the
    expert data-parallel groups from ``expert_decoder_rank_generator.get_ranks("dp")``): an
    expert-parallel group fills a node first, so a node holds g/(t·e) replicas of t·e different
    expert shards, each reduced across the nodes on its own: the node's NICs carry every
    shard, not one reduced copy as for the dense weights.
    """
    hardware, dp, tp = setup.hardware, setup.dp, setup.tp
    units, why_units = comm_units(base_strategy(setup.strategy), setup.accumulation)
    if setup.fp8_all_gather and base_strategy(setup.strategy) == "zero3":
        # torchtitan enable_fsdp_float8_all_gather: the forward and backward gathers move fp8
        # weights (1 byte), the reduce-scatter stays 16-bit: 2 x 1/2 + 1 of the 3 units.
        units *= 2.0 / 3.0
        why_units += "; the two gathers in fp8 (FSDP2 float8 all-gather), so 2Ψ in 16-bit terms"
    # All experts' gradients, not only the active ones; under t x p, this GPU's share.
    # Each rank holds 1/e of its stage's experts: their gradients reduce over its d/e peers only.
    params_here = params_per_rank(setup.model, tp, setup.pp, setup.ep)
    model_bytes = params_here * setup.grad_bytes
    # (bytes, group size, model-parallel width inside a node) of the dense and expert weights.
    parts = [(model_bytes, dp, tp)]
    if setup.ep > 1:
        stage = params_per_rank(setup.model, tp, setup.pp, 1)
        experts = min(stage, stage_expert_params(setup.model, tp, setup.pp)) // setup.ep
        expert_bytes = experts * setup.grad_bytes
        parts = [
            (model_bytes - expert_bytes, dp, tp),
            (expert_bytes, dp // setup.ep, tp * setup.ep),
        ]
    comm_bytes = int(sum(units * (n - 1) / n * b for b, n, _ in parts if n > 1))
    if dp <= 1:
        return comm_bytes, 0.0
    setup.notes.append(
        f"communication {comm_bytes / 1e9:.1f} GB per GPU per step: {why_units}; ring "
        f"collectives send (n-1)/n of the {setup.grad_bytes}-byte model per GPU (ZeRO paper sec. 7)"
        + (
            f", n = {dp} data-parallel ranks holding {params_here:,} parameters"
            if tp * setup.pp > 1
            else ""
        )
    )
    if hardware.nodes == 1 or links.network == "nvlink":
        # One NVLink/PCIe domain: a flat ring over all ranks.
        setup.notes.append(
            f"one {links.link} domain: {links.intra_gbs:.0f} GB/s per direction per GPU achieved "
            f"({LINK_EFFICIENCY[links.link]:.0%} of half the catalog's "
            f"{links.g2g or DEFAULT_GPU_TO_GPU_GBS:g} GB/s bidirectional)"
        )
        latency = _collectives(setup, model_bytes) * COLLECTIVE_S
        return comm_bytes, comm_bytes / (links.intra_gbs * 1e9) + latency
    g = max(1, hardware.gpus_per_node)
    intra_s = inter_s = 0.0
    for part_bytes, group, width in parts:
        replicas = max(1, min(group, g // width))
        shards = max(1, g // replicas)
        spanned = max(1, group // replicas)
        intra_s += units * (replicas - 1) / replicas * part_bytes / (links.intra_gbs * 1e9)
        inter_s += units * shards * (spanned - 1) / spanned * part_bytes / (links.inter_gbs * 1e9)
    if setup.ep > 1 and dp // setup.ep > 1:
        setup.notes.append(
            f"expert weights reduce over {dp // setup.ep} expert-data-parallel rank(s); an "
            f"expert-parallel group of {setup.ep} fills a node first (Megatron-Core's tp-ep-dp "
            "rank order), so each GPU's expert shard crosses the network on its own"
        )
    inter_s += _collectives(setup, model_bytes) * COLLECTIVE_S * (1 + math.log2(hardware.nodes))
    setup.notes.append(
        f"{hardware.nodes} nodes over {links.network}: {links.line_gbs:g} GB/s per direction per node"
        + (" (given)" if inter_node_gbs else "")
        + f" at {LINK_EFFICIENCY[links.network]:.0%}; hierarchical collectives, "
        f"{inter_s:.2f} s on the network + {intra_s:.2f} s inside nodes"
    )
    return comm_bytes, intra_s + inter_s


def _collectives(setup: StepSetup, model_bytes: float) -> float:
    """Data-parallel collectives per step, each paying ``COLLECTIVE_S``.

    ZeRO-3 gathers and reduces layer by layer (3 per layer per micro step); the others reduce
    in buckets (PyTorch DDP's 25 MB default, Li et al. 2020 sec. 3.2.3), every micro step for
    ZeRO-2.
    """
    base = base_strategy(setup.strategy)
    layers = heaviest_stage_layers(setup.model.layers, setup.pp)
    if base == "zero3":
        return 3.0 * layers * setup.accumulation
    buckets = math.ceil(model_bytes / 25e6)
    return buckets * (setup.accumulation if base == "zero2" else 1) + (
        buckets if base in ("zero1", "zero2") else 0
    )


def context_parallel_comm(setup: StepSetup, links: Links) -> tuple[int, float]:
    """Ring-attention exchanges per GPU per step (Liu et al. 2023, "Ring Attention", sec. 3).

    Each layer passes its key and value blocks around the c ranks in forward (c-1 steps of
    2·(s/c)·b·kv_dim values) and keys, values and their gradients in backward (twice that);
    full recomputation repeats the forward's. Context-parallel groups stay inside a node when
    t x c fits one (torchtitan's mesh order puts them next to tensor parallelism).
    """
    cp = setup.cp
    if cp <= 1:
        return 0, 0.0
    if setup.all_to_all_cp:
        return 0, 0.0  # all-to-alls instead: tools/planning/all_to_all.py ulysses_comm
    model = setup.model
    kv_dim = (model.kv_heads or model.heads) * head_dim(model) // setup.tp
    block = 2 * setup.micro * setup.seq // cp * kv_dim * setup.grad_bytes
    passes = 3 + (1 if setup.recompute == "full" else 0)
    layers = heaviest_stage_layers(model.layers, setup.pp)
    cp_bytes = int(passes * (cp - 1) * block * layers * setup.accumulation)
    inside = setup.tp * cp <= max(1, setup.hardware.gpus_per_node)
    gbs = links.intra_gbs if inside or setup.hardware.nodes == 1 else links.inter_gbs / 8
    cp_s = cp_bytes / (gbs * 1e9)
    setup.notes.append(
        f"context parallel {cp}: ring attention sends {cp_bytes / 1e9:.2f} GB of keys and values "
        f"per GPU per step {'inside the node' if inside else 'across nodes'} ({cp_s:.3f} s), "
        "hidden behind the attention it feeds where that is longer"
    )
    return cp_bytes, cp_s


def tensor_parallel_comm(setup: StepSetup, links: Links) -> tuple[int, float]:
    """Tensor-parallel collectives per GPU per step, all on the critical path.

    Narayanan et al. 2021 sec. 2.3; Shoeybi et al. 2019 fig. 4: per layer and micro-batch, two
    all-reduces of the s·b·h activations in forward and two in backward (sequence parallelism
    swaps each for an all-gather plus a reduce-scatter, the same bytes: Korthikanti et al. 2022
    sec. 4.2.2); full recomputation repeats the forward's two. Tensor groups stay inside a node.
    """
    tp = setup.tp
    if tp <= 1:
        return 0, 0.0
    layers_here = heaviest_stage_layers(setup.model.layers, setup.pp)
    per_layer = 6 if setup.checkpointing else 4
    tp_bytes = int(
        per_layer * layers_here * setup.accumulation * 2 * (tp - 1) / tp * setup.micro_bytes
    )
    collectives = per_layer * layers_here * setup.accumulation
    tp_s = tp_bytes / (links.intra_gbs * 1e9) + collectives * COLLECTIVE_S
    setup.notes.append(
        f"tensor parallel: {per_layer} all-reduces of s·b·h per layer per micro-batch "
        f"(2 forward, 2 backward{', 2 recomputed' if setup.checkpointing else ''}) x "
        f"{layers_here} layers x {setup.accumulation} micro-batches, ring 2(t-1)/t: "
        f"{tp_bytes / 1e9:.1f} GB per GPU over {links.link} at {links.intra_gbs:.0f} GB/s: "
        f"{tp_s:.2f} s, not overlapped"
    )
    return tp_bytes, tp_s


def pipeline_comm(setup: StepSetup, links: Links) -> tuple[int, float, float]:
    """Pipeline sends per GPU per step, their time, and the 1F1B bubble's share of the step.

    Each stage boundary sends a micro-batch's activations forward and its gradient back, split
    over the t GPUs of a stage (Narayanan et al. 2021 sec. 4.1 scatter/gather); the 1F1B bubble
    leaves (p-1)/(m+p-1) of the step idle (sec. 2.2.1: (p-1)/m of the ideal).
    """
    pp, tp, hardware = setup.pp, setup.tp, setup.hardware
    if pp <= 1:
        return 0, 0.0, 0.0
    pp_bytes = int(2 * setup.accumulation * setup.micro_bytes / tp)
    crosses_nodes = hardware.nodes > 1 and tp * pp > max(1, hardware.gpus_per_node)
    # Across a node boundary the t GPUs of the boundary stage share the node's NIC.
    pp_gbs = (
        links.inter_gbs / tp if crosses_nodes and links.network != "nvlink" else links.intra_gbs
    )
    pp_s = pp_bytes / (pp_gbs * 1e9)
    v = setup.vpp
    bubble = (pp - 1) / (v * setup.accumulation + pp - 1)
    setup.notes.append(
        f"pipeline: {'interleaved ' if v > 1 else ''}1F1B bubble (p-1)/(v·m+p-1) = ({pp}-1)/"
        f"({v}x{setup.accumulation}+{pp}-1) = {bubble:.1%} of the step idle (Narayanan et al. "
        "2021 sec. 2.2.1-2.2.2); "
        f"{pp_bytes / 1e9:.2f} GB of activations and gradients sent per GPU "
        f"{'between nodes' if crosses_nodes else 'inside the node'}: {pp_s:.2f} s"
    )
    return pp_bytes, pp_s, bubble


def offload_cost(setup: StepSetup) -> tuple[int, float]:
    """PCIe bytes per GPU per step and the time of the CPU-side step (Ren et al. 2021 sec. 4)."""
    if setup.strategy not in OFFLOAD_STRATEGIES:
        return 0, 0.0
    model, hardware, accumulation = setup.model, setup.hardware, setup.accumulation
    partition = model.params / hardware.world_size
    # Gradients go down once per reduction (every micro step for ZeRO-2/3) and updated 16-bit
    # parameters come back once per step (ZeRO-Offload sec. 4.1: 2Ψ + 2Ψ).
    moved = (accumulation + 1) * partition * setup.grad_bytes
    what = f"gradients x{accumulation} micro steps down, parameters once up"
    if setup.strategy == "zero3_offload_all":
        # Parameters live on CPU: each micro step fetches the partition for forward and again
        # for backward before the all-gather.
        moved += 2 * accumulation * partition * setup.grad_bytes
        what += ", parameters fetched for forward and backward every micro step"
    offload_bytes = int(moved)
    pcie_s = offload_bytes / (PCIE_GBS * 1e9)
    adam_s = model.params / hardware.nodes / CPU_ADAM_PARAMS_PER_S
    setup.notes.append(
        f"offload: {offload_bytes / 1e9:.1f} GB per GPU over PCIe at {PCIE_GBS:g} GB/s "
        f"(Gen4 x16 achieved) ({what}): {pcie_s:.2f} s; CPU Adam at "
        f"{CPU_ADAM_PARAMS_PER_S:.0e} params/s per node (DeepSpeed CPU Adam, an assumption) "
        f"on {model.params / hardware.nodes:.2e} params: {adam_s:.2f} s; not overlapped"
    )
    return offload_bytes, pcie_s + adam_s
