"""Strategy search: the one place a training setup is chosen, from the memory and speed models.

DeepSpeed's autotuner finds a configuration by running it on the target GPUs; this search runs
nothing. Over strategy x micro-batch x activation checkpointing it keeps the setups whose
estimated peak leaves at least ``MIN_HEADROOM`` of the GPU free (and, for offload, of the
node's CPU RAM), never offloads when a non-offload strategy fits (offload trades GPU memory for
PCIe traffic and CPU time), and picks the highest estimated tokens/s. Every other strategy gets
the reason it lost. Without a speed model (a CPU-only target), with ``objective="memory"``, or
when nothing fits with headroom, the simplest strategy that fits wins, with the largest
micro-batch it allows.

When no data-parallel strategy fits without offload (not even ZeRO-3), the search adds
Megatron-style tensor x pipeline parallelism (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM"): tensor degree t in 2, 4, 8 inside
a node, pipeline degree p dividing the layers, ZeRO-1 over the world / (t x p) data-parallel
ranks (ZeRO-2/3 too when p = 1). Such a setup, when it fits, wins over offload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tools.core.errors import InputError
from tools.core.schemas import (
    HardwareSpec,
    MemoryPlan,
    ModelSpec,
    ResolvedPrecision,
    SpeedEstimate,
    StrategyEstimate,
    StrategyName,
    TrainingBrief,
)
from tools.core.strategies import (
    MIN_HEADROOM,
    OFFLOAD_STRATEGIES,
    STRATEGY_ORDER,
    ZERO_STAGE,
    check_strategy,
)
from tools.planning import alternatives, explain
from tools.planning.batch import resolve_batch
from tools.planning.memory import GB, capacity_bytes, estimate_strategy
from tools.planning.parallel import model_parallel_setups
from tools.planning.scale_out import MAX_NODES_SUGGESTED, TRAINING_TASKS, smallest_fitting
from tools.planning.speed import estimate_speed
from tools.planning.states import resolve_precision

Objective = Literal["speed", "memory"]
MICRO_BATCH_CANDIDATES = (8, 4, 2, 1)


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
    # The speed estimate behind each row's tokens/s, by the row's id.
    speeds: dict[int, SpeedEstimate] = field(default_factory=dict)
    # The (tensor, pipeline) degrees the request pinned; None: searched.
    pinned: tuple[int | None, int | None] = (None, None)

    def per_rank(self, tp: int = 1, pp: int = 1) -> int:
        """Sequences per data-parallel rank per optimizer step."""
        return self.brief.batch // (self.hardware.world_size // (tp * pp))

    def micro_options(self, per_rank: int) -> list[int]:
        """The micro-batches to try, largest first (or the pinned one)."""
        if self.micro:
            return [self.micro]
        return [m for m in MICRO_BATCH_CANDIDATES if per_rank % m == 0]

    def estimate(
        self, name: StrategyName, micro: int, ckpt: bool, tp: int = 1, pp: int = 1
    ) -> StrategyEstimate:
        """The memory estimate of one setup, recording its checkpointing."""
        est = estimate_strategy(
            self.model,
            self.hardware,
            name,
            task=self.brief.task,
            precision=self.precision,
            micro_batch_size=micro,
            activation_checkpointing=ckpt,
            seq_len=self.brief.seq_len,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            gradient_accumulation_steps=self.per_rank(tp, pp) // micro,
        )
        return est.model_copy(update={"activation_checkpointing": ckpt})

    def with_speed(self, est: StrategyEstimate) -> StrategyEstimate:
        """``est`` with the speed model's tokens/s; the estimate itself is kept in ``speeds``."""
        tp, pp = est.tensor_parallel, est.pipeline_parallel
        speed = estimate_speed(
            self.model,
            self.hardware,
            est.name,
            micro_batch_size=est.micro_batch_size,
            gradient_accumulation_steps=self.per_rank(tp, pp) // est.micro_batch_size,
            activation_checkpointing=est.activation_checkpointing,
            precision=self.precision,
            seq_len=self.brief.seq_len,
            dataset_tokens=self.brief.dataset_tokens,
            tensor_parallel=tp,
            pipeline_parallel=pp,
        )
        row = est.model_copy(update={"tokens_per_s": speed.tokens_per_s})
        self.speeds[id(row)] = speed
        return row


