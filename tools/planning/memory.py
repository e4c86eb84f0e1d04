"""Per-GPU memory of one training setup: DDP, ZeRO-1/2/3, offload, and tensor/pipeline splits.

Pure arithmetic on a ``ModelSpec`` and a ``HardwareSpec``; nothing here imports torch or
DeepSpeed, so the strategy search compares every setup in microseconds. The terms come from
tools/planning/memory_terms.py (model states from states.py and footprint.py, activations from
activations.py, Korthikanti et al. 2022; splits from parallel.py, Megatron-LM); overheads.py adds
the communication buffers (DeepSpeed's ZeRO config defaults and the reduce buckets
``stage_1_and_2.py`` allocates), the CUDA context, the fragmentation margin, CPU RAM for offload,
and the liveness rule: activations and gradients are not counted at full size together (autograd
frees saved tensors as backward produces gradients). It estimates; tools/planning/search.py
chooses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, MemoryBreakdown, ModelSpec, StrategyEstimate, Task
from tools.core.strategies import OFFLOAD_STRATEGIES, Recompute, StrategyName, check_strategy
from tools.core.units import GB
from tools.planning.footprint import Terms
from tools.planning.host_ranks import ADAM_OPTIMIZERS, host_rank_breakdown
from tools.planning.memory_terms import recipe_terms, terms_cpu
from tools.planning.overheads import (
    FRAGMENTATION_MARGIN,
    breakdown_of,
    capacity_bytes,
    cpu_bytes_per_node,
    fits_cpu_ram,
)
from tools.planning.parallel import check_model_parallel, pipeline_split, routed_experts
from tools.planning.recipe import Recipe, resolve_recipe
from tools.planning.states import DEFAULT_LORA_RANK, ResolvedPrecision, resolve_precision

# GB (decimal, as vendors quote GPU memory) is tools/core/units.py's, re-exported here.


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
    expert_parallel: int = 1,
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
        expert_parallel: Ranks a mixture of experts' routed experts are split over, within
            the data-parallel ranks (DeepSpeed-MoE); ZeRO-0 to 2 without offload.
    """
    strategy = check_strategy(strategy)
    _check_request(hardware, strategy, micro_batch_size)
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
    setup = _priced_setup(
        model,
        hardware,
        strategy,
        task,
        recipe,
        tp=tensor_parallel,
        pp=pipeline_parallel,
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        attention=attention,
        lora_rank=lora_rank,
    )
    if expert_parallel > 1:
        _check_experts(setup, expert_parallel)
        setup = replace(setup, ep=expert_parallel)
    return _estimate(setup)


def _check_experts(setup: _Priced, ep: int) -> None:
    """Refuse expert parallelism a model or setup cannot run (naming the field)."""
    experts = routed_experts(setup.model)
    if experts <= 1:
        raise InputError("expert_parallel", f"{setup.model.name} has no routed experts to split")
    if experts % ep or setup.world % ep:
        raise InputError(
            "expert_parallel",
            f"{ep} must divide the {experts} experts and the {setup.world} data-parallel ranks",
        )
    if setup.recipe.framework != "deepspeed":
        raise InputError(
            "expert_parallel",
            f"expert parallelism is priced for DeepSpeed-MoE's ZeRO, not the "
            f"{setup.recipe.framework} recipe",
        )
    if setup.strategy not in ("ddp", "zero1", "zero2"):
        raise InputError(
            "expert_parallel",
            f"expert parallelism runs with ZeRO stage 0 to 2, not {setup.strategy}",
        )


@dataclass(frozen=True)
class _Priced:
    """One setup as the estimate prices it: the request resolved, checked and split."""

    model: ModelSpec
    hardware: HardwareSpec
    strategy: StrategyName
    task: Task
    recipe: Recipe
    resolved: ResolvedPrecision
    world: int  # the data-parallel size, after tensor, pipeline and context parallelism
    tp: int
    pp: int
    cp: int
    seq: int
    micro_batch_size: int
    micro_batches: int | None
    attention: str
    lora_rank: int
    ep: int = 1  # expert parallel, within the data-parallel ranks


def _check_request(hardware: HardwareSpec, strategy: StrategyName, micro_batch_size: int) -> None:
    """Refuse a micro-batch below 1 and offload without a GPU."""
    if micro_batch_size < 1:
        raise InputError("micro_batch_size", "must be at least 1")
    if hardware.gpu is None and strategy in OFFLOAD_STRATEGIES:
        raise InputError("strategy", f"{strategy} offloads GPU memory to CPU and needs a GPU")


