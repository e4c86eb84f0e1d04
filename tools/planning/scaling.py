"""Time and cost at other cluster sizes of the plan's GPU: the smallest that fits, the fastest.

The planner's own chooser (``search_strategy``) picks the setup at each size; this module only
chooses which sizes to ask about and does the arithmetic of time and money:

- sizes: the plan's cluster, then twice and four times its nodes, and downwards by halves (GPUs
  of one node 1, 2, 4, ..., then 1, 2, 4, ... nodes) to the smallest that fits, plus the first
  that does not; at most ``MAX_SIZES`` rows, so a plan stays about a second.
- at a size the plan's global batch does not divide, the batch is rounded up to a multiple of
  the GPU count (as ``scale_out.smallest_fitting`` does), and the row says which batch it used.
- hours = dataset_tokens / tokens_per_s / 3600; GPU-hours = GPUs x hours; cost = GPU-hours x
  price per GPU-hour; cost per billion tokens = GPUs x (1e9 / tokens_per_s / 3600) x price.
  (The definition of a GPU-hour as billed by the hour per GPU: every provider of
  knowledge/gpu_prices.yaml lists its price per GPU per hour.)
"""

from __future__ import annotations

from tools.core.errors import InputError
from tools.core.schemas import (
    TRAINING_TASKS,
    HardwareSpec,
    MemoryPlan,
    ModelSpec,
    ScalingPlan,
    ScalingRow,
    SpeedEstimate,
    TrainingBrief,
)
from tools.planning.batch import resolve_batch
from tools.planning.scale_out import fits_somewhere
from tools.planning.search import search_strategy
from tools.research.hardware import find_gpu
from tools.research.prices import plan_price

# The most cluster sizes one plan asks about (each is one strategy search, ~0.01-1 s).
MAX_SIZES = 8
# How far above the plan's cluster the table goes, in multiples of its nodes.
UPSCALE = 4
NO_GPU_NOTE = (
    "no scaling table: this is a CPU-only machine, and the speed model needs a GPU's peak "
    "FLOP/s, so no other cluster sizes were estimated"
)


def plan_scaling(
    model: ModelSpec | None,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    memory: MemoryPlan | None,
    speed: SpeedEstimate | None,
) -> ScalingPlan:
    """The plan's time and cost at its own size and at other sizes of the same GPU.

    Args:
        model: The architecture (None: nothing is trained).
        hardware: The plan's machine or cluster.
        brief: The plan's brief (its dataset_tokens, price_per_gpu_hour and global batch).
        memory: The plan's memory plan: its chosen setup is the row of the plan's own size.
        speed: The speed estimate of that setup.

    Returns:
        Rows ordered by GPU count, the price used and its source, and the GPU counts of the
        smallest and the fastest size that fit; no rows (with a note) when there is no GPU,
        nothing is trained, or the GPU has no speed figures.
    """
    price = plan_price(brief, hardware.gpu)
    empty = ScalingPlan(
        price_per_gpu_hour=price.price_per_gpu_hour if price else None,
        currency=price.currency if price else None,
        price_source=price.source if price else "",
        dataset_tokens=brief.dataset_tokens,
    )
    if hardware.gpu is None or hardware.gpus_per_node == 0:
        return empty.model_copy(update={"notes": [NO_GPU_NOTE]})
    if model is None or memory is None or brief.task not in TRAINING_TASKS:
        return empty.model_copy(update={"notes": ["no scaling table: nothing is trained"]})
    if speed is None or speed.tokens_per_s is None:
        return empty.model_copy(
            update={
                "notes": [
                    f"no scaling table: {hardware.gpu.name} has no peak FLOP/s in the GPU "
                    "catalog, so the speed model gives no tokens/s"
                ]
            }
        )
    if brief.global_batch_size is None:
        brief = resolve_batch(brief, model, hardware)[0]
    rows = [
        _row(empty, hardware, brief.batch, memory, speed, chosen=True)
        if size == (hardware.nodes, hardware.gpus_per_node)
        else _searched(empty, model, _resized(hardware, brief, *size), brief)
        for size in _sizes(model, hardware, brief)
    ]
    fitting = [r for r in rows if r.fits and r.tokens_per_s]
    notes = []
    if any(r.global_batch_size != brief.batch for r in rows):
        notes.append(
            f"at sizes the global batch of {brief.batch} does not divide, it is rounded up to a "
            "multiple of the GPU count (each row's global_batch_size in plan.json)"
        )
    if not fitting:
        notes.append(f"nothing fits up to {UPSCALE}x the plan's nodes")
    return empty.model_copy(
        update={
            "rows": rows,
            "smallest_gpus": fitting[0].gpus if fitting else None,
            "fastest_gpus": max(fitting, key=lambda r: r.tokens_per_s or 0).gpus
            if fitting
            else None,
            "notes": notes,
        }
    )


