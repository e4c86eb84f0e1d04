"""What a GPU holds besides the model states and activations, and the host RAM offload needs.

DeepSpeed's communication buckets (its ZeRO config defaults and the reduce buckets
``stage_1_and_2.py`` allocates), the CUDA context and NCCL's buffers, the caching allocator's
fragmentation margin, the liveness rule that turns the terms into the three peaks (allocated,
reserved, device used), and the offloaded states' share of the node's CPU RAM. Pure arithmetic;
tools/planning/memory.py assembles a setup's estimate from these.
"""

from __future__ import annotations

from tools.core.schemas import HardwareSpec, MemoryBreakdown, ModelSpec
from tools.core.strategies import StrategyName
from tools.core.units import GB
from tools.planning.footprint import Terms
from tools.planning.states import ResolvedPrecision, zero_settings

# GB (decimal, as vendors quote GPU memory) is tools/core/units.py's, re-exported here.

# PyTorch + CUDA 12 context with cuBLAS/NCCL workspaces: measured 0.5-1 GB; we take the middle.
CUDA_CONTEXT_BYTES = 750_000_000
# NCCL's communicator buffers: NCCL_BUFFSIZE 4 MiB (NCCL environment-variable docs) per channel
# and peer for send and receive, up to 32 channels on NVLink systems: 32 x 2 x 4 MiB.
NCCL_BUFFER_BYTES = 32 * 2 * 4 * 2**20
# Caching-allocator fragmentation: PyTorch rarely returns all freed blocks to a usable pool.
FRAGMENTATION_MARGIN = 0.035
# Reduce buffers DeepSpeed's ZeRO-1/2 optimizer allocates with overlap_comm (double buffering).
OVERLAP_BUFFERS = 2
# deepspeed/runtime/engine.py MEMORY_OPT_ALLREDUCE_SIZE: the stage-0 gradient all-reduce bucket.
DDP_ALLREDUCE_BUCKET_ELEMENTS = 500_000_000
# DeepSpeed's estimators' additional_buffer_factor for CPU memory: pinned staging copies
# (e.g. stage_1_and_2.py's param_buffer_of_bit16_for_cpu_offload_groups) and allocator slack.
CPU_BUFFER_FACTOR = 1.5
# Offload must leave this share of the node's RAM to the OS, the page cache, data-loader
# workers and each rank's own process (the same line as the GPU headroom in tools/planning/search.py).
CPU_RAM_HEADROOM = 0.10
# A described cluster ("2x8xH100-80GB") says nothing about host RAM. Assumed: twice the node's
# GPU memory, a common server sizing rule (DGX H100: 2 TB for 640 GB of GPU memory; DGX A100:
# 1-2 TB for 320-640 GB; cloud 8-GPU instances 1.1-2 TB), and at least a 64 GB workstation.
ASSUMED_RAM_PER_GPU_MEMORY = 2.0
MIN_ASSUMED_NODE_RAM_GB = 64.0


def node_ram_bytes(hardware: HardwareSpec) -> tuple[int, str | None]:
    """Host RAM per node, and the assumption behind it when the hardware spec does not say."""
    if hardware.ram_gb is not None:
        return int(hardware.ram_gb * GB), None
    gpu_gb = (hardware.gpu.memory_gb if hardware.gpu else 0.0) * max(1, hardware.gpus_per_node)
    ram_gb = max(MIN_ASSUMED_NODE_RAM_GB, ASSUMED_RAM_PER_GPU_MEMORY * gpu_gb)
    return int(ram_gb * GB), (
        f"node RAM not given: assumed {ram_gb:g} GB ({ASSUMED_RAM_PER_GPU_MEMORY:g}x the node's "
        f"{gpu_gb:g} GB of GPU memory, a common server sizing, at least "
        f"{MIN_ASSUMED_NODE_RAM_GB:g} GB); offload must leave {CPU_RAM_HEADROOM:.0%} of it free"
    )


