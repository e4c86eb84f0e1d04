"""Per-GPU memory estimates for data-parallel strategies (DDP, ZeRO-1/2/3, ZeRO-Offload).

Pure arithmetic on a ``ModelSpec`` and a ``HardwareSpec``; nothing here imports torch or
DeepSpeed, so the engineer agent can compare every strategy in microseconds.

Sources, cited again at each term:

- Model states: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", sec. 3.1 and 5 (2Ψ + 2Ψ + KΨ with K = 12 for mixed-precision Adam), and
  DeepSpeed's implementation (``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``),
  whose own estimators ``estimate_zero2_model_states_mem_needs`` and
  ``estimate_zero3_model_states_mem_needs`` the tests compare against.
- Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", eq. 1 (no parallelism) and sec. 4.1 (full recomputation).
- Buffers: DeepSpeed's ZeRO config defaults (``deepspeed/runtime/zero/config.py``) and the
  Hugging Face DeepSpeed guide on ``overlap_comm`` (4.5x the bucket sizes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from tools.errors import InputError
from tools.schemas import (
    HardwareSpec,
    MemoryBreakdown,
    MemoryPlan,
    ModelSpec,
    StrategyEstimate,
    StrategyName,
    Task,
    TrainingBrief,
)

ResolvedPrecision = Literal["bf16", "fp16", "fp32"]

# Preference order for the choice: communication volume and step time grow along it (ZeRO
# paper sec. 7: stages 1-2 move as much data as DDP, stage 3 1.5x; offload adds PCIe traffic).
STRATEGY_ORDER: tuple[StrategyName, ...] = get_args(StrategyName)
OFFLOAD_STRATEGIES: frozenset[str] = frozenset(
    {"zero2_offload_optimizer", "zero3_offload_optimizer", "zero3_offload_all"}
)

# Vendors quote GPU memory in decimal GB ("80GB"); 80e9 bytes is ~7% under the 80 GiB an
# A100-80GB has, which leaves room for what the driver and ECC reserve.
GB = 1_000_000_000

# PyTorch + CUDA 12 context with cuBLAS/NCCL workspaces: measured 0.5-1 GB; we take the middle.
CUDA_CONTEXT_BYTES = 750_000_000
# Caching-allocator fragmentation: PyTorch rarely returns all freed blocks to a usable pool.
FRAGMENTATION_MARGIN = 0.10

# ZeRO-1/2 bucket size we emit: DeepSpeed's default is 5e8 elements, which with overlap_comm
# costs ~9 GB (HF DeepSpeed guide: 5e8 x 2 bytes x 2 x 4.5); 2e8 is the guide's advice.
ZERO12_BUCKET_ELEMENTS = 200_000_000
# HF DeepSpeed guide: "overlap_comm uses 4.5x the allgather_bucket_size and reduce_bucket_size".
OVERLAP_COMM_FACTOR = 4.5
# deepspeed/runtime/engine.py MEMORY_OPT_ALLREDUCE_SIZE: the stage-0 gradient all-reduce bucket.
DDP_ALLREDUCE_BUCKET_ELEMENTS = 500_000_000
# DeepSpeed ZeRO-3 defaults (zero/config.py): sub_group_size and stage3_max_live_parameters.
SUB_GROUP_SIZE = 1_000_000_000
MAX_LIVE_PARAMETERS = 1_000_000_000
# DeepSpeed's estimators' additional_buffer_factor for CPU memory: pinned staging copies
# (e.g. stage_1_and_2.py's param_buffer_of_bit16_for_cpu_offload_groups) and allocator slack.
CPU_BUFFER_FACTOR = 1.5

DEFAULT_LORA_RANK = 16
# Optimizer state bytes per trainable parameter (ZeRO paper sec. 3.1: Adam's momentum and
# variance in fp32; SGD with momentum keeps one fp32 buffer; 8-bit Adam keeps both moments
# block-wise quantized to one byte each, Dettmers et al. 2022, "8-bit Optimizers via Block-wise
# Quantization", whose per-block scales add well under 1%).
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 4, "adam8bit": 2}

MICRO_BATCH_CANDIDATES = (8, 4, 2, 1)


@dataclass(frozen=True)
class ModelStates:
    """Model-state bytes by sub-term: resident on each GPU, and held in CPU memory per rank.

    Keys: ``params`` (working weights, or their ZeRO-3 partition), ``gathered_params`` (ZeRO-3:
    the largest layer gathered for compute), ``grads`` (gradients at the training precision),
    ``gathered_grads`` (ZeRO-3: the largest layer's full gradients before reduce-scatter),
    ``grads_fp32`` (the fp32 gradient copy DeepSpeed's mixed-precision optimizers step on),
    ``master_params`` (fp32 master weights), ``optimizer_moments`` (Adam m and v).
    """

    gpu: dict[str, int] = field(default_factory=dict)
    cpu_per_rank: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ZeroSettings:
    """The ZeRO bucket and threshold sizes (elements) shared by the estimate and the config."""

    reduce_bucket_size: int
    allgather_bucket_size: int
    prefetch_bucket_size: int
    param_persistence_threshold: int
    max_live_parameters: int
    sub_group_size: int


def zero_settings(model: ModelSpec, strategy: StrategyName) -> ZeroSettings:
    """ZeRO bucket sizes for ``model``: what we estimate with and what the DeepSpeed config says."""
    hidden_sq = model.hidden * model.hidden
    if strategy.startswith("zero3"):
        # The Hugging Face integration's "auto" values (transformers/integrations/deepspeed.py):
        # reduce bucket hidden^2, prefetch 0.9 * hidden^2, persistence threshold 10 * hidden.
        return ZeroSettings(
            reduce_bucket_size=hidden_sq,
            allgather_bucket_size=hidden_sq,
            prefetch_bucket_size=int(0.9 * hidden_sq),
            param_persistence_threshold=10 * model.hidden,
            max_live_parameters=MAX_LIVE_PARAMETERS,
            sub_group_size=SUB_GROUP_SIZE,
        )
    # A bucket larger than the model only wastes memory.
    bucket = max(1, min(ZERO12_BUCKET_ELEMENTS, model.params))
    return ZeroSettings(
        reduce_bucket_size=bucket,
        allgather_bucket_size=bucket,
        prefetch_bucket_size=0,
        param_persistence_threshold=0,
        max_live_parameters=0,
        sub_group_size=SUB_GROUP_SIZE,
    )


def resolve_precision(precision: str, hardware: HardwareSpec) -> ResolvedPrecision:
    """Resolve ``auto`` (and CPU-only machines) to the precision training will really use."""
    if hardware.gpu is None:
        # CPU training runs fp32 here: mixed precision on CPU saves little and DeepSpeed's CPU
        # accelerator support for 16-bit optimizers is partial.
        return "fp32"
    if precision == "auto":
        # bf16 where the GPU has bf16 tensor cores (A100/H100-class); V100/T4 only fp16.
        return "bf16" if hardware.gpu.bf16_tflops else "fp16"
    if precision not in ("bf16", "fp16", "fp32"):
        raise InputError(
            "precision", f"unknown precision {precision!r}; use bf16, fp16, fp32 or auto"
        )
    return precision  # type: ignore[return-value]


def lora_adapter_params(model: ModelSpec, rank: int = DEFAULT_LORA_RANK) -> int:
    """Trainable LoRA parameters for rank ``rank`` adapters on q, k, v and o projections.

    Hu et al. 2021 ("LoRA", sec. 4): an adapter on a d_in x d_out weight adds r * (d_in + d_out)
    parameters. k and v project to kv_heads * head_dim under grouped-query attention.
    """
    kv_dim = model.hidden * (model.kv_heads or model.heads) // model.heads
    per_layer = rank * (2 * model.hidden + 2 * (model.hidden + kv_dim) + 2 * model.hidden)
    return model.layers * per_layer


def _check_strategy(strategy: str) -> StrategyName:
    if strategy not in STRATEGY_ORDER:
        raise InputError(
            "strategy", f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGY_ORDER)}"
        )
    return strategy  # type: ignore[return-value]


def model_state_bytes(
    total_params: int,
    trainable_params: int,
    largest_layer_params: int,
    world_size: int,
    strategy: StrategyName,
    *,
    precision: ResolvedPrecision = "bf16",
    optimizer: str = "adamw",
    sub_group_size: int | None = SUB_GROUP_SIZE,
    largest_layer_trainable_params: int | None = None,
) -> ModelStates:
    """Bytes of parameters, gradients and optimizer state per GPU (and per rank on CPU).

    Args:
        total_params: All parameters (Ψ), frozen ones included.
        trainable_params: Parameters that get gradients and optimizer state (Ψ, or the LoRA
            adapters; 0 for inference).
        largest_layer_params: Parameters of the largest single module (ZeRO-3 gathers it whole).
        world_size: Data-parallel ranks (N_d in the ZeRO paper).
        strategy: One of ``STRATEGY_ORDER``.
        precision: ``bf16``/``fp16`` (mixed precision with fp32 master weights) or ``fp32``.
        optimizer: ``adamw``/``adam`` (8 bytes of state per parameter) or ``sgd`` (4).
        sub_group_size: ZeRO-3 converts gradients to fp32 one sub-group of this many elements
            at a time; ``None`` counts the whole partition at once, as DeepSpeed's estimator does.
        largest_layer_trainable_params: Trainable parameters of that largest layer (defaults to
            all of it when training everything, none otherwise).
    """
    strategy = _check_strategy(strategy)
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise InputError(
            "optimizer",
            f"unknown optimizer {optimizer!r}; choose from {sorted(OPTIMIZER_STATE_BYTES)}",
        )
    n = max(1, world_size)
    mixed = precision in ("bf16", "fp16")
    weight_bytes = 2 if mixed else 4
    shard_params = strategy.startswith("zero3")
    shard_grads = strategy.startswith(("zero2", "zero3"))
    shard_optimizer = strategy != "ddp"
    offload_optimizer = strategy in OFFLOAD_STRATEGIES
    offload_params = strategy == "zero3_offload_all"
    trainable = trainable_params
    if largest_layer_trainable_params is None:
        largest_layer_trainable_params = largest_layer_params if trainable >= total_params else 0

    def part(count: int, sharded: bool) -> int:
        # ZeRO pads partitions to equal size, so each rank holds ceil(count / N).
        return math.ceil(count / n) if sharded else count

    gpu: dict[str, int] = {}
    cpu: dict[str, int] = {}
    # ZeRO paper sec. 3.1: 2Ψ for 16-bit weights (4Ψ in fp32); sec. 5.3: stage 3 keeps 1/N_d.
    (cpu if offload_params else gpu)["params"] = weight_bytes * part(total_params, shard_params)
    if shard_params:
        # stage3.py gathers each module's full weights before its forward/backward; the
        # largest one bounds this (DeepSpeed's estimator: 4 * largest_layer_params for 16-bit
        # params plus grads).
        gpu["gathered_params"] = weight_bytes * largest_layer_params
    if trainable:
        # ZeRO paper sec. 3.1: 2Ψ for 16-bit gradients; sec. 5.2: stage 2 keeps 1/N_d.
        grads = weight_bytes * part(trainable, shard_grads)
        if strategy == "zero2_offload_optimizer":
            # stage_1_and_2.py (cpu_offload): reduced buckets are copied straight into the
            # pinned fp32 gradient partition on CPU; no 16-bit partition stays on the GPU.
            grads = 0
        if grads:
            # stage3.py grad_partitions_flat_buffer lives on self.device: CPU when offloading.
            (cpu if strategy.startswith("zero3") and offload_optimizer else gpu)["grads"] = grads
        if shard_params:
            gpu["gathered_grads"] = weight_bytes * largest_layer_trainable_params
        if mixed:
            # DeepSpeed's 16-bit optimizers step on an fp32 copy of the gradients (FP16_/
            # BF16_Optimizer; stage_1_and_2.py single_partition_of_fp32_groups[i].grad;
            # stage3.py _prepare_fp32_grad_for_sub_group, one sub-group at a time). The
            # ZeRO paper's K=12 leaves this out; DeepSpeed's estimators count it (18 = 2+4+12).
            fp32_grads = part(trainable, shard_optimizer)
            if strategy == "zero3" and sub_group_size is not None:
                fp32_grads = min(fp32_grads, sub_group_size)
            (cpu if offload_optimizer else gpu)["grads_fp32"] = 4 * fp32_grads
        # ZeRO paper sec. 3.1, K=12 for mixed-precision Adam: fp32 master weights (4) + momentum
        # and variance (8); sec. 5.1: stage 1 partitions them. In fp32, DDP steps the weights
        # in place, but ZeRO still clones an fp32 partition (stage_1_and_2.py weights_partition,
        # stage3.py fp32_partitioned_groups_flat).
        if mixed or shard_optimizer:
            (cpu if offload_optimizer else gpu)["master_params"] = 4 * part(
                trainable, shard_optimizer
            )
        (cpu if offload_optimizer else gpu)["optimizer_moments"] = OPTIMIZER_STATE_BYTES[
            optimizer
        ] * part(trainable, shard_optimizer)
    return ModelStates(gpu=gpu, cpu_per_rank=cpu)


def activation_bytes(
    model: ModelSpec,
    *,
    seq_len: int,
    micro_batch_size: int,
    precision: ResolvedPrecision,
    activation_checkpointing: bool,
    task: Task = "finetune",
    selective_recompute: bool = False,
) -> int:
    """Activation bytes per GPU for one micro batch (Korthikanti et al. 2022, eq. 1).

    Per transformer layer without recomputation: s*b*h*(34 + 5*a*s/h) bytes at 16-bit (the
    5*a*s/h part is the attention score/softmax/dropout tensors, which FlashAttention-style
    kernels do not store, so this is an upper bound with them). With full activation
    checkpointing (sec. 4.1) each layer keeps only its 16-bit input, 2*s*b*h bytes, plus one
    layer's full activations while it is recomputed. fp32 doubles the 16-bit tensors. The
    logits add s*b*V at the working precision plus the fp32 copy cross-entropy takes
    (Hugging Face ``ForCausalLMLoss`` upcasts logits with ``.float()``).
    Inference keeps a KV cache (2 * layers * s * b * kv_dim) instead of training activations.
    Selective recomputation (sec. 5, Table 2) recomputes only the attention core, so a layer
    keeps 34*s*b*h bytes; memory-efficient attention kernels store about the same.
    """
    s, b, h, a = seq_len, micro_batch_size, model.hidden, model.heads
    scale = 2 if precision == "fp32" else 1
    act_bytes = 4 if precision == "fp32" else 2
    one_layer = s * b * (34 * h + (0 if selective_recompute else 5 * a * s)) * scale
    if task in ("inference", "agent-app"):
        kv_dim = h * (model.kv_heads or a) // a
        kv_cache = 2 * model.layers * s * b * kv_dim * act_bytes
        # Generation computes logits for the last position only (transformers logits_to_keep).
        return kv_cache + one_layer + b * model.vocab * 4
    if activation_checkpointing:
        kept = model.layers * 2 * s * b * h * scale + one_layer
    else:
        kept = model.layers * one_layer
    logits = s * b * model.vocab * (act_bytes + 4)
    return kept + logits


def _buffer_bytes(
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
    else:
        bucket = int(
            OVERLAP_COMM_FACTOR
            * (settings.reduce_bucket_size + settings.allgather_bucket_size)
            * grad_bytes
        )
        total += bucket
        notes.append(
            f"reduce/allgather buckets {settings.reduce_bucket_size:,} elements each, x4.5 for "
            f"overlap_comm: {bucket / GB:.2f} GB"
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


def estimate_strategy(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    *,
    task: Task = "finetune",
    precision: str = "bf16",
    micro_batch_size: int = 1,
    activation_checkpointing: bool = False,
    optimizer: str = "adamw",
    seq_len: int | None = None,
    lora_rank: int = DEFAULT_LORA_RANK,
    selective_recompute: bool = False,
) -> StrategyEstimate:
    """Estimate per-GPU memory (and CPU memory per node) of one strategy for one micro batch.

    Args:
        model: The architecture, with exact sizes.
        hardware: The target machine or cluster; its world size is the data-parallel degree.
        strategy: ddp, zero1, zero2, zero3, zero2_offload_optimizer, zero3_offload_optimizer or
            zero3_offload_all.
        task: pretrain, finetune, lora (frozen base, rank-``lora_rank`` adapters on q/k/v/o),
            inference or agent-app (both forward only).
        precision: bf16, fp16, fp32 or auto (resolved with the GPU; CPU-only means fp32).
        micro_batch_size: Sequences per GPU per forward pass.
        activation_checkpointing: Whether every transformer layer is recomputed in backward.
        optimizer: adamw, adam, adam8bit or sgd (with momentum).
        seq_len: Tokens per sequence; defaults to ``model.seq_len``.
        lora_rank: Adapter rank for the lora task.
        selective_recompute: Recompute only the attention core (Korthikanti et al. sec. 5).
    """
    strategy = _check_strategy(strategy)
    if micro_batch_size < 1:
        raise InputError("micro_batch_size", "must be at least 1")
    on_gpu = hardware.gpu is not None
    if not on_gpu and strategy in OFFLOAD_STRATEGIES:
        raise InputError("strategy", f"{strategy} offloads GPU memory to CPU and needs a GPU")
    resolved = resolve_precision(precision, hardware)
    world = hardware.world_size
    seq = seq_len or model.seq_len
    training = task in ("pretrain", "finetune", "lora")

    notes: list[str] = []
    if task == "lora":
        adapters = lora_adapter_params(model, lora_rank)
        total_params, trainable = model.params + adapters, adapters
        layer_trainable = adapters // model.layers
        notes.append(f"LoRA rank {lora_rank} on q/k/v/o: {adapters:,} trainable parameters")
    elif training:
        total_params, trainable, layer_trainable = model.params, model.params, None
    else:
        total_params, trainable, layer_trainable = model.params, 0, 0
    states = model_state_bytes(
        total_params,
        trainable,
        model.largest_layer_params,
        world,
        strategy,
        precision=resolved,
        optimizer=optimizer,
        largest_layer_trainable_params=layer_trainable,
    )
    gpu = states.gpu
    params = gpu.get("params", 0) + gpu.get("gathered_params", 0)
    gradients = gpu.get("grads", 0) + gpu.get("gathered_grads", 0) + gpu.get("grads_fp32", 0)
    optimizer_bytes = gpu.get("master_params", 0) + gpu.get("optimizer_moments", 0)
    activations = activation_bytes(
        model,
        seq_len=seq,
        micro_batch_size=micro_batch_size,
        precision=resolved,
        activation_checkpointing=activation_checkpointing,
        task=task,
        selective_recompute=selective_recompute,
    )
    buffers, buffer_notes = _buffer_bytes(
        model, strategy, world_size=world, precision=resolved, on_gpu=on_gpu, training=training
    )
    subtotal = params + gradients + optimizer_bytes + activations + buffers
    margin = int(FRAGMENTATION_MARGIN * subtotal)
    buffers += margin
    total = subtotal + margin
    notes.extend(buffer_notes)
    notes.append(f"fragmentation margin {margin / GB:.2f} GB (10% of the rest), in buffers")

    cpu_per_node = 0
    if states.cpu_per_rank:
        ranks_per_node = max(1, hardware.gpus_per_node)
        cpu_per_node = int(sum(states.cpu_per_rank.values()) * ranks_per_node * CPU_BUFFER_FACTOR)
        notes.append(
            f"CPU per node {cpu_per_node / GB:.1f} GB: offloaded states of {ranks_per_node} ranks "
            "x1.5 (DeepSpeed's additional_buffer_factor for pinned buffers)"
        )

    capacity = capacity_bytes(hardware)
    fits = capacity is None or total <= capacity
    if capacity is None:
        notes.append("memory capacity unknown: fit not checked")
    if cpu_per_node and hardware.ram_gb is not None and cpu_per_node > hardware.ram_gb * GB:
        fits = False
        notes.append(
            f"needs {cpu_per_node / GB:.0f} GB CPU RAM per node, node has {hardware.ram_gb:g} GB"
        )
    elif cpu_per_node and hardware.ram_gb is None:
        notes.append(f"node RAM unknown: offload needs {cpu_per_node / GB:.0f} GB per node")
    if strategy != "ddp" and world == 1:
        notes.append("world size 1: ZeRO has nothing to partition across")
    return StrategyEstimate(
        name=strategy,
        per_gpu_bytes=MemoryBreakdown(
            params=params,
            gradients=gradients,
            optimizer=optimizer_bytes,
            activations=activations,
            buffers=buffers,
            total=total,
        ),
        cpu_bytes_per_node=cpu_per_node,
        fits=fits,
        micro_batch_size=micro_batch_size,
        notes=notes,
    )


def _micro_batch_candidates(per_rank_batch: int, requested: int | None) -> list[int]:
    if requested is not None:
        if requested < 1 or per_rank_batch % requested:
            raise InputError(
                "micro_batch_size",
                f"{requested} must divide the per-GPU batch of {per_rank_batch} sequences",
            )
        return [requested]
    return [m for m in MICRO_BATCH_CANDIDATES if per_rank_batch % m == 0]


def plan_memory(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    *,
    micro_batch_size: int | None = None,
    activation_checkpointing: bool | None = None,
    strategies: list[str] | None = None,
) -> MemoryPlan:
    """Estimate every strategy and choose the simplest that fits, with micro batch and accumulation.

    Args:
        model: The architecture, with exact sizes.
        hardware: The target machine or cluster.
        brief: The training brief (task, seq_len, global_batch_size, precision).
        micro_batch_size: Force this micro batch instead of searching 8, 4, 2, 1.
        activation_checkpointing: Force checkpointing on or off instead of trying off first.
        strategies: Only consider these strategies (names as in ``STRATEGY_ORDER``).
    """
    world = hardware.world_size
    global_batch = brief.global_batch_size
    if global_batch % world:
        lower = max(world, global_batch // world * world)
        raise InputError(
            "global_batch_size",
            f"{global_batch} sequences per step must be a multiple of the data-parallel world "
            f"size {world} (nodes x GPUs per node); try {lower} or {lower + world}",
        )
    per_rank = global_batch // world
    micro_candidates = _micro_batch_candidates(per_rank, micro_batch_size)
    precision = resolve_precision(brief.precision, hardware)

    names = [_check_strategy(s) for s in strategies] if strategies else list(STRATEGY_ORDER)
    names = sorted(set(names), key=STRATEGY_ORDER.index)
    assumptions: list[str] = []
    if hardware.gpu is None:
        skipped = [s for s in names if s in OFFLOAD_STRATEGIES]
        names = [s for s in names if s not in OFFLOAD_STRATEGIES]
        if skipped:
            assumptions.append("CPU-only machine: offload strategies do not apply")
        if not names:
            raise InputError("strategies", "offload strategies need a GPU; this machine has none")

    def estimate(name: StrategyName, micro: int, ckpt: bool) -> StrategyEstimate:
        return estimate_strategy(
            model,
            hardware,
            name,
            task=brief.task,
            precision=precision,
            micro_batch_size=micro,
            activation_checkpointing=ckpt,
            seq_len=brief.seq_len,
        )

    def best_micro(name: StrategyName, ckpt: bool) -> StrategyEstimate:
        for micro in micro_candidates:
            est = estimate(name, micro, ckpt)
            if est.fits:
                return est
        return est  # the smallest micro batch, which does not fit either

    # Checkpointing costs ~1/3 more compute (Korthikanti et al. sec. 4.1), so it is the last
    # resort; among strategies the simplest wins, then the largest micro batch it allows.
    ckpt_options = (
        [activation_checkpointing] if activation_checkpointing is not None else [False, True]
    )
    chosen: StrategyEstimate | None = None
    ckpt = ckpt_options[-1]
    for option in ckpt_options:
        for name in names:
            est = best_micro(name, option)
            if est.fits:
                chosen, ckpt = est, option
                break
        if chosen is not None:
            break

    estimates = [best_micro(name, ckpt) for name in names]
    if chosen is None:
        chosen = min(estimates, key=lambda e: e.per_gpu_bytes.total)
        assumptions.append(
            f"nothing fits: {chosen.name} has the smallest footprint "
            f"({chosen.per_gpu_bytes.total / GB:.1f} GB per device); it does not fit either"
        )
    else:
        chosen = next(e for e in estimates if e.name == chosen.name)

    capacity = capacity_bytes(hardware)
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
    assumptions.extend(
        [
            f"capacity per device: {device}",
            how_precision,
            f"data-parallel world size {world}; seq_len {brief.seq_len}; global batch "
            f"{global_batch} = micro {chosen.micro_batch_size} x accumulation "
            f"{per_rank // chosen.micro_batch_size} x {world}",
            "model states: ZeRO paper (2+2+12 bytes/param for mixed-precision Adam) plus the "
            "fp32 gradient copy DeepSpeed steps on (4 bytes/param, partitioned like the optimizer)",
            "activations: Korthikanti et al. 2022 eq. 1 (stores attention scores; an upper bound "
            "with FlashAttention/SDPA), full checkpointing keeps 2*s*b*h per layer",
            "logits: 16-bit logits plus the fp32 copy cross-entropy makes (s*b*V*(2+4) bytes)",
            f"buffers: ZeRO-1/2 buckets {ZERO12_BUCKET_ELEMENTS:.0e} elements x4.5 with "
            "overlap_comm; ZeRO-3 buckets from hidden size as the HF integration sets them; "
            f"CUDA context {CUDA_CONTEXT_BYTES / GB:.2f} GB; "
            f"fragmentation margin {FRAGMENTATION_MARGIN:.0%} of the total",
            "ZeRO-3 assumes the model is built under deepspeed.zero.Init "
            "(Hugging Face does this for stage 3)",
        ]
    )
    if brief.seq_len > model.seq_len:
        assumptions.append(f"seq_len {brief.seq_len} exceeds the model's {model.seq_len} positions")
    if ckpt and chosen.fits and activation_checkpointing is None:
        assumptions.append("activation checkpointing is needed: nothing fits without it")

    return MemoryPlan(
        strategies=estimates,
        chosen=chosen.name,
        micro_batch_size=chosen.micro_batch_size,
        gradient_accumulation_steps=per_rank // chosen.micro_batch_size,
        activation_checkpointing=ckpt,
        capacity_bytes=capacity,
        assumptions=assumptions,
    )
