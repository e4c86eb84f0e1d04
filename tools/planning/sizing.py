"""Which GPUs, how many, how long and how much: the sizing search (``app.py size``).

For a model, a task and a recipe (the brief's), over the GPU types that have a price
(``knowledge/gpu_prices.yaml``) plus any the request names, less any it refuses, the sizing runs
the one strategy search (tools/planning/search.py ``search_strategy``) at each count it asks
about and keeps what the search picks there. It chooses nothing itself: it only chooses
which counts to ask about and does the arithmetic of time and money:

- counts: 1, 2, 4, ... up to one node (the catalog's node shape, ``node_gpus``), then whole
  nodes by powers of two (and the GPU cap itself when it is whole nodes) up to ``max_gpus``
  (at most 1,024); one node only stops at the node. A GPU type stops once its rows are past
  its cost optimum (two counts in a row dearer per token than the best, see ``_go_on``),
  unless a deadline is not met yet or, with a budget alone, a faster row may still be within it.
- the global batch: the brief's (or the default rule's for one GPU, tools/planning/batch.py),
  rounded up to a multiple of the count where it does not divide, as the scaling table does.
- time_s = tokens / tokens_per_s; cost_usd = time_s / 3600 x count x price per GPU-hour (the
  request's price wins over the table's; tools/research/prices.py).
- fit: the fit check's level (tools/planning/outcome.py ``fit_verdict``) for the picked setup.

The pick, the Pareto set and what binds are tools/planning/sizing_pick.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tools.core.errors import InputError
from tools.core.schemas import (
    TRAINING_TASKS,
    GPUSpec,
    HardwareSpec,
    MemoryPlan,
    ModelSpec,
    SizingAnswer,
    SizingPlan,
    SizingRow,
    TrainingBrief,
)
from tools.core.sizing_types import FitLevel
from tools.core.strategies import MIN_HEADROOM, OFFLOAD_STRATEGIES, SAFE_HEADROOM
from tools.planning.batch import default_global_batch
from tools.planning.memory import capacity_bytes
from tools.planning.options import SearchOptions
from tools.planning.overheads import node_ram_bytes
from tools.planning.search import search_strategy
from tools.planning.sizing_pick import finish_sizing
from tools.research.hardware import CatalogGPU, find_gpu, load_gpu_catalog
from tools.research.prices import list_price

# The most GPUs a sizing considers (the range: 1 to 1,024).
MAX_SIZING_GPUS = 1024
# Each row's band is the published comparison's for its GPU family and framework
# (tools/planning/bands.py, knowledge/error_bands.yaml); said so in the plan.
SPEED_ERROR_SOURCE = (
    "each row's tokens/s band is the published comparison's for its GPU family and framework "
    "(knowledge/error_bands.yaml, from bench/calibration/bands.py): 80% of the published runs "
    "of that kind the model was not fitted on were within it; a row with no such runs says "
    "uncalibrated"
)
# Counts past a GPU type's cheapest row before it stops (a dip later is rare: per-GPU speed
# falls as the count grows, so the cost per token rises).
PATIENCE = 2


@dataclass(frozen=True)
class SizingLimits:
    """What a sizing question constrains; None or empty: not constrained.

    ``asked``: GPU types the request names (the pick is one of them when any are named; they
    are sized even without a price). ``prices``: a price per GPU-hour per catalog id, the
    request's own, which wins over the table. ``extra``: GPUs the catalog lacks, sized as given
    (a published run's 96 GB H100). ``refused``: types never sized.
    """

    tokens: float | None = None
    deadline_s: float | None = None
    budget_usd: float | None = None
    asked: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    prices: dict[str, float] = field(default_factory=dict)
    extra: tuple[GPUSpec, ...] = ()
    max_gpus: int = MAX_SIZING_GPUS
    one_node: bool = False
    only_asked: bool = False  # size the asked types only (no table over the priced catalog)


@dataclass
class _Type:
    """One GPU type to size: the GPU, its node shape and its price."""

    gpu: GPUSpec
    gpu_id: str
    per_node: int
    price: float | None
    price_source: str
    asked: bool


def size_training(
    model: ModelSpec,
    brief: TrainingBrief,
    limits: SizingLimits,
    options: SearchOptions | None = None,
) -> SizingPlan:
    """The sizing of ``brief``'s training of ``model`` under ``limits``.

    Args:
        model: The architecture, with exact sizes.
        brief: The task, sequence length, global batch, precision, recipe and wishes (its
            hardware is not read: the sizing chooses it).
        limits: The token budget, deadline, budget, GPU types and counts allowed.
        options: The search's options (pins); None searches everything.

    Raises:
        InputError: A task that trains nothing, or a GPU type the catalog does not know.
    """
    if brief.task not in TRAINING_TASKS:
        raise InputError(
            "task", f"sizing is for training (pretrain, finetune, lora), not {brief.task!r}"
        )
    types, notes = gpu_types(brief, limits)
    if not types:
        raise InputError("gpus", "every GPU type with a price is refused: nothing to size")
    rows: list[SizingRow] = []
    answers: list[SizingAnswer] = []
    for kind in types:
        found, answer = _size_type(model, brief, kind, limits, options)
        rows += found
        answers.append(answer)
    notes += _batch_notes(brief, rows)
    plan = SizingPlan(
        model=model.name,
        task=brief.task,
        seq_len=brief.seq_len,
        tokens=limits.tokens,
        deadline_s=limits.deadline_s,
        budget_usd=limits.budget_usd,
        max_gpus=limits.max_gpus,
        one_node=limits.one_node,
        rows=rows,
        answers=answers,
        speed_error_source=SPEED_ERROR_SOURCE,
        notes=notes,
    )
    plan = finish_sizing(plan)
    if plan.binding is not None and plan.binding.constraint in ("one_node", "max_gpus"):
        plan = _beyond_cap(model, brief, limits, types, plan, options)
    # The pick's band (each row has its own; 0.0 without a pick or where it is uncalibrated).
    pick_error = plan.pick.speed_error if plan.pick is not None else None
    return plan.model_copy(update={"speed_error": pick_error or 0.0})


def _beyond_cap(
    model: ModelSpec,
    brief: TrainingBrief,
    limits: SizingLimits,
    types: list[_Type],
    plan: SizingPlan,
    options: SearchOptions | None,
) -> SizingPlan:
    """The cap binds: the least count past it that fits, to say by how much it binds."""
    assert plan.binding is not None
    pool = [t for t in types if t.asked] or types
    capped = counts_for(pool[0].per_node, limits.max_gpus, limits.one_node)[-1]
    least: tuple[int, str, str] | None = None
    for kind in pool:
        for count in counts_for(kind.per_node, MAX_SIZING_GPUS, False):
            if count <= capped or (least is not None and count >= least[0]):
                continue
            row = size_count(model, brief, kind.gpu, count, kind.per_node, options)
            if row.fit != "does not fit":
                least = (count, kind.gpu_id, row.setup)
                break
    if least is None:
        text = f"{plan.binding.text}; nor on up to {MAX_SIZING_GPUS}"
        update: dict[str, object] = {"text": text, "limit": float(capped)}
    else:
        count, gpu, setup = least
        text = (
            f"{plan.binding.text}; the least that fits is {count} x {gpu} ({setup}), "
            f"{count - capped} more than the {capped} allowed"
        )
        update = {
            "text": text,
            "limit": float(capped),
            "best": float(count),
            "by": float(count - capped),
        }
    return plan.model_copy(update={"binding": plan.binding.model_copy(update=update)})


def gpu_types(brief: TrainingBrief, limits: SizingLimits) -> tuple[list[_Type], list[str]]:
    """The types to size: the priced catalog and the asked ones, less the refused; and notes."""
    refused = {find_gpu(name).id for name in limits.refused}
    asked = [find_gpu(name).id for name in limits.asked]
    catalog = load_gpu_catalog()
    ids = list(dict.fromkeys(asked))
    if not limits.only_asked:
        ids += [i for i in catalog if i not in ids and list_price(catalog[i]) is not None]
    notes: list[str] = []
    clash = [i for i in asked if i in refused]
    if clash:
        raise InputError("gpus", f"{', '.join(clash)} is both asked for and refused")
    if refused:
        notes.append(f"refused by the request, not sized: {', '.join(sorted(refused))}")
    types = [_catalog_type(catalog[i], brief, limits, i in asked) for i in ids if i not in refused]
    for gpu in limits.extra:
        gpu_id = getattr(gpu, "id", gpu.name)
        price = limits.prices.get(gpu_id)
        source = "the request's price" if price is not None else ""
        types.append(_Type(gpu, gpu_id, getattr(gpu, "node_gpus", 8), price, source, True))
    if brief.price_per_gpu_hour is not None and not asked:
        notes.append(
            f"the request's price ({brief.price_per_gpu_hour:g} per GPU-hour) names no GPU type, "
            "so it is not applied: each type's list price is used"
        )
    unpriced = [t.gpu_id for t in types if t.price is None]
    if unpriced:
        notes.append(
            f"no price for {', '.join(unpriced)} (not in knowledge/gpu_prices.yaml and none "
            "given): time only, no cost, for those"
        )
    return types, notes


def _catalog_type(
    gpu: CatalogGPU, brief: TrainingBrief, limits: SizingLimits, asked: bool
) -> _Type:
    """A catalog GPU with its price: the request's for it, else the table's."""
    own = limits.prices.get(gpu.id)
    if own is None and asked and brief.price_per_gpu_hour is not None:
        own = brief.price_per_gpu_hour
    if own is not None:
        return _Type(gpu, gpu.id, gpu.node_gpus, own, "the request's price", asked)
    listed = list_price(gpu)
    if listed is None:
        return _Type(gpu, gpu.id, gpu.node_gpus, None, "", asked)
    source = f"{listed.provider} {listed.offer}, listed {listed.listed} (knowledge/gpu_prices.yaml)"
    return _Type(gpu, gpu.id, gpu.node_gpus, listed.usd_per_gpu_hour, source, asked)


def counts_for(per_node: int, max_gpus: int, one_node: bool) -> list[int]:
    """The counts a sizing asks about: powers of two to a node, then whole nodes (docstring)."""
    cap = min(max_gpus, per_node) if one_node else min(max_gpus, MAX_SIZING_GPUS)
    counts = []
    value = 1
    while value < per_node and value <= cap:
        counts.append(value)
        value *= 2
    nodes = 1
    while nodes * per_node <= cap:
        counts.append(nodes * per_node)
        nodes *= 2
    if cap >= per_node and cap % per_node == 0 and cap not in counts:
        counts.append(cap)
    elif cap < per_node and cap not in counts:
        counts.append(cap)
    return sorted(set(counts))


def _size_type(
    model: ModelSpec,
    brief: TrainingBrief,
    kind: _Type,
    limits: SizingLimits,
    options: SearchOptions | None,
) -> tuple[list[SizingRow], SizingAnswer]:
    """One GPU type's rows, ascending, and its answer (least count, cost-optimal count)."""
    rows: list[SizingRow] = []
    best: SizingRow | None = None
    stopped = "the largest count allowed"
    counts = counts_for(kind.per_node, limits.max_gpus, limits.one_node)
    for count in counts:
        row = size_count(model, brief, kind.gpu, count, kind.per_node, options)
        row = _priced(row, kind.price, limits)
        rows.append(row)
        if row.fit != "does not fit" and (best is None or _unit_cost(row) < _unit_cost(best)):
            best = row
        why = _stop(rows, best, limits)
        if why and count != counts[-1]:
            stopped = why
            break
    least = next((r for r in rows if r.fit != "does not fit"), None)
    answer = SizingAnswer(
        gpu=kind.gpu_id,
        asked=kind.asked,
        gpus_per_node=kind.per_node,
        min_count=least.count if least else None,
        min_setup=least.setup if least else "",
        min_fit=least.fit if least else "does not fit",
        min_free_share=1 - least.memory_share if least and least.memory_share else None,
        cost_optimal_count=best.count if best is not None else None,
        price_per_gpu_hour=kind.price,
        price_source=kind.price_source,
        counts_searched=[r.count for r in rows],
        stopped=stopped,
    )
    return rows, answer


def _unit_cost(row: SizingRow) -> float:
    """What the cost optimum minimizes: GPU-seconds per token, times the price where known."""
    assert row.tokens_per_s
    return row.count * (row.price_per_gpu_hour or 1.0) / row.tokens_per_s


def _stop(rows: list[SizingRow], best: SizingRow | None, limits: SizingLimits) -> str:
    """Why a GPU type stops after ``rows`` ("" to go on), by the rule in the module docstring."""
    if best is None:
        return ""
    past = rows[rows.index(best) + 1 :]
    if len(past) < PATIENCE or not all(r.fit != "does not fit" for r in past):
        return ""
    last = rows[-1]
    if limits.deadline_s is not None and not any(r.meets_deadline for r in rows):
        return ""  # more GPUs may still meet the deadline
    if limits.budget_usd is not None and limits.deadline_s is None and last.meets_budget:
        return ""  # a budget alone asks for the fastest within it
    return (
        f"past the cost optimum ({best.count} GPUs): {PATIENCE} larger counts cost more per token"
    )


def size_count(
    model: ModelSpec,
    brief: TrainingBrief,
    gpu: GPUSpec,
    count: int,
    per_node: int = 8,
    options: SearchOptions | None = None,
) -> SizingRow:
    """One GPU type at one count: the strategy search's pick there, as a sizing row (no price).

    Whole nodes of ``per_node`` past one node; the brief's global batch rounded up to a
    multiple of ``count``.
    """
    nodes = max(1, count // per_node) if count > per_node else 1
    shape = per_node if count > per_node else count
    hardware = _hardware(gpu, nodes, shape, brief)
    trial = _batched(model, hardware, brief)
    row = SizingRow(
        gpu=getattr(gpu, "id", gpu.name),
        count=count,
        nodes=nodes,
        gpus_per_node=shape,
        global_batch_size=trial.batch,
    )
    try:
        memory = search_strategy(model, hardware, trial, options or SearchOptions())
    except InputError as exc:
        return row.model_copy(update={"note": exc.message})
    return _from_plan(row, memory, hardware)


def _hardware(gpu: GPUSpec, nodes: int, per_node: int, brief: TrainingBrief) -> HardwareSpec:
    """A described cluster, as ``parse_hardware`` builds one, with the brief's node facts."""
    link = brief.interconnect or (getattr(gpu, "link", None) if nodes == 1 else None)
    return HardwareSpec(
        source="described",
        nodes=nodes,
        gpus_per_node=per_node,
        gpu=gpu,
        interconnect=link,
        cuda_available=True,
        ram_gb=brief.host_ram_gb,
        nics_per_node=brief.nics_per_node,
        nic_gbps=brief.nic_gbps,
    )


def _batched(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> TrainingBrief:
    """The brief with a global batch that ``hardware``'s GPU count divides (docstring)."""
    world = hardware.world_size
    if brief.global_batch_size is None:
        one = hardware.model_copy(update={"nodes": 1, "gpus_per_node": 1})
        base = default_global_batch(model, one, brief)
    else:
        base = brief.global_batch_size
    batch = max(world, -(-base // world) * world)
    return brief.model_copy(update={"global_batch_size": batch})


def _batch_notes(brief: TrainingBrief, rows: list[SizingRow]) -> list[str]:
    """What each row's global batch is, where it is not the one the request gave."""
    if brief.global_batch_size is None:
        return [
            "global batch not given: each row uses the default for the model's size, rounded "
            "up to a multiple of its GPU count (its global_batch_size)"
        ]
    asked = brief.global_batch_size
    changed = sorted({(r.count, r.global_batch_size) for r in rows if r.global_batch_size != asked})
    if not changed:
        return []
    shown = ", ".join(f"{batch} at {count} GPUs" for count, batch in changed[:4])
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    return [
        f"global batch {asked} does not divide over every count: rounded up to a multiple of "
        f"the GPU count ({shown}{more}); each row's global_batch_size is its batch"
    ]


def fit_level(memory: MemoryPlan, hardware: HardwareSpec) -> tuple[FitLevel, float | None]:
    """The chosen setup's fit level and its share of the GPU (fit_verdict's thresholds)."""
    row = memory.chosen_row
    capacity = capacity_bytes(hardware) or 0
    if row is None or not capacity:
        return "does not fit", None
    share = row.per_gpu_bytes.device_used / capacity
    if not row.fits or memory.binding is not None or share > 1 - MIN_HEADROOM:
        return "does not fit", share
    return ("fits" if share <= 1 - SAFE_HEADROOM else "tight"), share


def _from_plan(row: SizingRow, memory: MemoryPlan, hardware: HardwareSpec) -> SizingRow:
    """The row's setup, fit, speed and offload from the search's plan at this count."""
    fit, share = fit_level(memory, hardware)
    chosen = memory.chosen_row
    if fit == "does not fit" or chosen is None:
        why = memory.binding or "no setup fits"
        return row.model_copy(update={"memory_share": share, "note": why})
    tps = memory.speed.tokens_per_s if memory.speed else None
    band = memory.speed.error_band if memory.speed else None
    err = band.band if band else None
    return row.model_copy(
        update={
            "setup": memory.chosen_label,
            "fit": fit,
            "memory_share": share,
            "tokens_per_s": tps,
            "tokens_per_s_band": (tps * (1 - err), tps * (1 + err)) if tps and err else None,
            "speed_error": err,
            "speed_error_kind": (band.matched or f"{band.kind}: uncalibrated") if band else "",
            "offload": _offload(memory, hardware),
        }
    )


def _offload(memory: MemoryPlan, hardware: HardwareSpec) -> str | None:
    """What the setup keeps in host RAM and how much RAM per node that takes (None: nothing)."""
    row = memory.chosen_row
    if row is None or (row.name not in OFFLOAD_STRATEGIES and not row.cpu_bytes_per_node):
        return None
    ram, assumed = node_ram_bytes(hardware)
    what = "ZeRO offload" if row.name in OFFLOAD_STRATEGIES else "activation offload"
    return (
        f"{what}: needs {row.cpu_bytes_per_node / 1e9:.0f} GB of host RAM per node, of "
        f"{ram / 1e9:g} GB" + (" (assumed: not given)" if assumed else "")
    )


def _priced(row: SizingRow, price: float | None, limits: SizingLimits) -> SizingRow:
    """The row with its price, time and cost for the token budget, and the limits it meets."""
    tps = row.tokens_per_s
    update: dict[str, object] = {"price_per_gpu_hour": price}
    if tps and price:
        update["usd_per_billion_tokens"] = row.count * price * 1e9 / tps / 3600
    if tps and limits.tokens:
        time_s = limits.tokens / tps
        update["time_s"] = time_s
        cost = time_s / 3600 * row.count * price if price else None
        update["cost_usd"] = cost
        if limits.deadline_s is not None:
            update["meets_deadline"] = time_s <= limits.deadline_s
        if limits.budget_usd is not None:
            update["meets_budget"] = cost is not None and cost <= limits.budget_usd
    return row.model_copy(update=update)


def sizing_gpu(name: str, memory_gb: float | None = None) -> GPUSpec:
    """A catalog GPU by name, with another memory size where a part differs (a 96 GB H100)."""
    gpu = find_gpu(name)
    if memory_gb is None or memory_gb == gpu.memory_gb:
        return gpu
    return gpu.model_copy(
        update={
            "id": f"{gpu.id} ({memory_gb:g} GB)",
            "name": f"{gpu.name} ({memory_gb:g} GB)",
            "memory_gb": memory_gb,
        }
    )


__all__ = [
    "MAX_SIZING_GPUS",
    "SizingLimits",
    "counts_for",
    "fit_level",
    "gpu_types",
    "size_count",
    "size_training",
    "sizing_gpu",
]
