"""The graph's own state: a narrow input, the work products while a plan is made, the plan once.

Every value is a JSON-able dict, so checkpoints serialise plainly; the types behind them are the
plan contract (tools/core/schemas.py). The reporter replaces the work products with the
assembled ``plan``.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict


def merge_dicts(left: dict[str, str] | None, right: dict[str, str] | None) -> dict[str, str]:
    """Reducer: later roles add their notes without erasing earlier ones."""
    return {**(left or {}), **(right or {})}


class PlanInput(TypedDict, total=False):
    """What a caller gives the graph.

    A free-text request or a brief (the other None), the fields the caller fixed (CLI flags
    such as --hardware, which win over what intake reads or is told), where files go, and
    whether to run a smoke test (``smoke``: a flag like ``overrides``' own; the served graph
    runs one only when the input asks, agents/intake.py).
    """

    request: str | None
    brief: dict[str, Any] | None
    overrides: dict[str, Any] | None
    out_dir: str | None
    smoke: bool | None


class PlanState(PlanInput, total=False):
    """One plan's state: the input, the work products (keys as in TrainingPlan), the plan."""

    hardware: dict[str, Any] | None
    model: dict[str, Any] | None
    framework: dict[str, Any] | None
    memory: dict[str, Any] | None
    deepspeed_config: dict[str, Any] | None
    launch: dict[str, Any] | None
    speed: dict[str, Any] | None
    smoke_test: dict[str, Any] | None
    review: dict[str, Any] | None
    inference: dict[str, Any] | None
    # The researcher's strategy search, which the engineer reuses (agents/workspace.py).
    searched: dict[str, Any] | None
    review_round: int
    plan: dict[str, Any] | None
    narrative: Annotated[dict[str, str], merge_dicts]
    notes: Annotated[list[str], operator.add]
    # A sizing question's answer (plan JSON ``sizing``, agents/sizing.py), from intake to the plan.
    sizing: dict[str, Any] | None
    # The request's words accounted for (tools/core/request_account.py), from intake to the plan.
    request_account: dict[str, Any] | None
