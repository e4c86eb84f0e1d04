"""Strategy search: the one place a training setup is chosen, from the memory and speed models.

DeepSpeed's autotuner finds a configuration by running it on the target GPUs; this search runs
nothing. It covers the whole space planners such as Alpa, Galvatron and Aceso search, plus the
ZeRO stages and offload: strategy (DDP, ZeRO-1/2/3, the three offload strategies) x tensor
parallel t (1, 2, 4, 8 within a node, dividing the heads and key-value heads) x pipeline
parallel p (dividing the layers; with interleaved virtual stages where the layers split evenly)
x context parallel c (sequences of 16k tokens and more) x micro-batch (the divisors of the
per-rank batch up to 16) x gradient accumulation (what the global batch leaves) x recompute
(none, selective, full). Layouts follow Megatron-LM (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"): t x p x c x d = the
world size, and the global batch divides by the data-parallel degree d.

Memory prunes first (tools/planning/memory.py, cheap): a setup must leave ``MIN_HEADROOM`` of
the GPU free (and, for offload, of the node's CPU RAM); a larger micro-batch never needs less
memory, so a family stops at its first micro-batch that does not fit, and a heavier recompute
policy is only tried at micro-batches the lighter ones could not hold (recomputation only adds
work, Korthikanti et al. 2022 sec. 5). The survivors are ranked by the speed model's tokens/s
(tools/planning/speed.py); ties go to the simpler setup. Offload competes like any other
strategy: it wins when it is the only fit or when it is predicted faster. Every other family
(strategy x t x p x c) gets the reason it lost, with its margin. Without a speed model (a
CPU-only target) or with ``objective="memory"``, the simplest data-parallel strategy that fits
wins, with the largest micro-batch it allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tools.core.errors import InputError
from tools.core.schemas import (
    HardwareSpec,
    MemoryBreakdown,
    MemoryPlan,
    ModelSpec,
    ResolvedPrecision,
    SetupCandidate,
    SpeedEstimate,
    StrategyEstimate,
    StrategyName,
    TrainingBrief,
)
from tools.core.setup import Setup
from tools.core.strategies import (
    MIN_HEADROOM,
    OFFLOAD_STRATEGIES,
    RECOMPUTE_POLICIES,
    SAFE_HEADROOM,
    STRATEGY_ORDER,
    ZERO_STAGE,
    Recompute,
    check_recompute,
    check_strategy,
)
from tools.core.units import gb_text
from tools.planning import alternatives, explain
from tools.planning.batch import resolve_batch
from tools.planning.memory import GB, capacity_bytes, estimate_strategy
from tools.planning.options import Objective, SearchOptions
from tools.planning.parallel import TENSOR_PARALLEL_CANDIDATES, check_model_parallel
from tools.planning.recipe import Recipe, recipe_from_brief, resolve_recipe
from tools.planning.scale_out import MAX_NODES_SUGGESTED, TRAINING_TASKS, smallest_fitting
from tools.planning.speed import estimate_speed
from tools.planning.states import resolve_precision
from tools.research.framework import replicas_fit
from tools.research.splits import (
    runs_on,
    runs_setup,
    setup_framework,
    split_framework,
    torchtitan_flavor,
)

# Nothing pinned: the search over the whole space.
ALL = SearchOptions()
# The memory-only choice tries these micro-batches, largest first.
MICRO_BATCH_CANDIDATES = (8, 4, 2, 1)
# The speed search tries every divisor of the per-rank batch up to this many sequences
# (Megatron-LM's and torchtitan's published recipes run micro-batches of 1-16 sequences).
MAX_MICRO_BATCH = 16
# Context parallelism from this sequence length on (the Llama 3 paper, Dubey et al. 2024 sec.
# 3.3.2, turns it on for long-context training; shorter sequences split over TP/DP instead).
LONG_SEQUENCE = 16_384
# Megatron-Core context parallelism cuts the sequence into 2 x c chunks for load-balanced causal
# attention (its context_parallel docs), so 2 x c must divide the sequence.
CONTEXT_PARALLEL_CANDIDATES = (1, 2, 4, 8)
# Interleaved 1F1B (Narayanan et al. 2021 sec. 2.2.2): v model chunks per GPU; the layers must
# split into p x v whole chunks and Megatron needs the micro-batches per step to divide by p.
VIRTUAL_STAGE_CANDIDATES = (1, 2, 4)
# How many runners-up the plan lists (then the best setup of every other family).
TOP_CANDIDATES = 10
# Strategies a pipeline takes: DeepSpeed's PipelineEngine refuses ZeRO-2/3
# (runtime/pipe/engine.py); Megatron's distributed optimizer is ZeRO-1 (parallel.py).
PIPELINE_STRATEGIES: tuple[StrategyName, ...] = ("ddp", "zero1")
# The layout without model parallelism: every GPU holds the whole model.
DATA_PARALLEL = Setup()


@dataclass
class _Space:
    """What one search ranges over, the inputs every estimate shares, and what it found."""

    model: ModelSpec
    hardware: HardwareSpec
    brief: TrainingBrief
    precision: ResolvedPrecision
    names: list[StrategyName]
    micro: int | None
    ckpts: list[bool]
    notes: list[str]
    # The recompute policies searched, lightest first.
    policies: list[Recompute] = field(default_factory=lambda: list(RECOMPUTE_POLICIES))
    # The speed estimate behind each row's tokens/s, by the row's id.
    speeds: dict[int, SpeedEstimate] = field(default_factory=dict)
    # The (tensor, pipeline) degrees the request pinned; None: searched.
    pinned: tuple[int | None, int | None] = (None, None)
    # The context-parallel degree the caller pinned; None: searched.
    cp_pin: int | None = None
    # The model-parallel layouts searched (t x p x c, as setups of no strategy of their own).
    layouts: list[Setup] = field(default_factory=list)
    # The framework recipe memory is priced for (tools/planning/recipe.py); None: DeepSpeed's.
    recipe: Recipe | None = None

    def dp(self, layout: Setup = DATA_PARALLEL) -> int:
        """Data-parallel ranks of ``layout``: world / (t x p x c)."""
        return max(1, self.hardware.world_size // layout.split)

    def per_rank(self, layout: Setup = DATA_PARALLEL) -> int:
        """Sequences per data-parallel rank per optimizer step."""
        return self.brief.batch // self.dp(layout)

    def micro_options(self, per_rank: int) -> list[int]:
        """The memory-only choice's micro-batches, largest first (or the pinned one)."""
        if self.micro:
            return [self.micro]
        return [m for m in MICRO_BATCH_CANDIDATES if per_rank % m == 0]

    def micro_range(self, per_rank: int) -> list[int]:
        """The speed search's micro-batches, smallest first (or the pinned one)."""
        if self.micro:
            return [self.micro] if per_rank % self.micro == 0 else []
        return [m for m in range(1, min(per_rank, MAX_MICRO_BATCH) + 1) if per_rank % m == 0]

    def estimate(self, name: StrategyName, micro: int, ckpt: bool) -> StrategyEstimate:
        """The memory estimate of one data-parallel setup (full or no recompute)."""
        recompute: Recompute = "full" if ckpt else "none"
        return self.estimate_setup(Setup(name, micro_batch=micro, recompute=recompute))

    def estimate_setup(self, setup: Setup) -> StrategyEstimate:
        """The memory estimate of one setup, recording its recompute policy and layout.

        Context parallelism splits every sequence over c GPUs, so a rank's activations are those
        of seq / c tokens (Megatron-Core context_parallel docs); the model states are sharded by
        ZeRO over the d x c ranks that hold the same weights (Megatron's data-and-context group).
        """
        name, micro, policy, layout = setup.strategy, setup.micro_batch, setup.recompute, setup
        steps = self.per_rank(layout) // micro
        recipe = None
        if self.recipe is not None:
            recipe = replace(
                self.recipe,
                checkpointing=_recipe_policy(self.recipe, policy),
                gradient_accumulation_steps=max(1, steps),
                context_parallel=1,  # the sequence below is already one rank's share
            )
        est = estimate_strategy(
            self.model,
            self.hardware,
            check_strategy(name),
            task=self.brief.task,
            precision=self.precision,
            micro_batch_size=micro,
            activation_checkpointing=policy == "full",
            selective_recompute=policy == "selective",
            seq_len=self.brief.seq_len // layout.cp,
            tensor_parallel=layout.tp,
            pipeline_parallel=layout.pp,
            gradient_accumulation_steps=steps,
            recipe=recipe,
        )
        return est.model_copy(
            update={
                "activation_checkpointing": policy != "none",
                "checkpointing": policy,
                "context_parallel": layout.cp,
                "data_parallel": self.dp(layout),
                "gradient_accumulation_steps": max(1, steps),
            }
        )

    def with_speed(self, est: StrategyEstimate) -> StrategyEstimate:
        """``est`` with the speed model's tokens/s; the estimate itself is kept in ``speeds``."""
        tp, pp, cp = est.tensor_parallel, est.pipeline_parallel, est.context_parallel
        speed = estimate_speed(
            self.model,
            self.hardware,
            est.name,
            micro_batch_size=est.micro_batch_size,
            gradient_accumulation_steps=self.per_rank(est.setup) // est.micro_batch_size,
            activation_checkpointing=est.activation_checkpointing,
            precision=self.precision,
            seq_len=self.brief.seq_len,
            dataset_tokens=self.brief.dataset_tokens,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            recompute=est.checkpointing,
            virtual_stages=est.virtual_stages,
            context_parallel=cp,
        )
        row = est.model_copy(update={"tokens_per_s": speed.tokens_per_s})
        self.speeds[id(row)] = speed
        return row

    def candidate(self, row: StrategyEstimate) -> SetupCandidate:
        """``row`` in the contract's form, with its speed estimate's step time and MFU."""
        layout = row.setup
        per_rank = self.per_rank(layout)
        speed = self.speeds.get(id(row))
        t = row.per_gpu_bytes
        return SetupCandidate(
            strategy=row.name,
            tensor_parallel=layout.tp,
            pipeline_parallel=layout.pp,
            data_parallel=self.dp(layout),
            virtual_stages=row.virtual_stages,
            context_parallel=layout.cp,
            micro_batch_size=row.micro_batch_size,
            gradient_accumulation_steps=max(1, per_rank // row.micro_batch_size),
            checkpointing=row.checkpointing,
            per_gpu_bytes={
                "params": t.params,
                "gradients": t.gradients,
                "optimizer": t.optimizer,
                "activations": t.activations,
                "buffers": t.buffers,
                "total": t.total,
            },
            peak_allocated_bytes=t.peak_allocated,
            peak_reserved_bytes=t.peak_reserved,
            device_used_bytes=t.device_used,
            fits=row.fits and t.total <= (1 - MIN_HEADROOM) * (capacity_bytes(self.hardware) or 0)
            if self.hardware.gpu is not None
            else row.fits,
            step_time_s=speed.step_time_s if speed else None,
            tokens_per_s=speed.tokens_per_s if speed else row.tokens_per_s,
            mfu=speed.mfu if speed else None,
        )


def search_strategy(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    options: SearchOptions = ALL,
    *,
    searched: MemoryPlan | None = None,
) -> MemoryPlan:
    """Choose the fastest setup that fits: strategy, t x p x c, micro-batch and recompute.

    Args:
        model: The architecture, with exact sizes.
        hardware: The target machine or cluster.
        brief: The training brief (task, seq_len, global_batch_size, precision, pins).
        options: What the search may consider (tools/planning/options.py): pinned degrees,
            micro-batch, recompute and strategies, the objective, the recipe memory is priced
            for, and whether the plan's framework replicates the model (then the plan is the
            fastest DDP setup, when replicas fit, with what the fastest setup would gain).
        searched: This search's result without options for the same brief, hardware and
            model, when the caller already holds it (the researcher's): reused, not searched
            again.

    Returns:
        The memory plan: one row per data-parallel strategy and one per strategy with model
        parallelism (its fastest fitting setup, else its smallest), each with a unique label;
        the choice with its degrees; ``setup`` (the chosen setup) and ``candidates`` (the best
        setups first, then the best of every other family); ``why_not`` for every family that
        lost, keyed by its row's label; and, with a GPU, the chosen setup's ``speed`` estimate.
    """
    plain = options.but(replicating=None)
    if searched is not None and plain.searches_everything:
        fastest = searched.model_copy(deep=True)
    else:
        fastest = run_search(model, hardware, brief, plain)
    if options.replicating is not None and options.strategies is None:
        return _replicated(fastest, options.replicating, model, hardware, brief, plain)
    return fastest


def run_search(
    model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief, options: SearchOptions
) -> MemoryPlan:
    """One search over the space ``options`` leave open (the request's pins and wishes kept)."""
    plan = _search_brief(model, hardware, brief, options)
    return _framework_fallback(model, hardware, brief, plan, options)


def _framework_fallback(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    plan: MemoryPlan,
    options: SearchOptions,
) -> MemoryPlan:
    """When no setup the named framework runs fits, the search without that wish, said so.

    The request's refusals still hold; when nothing fits without the wish either, the plan
    keeps it. Megatron runs every split, so a Megatron wish never needs this.
    """
    wished, row = brief.framework, plan.chosen_row
    if wished in (None, "megatron") or row is None or row.fits or hardware.gpu is None:
        return plan
    free = _search_brief(model, hardware, brief.model_copy(update={"framework": None}), options)
    needed, free_row = setup_framework(model, free), free.chosen_row
    if free_row is None or not free_row.fits:
        return plan
    on = f" on {needed}" if needed else ""
    note = (
        f"{wished} was asked for, but no setup it runs fits: its smallest, {row.label}, "
        f"needs {gb_text(row.per_gpu_bytes.total)} per GPU; planned {free_row.label}{on} "
        "instead, which fits"
    )
    return free.model_copy(
        update={
            "assumptions": [note, *free.assumptions],
            "not_honoured": [note, *free.not_honoured],
        }
    )


def _search_brief(
    model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief, options: SearchOptions
) -> MemoryPlan:
    """The search for one brief: its default batch, recipe and pins."""
    brief, batch_note = resolve_batch(brief, model, hardware)
    options = options.but(recipe=options.recipe or recipe_from_brief(brief))
    if brief.pins.stated():
        return pinned_search(model, hardware, brief, batch_note, options)
    space = _space(model, hardware, brief, options)
    if batch_note:
        space.notes.append(batch_note)
    return _search(space, options.objective)


def _replicated(
    fastest: MemoryPlan,
    framework: str,
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    options: SearchOptions,
) -> MemoryPlan:
    """The plan a replicating framework runs: DDP, with what the fastest setup would gain.

    PyTorch DDP, Horovod and TensorFlow's mirrored strategies keep a full replica per GPU and
    implement no ZeRO stage or tensor/pipeline split, so when replicas fit, the plan is the
    fastest DDP setup and says how much faster the search's pick would be on DeepSpeed.
    """
    if not replicas_fit(fastest) or fastest.chosen_setup.family() == Setup("ddp"):
        return fastest
    ddp = options.but(strategies=["ddp"], tensor_parallel=1, pipeline_parallel=1)
    plan = run_search(model, hardware, brief, ddp)
    ours, best = plan.speed, fastest.speed
    if ours and best and ours.tokens_per_s and best.tokens_per_s:
        gain = best.tokens_per_s / ours.tokens_per_s - 1
        plan.assumptions.insert(
            0,
            f"{framework} replicates the model on every GPU, so the plan runs DDP; the fastest "
            f"setup searched ({fastest.chosen_label}, on DeepSpeed) is predicted {gain:.0%} "
            "faster",
        )
    return plan


def _search(space: _Space, objective: Objective) -> MemoryPlan:
    """The search over ``space``: the memory-only choice without a speed model, else by speed."""
    if space.hardware.gpu is None or objective == "memory":
        if space.brief.batch % space.hardware.world_size:
            raise InputError("global_batch_size", _batch_message(space.brief, space.hardware))
        return _finish(space, _simplest_fit(space), [])
    return _fastest_fit(space)


def pinned_search(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    batch_note: str | None,
    options: SearchOptions,
) -> MemoryPlan:
    """The search restricted to the request's pins; when nothing fits them, the unpinned plan.

    A ZeRO stage keeps the strategies of that stage, ``offload`` keeps (or drops) the offload
    strategies, tensor/pipeline degrees keep the setups with exactly those degrees (searched
    even where data parallelism alone would fit). The plan says what was pinned; when no pinned
    setup fits, the plan is the unpinned search's, with a note that the pinned choice does not
    fit, why, and what does instead.
    """
    pins = brief.pins
    wanted = " + ".join(pins.stated())
    objective = options.objective
    unpinned = brief.model_copy(update={"pins": type(pins)()})
    names: list[str] = [check_strategy(s) for s in options.strategies or STRATEGY_ORDER]
    kept = [
        n
        for n in names
        if (pins.zero_stage is None or ZERO_STAGE[n] == pins.zero_stage)
        and ZERO_STAGE[n] not in pins.avoid_zero_stages
        and (pins.offload is None or (n in OFFLOAD_STRATEGIES) == pins.offload)
    ]
    tp = options.tensor_parallel or pins.tensor_parallel
    pp = options.pipeline_parallel or pins.pipeline_parallel
    plan: MemoryPlan | None = None
    why = "no strategy has all of these"
    fits = False
    if kept:
        try:
            pinned = options.but(strategies=kept, tensor_parallel=tp, pipeline_parallel=pp)
            space = _space(model, hardware, unpinned, pinned)
            if batch_note:
                space.notes.append(batch_note)
            plan = _search(space, objective)
        except InputError as exc:
            why = exc.message
        else:
            row = plan.chosen_row
            fits = row is not None and row.fits and _matches(plan, tp, pp)
            if not fits:
                why = (
                    f"its smallest setup needs {row.per_gpu_bytes.total / GB:.1f} GB per GPU"
                    if row is not None and not row.fits
                    else "no pinned setup fits in memory with headroom"
                )
    if plan is not None and fits:
        return plan.model_copy(
            update={"assumptions": [f"pinned by the request: {wanted}", *plan.assumptions]}
        )
    fallback = run_search(model, hardware, unpinned, options.but(strategies=names))
    row = fallback.chosen_row
    if row is not None and row.fits:
        note = (
            f"the pinned choice ({wanted}) does not fit: {why}; planned "
            f"{fallback.chosen_label} instead, which fits"
        )
    else:
        note = f"the pinned choice ({wanted}) does not fit: {why}; nothing fits without it either"
        # Nothing fits either way: the plan keeps what the request pinned.
        fallback = plan if plan is not None and _matches(plan, tp, pp) else fallback
    notes = [note, *fallback.assumptions]
    if batch_note and batch_note not in notes:
        notes.append(batch_note)
    honoured = not (row is not None and row.fits)  # nothing fits: the plan keeps the pins
    missed = fallback.not_honoured if honoured else [note, *fallback.not_honoured]
    return fallback.model_copy(update={"assumptions": notes, "not_honoured": missed})


def _matches(plan: MemoryPlan, tp: int | None, pp: int | None) -> bool:
    """Does the plan's chosen setup have the pinned tensor and pipeline degrees?"""
    return (tp is None or plan.tensor_parallel == tp) and (
        pp is None or plan.pipeline_parallel == pp
    )


def _batch_message(brief: TrainingBrief, hardware: HardwareSpec, dp: int | None = None) -> str:
    """Why the global batch cannot be split, with the nearest batches that can."""
    world = hardware.world_size
    step = dp or world
    lower = brief.batch // step * step
    nearest = f"{lower} or {lower + step}" if lower else f"{step} or {2 * step}"
    if dp is not None:
        return (
            f"the requested {brief.batch} sequences per step must be a multiple of the "
            f"data-parallel degree {dp} (the {world} GPUs over tensor x pipeline parallel); "
            f"try {nearest}"
        )
    return (
        f"the requested {brief.batch} sequences per step must be a multiple of the data-parallel "
        f"degree of some setup (world size {world} over tensor x pipeline x context parallel); "
        f"try {nearest}, or leave it out for a default that fits"
    )


def check_pins(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    tensor_parallel: int | None,
    pipeline_parallel: int | None,
    strategies: list[StrategyName] | None = None,
) -> None:
    """Refuse a pinned tensor/pipeline degree that cannot run, naming the field.

    Megatron-LM's constraints (Narayanan et al. 2021 sec. 3.3): t within one node and dividing
    the attention heads and key-value heads, p dividing the layers, t x p dividing the GPUs, and
    the global batch dividing by the data-parallel degree world / (t x p).
    """
    tp, pp = tensor_parallel or 1, pipeline_parallel or 1
    world = hardware.world_size
    if tp < 1 or pp < 1:
        raise InputError("tensor_parallel" if tp < 1 else "pipeline_parallel", "must be at least 1")
    if tp * pp > 1 and hardware.gpu is None:
        raise InputError(
            "tensor_parallel" if tp > 1 else "pipeline_parallel",
            "tensor/pipeline parallelism needs GPUs; this machine has none",
        )
    if tp > max(1, hardware.gpus_per_node):
        raise InputError(
            "tensor_parallel",
            f"{tp} exceeds the {hardware.gpus_per_node} GPUs of one node (tensor parallelism "
            "all-reduces in every layer and stays inside a node)",
        )
    kv_heads = model.kv_heads or model.heads
    if model.heads % tp or kv_heads % tp:
        raise InputError(
            "tensor_parallel",
            f"{tp} must divide the {model.heads} attention heads and {kv_heads} key-value heads "
            f"of {model.name}",
        )
    if model.layers % pp:
        raise InputError(
            "pipeline_parallel", f"{pp} must divide the {model.layers} layers of {model.name}"
        )
    if world % (tp * pp):
        raise InputError(
            "pipeline_parallel" if pipeline_parallel else "tensor_parallel",
            f"tensor x pipeline = {tp * pp} must divide the {world} GPUs",
        )
    if (tensor_parallel or pipeline_parallel) and brief.batch % (world // (tp * pp)):
        raise InputError("global_batch_size", _batch_message(brief, hardware, world // (tp * pp)))
    if strategies and tp * pp > 1:
        usable = [n for n in strategies if n not in OFFLOAD_STRATEGIES]
        if pp > 1:
            usable = [n for n in usable if n in PIPELINE_STRATEGIES]
        if not usable:
            raise InputError(
                "strategy",
                f"{', '.join(strategies)} cannot run with "
                + (
                    "a pipeline: DeepSpeed's PipelineEngine takes ZeRO stage 0 or 1 only"
                    if pp > 1 and not any(n in OFFLOAD_STRATEGIES for n in strategies)
                    else "tensor/pipeline parallelism here (offload is data-parallel only)"
                ),
            )


def _space(
    model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief, options: SearchOptions
) -> _Space:
    """Check the batch arithmetic and the asked-for options; the space the search covers."""
    strategies, micro_batch_size = options.strategies, options.micro_batch_size
    tensor_parallel, pipeline_parallel = options.tensor_parallel, options.pipeline_parallel
    names = [check_strategy(s) for s in strategies] if strategies else list(STRATEGY_ORDER)
    names = sorted(set(names), key=STRATEGY_ORDER.index)
    notes: list[str] = []
    if hardware.gpu is None:
        skipped = [s for s in names if s in OFFLOAD_STRATEGIES]
        names = [s for s in names if s not in OFFLOAD_STRATEGIES]
        if skipped:
            notes.append("CPU-only machine: offload strategies do not apply")
        if not names:
            raise InputError("strategies", "offload strategies need a GPU; this machine has none")
    check_pins(
        model, hardware, brief, tensor_parallel, pipeline_parallel, names if strategies else None
    )
    if micro_batch_size is not None and micro_batch_size < 1:
        raise InputError("micro_batch_size", "must be at least 1")
    if options.recompute is not None:
        policies: list[Recompute] = [check_recompute(options.recompute)]
    elif options.activation_checkpointing is not None:
        policies = ["full" if options.activation_checkpointing else "none"]
    else:
        policies = list(RECOMPUTE_POLICIES)
    ckpts = sorted({p != "none" for p in policies})
    precision = resolve_precision(brief.precision, hardware)
    space = _Space(
        model, hardware, brief, precision, names, micro_batch_size, ckpts, notes, policies
    )
    space.pinned = (tensor_parallel, pipeline_parallel)
    space.cp_pin = options.context_parallel
    if options.recipe is not None:
        space.recipe = resolve_recipe(options.recipe)
        space.notes.append(f"memory priced for: {space.recipe.describe()}")
        space.notes.extend(f"assumed {a}" for a in space.recipe.assumed)
    space.layouts = _layouts(space)
    if not space.layouts:
        raise InputError("global_batch_size", _batch_message(brief, hardware))
    if hardware.gpu is not None and (line := _not_searched(space)):
        space.notes.append(line)
    if micro_batch_size is not None:
        runs = [lay for lay in space.layouts if space.micro_range(space.per_rank(lay))]
        if not runs:
            per_rank = space.per_rank(space.layouts[0])
            raise InputError(
                "micro_batch_size",
                f"{micro_batch_size} must divide the per-GPU batch of {per_rank} sequences",
            )
        space.layouts = runs
    return space


def _recipe_policy(recipe: Recipe, policy: Recompute) -> str:
    """The recipe's flavour of the search's policy: selective is per-op in torchtitan."""
    if policy != "selective":
        return policy
    if recipe.checkpointing == "selective-op" or recipe.framework == "torchtitan":
        return "selective-op"
    return "selective"


def _layouts(space: _Space) -> list[Setup]:
    """Every t x p x c the search covers: it factorizes the world and d divides the batch."""
    hw, model, brief = space.hardware, space.model, space.brief
    world = hw.world_size
    tp_pin, pp_pin = space.pinned
    if hw.gpu is None or brief.task not in TRAINING_TASKS:
        tps, pps, cps = [tp_pin or 1], [pp_pin or 1], [1]
    else:
        kv_heads = model.kv_heads or model.heads
        tps = (
            [tp_pin]
            if tp_pin
            else [
                t
                for t in TENSOR_PARALLEL_CANDIDATES
                if t <= max(1, hw.gpus_per_node) and model.heads % t == 0 and kv_heads % t == 0
            ]
        )
        pps = (
            [pp_pin]
            if pp_pin
            else [p for p in range(1, min(model.layers, world) + 1) if model.layers % p == 0]
        )
        # Context parallelism runs on torchtitan (FSDP2 x TP x PP x CP for its Llama models);
        # DeepSpeed and the Hugging Face script have no ring attention, so other models get none.
        cps = (
            [c for c in CONTEXT_PARALLEL_CANDIDATES if brief.seq_len % (2 * c) == 0]
            if brief.seq_len >= LONG_SEQUENCE and torchtitan_flavor(model) is not None
            else [1]
        )
    if space.cp_pin is not None:
        cps = [space.cp_pin]
    layouts = []
    for tp in tps:
        for pp in pps:
            for cp in cps:
                lay = Setup(tp=tp, pp=pp, cp=cp)
                if world % lay.split == 0 and brief.batch % (world // lay.split) == 0:
                    layouts.append(lay)
    return layouts


def _split_names(space: _Space, layout: Setup) -> list[StrategyName]:
    """The strategies a layout combines with (offload is data-parallel only, see parallel.py)."""
    if layout.split == 1:
        return space.names
    names = [n for n in space.names if n not in OFFLOAD_STRATEGIES]
    return [n for n in names if n in PIPELINE_STRATEGIES] if layout.pp > 1 else names


def _names_for(space: _Space, layout: Setup) -> list[StrategyName]:
    """The strategies a layout combines with, on a framework the request allows."""
    return [
        n
        for n in _split_names(space, layout)
        if runs_setup(space.brief, space.model, n, layout.tp, layout.pp, layout.cp)
    ]


def _not_searched(space: _Space) -> str | None:
    """The line saying which splits the request's framework wishes keep out of the search."""
    needs = {
        split_framework(space.model, n, lay.tp, lay.pp, lay.cp)
        for lay in space.layouts
        for n in _split_names(space, lay)
        if not runs_setup(space.brief, space.model, n, lay.tp, lay.pp, lay.cp)
    }
    if not needs:
        return None
    brief = space.brief
    why = (
        f"the request refuses {', '.join(brief.avoid_frameworks)}" if brief.avoid_frameworks else ""
    )
    if brief.framework is not None:
        why += ("; " if why else "") + f"the request asks for {brief.framework}"
    return (
        f"not searched: the splits that run only on {', '.join(sorted(str(f) for f in needs))} "
        f"({why})"
    )


def _virtual_stages(space: _Space, layout: Setup, accumulation: int) -> list[int]:
    """The interleaving degrees v a pipeline of ``accumulation`` micro-batches can run."""
    if layout.pp == 1:
        return [1]
    return [
        v
        for v in VIRTUAL_STAGE_CANDIDATES
        if space.model.layers % (layout.pp * v) == 0 and (v == 1 or accumulation % layout.pp == 0)
    ]


def _simplest_fit(space: _Space) -> MemoryPlan:
    """The memory-only choice: the simplest strategy that fits, with its largest micro-batch.

    Checkpointing costs ~1/3 more compute (Korthikanti et al. sec. 4.1), so it is the last
    resort; among strategies the simplest (earliest in ``STRATEGY_ORDER``) wins.
    """

    def best_micro(name: StrategyName, ckpt: bool) -> StrategyEstimate:
        for micro in space.micro_options(space.per_rank()):
            est = space.estimate(name, micro, ckpt)
            if est.fits:
                return est
        return est  # the smallest micro batch, which does not fit either

    if space.micro is not None and space.per_rank() % space.micro:
        raise InputError(
            "micro_batch_size",
            f"{space.micro} must divide the per-GPU batch of {space.per_rank()} sequences",
        )
    chosen: StrategyEstimate | None = None
    ckpt = space.ckpts[-1]
    for option in space.ckpts:
        chosen = next((e for e in (best_micro(n, option) for n in space.names) if e.fits), None)
        if chosen is not None:
            ckpt = option
            break
    rows = [best_micro(name, ckpt) for name in space.names]
    notes = list(space.notes)
    if chosen is None:
        chosen = min(rows, key=lambda e: e.per_gpu_bytes.total)
        notes.append(
            f"nothing fits: {chosen.name} has the smallest footprint "
            f"({chosen.per_gpu_bytes.total / GB:.1f} GB per device); it does not fit either"
        )
    else:
        chosen = next(e for e in rows if e.name == chosen.name)
    notes += explain.base_assumptions(
        space.model,
        space.hardware,
        space.brief,
        space.precision,
        space.names,
        chosen,
        checkpointing_needed=ckpt and chosen.fits and len(space.ckpts) > 1,
    )
    return MemoryPlan(
        strategies=rows,
        chosen=chosen.name,
        micro_batch_size=chosen.micro_batch_size,
        gradient_accumulation_steps=space.per_rank() // chosen.micro_batch_size,
        activation_checkpointing=ckpt,
        capacity_bytes=capacity_bytes(space.hardware),
        assumptions=notes,
    )


# Predicted speeds this close are not told apart: the speed model's median error on published
# runs it was not fitted on is about 4% (bench/results/2026-11-30-suite-full.md, "published"). Among setups within
# this share of the fastest, the simplest wins (``_simplicity``).
SIMPLER_WITHIN = 0.05


def _simplicity(row: StrategyEstimate) -> tuple[int, int, int, int, float]:
    """Fewer model-parallel dimensions, a lower ZeRO stage, less recompute; then speed."""
    return (
        row.tensor_parallel * row.pipeline_parallel * row.context_parallel,
        STRATEGY_ORDER.index(row.name),
        RECOMPUTE_POLICIES.index(row.checkpointing),
        row.virtual_stages,
        -(row.tokens_per_s or 0.0),
    )


def _pick(found: list[StrategyEstimate]) -> StrategyEstimate:
    """The simplest setup predicted within ``SIMPLER_WITHIN`` of the fastest (``found`` sorted)."""
    top = found[0].tokens_per_s or 0.0
    near = [r for r in found if (r.tokens_per_s or 0.0) >= (1 - SIMPLER_WITHIN) * top]
    return min(near, key=_simplicity)


def _rank(row: StrategyEstimate) -> tuple[float, int, int, int, int, int]:
    """Sort key, best first: faster; on a tie less model-parallel, simpler, less recompute."""
    return (
        -(row.tokens_per_s or 0.0),
        row.tensor_parallel * row.pipeline_parallel * row.context_parallel,
        STRATEGY_ORDER.index(row.name),
        RECOMPUTE_POLICIES.index(row.checkpointing),
        row.virtual_stages,
        -row.micro_batch_size,
    )


def _headroom(est: StrategyEstimate, limit: float) -> bool:
    """Fits with headroom (``fits`` is False when offloaded states overflow the node's RAM)."""
    return est.fits and est.per_gpu_bytes.total <= limit


def recompute_policies(searched: list[Recompute], layout: Setup) -> list[Recompute]:
    """Of the ``searched`` recompute policies, those the setup's launcher can run.

    Selective recomputation needs a framework that checkpoints below the layer: the pipeline
    launchers (torchtitan's per-op policy, Megatron's ``--recompute-granularity selective``).
    Data-parallel and AutoTP plans run the Hugging Face model, whose gradient checkpointing
    re-runs whole layers (``gradient_checkpointing_enable``), so they get none or full unless
    the request pins selective.
    """
    if layout.pp > 1 or searched == ["selective"]:
        return searched
    return [p for p in searched if p != "selective"]


def _family(
    space: _Space, name: StrategyName, layout: Setup, limit: float
) -> tuple[list[StrategyEstimate], StrategyEstimate | None]:
    """Every fitting setup of one family (with its speed), and the family's smallest setup."""
    per_rank = space.per_rank(layout)
    micros = space.micro_range(per_rank)
    fitting: list[StrategyEstimate] = []
    smallest: StrategyEstimate | None = None
    held = 0  # the largest micro-batch a lighter recompute policy already holds
    for policy in recompute_policies(space.policies, layout):
        for micro in micros:
            if micro <= held:
                continue
            est = space.estimate_setup(
                layout.but(strategy=name, micro_batch=micro, recompute=policy)
            )
            if smallest is None or est.per_gpu_bytes.total < smallest.per_gpu_bytes.total:
                smallest = est
            if not _headroom(est, limit):
                break  # a larger micro-batch needs more memory still
            held = max(held, micro)
            plain = space.with_speed(est)
            fitting.append(plain)
            # Interleaving is kept only where the speed model rates it faster than v = 1 (it
            # shrinks the bubble and adds pipeline sends, Narayanan et al. 2021 sec. 2.2.2).
            for v in _virtual_stages(space, layout, per_rank // micro)[1:]:
                row = space.with_speed(est.model_copy(update={"virtual_stages": v}))
                if (row.tokens_per_s or 0) > (plain.tokens_per_s or 0):
                    fitting.append(row)
    return fitting, smallest


def _fastest_fit(space: _Space) -> MemoryPlan:
    """The speed search over the whole space: prune by memory, rank by tokens/s."""
    capacity = capacity_bytes(space.hardware) or 0
    limit = (1 - MIN_HEADROOM) * capacity
    found: list[StrategyEstimate] = []
    # Each family's smallest setup and (below) its best, by the family (strategy x t x p x c).
    smallest: dict[Setup, StrategyEstimate] = {}
    for layout in space.layouts:
        for name in _names_for(space, layout):
            try:
                check_model_parallel(space.model, space.hardware, name, layout.tp, layout.pp)
            except InputError:
                continue
            rows, small = _family(space, name, layout, limit)
            found += rows
            if small is not None:
                smallest[small.setup.family()] = small
    if not smallest:
        wish = space.brief.framework or ", ".join(space.brief.avoid_frameworks)
        raise InputError(
            "strategy",
            "no searched strategy runs with the pinned tensor/pipeline degrees"
            + (f" on a framework the request allows ({wish})" if wish else ""),
        )
    found.sort(key=_rank)
    if found:
        win = _pick(found)
        found.remove(win)
        found.insert(0, win)
    best: dict[Setup, StrategyEstimate] = {}
    for row in found:
        best.setdefault(row.setup.family(), row)
    rows = _rows(space, best, smallest)
    searched = _search_line(space, len(smallest), len(found))
    node_ram = explain.node_ram_text(space.hardware)
    if not found:
        return _nothing_fits(space, rows, smallest, limit, capacity, node_ram, searched)
    why_not = _why_not(win, best, smallest, limit, capacity, node_ram)
    return _chosen_plan(space, rows, win, why_not, searched, found, best)


def _rows(
    space: _Space, best: dict[Setup, StrategyEstimate], smallest: dict[Setup, StrategyEstimate]
) -> list[StrategyEstimate]:
    """One row per data-parallel strategy, then one per strategy with model parallelism.

    Each row is the fastest fitting setup of its kind, else the smallest; no two rows share a
    label.
    """
    families = [Setup(n) for n in space.names]
    plain = [best.get(f) or smallest[f] for f in families if f in smallest]
    fitting = {id(r) for r in best.values()}
    split: dict[str, StrategyEstimate] = {}
    for fam, small in smallest.items():
        if not fam.model_parallel:
            continue
        row, held = best.get(fam), split.get(small.name)
        if row is not None:
            if held is None or id(held) not in fitting or _rank(row) < _rank(held):
                split[small.name] = row
        elif held is None or (
            id(held) not in fitting and small.per_gpu_bytes.total < held.per_gpu_bytes.total
        ):
            split[small.name] = small
    return plain + [split[n] for n in STRATEGY_ORDER if n in split]


def _why_not(
    win: StrategyEstimate,
    best: dict[Setup, StrategyEstimate],
    smallest: dict[Setup, StrategyEstimate],
    limit: float,
    capacity: int,
    node_ram: str,
) -> dict[str, str]:
    """Why every other family lost: how much slower its best setup is, or by how much it misses.

    Keyed by the label of the family's row: its best setup, else its smallest.
    """
    win_label = win.label
    win_speed = win.tokens_per_s or 0.0
    reasons: dict[str, str] = {}
    for fam, small in smallest.items():
        if fam == win.setup.family():
            continue
        row = best.get(fam)
        lab = (row or small).label
        if row is None:
            split = small.tensor_parallel * small.pipeline_parallel * small.context_parallel > 1
            if explain.cpu_short(small, limit):
                reasons[lab] = explain.no_fit(small, limit, capacity, node_ram, split=split)
            else:
                reasons[lab] = (
                    f"does not fit, {small.per_gpu_bytes.total / GB:.0f} GB > {limit / GB:.0f} GB "
                    f"usable ({capacity / GB:.0f} GB less {MIN_HEADROOM:.0%} headroom) at its "
                    f"smallest (micro-batch {small.micro_batch_size}, "
                    f"recompute {small.checkpointing})"
                )
            continue
        speed = row.tokens_per_s or 0.0
        setup = f"micro-batch {row.micro_batch_size}, recompute {row.checkpointing}" + (
            f", {row.virtual_stages} virtual stages" if row.virtual_stages > 1 else ""
        )
        if speed >= win_speed:
            reasons[lab] = (
                f"{speed / win_speed - 1:.0%} faster on paper ({speed:,.0f} vs {win_speed:,.0f} "
                f"tokens/s), within the {SIMPLER_WITHIN:.0%} the speed model does not tell apart; "
                f"{win_label} is simpler"
                if speed > win_speed
                else f"no faster than {win_label} ({win_speed:,.0f} tokens/s), which is simpler"
            )
        else:
            reasons[lab] = (
                f"{1 - speed / win_speed:.0%} slower: {speed:,.0f} vs {win_speed:,.0f} tokens/s "
                f"at its best ({setup})"
            )
    return reasons


def _search_line(space: _Space, families: int, fitting: int) -> str:
    """One line on what the speed search covered."""
    tps = sorted({lay.tp for lay in space.layouts})
    pps = sorted({lay.pp for lay in space.layouts})
    cps = sorted({lay.cp for lay in space.layouts})
    return (
        f"search: {families} families (strategy x tensor {tps} x pipeline {pps} x context "
        f"{cps}) x micro-batch x recompute {list(space.policies)} (virtual pipeline stages "
        f"where the layers split evenly); {fitting} setups fit with {MIN_HEADROOM:.0%} memory "
        "headroom, ranked by estimated tokens/s, offload included (chosen when it is the only "
        "fit or predicted faster)"
    )


def _nothing_fits(
    space: _Space,
    rows: list[StrategyEstimate],
    smallest: dict[Setup, StrategyEstimate],
    limit: float,
    capacity: int,
    node_ram: str,
    searched: str,
) -> MemoryPlan:
    """The plan when no setup fits with headroom: the smallest one, what binds, what would fit."""
    why: dict[str, str] = {
        small.label: explain.over(
            small,
            limit,
            capacity,
            node_ram,
            split=small.tensor_parallel * small.pipeline_parallel > 1,
        )
        for small in smallest.values()
    }
    index = min(range(len(rows)), key=lambda i: rows[i].per_gpu_bytes.total)
    chosen = rows[index] = space.with_speed(rows[index])
    bigger = smallest_fitting(space.model, space.hardware, space.brief)
    tp, pp = chosen.tensor_parallel, chosen.pipeline_parallel
    per_rank = space.per_rank(chosen.setup)
    notes = [
        explain.nothing_fits_note(bigger, MAX_NODES_SUGGESTED),
        searched,
        f"nothing fits: {chosen.label} has the smallest footprint "
        f"({chosen.per_gpu_bytes.total / GB:.1f} GB per device); it does not fit either",
        *_assumptions(space, chosen),
    ]
    plan = MemoryPlan(
        strategies=rows,
        chosen=chosen.name,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        micro_batch_size=chosen.micro_batch_size,
        gradient_accumulation_steps=max(1, per_rank // chosen.micro_batch_size),
        activation_checkpointing=chosen.activation_checkpointing,
        capacity_bytes=capacity_bytes(space.hardware),
        assumptions=notes,
        why_not=why,
        smallest_fitting_hardware=bigger,
        binding=alternatives.binding(rows, space.hardware),
        fit_options=alternatives.fit_options(space.model, space.hardware, space.brief),
        speed=space.speeds[id(chosen)],
    )
    return _finish(space, plan, [], chosen)


def _assumptions(space: _Space, win: StrategyEstimate) -> list[str]:
    """The memory model's assumptions and how the chosen setup splits the batch."""
    lines = [
        a
        for a in explain.base_assumptions(
            space.model,
            space.hardware,
            space.brief,
            space.precision,
            space.names,
            win,
            checkpointing_needed=False,
        )
        if not a.startswith("data-parallel world size")
    ]
    lay = win.setup
    dp = space.dp(lay)
    lines.append(
        explain.batch_line(
            space.brief, win.micro_batch_size, space.per_rank(lay), dp, lay.tp, lay.pp
        )
    )
    if lay.cp > 1:
        lines.append(
            f"context parallel {lay.cp}: each sequence of {space.brief.seq_len} tokens is split "
            f"over {lay.cp} GPUs (activations of {space.brief.seq_len // lay.cp} tokens per GPU; "
            "Megatron-Core context parallelism)"
        )
    if win.checkpointing != "none":
        lines.append(
            f"recompute {win.checkpointing}"
            + (
                " (only the attention core is re-run, Korthikanti et al. 2022 sec. 5)"
                if win.checkpointing == "selective"
                else " (every layer's forward is re-run in backward)"
            )
        )
    if win.virtual_stages > 1:
        lines.append(
            f"interleaved pipeline: {win.virtual_stages} virtual stages per GPU (Narayanan et "
            "al. 2021 sec. 2.2.2); memory counts the 1F1B in-flight micro-batches"
        )
    return lines


def _chosen_plan(
    space: _Space,
    rows: list[StrategyEstimate],
    win: StrategyEstimate,
    why_not: dict[str, str],
    searched: str,
    found: list[StrategyEstimate],
    best: dict[Setup, StrategyEstimate],
) -> MemoryPlan:
    """The plan for the winning setup: its rows, batch split, assumptions, speed, candidates."""
    tp, pp = win.tensor_parallel, win.pipeline_parallel
    lay = win.setup
    dp = space.dp(lay)
    per_rank = space.per_rank(lay)
    # The chosen setup goes first among the rows of its name, where a reader that looks the
    # choice up by name alone finds it.
    rows = [r for r in rows if r.setup.family() != lay.family()]
    names = list(space.names)
    rows.insert(names.index(win.name) if win.name in names else len(names), win)
    assumptions = [*space.notes, searched]
    if tp * pp * lay.cp > 1:
        assumptions.append(
            f"{win.label} (tensor {tp} x pipeline {pp} x data {dp}"
            + (f" x context {lay.cp}" if lay.cp > 1 else "")
            + ") is the fastest setup that fits"
        )
        needed = runs_on(space.brief, space.model, win.name, tp, pp, lay.cp)
        assumptions.append(explain.split_note(needed, tp, pp, lay.cp))
    assumptions += _assumptions(space, win)
    top = found[:TOP_CANDIDATES]
    shown = {id(r) for r in top}
    candidates = top + [r for r in best.values() if id(r) not in shown]
    plan = MemoryPlan(
        strategies=rows,
        chosen=win.name,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        micro_batch_size=win.micro_batch_size,
        gradient_accumulation_steps=per_rank // win.micro_batch_size,
        activation_checkpointing=win.activation_checkpointing,
        capacity_bytes=capacity_bytes(space.hardware),
        assumptions=assumptions,
        why_not=why_not,
        speed=space.speeds[id(win)],
    )
    return _finish(space, plan, candidates, win)


def _finish(
    space: _Space,
    plan: MemoryPlan,
    candidates: list[StrategyEstimate],
    win: StrategyEstimate | None = None,
) -> MemoryPlan:
    """The plan with its ``setup`` (the chosen row) and ``candidates`` in the contract's form."""
    row = win or plan.chosen_row
    assumptions = list(plan.assumptions)
    if space.recipe is not None and row is not None:
        # The recipe's own recompute is a default; the chosen setup's policy is what was priced.
        priced = f"memory priced for: {space.recipe.describe()}"
        policy = _recipe_policy(space.recipe, row.checkpointing)
        chosen = replace(space.recipe, checkpointing=policy)
        assumptions = [
            f"memory priced for: {chosen.describe()}" if a == priced else a for a in assumptions
        ]
    if row is not None and space.hardware.gpu is not None:
        assumptions.append(fit_verdict(row.per_gpu_bytes, capacity_bytes(space.hardware) or 0))
    return plan.model_copy(
        update={
            "setup": space.candidate(row) if row is not None else None,
            "candidates": [space.candidate(r) for r in candidates],
            "assumptions": assumptions,
        }
    )


def fit_verdict(t: MemoryBreakdown, capacity: int) -> str:
    """The fit check in words: the quantity compared, the margins, and the largest term.

    "fits" leaves ``SAFE_HEADROOM`` of the GPU free (the model's worst under-prediction on
    published runs); "tight" leaves between that and ``MIN_HEADROOM`` (the search accepts it:
    most runs like it measure within 10% of the prediction, but some needed up to 23% more);
    "does not fit" leaves less.
    """
    terms = {
        "parameters": t.params,
        "gradients": t.gradients,
        "optimizer states": t.optimizer,
        "activations": t.activations,
    }
    binding = max(terms, key=lambda k: terms[k])
    share = t.device_used / capacity if capacity else 0.0
    if share <= 1 - SAFE_HEADROOM:
        verdict = f"fits with a {SAFE_HEADROOM:.0%} margin"
    elif share <= 1 - MIN_HEADROOM:
        verdict = (
            f"tight: leaves {1 - share:.0%} of the GPU free, under the {SAFE_HEADROOM:.0%} that "
            "covers the model's worst under-prediction on published runs"
        )
    else:
        verdict = f"does not fit (needs {MIN_HEADROOM:.0%} of the GPU free)"
    return (
        f"fit check: {verdict}; predicted device memory {t.device_used / GB:.1f} GB "
        f"({share:.0%} of {capacity / GB:.0f} GB; peak allocated {t.peak_allocated / GB:.1f} GB, "
        f"reserved {t.peak_reserved / GB:.1f} GB, plus the CUDA context and NCCL buffers); "
        f"largest term: {binding} {terms[binding] / GB:.1f} GB"
    )
