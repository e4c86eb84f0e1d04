"""Checks of the request's pinned tensor/pipeline/expert degrees, and the batch-split message.

Megatron-LM's constraints (Narayanan et al. 2021 sec. 3.3), refused with the field that
breaks them before any setup is priced.
"""

from __future__ import annotations

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, ModelSpec, Pins, StrategyName, TrainingBrief
from tools.core.strategies import OFFLOAD_STRATEGIES
from tools.planning.parallel import routed_experts
from tools.planning.search_space import PIPELINE_STRATEGIES
from tools.research.titan_flavors import torchtitan_flavor


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


def drop_expert_pin(model: ModelSpec, pins: Pins) -> tuple[Pins, str | None]:
    """The pins without an expert-parallel degree a dense model cannot have, and the line why.

    An expert split needs routed experts (DeepSpeed-MoE splits them over the data-parallel
    ranks); a dense model has none, so "EP 4" on it plans as if unsaid, and says so. Degree 1
    ("no expert parallelism") is what a dense model runs anyway and stays.
    """
    ep = pins.expert_parallel
    if ep is None or ep == 1 or routed_experts(model) > 1:
        return pins, None
    return pins.model_copy(update={"expert_parallel": None}), dense_expert_line(ep)


def dense_expert_line(ep: int) -> str:
    """The one line for an expert-parallel pin on a dense model (the plan's and the wish's)."""
    return (
        f"expert parallel {ep} not planned: the model has no experts to split (a dense model); "
        "the pin is dropped"
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


def check_split_pins(
    model: ModelSpec,
    hardware: HardwareSpec,
    expert_parallel: int | None,
    context_parallel: int | None,
    model_split: tuple[int | None, int | None] = (None, None),
) -> None:
    """Refuse a pinned expert- or context-parallel degree that cannot run, naming the field.

    Expert parallelism splits a mixture of experts' routed experts (a dense model has none)
    over data-parallel ranks: e divides the experts and the GPUs (DeepSpeed-MoE,
    ``--moe-expert-parallel-size``). Context parallelism splits each sequence over c of the
    GPUs, so c divides them, and beside a tensor or pipeline split only on torchtitan (ring
    attention, for the Llama 3.1 models its flavors build): elsewhere it is DeepSpeed-Ulysses,
    which Megatron-DeepSpeed runs beside data parallelism only (``model_split``: the pinned
    tensor and pipeline degrees).
    """
    ep, cp, world = expert_parallel, context_parallel, hardware.world_size
    experts = routed_experts(model)
    if ep is not None and ep > 1 and experts <= 1:
        raise InputError("expert_parallel", f"{model.name} has no experts to split (a dense model)")
    if ep is not None and ep > 1 and experts % ep:
        raise InputError(
            "expert_parallel", f"{ep} must divide the {experts} routed experts of {model.name}"
        )
    if ep is not None and ep > 1 and world % ep:
        raise InputError(
            "expert_parallel",
            f"{ep} must divide the {world} GPUs (the experts split over data-parallel ranks)",
        )
    if cp is not None and cp < 1:
        raise InputError("context_parallel", "must be at least 1")
    if cp is not None and world % cp:
        raise InputError("context_parallel", f"{cp} must divide the {world} GPUs")
    tp, pp = ((d or 1) for d in model_split)
    if cp is not None and cp > 1 and tp * pp > 1 and torchtitan_flavor(model) is None:
        raise InputError(
            "context_parallel",
            f"context parallel {cp} with tensor x pipeline parallel {tp} x {pp} runs on "
            f"torchtitan's ring attention, for the Llama 3.1 models its flavors build, and "
            f"{model.name} is none of them; its context parallelism is DeepSpeed-Ulysses on "
            "Megatron-DeepSpeed, beside data parallelism only (it refuses Ulysses with "
            "Megatron's sequence parallelism)",
        )