def _priced_setup(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    task: Task,
    recipe: Recipe,
    *,
    tp: int,
    pp: int,
    seq_len: int | None,
    micro_batch_size: int,
    gradient_accumulation_steps: int | None,
    attention: str,
    lora_rank: int,
) -> _Priced:
    """The task the recipe trains, its precision on this hardware, and the checked split."""
    if recipe.lora_rank and task in ("pretrain", "finetune"):
        task = "lora"
    resolved = resolve_precision(
        "bf16"
        if recipe.precision in ("pure-bf16", "fp8")
        else "fp32"
        if recipe.precision == "tf32"
        else recipe.precision,
        hardware,
    )
    if hardware.gpu is None:
        recipe = resolve_recipe(recipe, precision="fp32")
    cp = recipe.context_parallel
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
    return _Priced(
        model, hardware, strategy, task, recipe, resolved, world, tp, pp, cp, seq,
        micro_batch_size, micro_batches, attention, lora_rank,
    )  # fmt: skip


def _per_gpu(setup: _Priced, notes: list[str]) -> MemoryBreakdown:
    """The per-GPU breakdown: the recipe's terms, buffers and peaks (CPU ranks: measured terms)."""
    s = setup
    terms, buffers, buffer_notes = recipe_terms(
        s.model,
        s.hardware,
        s.strategy,
        task=s.task,
        recipe=s.recipe,
        resolved=s.resolved,
        world=s.world,
        tp=s.tp,
        pp=s.pp,
        seq=s.seq,
        micro_batch_size=s.micro_batch_size,
        micro_batches=s.micro_batches,
        attention=s.attention,
        lora_rank=s.lora_rank,
        notes=notes,
        expert_parallel=s.ep,
    )
    on_gpu = s.hardware.gpu is not None
    breakdown = breakdown_of(terms, buffers, on_gpu, s.world * s.cp * s.tp * s.pp, notes)
    host = _host_ranks(
        s.model, s.hardware, s.strategy, s.task, s.recipe, s.resolved, s.world, s.tp * s.pp, terms
    )
    if host is not None:
        breakdown = host[0]
        notes.extend(host[1])
    else:
        notes.extend(buffer_notes)
    notes.append(
        f"allocator slack {breakdown.margin / GB:.2f} GB "
        f"({FRAGMENTATION_MARGIN:.1%} of the allocated peak), in buffers"
    )
    return breakdown


def _estimate(setup: _Priced) -> StrategyEstimate:
    """The setup's estimate: per-GPU bytes, host RAM per node, and whether both fit."""
    s = setup
    recipe = s.recipe
    notes: list[str] = [f"recipe: {recipe.describe()}"] + [f"assumed {a}" for a in recipe.assumed]
    breakdown = _per_gpu(s, notes)
    total = breakdown.total

    cpu_per_node = cpu_bytes_per_node(
        s.hardware,
        terms_cpu(
            s.model, s.strategy, s.task, s.world, s.tp, s.pp, s.resolved, recipe, s.lora_rank
        ),
        notes,
        fsdp=recipe.fsdp_like,
    )
    capacity = capacity_bytes(s.hardware)
    fits = capacity is None or total <= capacity
    if capacity is None:
        notes.append("memory capacity unknown: fit not checked")
    if cpu_per_node and not fits_cpu_ram(s.hardware, cpu_per_node, notes):
        fits = False
    if s.strategy != "ddp" and s.world == 1:
        notes.append("world size 1: ZeRO has nothing to partition across")
    return StrategyEstimate(
        name=s.strategy,
        per_gpu_bytes=breakdown,
        cpu_bytes_per_node=cpu_per_node,
        fits=fits,
        micro_batch_size=s.micro_batch_size,
        notes=notes,
        tensor_parallel=s.tp,
        pipeline_parallel=s.pp,
        context_parallel=s.cp,
        stage_layers=list(pipeline_split(s.model.layers, s.pp)),
        expert_parallel=s.ep,
        data_parallel=s.world,
        gradient_accumulation_steps=max(1, s.micro_batches or 1),
        checkpointing=_recompute_label(recipe),
        activation_checkpointing=recipe.checkpointing != "none",
    )