def _sizes(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> list[tuple[int, int]]:
    """(nodes, GPUs per node) to ask about, ascending: see the module docstring."""
    nodes, per_node = hardware.nodes, hardware.gpus_per_node
    below = [(1, g) for g in _halvings(per_node)] + [(n, per_node) for n in _halvings(nodes)]
    below = sorted(set(below) - {(nodes, per_node)}, key=lambda s: s[0] * s[1], reverse=True)
    smaller: list[tuple[int, int]] = []
    for size in below:
        smaller.insert(0, size)
        if not fits_somewhere(model, _resized(hardware, brief, *size), _batched(brief, *size)):
            break  # the first size that does not fit ends the table's lower end
    above = [(nodes * k, per_node) for k in (2, UPSCALE) if k <= UPSCALE]
    sizes = [*smaller, (nodes, per_node), *above]
    while len(sizes) > MAX_SIZES and len(smaller) > 2:
        # Keep the two smallest (the first that does not fit and the smallest that fits).
        sizes.remove(smaller.pop(2))
    return sizes[:MAX_SIZES] if len(sizes) > MAX_SIZES else sizes


def _halvings(count: int) -> list[int]:
    """1, 2, 4, ... below ``count`` (powers of two), and ``count`` itself."""
    powers = []
    value = 1
    while value < count:
        powers.append(value)
        value *= 2
    return [*powers, count]


def _batched(brief: TrainingBrief, nodes: int, per_node: int) -> TrainingBrief:
    """The brief with its global batch rounded up to a multiple of this size's GPU count."""
    world = nodes * per_node
    batch = max(world, -(-brief.batch // world) * world)
    return brief if batch == brief.batch else brief.model_copy(update={"global_batch_size": batch})


def _resized(
    hardware: HardwareSpec, brief: TrainingBrief, nodes: int, per_node: int
) -> HardwareSpec:
    """The plan's hardware at another size, with the link ``parse_hardware`` would give it.

    Between nodes: the network the brief names, else unknown; inside one node: the brief's
    network or the GPU's own link (tools/research/hardware.py parse_hardware).
    """
    if (nodes, per_node) == (hardware.nodes, hardware.gpus_per_node):
        return hardware
    link = brief.interconnect or (_gpu_link(hardware) if nodes == 1 else None)
    return hardware.model_copy(
        update={"nodes": nodes, "gpus_per_node": per_node, "interconnect": link}
    )


def _gpu_link(hardware: HardwareSpec) -> str | None:
    """The catalog's link between the GPUs of one node (nvlink, infinity_fabric or pcie)."""
    if hardware.gpu is None:
        return None
    try:
        return find_gpu(hardware.gpu.name).link
    except InputError:  # a GPU the catalog does not know: what the plan's hardware said
        return hardware.interconnect if hardware.nodes == 1 else None


def _searched(
    base: ScalingPlan, model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief
) -> ScalingRow:
    """The row of one other size: the chooser's setup there, if anything fits."""
    trial = _batched(brief, hardware.nodes, hardware.gpus_per_node)
    empty = ScalingRow(
        nodes=hardware.nodes,
        gpus_per_node=hardware.gpus_per_node,
        gpus=hardware.world_size,
        global_batch_size=trial.batch,
        fits=False,
    )
    if not fits_somewhere(model, hardware, trial):
        return empty
    try:
        memory = search_strategy(model, hardware, trial)
    except InputError:
        return empty  # e.g. a pinned degree this size cannot hold
    if memory.speed is None:
        return empty
    return _row(base, hardware, trial.batch, memory, memory.speed)


def _row(
    base: ScalingPlan,
    hardware: HardwareSpec,
    batch: int,
    memory: MemoryPlan,
    speed: SpeedEstimate,
    *,
    chosen: bool = False,
) -> ScalingRow:
    """A row from a memory plan and its speed, with time and cost where known."""
    chosen_row = memory.chosen_row
    fits = chosen_row is not None and chosen_row.fits and memory.binding is None
    gpus = hardware.world_size
    tps = speed.tokens_per_s if fits else None
    price, tokens = base.price_per_gpu_hour, base.dataset_tokens
    hours = tokens / tps / 3600 if tps and tokens else None
    return ScalingRow(
        nodes=hardware.nodes,
        gpus_per_node=hardware.gpus_per_node,
        gpus=gpus,
        global_batch_size=batch,
        fits=fits,
        chosen=chosen,
        setup=memory.chosen_label if fits else "",
        strategy=memory.chosen if fits else None,
        tensor_parallel=memory.tensor_parallel,
        pipeline_parallel=memory.pipeline_parallel,
        micro_batch_size=memory.micro_batch_size if fits else None,
        gradient_accumulation_steps=memory.gradient_accumulation_steps if fits else None,
        activation_checkpointing=memory.activation_checkpointing,
        tokens_per_s=tps,
        mfu=speed.mfu if fits else None,
        hours=hours,
        cost=gpus * hours * price if hours is not None and price else None,
        cost_per_billion_tokens=gpus * (1e9 / tps / 3600) * price if tps and price else None,
    )
