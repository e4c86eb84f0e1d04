"""Checks of the request's pinned tensor/pipeline degrees, and the batch-split message.

Megatron-LM's constraints (Narayanan et al. 2021 sec. 3.3), refused with the field that
breaks them before any setup is priced.
"""

from __future__ import annotations

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, ModelSpec, StrategyName, TrainingBrief
from tools.core.strategies import OFFLOAD_STRATEGIES
from tools.planning.search_space import PIPELINE_STRATEGIES


def batch_message(
    brief: TrainingBrief, hardware: HardwareSpec, dp: int | None = None, step: int | None = None
) -> str:
    """Why the global batch cannot be split, with the nearest batches that can.

    ``dp``: the pinned layout's data-parallel degree; ``step``: the fewest data-parallel ranks
    any layout leaves, whose multiples split (default: the world size).
    """
    world = hardware.world_size
    step = dp or step or world
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
    the attention heads and key-value heads, p at most the layers (uneven stages where it does
    not divide them, tools/planning/parallel.py ``pipeline_split``), t x p dividing the GPUs, and
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
    if pp > model.layers:
        raise InputError(
            "pipeline_parallel",
            f"{pp} stages exceed the {model.layers} layers of {model.name} (each stage needs one)",
        )
    if world % (tp * pp):
        raise InputError(
            "pipeline_parallel" if pipeline_parallel else "tensor_parallel",
            f"tensor x pipeline = {tp * pp} must divide the {world} GPUs",
        )
    if (tensor_parallel or pipeline_parallel) and brief.batch % (world // (tp * pp)):
        raise InputError("global_batch_size", batch_message(brief, hardware, world // (tp * pp)))
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
