"""The plan a search ends in, and why: the chosen setup's plan or the nothing-fits plan.

Every family that lost gets its reason with its margin (slower by how much, or over memory by
how much); the plan carries the memory model's assumptions, how the chosen setup splits the
batch, and the fit verdict in words.
"""

from __future__ import annotations

from dataclasses import replace

from tools.core.schemas import MemoryBreakdown, MemoryPlan, StrategyEstimate
from tools.core.setup import Setup
from tools.core.strategies import MIN_HEADROOM, SAFE_HEADROOM
from tools.planning import alternatives, explain
from tools.planning.layouts import names_for
from tools.planning.memory import GB, capacity_bytes
from tools.planning.ranking import SIMPLER_WITHIN
from tools.planning.scale_out import MAX_NODES_SUGGESTED, lifted_fit, smallest_fitting
from tools.planning.search_space import SearchSpace, recipe_policy
from tools.planning.vision import image_notes
from tools.research.splits import runs_on

# How many runners-up the plan lists (then the best setup of every other family).
TOP_CANDIDATES = 10


def why_not_reasons(
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


def search_line(space: SearchSpace, families: int, fitting: int) -> str:
    """One line on what the speed search covered (the layouts some allowed strategy runs)."""
    runs = runs_any(space) or space.layouts
    tps = sorted({lay.tp for lay in runs})
    pps = sorted({lay.pp for lay in runs})
    cps = sorted({lay.cp for lay in runs})
    return (
        f"search: {families} families (strategy x tensor {tps} x pipeline {pps} x context "
        f"{cps}) x micro-batch x recompute {list(space.policies)} (virtual pipeline stages "
        f"where the layers split evenly); {fitting} setups fit with {MIN_HEADROOM:.0%} memory "
        "headroom, ranked by estimated tokens/s, offload included (chosen when it is the only "
        "fit or predicted faster)"
    )


def runs_any(space: SearchSpace) -> list[Setup]:
    """The layouts the search prices: those some strategy the request allows runs on."""
    return [lay for lay in space.layouts if names_for(space, lay)]


def nothing_fits(
    space: SearchSpace,
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
    if not rows:
        # Only families the rows leave out were searched (an expert-parallel pin alone: the
        # rows keep one per strategy and one per model-parallel split): their smallest setups.
        rows = list(smallest.values())
    index = min(range(len(rows)), key=lambda i: rows[i].per_gpu_bytes.total)
    chosen = rows[index] = space.with_speed(rows[index])
    bigger = smallest_fitting(space.model, space.hardware, space.brief)
    tp, pp = chosen.tensor_parallel, chosen.pipeline_parallel
    per_rank = space.per_rank(chosen.setup)
    notes = [
        explain.nothing_fits_note(
            bigger, MAX_NODES_SUGGESTED, splits=any(lay.split > 1 for lay in runs_any(space))
        ),
        # What the search left out (a LoRA job's splits, a refused framework's) is said here too,
        # and where the job fits without the request's framework wish or refusals.
        *(n for n in space.notes if n.startswith("not searched")),
        *(
            [lifted]
            if bigger is None and (lifted := lifted_fit(space.model, space.hardware, space.brief))
            else []
        ),
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
    return finish(space, plan, [], chosen)


def _assumptions(space: SearchSpace, win: StrategyEstimate) -> list[str]:
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
            attention=space.attention(win.setup).kernel,
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


def chosen_plan(
    space: SearchSpace,
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
    return finish(space, plan, candidates, win)


def finish(
    space: SearchSpace,
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
        policy = recipe_policy(space.recipe, row.checkpointing)
        chosen = replace(space.recipe, checkpointing=policy)
        assumptions = [
            f"memory priced for: {chosen.describe()}" if a == priced else a for a in assumptions
        ]
    if row is not None and (attention := space.attention(row.setup).note):
        assumptions.append(attention)
    if row is not None and space.hardware.gpu is not None:
        assumptions.append(fit_verdict(row.per_gpu_bytes, capacity_bytes(space.hardware) or 0))
    if plan.speed is not None and plan.speed.images_per_s:
        # How the images/s were priced (layout, Winograd, TF32, input pipeline), in the JSON too.
        assumptions += [a for a in image_notes(plan.speed.assumptions) if a not in assumptions]
    return plan.model_copy(
        update={
            "setup": space.candidate(row) if row is not None else None,
            "candidates": [space.candidate(r) for r in candidates],
            "assumptions": assumptions,
            "images_per_s": plan.speed.images_per_s if plan.speed else None,
            "input_images_per_s": plan.speed.input_images_per_s if plan.speed else None,
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
