"""Ranking and picking: setups ordered by predicted speed, the simplest near the fastest chosen.

A family (strategy x t x p x c) is walked from its smallest micro-batch up, stopping at the
first that does not fit with headroom; a heavier recompute policy is only tried at micro-batches
the lighter ones could not hold. Among setups predicted within ``SIMPLER_WITHIN`` of the fastest,
the simplest wins. Without a speed model, ``simplest_fit`` is the memory-only choice.
"""

from __future__ import annotations

from tools.core.errors import InputError
from tools.core.schemas import MemoryPlan, StrategyEstimate, StrategyName
from tools.core.setup import Setup
from tools.core.strategies import RECOMPUTE_POLICIES, STRATEGY_ORDER, Recompute
from tools.planning import explain
from tools.planning.layouts import virtual_stages
from tools.planning.memory import GB, capacity_bytes
from tools.planning.search_space import SearchSpace


def simplest_fit(space: SearchSpace) -> MemoryPlan:
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
        attention=space.attention(chosen.setup).kernel,
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


def pick(found: list[StrategyEstimate]) -> StrategyEstimate:
    """The simplest setup predicted within ``SIMPLER_WITHIN`` of the fastest (``found`` sorted)."""
    top = found[0].tokens_per_s or 0.0
    near = [r for r in found if (r.tokens_per_s or 0.0) >= (1 - SIMPLER_WITHIN) * top]
    return min(near, key=_simplicity)


def rank(row: StrategyEstimate) -> tuple[float, int, int, int, int, int]:
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


def family_setups(
    space: SearchSpace, name: StrategyName, layout: Setup, limit: float
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
            for v in virtual_stages(space, layout, per_rank // micro)[1:]:
                row = space.with_speed(est.model_copy(update={"virtual_stages": v}))
                if (row.tokens_per_s or 0) > (plain.tokens_per_s or 0):
                    fitting.append(row)
    return fitting, smallest


def family_rows(
    space: SearchSpace, best: dict[Setup, StrategyEstimate], smallest: dict[Setup, StrategyEstimate]
) -> list[StrategyEstimate]:
    """One row per data-parallel strategy, then one per strategy with model parallelism.

    Each row is the fastest fitting setup of its kind, else the smallest; no two rows share a
    label. A smallest row the memory model calls fits (within the GPU, not within the search's
    headroom) carries its speed too: a row that fits is never shown without one.
    """
    smallest = {
        fam: space.with_speed(row) if row.fits and row.tokens_per_s is None else row
        for fam, row in smallest.items()
    }
    families = [Setup(n) for n in space.names]
    plain = [best.get(f) or smallest[f] for f in families if f in smallest]
    fitting = {id(r) for r in best.values()}
    split: dict[str, StrategyEstimate] = {}
    for fam, small in smallest.items():
        if not fam.model_parallel:
            continue
        row, held = best.get(fam), split.get(small.name)
        if row is not None:
            if held is None or id(held) not in fitting or rank(row) < rank(held):
                split[small.name] = row
        elif held is None or (
            id(held) not in fitting and small.per_gpu_bytes.total < held.per_gpu_bytes.total
        ):
            split[small.name] = small
    return plain + [split[n] for n in STRATEGY_ORDER if n in split]
