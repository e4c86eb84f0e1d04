"""The graph's own state: the plan's parts as JSON-able dicts, so checkpoints serialise plainly."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict


def merge_dicts(left: dict[str, str] | None, right: dict[str, str] | None) -> dict[str, str]:
    """Reducer: later roles add their notes without erasing earlier ones."""
    return {**(left or {}), **(right or {})}


class PlanState(TypedDict, total=False):
    """One plan's state; keys mirror TrainingPlan (tools/core/schemas.py)."""

    # The input: a free-text request or a brief (the other None), and the fields the caller
    # fixed (CLI flags such as --hardware), which win over what intake reads or is told.
    request: str | None
    brief: dict[str, Any] | None
    overrides: dict[str, Any] | None
    out_dir: str | None
    hardware: dict[str, Any] | None
    model: dict[str, Any] | None
    framework: dict[str, Any] | None
    memory: dict[str, Any] | None
    deepspeed_config: dict[str, Any] | None
    launch: dict[str, Any] | None
    speed: dict[str, Any] | None
    smoke_test: dict[str, Any] | None
    review: dict[str, Any] | None
    review_round: int
    report: dict[str, Any] | None
    plan: dict[str, Any] | None
    narrative: Annotated[dict[str, str], merge_dicts]
    notes: Annotated[list[str], operator.add]