def search_strategy(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    *,
    micro_batch_size: int | None = None,
    activation_checkpointing: bool | None = None,
    strategies: list[str] | None = None,
    objective: Objective = "speed",
) -> MemoryPlan:
    """Choose strategy, micro-batch and checkpointing: the fastest setup that fits.

    Args:
        model: The architecture, with exact sizes.
        hardware: The target machine or cluster.
        brief: The training brief (task, seq_len, global_batch_size, precision).
        micro_batch_size: Only consider this micro-batch.
        activation_checkpointing: Only consider checkpointing on (True) or off (False).
        strategies: Only consider these strategies (also the ZeRO stages tried with
            tensor/pipeline parallelism).
        objective: ``speed`` (the fastest setup that fits with headroom) or ``memory`` (the
            simplest strategy that fits, ignoring speed).

    Returns:
        The memory plan with one row per strategy (its fastest fitting setup, else its smallest),
        plus, when tensor/pipeline parallelism was searched, one row per ZeRO stage tried with it
        (its fastest fitting t x p, else its smallest); the choice with its tensor and pipeline
        degrees; ``why_not`` for every row that lost, keyed by setup label; and, with a GPU, the
        chosen setup's ``speed`` estimate.
    """
    brief, batch_note = resolve_batch(brief, model, hardware)
    if brief.pins.stated():
        return pinned_search(
            model,
            hardware,
            brief,
            batch_note,
            micro_batch_size=micro_batch_size,
            activation_checkpointing=activation_checkpointing,
            strategies=strategies,
            objective=objective,
        )
    space = _space(model, hardware, brief, micro_batch_size, activation_checkpointing, strategies)
    if batch_note:
        space.notes.append(batch_note)
    return _search(space, objective)


def _search(space: _Space, objective: Objective, splits: bool | None = None) -> MemoryPlan:
    """The search over ``space``; ``splits`` True/False forces tensor x pipeline on or off."""
    simplest = _simplest_fit(space)
    if space.hardware.gpu is None or objective == "memory":
        return simplest
    return _fastest_fit(space, simplest, splits)


def pinned_search(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    batch_note: str | None = None,
    **options: Any,
) -> MemoryPlan:
    """The search restricted to the request's pins; when nothing fits them, the unpinned plan.

    A ZeRO stage keeps the strategies of that stage, ``offload`` keeps (or drops) the offload
    strategies, tensor/pipeline degrees keep the setups with exactly those degrees (a degree
    above 1 searches model parallelism even where data parallelism would fit). The plan says
    what was pinned; when no pinned setup fits, the plan is the unpinned search's, with a note
    that the pinned choice does not fit, why, and what does instead.
    """
    pins = brief.pins
    wanted = " + ".join(pins.stated())
    objective = options.pop("objective", "speed")
    unpinned = brief.model_copy(update={"pins": type(pins)()})
    names: list[str] = [
        check_strategy(s) for s in options.pop("strategies", None) or STRATEGY_ORDER
    ]
    kept = [
        n
        for n in names
        if (pins.zero_stage is None or ZERO_STAGE[n] == pins.zero_stage)
        and (pins.offload is None or (n in OFFLOAD_STRATEGIES) == pins.offload)
    ]
    tp, pp = pins.tensor_parallel, pins.pipeline_parallel
    split = (tp or 1) * (pp or 1) > 1
    plan: MemoryPlan | None = None
    why = "no strategy has all of these"
    fits = False
    if kept:
        space = _space(model, hardware, unpinned, strategies=kept, **options)
        space.pinned = (tp, pp)
        if batch_note:
            space.notes.append(batch_note)
        try:
            plan = _search(space, objective, splits=split if split or tp or pp else None)
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
    fallback = search_strategy(
        model, hardware, unpinned, strategies=names, objective=objective, **options
    )
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
    return fallback.model_copy(update={"assumptions": notes})


def _matches(plan: MemoryPlan, tp: int | None, pp: int | None) -> bool:
    """Does the plan's chosen setup have the pinned tensor and pipeline degrees?"""
    return (tp is None or plan.tensor_parallel == tp) and (
        pp is None or plan.pipeline_parallel == pp
    )


