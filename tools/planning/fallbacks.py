"""The searches a plan falls back on when nothing the request's first search allows fits.

A named framework none of whose setups fits (``framework_fallback``), and a model Megatron-
DeepSpeed cannot build as it is when only its splits fit (``inexact_fallback``): each runs the
search again with the restriction lifted and says so under "Not as asked". ``search`` is
tools/planning/search.py's search of one brief (its batch, recipe and pins settled).
"""

from __future__ import annotations

from collections.abc import Callable

from tools.core.schemas import HardwareSpec, MemoryPlan, ModelSpec, TrainingBrief
from tools.core.units import gb_text
from tools.planning.options import SearchOptions
from tools.research.megatron_arch import megatron_excluded
from tools.research.splits import setup_framework

# One search of a brief with options (the caller's model and hardware).
Search = Callable[[TrainingBrief, SearchOptions], MemoryPlan]


def inexact_fallback(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    plan: MemoryPlan,
    options: SearchOptions,
    search: Search,
) -> MemoryPlan:
    """When nothing fits without Megatron's splits, the search with them, said so.

    A model Megatron-DeepSpeed cannot build as it is (tools/research/megatron_arch.py) keeps
    off the splits only it runs; when no other setup fits, a plan that trains a model which
    differs where it says beats none, and "Not as asked" says so (the launch notes say what
    differs).
    """
    row = plan.chosen_row
    if options.inexact_megatron or row is None or row.fits or hardware.gpu is None:
        return plan
    if brief.framework == "megatron" or megatron_excluded(model, brief.loads_weights) is None:
        return plan
    wider = search(brief, options.but(inexact_megatron=True))
    wide_row = wider.chosen_row
    if wide_row is None or not wide_row.fits or setup_framework(model, wider) != "megatron":
        return plan
    note = (
        f"no setup whose launch builds {model.name} as it is fits: its smallest, {row.label}, "
        f"needs {gb_text(row.per_gpu_bytes.total)} per GPU; planned {wide_row.label} on "
        "Megatron-DeepSpeed, which fits but does not build it as it is (the launch notes say "
        "what differs)"
    )
    return not_as_asked(wider, note)


def framework_fallback(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    plan: MemoryPlan,
    options: SearchOptions,
    search: Search,
) -> MemoryPlan:
    """When no setup the named framework runs fits, the search without that wish, said so.

    The request's refusals still hold; when nothing fits without the wish either, the plan
    keeps it. Megatron runs every split, so a Megatron wish never needs this.
    """
    wished, row = brief.framework, plan.chosen_row
    if wished in (None, "megatron") or row is None or row.fits or hardware.gpu is None:
        return plan
    free = search(without_framework_wish(brief), options)
    needed, free_row = setup_framework(model, free), free.chosen_row
    if free_row is None or not free_row.fits:
        return plan
    on = f" on {needed}" if needed else ""
    note = (
        f"{wished} was asked for, but no setup it runs fits: its smallest, {row.label}, "
        f"needs {gb_text(row.per_gpu_bytes.total)} per GPU; planned {free_row.label}{on} "
        "instead, which fits"
    )
    return not_as_asked(free, note)


def without_framework_wish(brief: TrainingBrief) -> TrainingBrief:
    """The brief without its framework wish.

    The recipe's framework is the wished one's (tools/core/brief_types.py): it goes with it, so
    memory is priced for what runs instead.
    """
    recipe = brief.recipe.model_copy(update={"framework": None}) if brief.recipe else None
    return brief.model_copy(update={"framework": None, "recipe": recipe})


def not_as_asked(plan: MemoryPlan, note: str) -> MemoryPlan:
    """The plan with ``note`` first under its assumptions and under "Not as asked"."""
    return plan.model_copy(
        update={
            "assumptions": [note, *plan.assumptions],
            "not_honoured": [note, *plan.not_honoured],
        }
    )
