"""Per-GPU memory of one training setup: DDP, ZeRO-1/2/3, offload, and tensor/pipeline splits.

Pure arithmetic on a ``ModelSpec`` and a ``HardwareSpec``; nothing here imports torch or
DeepSpeed, so the strategy search compares every setup in microseconds. The terms come from
tools/planning/states.py (model states), activations.py (Korthikanti et al. 2022) and
parallel.py (Megatron-LM splits); this module adds the communication buffers (DeepSpeed's ZeRO
config defaults and the reduce buckets ``stage_1_and_2.py`` allocates), the CUDA context, the
fragmentation margin, CPU RAM for offload, and the liveness rule: activations and gradients are
not counted at full size together (autograd frees saved tensors as backward produces gradients).
It estimates; tools/planning/search.py chooses.
"""

from __future__ import annotations

import math

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, MemoryBreakdown, ModelSpec, StrategyEstimate, Task
from tools.core.strategies import OFFLOAD_STRATEGIES, Recompute, StrategyName, check_strategy
from tools.core.units import GB
from tools.planning.activations import activation_bytes, is_encoder_decoder
from tools.planning.footprint import (
    NF4_BYTES,
    Layout,
    Terms,
    block_params,
    fsdp_states,
    loss_bytes,
    megatron_states,
    native_layer_bytes,
    optimizer_bytes,
    outside_params,
    quantized_share,
)
from tools.planning.host_ranks import ADAM_OPTIMIZERS, host_rank_breakdown
from tools.planning.parallel import check_model_parallel, model_parallel_params
from tools.planning.recipe import Recipe, resolve_recipe
from tools.planning.states import (
    DEFAULT_LORA_RANK,
    OPTIMIZER_STATE_BYTES,
    ModelStates,
    ResolvedPrecision,
    lora_adapter_params,
    model_state_bytes,
    resolve_precision,
    zero_settings,
)

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


def _model_states(
    model: ModelSpec,
    strategy: StrategyName,
    task: Task,
    world: int,
    tp: int,
    pp: int,
    precision: ResolvedPrecision,
    optimizer: str,
    lora_rank: int,
    notes: list[str],
) -> tuple[ModelStates, int]:
    """Model states on the most loaded GPU, and the parameters it holds before ZeRO shards them."""
    params_here, largest_here = model_parallel_params(model, tp, pp)
    share = params_here / model.params if model.params else 1.0
    if tp * pp > 1:
        notes.append(
            f"tensor parallel {tp} x pipeline {pp} x data parallel {world} "
            f"(Megatron-LM, Narayanan et al. 2021): {params_here:,} parameters on the heaviest "
            "stage's GPUs before ZeRO; activations with sequence parallelism"
            + (f" and {pp} micro-batches in flight on the first stage (1F1B)" if pp > 1 else "")
        )
    total_params, trainable, layer_trainable = _trainable(
        model, task, params_here, share, tp, lora_rank, notes
    )
    states = model_state_bytes(
        total_params,
        trainable,
        largest_here,
        world,
        strategy,
        precision=precision,
        optimizer=optimizer,
        largest_layer_trainable_params=layer_trainable,
    )
    return states, params_here


def _trainable(
    model: ModelSpec,
    task: Task,
    params_here: int,
    share: float,
    tp: int,
    lora_rank: int,
    notes: list[str],
) -> tuple[int, int, int | None]:
    """(parameters held, parameters trained, trained parameters of the largest layer) per GPU."""
    if task == "lora":
        adapters = lora_adapter_params(model, lora_rank)
        adapters_here = math.ceil(adapters * share)
        notes.append(
            f"LoRA rank {lora_rank} on q/k/v/o/gate/up/down: {adapters:,} trainable parameters"
        )
        return params_here + adapters_here, adapters_here, adapters // model.layers // tp
    if task in ("pretrain", "finetune"):
        return params_here, params_here, None
    return params_here, 0, 0


