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

This module decides which spaces are searched (the request's pins, its framework wish, a
recipe's recompute); tools/planning/space_search.py searches one.
"""

from __future__ import annotations

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, MemoryPlan, ModelSpec, TrainingBrief
from tools.core.setup import Setup
from tools.core.strategies import (
    OFFLOAD_STRATEGIES,
    STRATEGY_ORDER,
    ZERO_STAGE,
    check_strategy,
)
from tools.planning.bands import attach_bands, band_framework
from tools.planning.batch import resolve_batch
from tools.planning.fallbacks import (
    framework_fallback,
    inexact_fallback,
    not_as_asked,
    without_framework_wish,
)
from tools.planning.flops import require_tf32
from tools.planning.fp8 import fp8_plan_note
from tools.planning.layouts import build_space
from tools.planning.memory import GB
from tools.planning.options import SearchOptions
from tools.planning.pins import drop_expert_pin
from tools.planning.recipe import recipe_from_brief
from tools.planning.space_search import search_space
from tools.research.framework import replicas_fit
from tools.research.splits import (
    REPLICATING_FRAMEWORKS,
    setup_framework,
)

# Nothing pinned: the search over the whole space.
ALL = SearchOptions()


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
        fastest = _replicated(fastest, options.replicating, model, hardware, brief, plain)
    recipe = options.recipe or recipe_from_brief(_as_run(brief, options.replicating), model)
    fp8 = recipe is not None and recipe.precision == "fp8"
    return attach_bands(fastest, hardware, band_framework(brief, recipe), fp8=fp8)


def run_search(
    model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief, options: SearchOptions
) -> MemoryPlan:
    """One search over the space ``options`` leave open (the request's pins and wishes kept)."""

    def search(changed: TrainingBrief, wider: SearchOptions) -> MemoryPlan:
        return _search_brief(model, hardware, changed, wider)

    plan = _search_brief(model, hardware, brief, options)
    plan = framework_fallback(model, hardware, brief, plan, options, search)
    return inexact_fallback(model, hardware, brief, plan, options, search)


def _search_brief(
    model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief, options: SearchOptions
) -> MemoryPlan:
    """The search for one brief: its default batch, recipe and pins."""
    brief, batch_note = resolve_batch(brief, model, hardware)
    options = options.but(recipe=options.recipe or recipe_from_brief(brief, model))
    fp8_note = None
    if options.recipe is not None and options.recipe.precision == "fp8":
        # One line naming the GPU when it has no FP8 tensor cores, never a silent bf16 run.
        fp8_note = fp8_plan_note(hardware, options.recipe.framework)
    if options.recipe is not None and options.recipe.precision == "tf32":
        require_tf32(hardware)  # one line naming a GPU without TF32, never a silent fp32 run
    stated = brief.recipe.checkpointing if brief.recipe is not None else None
    if options.recompute is None and stated is not None:
        plan = _recipe_recompute(model, hardware, brief, batch_note, options, stated)
    else:
        plan = _pins_search(model, hardware, brief, batch_note, options)
    if fp8_note is not None:
        plan.assumptions.insert(0, fp8_note)
    return plan


def _pins_search(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    batch_note: str | None,
    options: SearchOptions,
) -> MemoryPlan:
    """The search of one settled brief and options: its pins kept where any are stated."""
    pins, dropped = drop_expert_pin(model, brief.pins)
    if dropped is not None:
        # Expert parallelism asked of a dense model: one line under "not as asked", never silent.
        plan = _pins_search(
            model, hardware, brief.model_copy(update={"pins": pins}), batch_note, options
        )
        return plan.model_copy(
            update={
                "assumptions": [dropped, *plan.assumptions],
                "not_honoured": [dropped, *plan.not_honoured],
            }
        )
    if brief.pins.stated():
        return pinned_search(model, hardware, brief, batch_note, options)
    space = build_space(model, hardware, brief, options)
    if batch_note:
        space.notes.append(batch_note)
    return search_space(space, options.objective)


def _recipe_recompute(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    batch_note: str | None,
    options: SearchOptions,
    stated: str,
) -> MemoryPlan:
    """The search keeping the recompute a brief's recipe states; when nothing fits it, said.

    A recipe that states its recompute describes the run, so the search keeps that policy
    (torchtitan's per-op policy is the search's selective, priced per-op by the recipe) instead
    of pricing its own with the recipe's name on it. When no setup fits with it, the plan is the
    search over every policy, with one line under "not as asked".
    """
    policy = "selective" if stated == "selective-op" else stated
    plan = _pins_search(model, hardware, brief, batch_note, options.but(recompute=policy))
    row = plan.chosen_row
    if row is not None and row.fits:
        return plan
    free = _pins_search(model, hardware, brief, batch_note, options)
    alt = free.chosen_row
    if alt is None or not alt.fits:
        return plan  # nothing fits either way: the plan keeps what the recipe states
    needs = (
        f"its smallest setup needs {row.per_gpu_bytes.total / GB:.1f} GB per GPU; " if row else ""
    )
    note = (
        f"recipe.checkpointing {stated} does not fit: {needs}planned {free.chosen_label} with "
        f"recompute {alt.checkpointing} instead, which fits"
    )
    return free.model_copy(
        update={
            "assumptions": [note, *free.assumptions],
            "not_honoured": [note, *free.not_honoured],
        }
    )


# The pins that split the model (a replica holds all of it).
_SPLIT_PINS = ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel")


def _as_run(brief: TrainingBrief, replicating: str | None) -> TrainingBrief:
    """The brief a replicating plan's recipe is priced for (``brief`` itself: no change).

    A recipe that names no framework is priced as what runs: the replicas as the replicating
    framework keeps them (PyTorch DDP: FSDP's unsharded path, not DeepSpeed's ZeRO-0).
    """
    if replicating is None or brief.recipe is None or brief.recipe.framework is not None:
        return brief
    return brief.model_copy(update={"framework": replicating})


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
    if options.recipe is None and (as_run := _as_run(brief, framework)) is not brief:
        ddp = ddp.but(recipe=recipe_from_brief(as_run, model))
    # A pinned split is not a replica's: the plan without it says so (LoRA with "pipeline
    # parallel 2" planned DDP and said "pinned by the request: pipeline parallel 2").
    split = {k: None for k in _SPLIT_PINS if getattr(brief.pins, k) not in (None, 1)}
    plain = brief.model_copy(update={"pins": brief.pins.model_copy(update=split)})
    plan = run_search(model, hardware, plain if split else brief, ddp)
    if split:
        why = next((n for n in fastest.not_honoured if n.startswith("the pinned choice")), "")
        why = why.split("; planned ")[0] or (
            f"the pinned choice ({' + '.join(brief.pins.stated())}) not planned"
        )
        plan = not_as_asked(
            plan, f"{why}; planned {plan.chosen_label} on {framework} (replicas) instead"
        )
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


def pinned_search(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    batch_note: str | None,
    options: SearchOptions,
) -> MemoryPlan:
    """The search restricted to the request's pins; when nothing fits them, the unpinned plan.

    A ZeRO stage keeps the strategies of that stage, ``offload`` keeps (or drops) the offload
    strategies, tensor/pipeline/expert/context degrees keep the setups with exactly those
    degrees (searched even where data parallelism alone would fit). The plan says what was
    pinned; when no pinned setup fits, the plan is the unpinned search's, with a note that the
    pinned choice does not fit, why, and what does instead.
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
    micro = options.micro_batch_size or pins.micro_batch
    ep = options.expert_parallel or pins.expert_parallel
    cp = options.context_parallel or pins.context_parallel
    degrees = (tp, pp, ep, cp, micro)
    plan: MemoryPlan | None = None
    why = "no strategy has all of these"
    verb = "does not fit"  # or: cannot run (a pinned layout no framework here runs)
    fits = False
    if kept:
        try:
            pinned = options.but(
                strategies=kept,
                tensor_parallel=tp,
                pipeline_parallel=pp,
                expert_parallel=ep,
                context_parallel=cp,
                micro_batch_size=micro,
            )
            space = build_space(model, hardware, unpinned, pinned)
            if batch_note:
                space.notes.append(batch_note)
            plan = search_space(space, objective)
        except InputError as exc:
            why, verb = exc.message, "cannot run here"
        else:
            row = plan.chosen_row
            fits = row is not None and row.fits and _matches(plan, *degrees)
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
    if kept and brief.framework in REPLICATING_FRAMEWORKS:
        elsewhere = _pins_elsewhere(model, hardware, unpinned, batch_note, pinned, degrees, wanted)
        if elsewhere is not None:
            return elsewhere
    fallback = run_search(model, hardware, unpinned, options.but(strategies=names))
    row = fallback.chosen_row
    if row is not None and row.fits:
        note = (
            f"the pinned choice ({wanted}) {verb}: {why}; planned "
            f"{fallback.chosen_label} instead, which fits"
        )
    else:
        note = f"the pinned choice ({wanted}) {verb}: {why}; nothing fits without it either"
        # Nothing fits either way: the plan keeps what the request pinned.
        fallback = plan if plan is not None and _matches(plan, *degrees) else fallback
    notes = [note, *fallback.assumptions]
    if batch_note and batch_note not in notes:
        notes.append(batch_note)
    # Nothing fits: the plan keeps the pins, where a pinned setup could be built at all (tensor
    # parallel 2 on one GPU cannot: the plan without it is then not as asked).
    honoured = not (row is not None and row.fits) and _matches(fallback, *degrees)
    missed = fallback.not_honoured if honoured else [note, *fallback.not_honoured]
    return fallback.model_copy(update={"assumptions": notes, "not_honoured": missed})


def _pins_elsewhere(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    batch_note: str | None,
    pinned: SearchOptions,
    degrees: tuple[int | None, ...],
    wanted: str,
) -> MemoryPlan | None:
    """The pinned search without the framework wish, when the wished one cannot run the pins.

    A replicating framework (DDP, Horovod, TensorFlow) runs no expert, context, tensor or
    pipeline split: the pins are the user's choice of layout, so the plan keeps them on the
    framework that runs them (the wish is then refused on its own line) rather than dropping
    them for another layout. None when the pins do not fit there either.
    """
    wished = brief.framework
    free = without_framework_wish(brief)
    try:
        space = build_space(
            model, hardware, free, pinned.but(recipe=recipe_from_brief(free, model))
        )
        if batch_note:
            space.notes.append(batch_note)
        plan = search_space(space, pinned.objective)
    except InputError:
        return None
    row = plan.chosen_row
    if row is None or not row.fits or not _matches(plan, *degrees):
        return None
    needed = setup_framework(model, plan)
    on = f" on {needed}" if needed else ""
    return plan.model_copy(
        update={
            "assumptions": [
                f"pinned by the request: {wanted}",
                f"{wished} runs no setup with the pinned degrees; planned {plan.chosen_label}{on}, "
                "which keeps them and fits",
                *plan.assumptions,
            ]
        }
    )


def _matches(plan: MemoryPlan, *pins: int | None) -> bool:
    """Does the chosen setup have the pinned (tensor, pipeline, expert, context, micro-batch)?"""
    s = plan.chosen_setup
    return all(
        p is None or got == p
        for p, got in zip(pins, (s.tp, s.pp, s.ep, s.cp, s.micro_batch), strict=False)
    )