def _space(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    micro_batch_size: int | None = None,
    activation_checkpointing: bool | None = None,
    strategies: list[str] | None = None,
) -> _Space:
    """Check the batch arithmetic and the asked-for options; the space the search covers."""
    world = hardware.world_size
    if brief.batch % world:
        lower = brief.batch // world * world
        nearest = f"{lower} or {lower + world}" if lower else f"{world} or {2 * world}"
        raise InputError(
            "global_batch_size",
            f"the requested {brief.batch} sequences per step must be a multiple of the "
            f"world size {world} (nodes x GPUs per node), which every data-parallel degree "
            f"divides; try {nearest}, or leave it out for a default that fits",
        )
    per_rank = brief.batch // world
    if micro_batch_size is not None and (micro_batch_size < 1 or per_rank % micro_batch_size):
        raise InputError(
            "micro_batch_size",
            f"{micro_batch_size} must divide the per-GPU batch of {per_rank} sequences",
        )
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
    ckpts = [activation_checkpointing] if activation_checkpointing is not None else [False, True]
    precision = resolve_precision(brief.precision, hardware)
    return _Space(model, hardware, brief, precision, names, micro_batch_size, ckpts, notes)


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


def _faster(a: StrategyEstimate, b: StrategyEstimate | None) -> bool:
    """Is ``a`` faster than ``b``; on a tie, is it less model-parallel and simpler?"""
    if b is None:
        return True

    def key(e: StrategyEstimate) -> tuple[float, int, int]:
        return (
            e.tokens_per_s or 0.0,
            -e.tensor_parallel * e.pipeline_parallel,
            -STRATEGY_ORDER.index(e.name),
        )

    return key(a) > key(b)


def _evaluate(
    space: _Space, name: StrategyName, limit: float, tp: int = 1, pp: int = 1
) -> tuple[StrategyEstimate | None, StrategyEstimate]:
    """The fastest setup of (name, t, p) that fits with headroom, and the smallest one."""
    best: StrategyEstimate | None = None
    smallest: StrategyEstimate | None = None
    for micro in space.micro_options(space.per_rank(tp, pp)):
        for ckpt in space.ckpts:
            est = space.estimate(name, micro, ckpt, tp, pp)
            if smallest is None or est.per_gpu_bytes.total < smallest.per_gpu_bytes.total:
                smallest = est
            # fits is False when offloaded states overflow the node's CPU RAM.
            if not est.fits or est.per_gpu_bytes.total > limit:
                continue
            est = space.with_speed(est)
            if _faster(est, best):
                best = est
    assert smallest is not None  # micro_options is never empty: 1 divides everything
    return best, smallest


@dataclass
class _Rows:
    """Per strategy (or ZeRO stage under t x p): its fastest fitting setup and its smallest."""

    best: dict[str, StrategyEstimate] = field(default_factory=dict)
    smallest: dict[str, StrategyEstimate] = field(default_factory=dict)

    def add(self, name: str, fit: StrategyEstimate | None, small: StrategyEstimate) -> None:
        """Keep the fastest fitting and the smallest setup seen for ``name``."""
        if name not in self.smallest or (
            small.per_gpu_bytes.total < self.smallest[name].per_gpu_bytes.total
        ):
            self.smallest[name] = small
        if fit is not None and _faster(fit, self.best.get(name)):
            self.best[name] = fit

    def rows(self) -> list[StrategyEstimate]:
        """One row per name: the fastest fitting setup, else the smallest."""
        return [self.best.get(n) or self.smallest[n] for n in self.smallest]


