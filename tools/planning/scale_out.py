"""When nothing fits: the smallest cluster of the same GPU on which some setup would."""

from __future__ import annotations

from tools.core.errors import InputError
from tools.core.schemas import TRAINING_TASKS, HardwareSpec, ModelSpec, TrainingBrief
from tools.core.strategies import MIN_HEADROOM, OFFLOAD_STRATEGIES, STRATEGY_ORDER
from tools.planning.fallbacks import without_framework_wish
from tools.planning.memory import capacity_bytes, estimate_strategy
from tools.planning.parallel import model_parallel_setups
from tools.planning.states import resolve_precision
from tools.research.splits import runs_setup

# How far the search scales a cluster out, in nodes, to name hardware on which something fits.
MAX_NODES_SUGGESTED = 64


def fits_somewhere(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> bool:
    """Does any strategy, or tensor x pipeline split, fit at micro-batch 1 with checkpointing?

    Only the splits the search would run for this request (``runs_setup``): a LoRA job's
    none, a refused framework's none, so that a suggested cluster is one the plan fits on.
    """
    world = hardware.world_size
    limit = (1 - MIN_HEADROOM) * (capacity_bytes(hardware) or 0)
    precision = resolve_precision(brief.precision, hardware)
    names = [n for n in STRATEGY_ORDER if hardware.gpu is not None or n not in OFFLOAD_STRATEGIES]
    # Sharded data parallel only where an allowed framework shards (not "no FSDP or DeepSpeed")
    setups = [(name, 1, 1) for name in names if runs_setup(brief, model, name, 1, 1, 1)]
    if brief.task in TRAINING_TASKS:
        setups += [
            (name, tp, pp)
            for name, tp, pp in model_parallel_setups(model, hardware, list(STRATEGY_ORDER))
            if runs_setup(brief, model, name, tp, pp, 1)
        ]
    for name, tp, pp in setups:
        # The global batch divides by the data-parallel degree world / (t x p), not the world.
        if brief.batch % (world // (tp * pp)):
            continue
        est = estimate_strategy(
            model,
            hardware,
            name,
            task=brief.task,
            precision=precision,
            micro_batch_size=1,
            activation_checkpointing=True,
            seq_len=brief.seq_len,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            gradient_accumulation_steps=brief.batch // (world // (tp * pp)),
        )
        if est.fits and est.per_gpu_bytes.total <= limit:
            return True
    return False


def smallest_fitting(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> str | None:
    """Scale the cluster out (same GPU) until some setup fits with headroom; None if never."""
    if hardware.gpu is None:
        return None
    gpus = max(hardware.gpus_per_node, 8) if hardware.gpus_per_node < 8 else hardware.gpus_per_node
    nodes = 1 if gpus > hardware.gpus_per_node else hardware.nodes * 2
    while nodes <= MAX_NODES_SUGGESTED:
        bigger = hardware.model_copy(update={"nodes": nodes, "gpus_per_node": gpus})
        world = bigger.world_size
        batch = max(world, -(-brief.batch // world) * world)
        trial = brief.model_copy(update={"global_batch_size": batch})
        if fits_somewhere(model, bigger, trial):
            return f"{nodes}x{gpus}x{_gpu_id(hardware.gpu.name)}"
        nodes *= 2
    return None


def _gpu_id(name: str) -> str:
    """The catalog id of a GPU (what a hardware spec names), from its display name."""
    from tools.research.hardware import find_gpu

    try:
        return str(getattr(find_gpu(name), "id", name))
    except InputError:
        return name


def lifted_fit(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> str | None:
    """Where the job fits once the request's framework wish and refusals are lifted, said.

    For a plan on which nothing the request allows fits ("with pytorch ddp", "no FSDP or
    DeepSpeed"): this hardware or the smallest cluster of its GPU where ZeRO, FSDP or a split
    fits. None when the request names no framework, or nothing fits either way.
    """
    if brief.framework is None and not brief.avoid_frameworks:
        return None
    asked = [f"the wish for {brief.framework}"] if brief.framework else []
    asked += (
        [f"the refusal of {', '.join(brief.avoid_frameworks)}"] if brief.avoid_frameworks else []
    )
    free = without_framework_wish(brief).model_copy(update={"avoid_frameworks": []})
    if fits_somewhere(model, hardware, free):
        where = "it fits on this hardware"
    elif (bigger := smallest_fitting(model, hardware, free)) is not None:
        where = f"the same GPU would fit it at {bigger}"
    else:
        return None
    return f"without {' and '.join(asked)}, {where} (with ZeRO or FSDP sharding, or a split)"