def buffer_bytes(
    model: ModelSpec,
    strategy: StrategyName,
    *,
    world_size: int,
    precision: ResolvedPrecision,
    on_gpu: bool,
    training: bool,
) -> tuple[int, list[str]]:
    """Communication buckets and the CUDA context, before the fragmentation margin."""
    grad_bytes = 4 if precision == "fp32" else 2
    settings = zero_settings(model, strategy)
    notes: list[str] = []
    total = 0
    if strategy == "ddp":
        if world_size > 1 and training:
            bucket = min(DDP_ALLREDUCE_BUCKET_ELEMENTS, model.params) * grad_bytes
            total += bucket
            notes.append(
                f"all-reduce bucket {bucket / GB:.2f} GB "
                "(DeepSpeed stage 0 buckets of 5e8 elements)"
            )
    elif strategy.startswith("zero3"):
        # Double-buffered reduce bucket with overlap_comm, plus the prefetch bucket.
        reduce = 2 * settings.reduce_bucket_size * grad_bytes if training else 0
        prefetch = settings.prefetch_bucket_size * grad_bytes
        total += reduce + prefetch
        notes.append(
            f"reduce bucket {settings.reduce_bucket_size:,} elements x2 (overlap_comm) and "
            f"prefetch bucket {settings.prefetch_bucket_size:,} elements: "
            f"{(reduce + prefetch) / GB:.2f} GB"
        )
    elif training:
        # DeepSpeed stage_1_and_2.py setup_buckets: a reduce bucket of reduce_bucket_size
        # elements, doubled with overlap_comm, in the gradient-reduction dtype: the fp32
        # accumulator at stage 1, the gradients' 16-bit dtype at stage 2. The all-gather of
        # updated parameters writes into the flat parameter buffer in place (runtime/utils.py
        # all_gather_dp_groups), so allgather_bucket_size adds no memory. (The Hugging Face
        # guide's "4.5x the bucket sizes" for overlap_comm is a rule of thumb; this is the code.)
        reduce_bytes = 4 if strategy.startswith("zero1") else grad_bytes
        bucket = OVERLAP_BUFFERS * settings.reduce_bucket_size * reduce_bytes
        total += bucket
        notes.append(
            f"reduce bucket {settings.reduce_bucket_size:,} elements x{OVERLAP_BUFFERS} "
            f"(overlap_comm) at {reduce_bytes} bytes: {bucket / GB:.2f} GB"
        )
    if on_gpu:
        total += CUDA_CONTEXT_BYTES
        notes.append(f"CUDA context and library workspaces {CUDA_CONTEXT_BYTES / GB:.2f} GB")
    return total, notes


def capacity_bytes(hardware: HardwareSpec) -> int | None:
    """Bytes one rank may use: the GPU's memory, or a CPU rank's share of the node's RAM."""
    if hardware.gpu is not None:
        return int(hardware.gpu.memory_gb * GB)
    if hardware.ram_gb is None:
        return None
    # CPU-only: every rank shares the node's RAM.
    return int(hardware.ram_gb * GB / hardware.world_size)