def _fastest_fit(space: _Space, simplest: MemoryPlan, splits: bool | None = None) -> MemoryPlan:
    """The speed search over the space, starting from the memory-only plan.

    ``splits`` True searches only tensor x pipeline setups (pinned degrees), False only
    data-parallel ones, None the usual: model parallelism only when nothing else fits.
    """
    capacity = capacity_bytes(space.hardware) or 0
    limit = (1 - MIN_HEADROOM) * capacity
    data = _Rows()
    for name in space.names if not splits else ():
        data.add(name, *_evaluate(space, name, limit))
    plain = [n for n in data.best if n not in OFFLOAD_STRATEGIES]
    # Tensor x pipeline parallelism, only when no data-parallel setup fits without offload.
    setups = []
    if (splits or (splits is None and not plain)) and space.brief.task in TRAINING_TASKS:
        tp, pp = space.pinned
        setups = [
            (n, t, p)
            for n, t, p in model_parallel_setups(space.model, space.hardware, space.names)
            if (tp is None or t == tp) and (pp is None or p == pp)
        ]
    split = _Rows()
    for name, tp, pp in setups:
        split.add(name, *_evaluate(space, name, limit, tp, pp))
    rows = data.rows() + split.rows()
    searched = explain.search_line(space.names, space.ckpts, setups)
    node_ram = explain.node_ram_text(space.hardware)
    candidates = [data.best[n] for n in plain] or list(split.best.values())
    candidates = candidates or list(data.best.values())
    if not candidates:
        why: dict[str, str] = {
            n: explain.over(data.smallest[n], limit, capacity, node_ram)
            for n in space.names
            if n in data.smallest
        }
        why.update(
            {
                explain.label(r): explain.over(r, limit, capacity, node_ram, split=True)
                for r in split.rows()
            }
        )
        bigger = smallest_fitting(space.model, space.hardware, space.brief)
        chosen = simplest.chosen_row
        all_rows = [*simplest.strategies, *split.rows()]
        return simplest.model_copy(
            update={
                "strategies": all_rows,
                "why_not": why,
                "smallest_fitting_hardware": bigger,
                "binding": alternatives.binding(all_rows, space.hardware),
                "fit_options": alternatives.fit_options(space.model, space.hardware, space.brief),
                "assumptions": [
                    explain.nothing_fits_note(bigger, MAX_NODES_SUGGESTED),
                    searched,
                    *simplest.assumptions,
                ],
                "speed": space.speeds[id(space.with_speed(chosen))] if chosen else None,
            }
        )
    win = candidates[0]
    for est in candidates[1:]:
        if _faster(est, win):
            win = est
    fitting = {id(r) for r in [*data.best.values(), *split.best.values()]}
    why_not = explain.why_not(rows, win, fitting, limit, capacity, node_ram)
    return _chosen_plan(space, simplest, rows, win, why_not, searched)


def _chosen_plan(
    space: _Space,
    simplest: MemoryPlan,
    rows: list[StrategyEstimate],
    win: StrategyEstimate,
    why_not: dict[str, str],
    searched: str,
) -> MemoryPlan:
    """The plan for the winning setup: its rows, batch split, assumptions and speed."""
    tp, pp = win.tensor_parallel, win.pipeline_parallel
    dp = space.hardware.world_size // (tp * pp)
    per_rank = space.brief.batch // dp
    if tp * pp > 1:
        # The chosen setup goes first among the rows of its name, where a reader that looks
        # the choice up by name alone finds it.
        rows.remove(win)
        names = list(space.names)
        rows.insert(names.index(win.name) if win.name in names else len(names), win)
    assumptions = [
        a
        for a in simplest.assumptions
        if not a.startswith(("data-parallel world size", "activation checkpointing is needed"))
    ]
    assumptions.insert(0, searched)
    if tp * pp > 1:
        assumptions.insert(
            1,
            f"no data-parallel strategy fits without offload, not even ZeRO-3: "
            f"{explain.label(win)} (tensor {tp} x pipeline {pp} x data {dp}) fits and is "
            "preferred to offload",
        )
        assumptions.append(explain.MEGATRON_NOTE)
    assumptions.append(explain.batch_line(space.brief, win.micro_batch_size, per_rank, dp, tp, pp))
    return simplest.model_copy(
        update={
            "strategies": rows,
            "chosen": win.name,
            "tensor_parallel": tp,
            "pipeline_parallel": pp,
            "micro_batch_size": win.micro_batch_size,
            "gradient_accumulation_steps": per_rank // win.micro_batch_size,
            "activation_checkpointing": win.activation_checkpointing,
            "assumptions": assumptions,
            "why_not": why_not,
            "speed": space.speeds[id(win)],
        }
    )
