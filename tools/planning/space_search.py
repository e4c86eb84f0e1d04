"""The search over one space: the memory-only choice, or the fastest setup that fits.

tools/planning/search.py decides which spaces to search (the request's pins, its framework
wish, a recipe's recompute); this module searches one, built by tools/planning/layouts.py.
"""

from __future__ import annotations

from tools.core.errors import InputError
from tools.core.schemas import MemoryPlan, StrategyEstimate
from tools.core.setup import Setup
from tools.core.strategies import MIN_HEADROOM
from tools.planning import explain
from tools.planning.layouts import names_for
from tools.planning.memory import capacity_bytes
from tools.planning.options import Objective
from tools.planning.outcome import chosen_plan, finish, nothing_fits, search_line, why_not_reasons
from tools.planning.parallel import check_model_parallel
from tools.planning.pins import batch_message
from tools.planning.ranking import family_rows, family_setups, pick, rank, simplest_fit
from tools.planning.search_space import SearchSpace
from tools.research.splits import autotp_shards, is_hf_model, lora_split_refusal, split_framework


def search_space(space: SearchSpace, objective: Objective) -> MemoryPlan:
    """The search over ``space``: the memory-only choice without a speed model, else by speed."""
    if space.hardware.gpu is None or objective == "memory":
        if space.brief.batch % space.hardware.world_size:
            raise InputError("global_batch_size", batch_message(space.brief, space.hardware))
        return finish(space, simplest_fit(space), [])
    return fastest_fit(space)


def _no_setup_message(space: SearchSpace) -> str:
    """Why no setup was searched, and why the layouts left do not run.

    With no degree pinned, a global batch smaller than the GPU count leaves no data-parallel-
    only layout (each rank trains whole sequences), so every layout left splits the model; it
    read "with the pinned degrees", naming pins the request never made. The advice goes last,
    where a shortened line keeps it.
    """
    world, batch = space.hardware.world_size, space.brief.batch
    advice = ""
    if space.pinned != (None, None) or space.cp_pin or space.ep_pin:
        head = "no searched strategy runs with the pinned degrees"
    elif batch < world and not any(lay.split == 1 for lay in space.layouts):
        head = (
            f"no setup runs this job: a global batch of {batch} sequences cannot keep {world} "
            "GPUs busy with data parallelism alone (each GPU trains whole sequences), and no "
            "layout that splits the model runs it here"
        )
        advice = f"; raise the global batch to {world} or more, or plan on {batch} GPUs or fewer"
    else:
        head = "no searched setup runs this job"
    wish = space.brief.framework or ", ".join(space.brief.avoid_frameworks)
    if wish:
        head += f" on a framework the request allows ({wish})"
    if is_hf_model(space.model) and not autotp_shards(space.model):
        head += (
            "; DeepSpeed AutoTP does not split a mixture of experts' experts (transformers "
            "holds them as fused parameters), so this model's tensor parallelism runs on megatron"
        )
    if space.brief.task == "lora" and any(lay.split > 1 for lay in space.layouts):
        head += "; " + lora_split_refusal(
            split_framework(space.model, n, lay.tp, lay.pp, lay.cp, lay.ep)
            for lay in space.layouts
            for n in space.names
        )
    return head + advice


def fastest_fit(space: SearchSpace) -> MemoryPlan:
    """The speed search over the whole space: prune by memory, rank by tokens/s."""
    capacity = capacity_bytes(space.hardware) or 0
    limit = (1 - MIN_HEADROOM) * capacity
    found: list[StrategyEstimate] = []
    # Each family's smallest setup and (below) its best, by the family (strategy x t x p x c).
    smallest: dict[Setup, StrategyEstimate] = {}
    for layout in space.layouts:
        for name in names_for(space, layout):
            try:
                check_model_parallel(space.model, space.hardware, name, layout.tp, layout.pp)
            except InputError:
                continue
            rows, small = family_setups(space, name, layout, limit)
            found += rows
            if small is not None:
                smallest[small.setup.family()] = small
    if not smallest:
        raise InputError("strategy", _no_setup_message(space))
    found.sort(key=rank)
    if found:
        win = pick(found)
        found.remove(win)
        found.insert(0, win)
    best: dict[Setup, StrategyEstimate] = {}
    for row in found:
        best.setdefault(row.setup.family(), row)
    rows = family_rows(space, best, smallest)
    searched = search_line(space, len(smallest), len(found))
    node_ram = explain.node_ram_text(space.hardware)
    if not found:
        return nothing_fits(space, rows, smallest, limit, capacity, node_ram, searched)
    why_not = why_not_reasons(win, best, smallest, limit, capacity, node_ram)
    return chosen_plan(space, rows, win, why_not, searched, found, best)