def _breakdown(
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
        notes.append(
            f"activations ({together / GB:.2f} GB) and gradients ({terms.gradients / GB:.2f} GB) "
            "are not live together: the peak counts the larger"
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


def _cpu_bytes_per_node(
    hardware: HardwareSpec, cpu_per_rank: dict[str, int], notes: list[str]
) -> int:
    """Offloaded states in host RAM per node (0 without offload).

    DeepSpeed's estimate_zero3_model_states_mem_needs / estimate_zero2_model_states_mem_needs
    CPU figure: the offloaded states of every rank on the node, x1.5.
    """
    if not cpu_per_rank:
        return 0
    ranks_per_node = max(1, hardware.gpus_per_node)
    cpu_per_node = int(sum(cpu_per_rank.values()) * ranks_per_node * CPU_BUFFER_FACTOR)
    notes.append(
        f"CPU per node {cpu_per_node / GB:.1f} GB: offloaded states of {ranks_per_node} ranks "
        "x1.5 (DeepSpeed's additional_buffer_factor for pinned buffers)"
    )
    return cpu_per_node


def _fits_cpu_ram(hardware: HardwareSpec, cpu_per_node: int, notes: list[str]) -> bool:
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


def _recipe_of(
    recipe: Recipe | None,
    *,
    precision: str,
    optimizer: str,
    activation_checkpointing: bool,
    selective_recompute: bool,
    gradient_accumulation_steps: int | None,
    lora_rank: int | None,
    context_parallel: int,
) -> Recipe:
    """The recipe priced: the one given, or DeepSpeed's with the keyword arguments' choices."""
    if recipe is not None:
        return resolve_recipe(recipe)
    policy = "full" if activation_checkpointing else "selective" if selective_recompute else "none"
    return resolve_recipe(
        Recipe(
            framework="deepspeed",
            precision=precision if precision != "auto" else "bf16",
            optimizer=optimizer,
            checkpointing=policy,
            gradient_accumulation_steps=max(1, gradient_accumulation_steps or 1),
            lora_rank=lora_rank,
            context_parallel=context_parallel,
        ),
        assumed=(),
    )


def _recompute_label(recipe: Recipe) -> Recompute:
    """The search's recompute vocabulary (selective-op is a selective policy)."""
    policy = str(recipe.checkpointing)
    if policy.startswith("selective"):
        return "selective"
    return "full" if policy == "full" else "none"


def _deepspeed_terms(
    states: ModelStates, recipe: Recipe, quantized: int, world: int, strategy: str, hidden: int
) -> Terms:
    """tools/planning/states.py's DeepSpeed states, adjusted for the recipe's optimizer."""
    gpu = dict(states.gpu)
    if recipe.precision == "pure-bf16":
        gpu.pop("master_params", None)
        gpu.pop("grads_fp32", None)
    moments = gpu.get("optimizer_moments", 0)
    if moments:
        part = moments / OPTIMIZER_STATE_BYTES["adamw"]  # states.py priced AdamW
        gpu["optimizer_moments"] = int(optimizer_bytes(recipe, part, hidden))
    if quantized:
        shard = world if strategy.startswith("zero3") else 1
        gpu["params"] -= int((2 - NF4_BYTES) * quantized / shard)
    return Terms(
        params=gpu.get("params", 0) + gpu.get("gathered_params", 0),
        gradients=gpu.get("grads", 0) + gpu.get("gathered_grads", 0) + gpu.get("grads_fp32", 0),
        optimizer=gpu.get("master_params", 0) + gpu.get("optimizer_moments", 0),
        # stage_1_and_2.py / stage3.py make the fp32 gradients from the 16-bit partition when
        # the step runs; through accumulation only the 16-bit gradients are kept.
        step_gradients=gpu.get("grads_fp32", 0),
    )


def _terms(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    *,
    task: Task,
    recipe: Recipe,
    resolved: ResolvedPrecision,
    world: int,
    tp: int,
    pp: int,
    seq: int,
    micro_batch_size: int,
    micro_batches: int | None,
    attention: str,
    lora_rank: int,
    notes: list[str],
) -> tuple[Terms, int, list[str]]:
    """The recipe's terms on the most loaded GPU, and the DeepSpeed buckets (with their notes)."""
    cp = recipe.context_parallel
    rank = recipe.lora_rank or lora_rank
    states, params_here = _model_states(
        model, strategy, task, world * cp, tp, pp, resolved, "adamw", rank, notes
    )
    share = params_here / model.params if model.params else 1.0
    trainable = _trainable(model, task, params_here, share, tp, rank, [])
    quantized = int(params_here * quantized_share(model)) if recipe.qlora else 0
    if recipe.framework == "deepspeed":
        terms = _deepspeed_terms(states, recipe, quantized, world * cp, strategy, model.hidden)
    else:
        lay = Layout(
            params_here=trainable[0],
            trainable_here=trainable[1],
            frozen_quantized=quantized,
            block=-(-block_params(model) // tp),
            outside=-(-outside_params(model) // tp),
            shards=world * cp,
            largest=-(-model.largest_layer_params // tp),
            widest=-(-model.hidden * (model.intermediate or 4 * model.hidden) // tp),
            pipeline=pp,
        )
        terms = Terms()
        if recipe.fsdp_like:
            fsdp_states(recipe, strategy, lay, model.hidden, terms)
        else:
            megatron_states(recipe, strategy, lay, model.hidden, terms)
        notes.extend(terms.notes)
    accumulating = (micro_batches or 1) > 1 or pp > 1
    if (
        accumulating
        and task in ("pretrain", "finetune", "lora")
        and not recipe.optimizer_in_backward
    ):
        terms.gradients_persistent = True
    terms.activations, terms.loss, terms.working = _activation_terms(
        model, task, recipe, resolved, tp, pp, seq // cp, micro_batch_size, micro_batches, attention
    )
    if recipe.qlora:
        notes.append(
            f"QLoRA: {quantized:,} base parameters in NF4 ({NF4_BYTES:.3f} bytes each, "
            "Dettmers et al. 2023), embeddings and output layer in 16-bit"
        )
    buffers, buffer_notes = 0, list[str]()
    if recipe.framework == "deepspeed":
        bucket_model = model if tp * pp == 1 else model.model_copy(update={"params": params_here})
        buffers, buffer_notes = _buffer_bytes(
            bucket_model,
            strategy,
            world_size=world,
            precision=resolved,
            on_gpu=False,
            training=task in ("pretrain", "finetune", "lora"),
        )
    return terms, buffers, buffer_notes


def _activation_terms(
    model: ModelSpec,
    task: Task,
    recipe: Recipe,
    resolved: ResolvedPrecision,
    tp: int,
    pp: int,
    seq: int,
    micro: int,
    micro_batches: int | None,
    attention: str,
) -> tuple[int, int, int]:
    """(activations, loss, recompute working set) per GPU for one micro-batch of ``seq`` tokens.

    The Hugging Face path (tools/planning/activations.py) counts its logits in the activations
    and its recompute working set in them too, so it returns 0 for the other two.
    """
    policy = str(recipe.checkpointing)
    native = (
        recipe.framework in ("torchtitan", "torchtune")
        and task != "inference"
        and not is_encoder_decoder(model)  # they train decoder-only models
    )
    if not native or task in ("inference", "agent-app"):
        acts = activation_bytes(
            model,
            seq_len=seq,
            micro_batch_size=micro,
            precision=resolved,
            activation_checkpointing=policy == "full",
            task=task,
            selective_recompute=policy.startswith("selective"),
            tensor_parallel=tp,
            pipeline_parallel=pp,
            micro_batches=micro_batches,
            attention=attention,
            sequence_parallel=bool(recipe.sequence_parallel) or tp == 1,
            loss=str(recipe.loss),
            offload=recipe.activation_offload,
            target_len=recipe.target_len,
        )
        return acts, 0, 0
    tokens = seq * micro
    kept, working = native_layer_bytes(
        model, policy, tp=tp, sp=bool(recipe.sequence_parallel), compiled=recipe.compile
    )
    layers_here = -(-model.layers // pp)
    in_flight = min(pp, micro_batches or pp) if pp > 1 else 1
    if recipe.activation_offload:
        # torchtune OffloadActivations: saved tensors go to pinned host memory as they are
        # made and come back for backward; about two layers' worth stay on the GPU.
        stored = kept * tokens * min(2, layers_here)
    else:
        stored = kept * tokens * layers_here * in_flight
    loss, _how = loss_bytes(
        tokens,
        -(-model.vocab // tp),
        str(recipe.loss),
        hf=False,
        fp32=resolved == "fp32",
        compiled=recipe.compile,
    )
    acts = int(stored + working * tokens)
    if pp > 1:
        # The first stage holds the micro-batches in flight; the last one the loss.
        last = int(kept * tokens * layers_here + working * tokens) + loss
        return max(acts, last), 0, int(working * tokens)
    return acts, loss, int(working * tokens)


def _host_ranks(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    task: Task,
    recipe: Recipe,
    resolved: ResolvedPrecision,
    world: int,
    model_parallel: int,
    terms: Terms,
) -> tuple[MemoryBreakdown, list[str]] | None:
    """The CPU-rank breakdown (gloo, fp32; tools/planning/host_ranks.py), None where unmeasured.

    DeepSpeed's and DDP's host-memory terms replace the GPU model's on CPU ranks for the
    setups they were measured for: data parallel, Adam, fp32, full training.
    """
    if (
        hardware.gpu is not None
        or resolved != "fp32"
        or model_parallel != 1
        or recipe.framework != "deepspeed"
        or recipe.optimizer not in ADAM_OPTIMIZERS
        or task not in ("pretrain", "finetune")
    ):
        return None
    return host_rank_breakdown(
        model, strategy, world, terms.activations, margin_fraction=FRAGMENTATION_MARGIN
    )


def terms_cpu(
    model: ModelSpec,
    strategy: StrategyName,
    task: Task,
    world: int,
    tp: int,
    pp: int,
    resolved: ResolvedPrecision,
    recipe: Recipe,
    lora_rank: int,
) -> dict[str, int]:
    """Offloaded states per rank in host RAM (DeepSpeed's offload strategies)."""
    if strategy not in OFFLOAD_STRATEGIES:
        return {}
    states, _ = _model_states(
        model, strategy, task, world, tp, pp, resolved, "adamw", recipe.lora_rank or lora_rank, []
    )
    return dict(states.cpu_per_rank)


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
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    gradient_accumulation_steps: int | None = None,
    attention: str = "sdpa",
    recipe: Recipe | None = None,
    context_parallel: int = 1,
) -> StrategyEstimate:
    """Estimate per-GPU memory (and CPU memory per node) of one strategy for one micro batch.

    Args:
        model: The architecture, with exact sizes.
        hardware: The target machine or cluster; its world size is the data-parallel degree.
        strategy: ddp, zero1, zero2, zero3, zero2_offload_optimizer, zero3_offload_optimizer or
            zero3_offload_all.
        task: pretrain, finetune, lora (frozen base, rank-``lora_rank`` adapters on every projection),
            inference or agent-app (both forward only).
        precision: bf16, fp16, fp32 or auto (resolved with the GPU; CPU-only means fp32).
        micro_batch_size: Sequences per GPU per forward pass.
        activation_checkpointing: Whether every transformer layer is recomputed in backward.
        optimizer: adamw, adam, adam8bit or sgd (with momentum).
        seq_len: Tokens per sequence; defaults to ``model.seq_len``.
        lora_rank: Adapter rank for the lora task.
        selective_recompute: Recompute only the attention core (Korthikanti et al. sec. 5).
        attention: The attention kernel, ``sdpa`` (default, also FlashAttention) or ``eager``.
        tensor_parallel: Megatron tensor-parallel degree t (with sequence parallelism).
        pipeline_parallel: Pipeline-parallel degree p (1F1B schedule); ZeRO then shards over
            the world / (t x p) data-parallel ranks.
        gradient_accumulation_steps: Micro-batches per optimizer step, which bounds the
            micro-batches a pipeline's first stage holds in flight (p when not given); above 1
            the accumulated gradients live with the next micro-batch's activations.
        recipe: The framework's recipe (tools/planning/recipe.py); it overrides precision,
            optimizer, the recompute flags and the accumulation steps. Default: DeepSpeed with
            the arguments above.
        context_parallel: Ranks each sequence is split over (states shard over them too).
    """
    strategy = check_strategy(strategy)
    if micro_batch_size < 1:
        raise InputError("micro_batch_size", "must be at least 1")
    on_gpu = hardware.gpu is not None
    if not on_gpu and strategy in OFFLOAD_STRATEGIES:
        raise InputError("strategy", f"{strategy} offloads GPU memory to CPU and needs a GPU")
    recipe = _recipe_of(
        recipe,
        precision=precision,
        optimizer=optimizer,
        activation_checkpointing=activation_checkpointing,
        selective_recompute=selective_recompute,
        gradient_accumulation_steps=gradient_accumulation_steps,
        lora_rank=lora_rank if task == "lora" else None,
        context_parallel=context_parallel,
    )
    if recipe.lora_rank and task in ("pretrain", "finetune"):
        task = "lora"
    resolved = resolve_precision(
        "bf16" if recipe.precision in ("pure-bf16", "fp8") else recipe.precision, hardware
    )
    if not on_gpu:
        recipe = resolve_recipe(recipe, precision="fp32")
    tp, pp, cp = tensor_parallel, pipeline_parallel, recipe.context_parallel
    # The data-parallel size.
    world = check_model_parallel(model, hardware, strategy, tp, pp, recipe.framework)
    if cp > 1:
        if world % cp:
            raise InputError("cp", f"context parallel {cp} does not divide {world} ranks")
        world //= cp
    seq = seq_len or model.seq_len
    if seq % cp:
        raise InputError("cp", f"context parallel {cp} does not divide sequence length {seq}")
    micro_batches = gradient_accumulation_steps or (
        recipe.gradient_accumulation_steps if recipe.gradient_accumulation_steps > 1 else None
    )

    notes: list[str] = [f"recipe: {recipe.describe()}"] + [f"assumed {a}" for a in recipe.assumed]
    terms, buffers, buffer_notes = _terms(
        model,
        hardware,
        strategy,
        task=task,
        recipe=recipe,
        resolved=resolved,
        world=world,
        tp=tp,
        pp=pp,
        seq=seq,
        micro_batch_size=micro_batch_size,
        micro_batches=micro_batches,
        attention=attention,
        lora_rank=lora_rank,
        notes=notes,
    )
    breakdown = _breakdown(terms, buffers, on_gpu, world * cp * tp * pp, notes)
    host = _host_ranks(model, hardware, strategy, task, recipe, resolved, world, tp * pp, terms)
    if host is not None:
        breakdown = host[0]
        notes.extend(host[1])
    else:
        notes.extend(buffer_notes)
    notes.append(
        f"allocator slack {breakdown.margin / GB:.2f} GB "
        f"({FRAGMENTATION_MARGIN:.1%} of the allocated peak), in buffers"
    )
    total = breakdown.total

    cpu_per_node = _cpu_bytes_per_node(
        hardware,
        terms_cpu(model, strategy, task, world, tp, pp, resolved, recipe, lora_rank),
        notes,
    )
    capacity = capacity_bytes(hardware)
    fits = capacity is None or total <= capacity
    if capacity is None:
        notes.append("memory capacity unknown: fit not checked")
    if cpu_per_node and not _fits_cpu_ram(hardware, cpu_per_node, notes):
        fits = False
    if strategy != "ddp" and world == 1:
        notes.append("world size 1: ZeRO has nothing to partition across")
    return StrategyEstimate(
        name=strategy,
        per_gpu_bytes=breakdown,
        cpu_bytes_per_node=cpu_per_node,
        fits=fits,
        micro_batch_size=micro_batch_size,
        notes=notes,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        context_parallel=cp,
        data_parallel=world,
        gradient_accumulation_steps=max(1, micro_batches or 1),
        checkpointing=_recompute_label(recipe),
        activation_checkpointing=recipe.checkpointing != "none",
    )