def breakdown_of(
    terms: Terms, buffers: int, on_gpu: bool, ranks: int, notes: list[str]
) -> MemoryBreakdown:
    """The per-GPU terms and the three peaks: allocated, reserved (allocator slack), device used.

    Activations and gradients do not peak together unless gradients persist across
    micro-batches (``Terms.peak``): autograd frees each saved tensor once its node's backward
    has run, while the gradients it produces appear (PyTorch autograd mechanics, "saved
    tensors"). The caching allocator reserves more than it allocates (``FRAGMENTATION_MARGIN``
    of the allocated peak); the device also holds the CUDA context and NCCL's buffers.
    """
    allocated = terms.peak() + buffers
    together = terms.activations + terms.loss
    if terms.gradients and together and not terms.gradients_persistent:
        resident = terms.resident_gradients
        notes.append(
            f"activations ({together / GB:.2f} GB) and gradients "
            f"({(terms.gradients - resident) / GB:.2f} GB) are not live together: the peak "
            "counts the larger"
            + (
                f"; the 16-bit gradient partition ({resident / GB:.2f} GB, allocated with "
                "the optimizer) lives with both"
                if resident
                else ""
            )
        )
    elif terms.gradients and together:
        notes.append(
            f"gradients ({terms.gradients / GB:.2f} GB) persist across micro-batches and live "
            f"with the activations ({together / GB:.2f} GB)"
        )
    margin = int(FRAGMENTATION_MARGIN * allocated)
    reserved = allocated + margin
    context = 0
    if on_gpu:
        context = CUDA_CONTEXT_BYTES + (NCCL_BUFFER_BYTES if ranks > 1 else 0)
        notes.append(
            f"CUDA context and library workspaces {CUDA_CONTEXT_BYTES / GB:.2f} GB"
            + (f", NCCL buffers {NCCL_BUFFER_BYTES / GB:.2f} GB" if ranks > 1 else "")
        )
    device_used = reserved + context
    activations = terms.activations + terms.loss
    gathered = terms.transient
    return MemoryBreakdown(
        params=terms.params + gathered,
        gradients=terms.gradients,
        optimizer=terms.optimizer,
        activations=activations,
        buffers=buffers + margin + context,
        total=device_used,
        # What the peak does not hold at once: the sum of the terms less the allocated peak.
        not_concurrent=terms.params
        + gathered
        + terms.gradients
        + terms.optimizer
        + activations
        + buffers
        - allocated,
        margin=margin,
        peak_allocated=allocated,
        peak_reserved=reserved,
        device_used=device_used,
    )


def cpu_bytes_per_node(
    hardware: HardwareSpec, cpu_per_rank: dict[str, int], notes: list[str], *, fsdp: bool = False
) -> int:
    """Offloaded states in host RAM per node (0 without offload).

    DeepSpeed: its estimate_zero3_model_states_mem_needs / estimate_zero2_model_states_mem_needs
    CPU figure, the offloaded states of every rank on the node, x1.5. FSDP: the shards
    themselves (pinned in place, no staging buffers), with the optimizer step's temporary
    counted as a term of its own.
    """
    if not cpu_per_rank:
        return 0
    ranks_per_node = max(1, hardware.gpus_per_node)
    factor = 1.0 if fsdp else CPU_BUFFER_FACTOR
    cpu_per_node = int(sum(cpu_per_rank.values()) * ranks_per_node * factor)
    if fsdp:
        parts = ", ".join(f"{k.replace('_', ' ')} {v / GB:.2f}" for k, v in cpu_per_rank.items())
        notes.append(
            f"CPU per node {cpu_per_node / GB:.1f} GB: FSDP CPU offload keeps each of "
            f"{ranks_per_node} ranks' shards in host memory (GB per rank: {parts}; parameters "
            "and gradients in their stored dtype, the optimizer stepping there)"
        )
        return cpu_per_node
    notes.append(
        f"CPU per node {cpu_per_node / GB:.1f} GB: offloaded states of {ranks_per_node} ranks "
        "x1.5 (DeepSpeed's additional_buffer_factor for pinned buffers)"
    )
    return cpu_per_node


def fits_cpu_ram(hardware: HardwareSpec, cpu_per_node: int, notes: list[str]) -> bool:
    """Whether offloaded states leave ``CPU_RAM_HEADROOM`` of the node's RAM free."""
    ram, assumed = node_ram_bytes(hardware)
    if assumed:
        notes.append(assumed)
    if cpu_per_node <= (1 - CPU_RAM_HEADROOM) * ram:
        return True
    notes.append(
        f"does not fit in CPU RAM: offload needs {cpu_per_node / GB:.0f} GB per node, "
        f"more than {1 - CPU_RAM_HEADROOM:.0%} of the node's {ram / GB:g} GB"
        + (" (assumed)" if assumed else "")
    )
    return False
