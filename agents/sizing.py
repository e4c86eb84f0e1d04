"""Intake's sizing step: a request that asks what hardware it needs gets the sizing, and a plan.

A free-text request that asks a sizing question (tools/intake/sizing_text.py: "how many A100
40GB do I need", "which GPUs", "cheapest ... within 30 days", "需要多少张") and states no GPU
count is sized (tools/planning/sizing.py) over the priced GPU types and any type it names,
under the limits it states; the plan is then made for the sizing's pick (the cheapest within
the deadline, the fastest within a budget alone), so the answer comes with the full plan of
the chosen row. When nothing meets the limits, the plan is for the closest row and says
which limit binds and by how much. A GPU count the request states, or ``--hardware``, keeps
its hardware: then a deadline or budget stays a wish of that plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tools.core.request_account import mark_wish
from tools.core.schemas import SizingPlan, SizingRow, TrainingBrief
from tools.intake.hardware_text import HARDWARE_ASSUMED, HARDWARE_UNCLEAR
from tools.intake.sizing_text import SizingAsk, sizing_question

DAY_S = 86_400.0
_NO_COUNT = "no GPU count given"


@dataclass
class Sizing:
    """The sizing a request asked for: the plan's hardware and what intake says about it."""

    plan: SizingPlan
    hardware: str
    notes: list[str] = field(default_factory=list)


def sizing_ask(
    text: str, fields: Mapping[str, Any], overrides: Mapping[str, Any]
) -> SizingAsk | None:
    """The sizing question a request asks, unless its hardware is fixed (a count, --hardware)."""
    if "hardware" in overrides or not text:
        return None
    assumed = " ".join(fields.get(HARDWARE_ASSUMED) or [])
    count_given = "hardware" in fields and _NO_COUNT not in assumed
    return sizing_question(text, count_given)


def trains(fields: Mapping[str, Any]) -> bool:
    """Whether the request trains (a sizing is for training; the default task is finetune)."""
    return fields.get("task", "finetune") in ("pretrain", "finetune", "lora")


def not_sized(ask: SizingAsk, task: str) -> str:
    """The note for a sizing question of a task the sizing does not answer."""
    return (
        f"intake: the request asks a sizing question ({ask.words!r}); sizing is for training, "
        f"so this {task} plan uses the hardware the request names (or the default)"
    )


def drop_unclear(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields without what a sizing settles: "GPUs named, but no type or count"."""
    out = dict(fields)
    out.pop(HARDWARE_UNCLEAR, None)
    out[HARDWARE_ASSUMED] = [n for n in out.get(HARDWARE_ASSUMED) or [] if _NO_COUNT not in n]
    return out


def run_sizing(ask: SizingAsk, brief: TrainingBrief, gpu: str | None) -> Sizing:
    """Size the brief's training under the question's limits; the plan's hardware and notes."""
    from tools.planning.sizing import MAX_SIZING_GPUS, SizingLimits, size_training
    from tools.research.model_catalog import brief_model

    assert brief.model is not None
    model = brief_model(brief)
    limits = SizingLimits(
        tokens=brief.dataset_tokens,
        deadline_s=ask.deadline_s,
        budget_usd=ask.budget_usd,
        asked=(gpu,) if gpu else (),
        max_gpus=ask.max_gpus or MAX_SIZING_GPUS,
        one_node=ask.one_node,
    )
    plan = size_training(model, brief, limits)
    row, why = _planned_row(plan)
    notes = [f"intake: sizing question ({ask.words!r}): {why}", *ask.notes]
    if plan.binding is not None:
        notes.append(f"intake: nothing meets the request's limits: {plan.binding.text}")
    if not brief.dataset_tokens:
        notes.append(
            "intake: no token count in the request ('on 1T tokens'): the sizing ranks by cost "
            "per token, without time or cost"
        )
    hardware = f"{row.nodes}x{row.gpus_per_node}x{row.gpu}" if row else brief.hardware
    return Sizing(plan, hardware, notes)


def _planned_row(plan: SizingPlan) -> tuple[SizingRow | None, str]:
    """The row the plan is made for, and why: the pick, else the closest fitting row."""
    if plan.pick is not None:
        what = "fastest within the budget" if plan.objective == "fastest" else "cheapest"
        if plan.deadline_s is not None:
            what += " within the deadline"
        return plan.pick, f"planned for the sizing's pick, {_row(plan.pick)} ({what})"
    asked = {a.gpu for a in plan.answers if a.asked}
    fitting = [r for r in plan.rows if r.fit != "does not fit" and r.tokens_per_s]
    pool = [r for r in fitting if r.gpu in asked] or fitting
    if not pool:
        return None, "nothing fits any GPU type sized; the plan keeps the request's hardware"
    constraint = plan.binding.constraint if plan.binding else ""
    if constraint == "deadline":
        row = max(pool, key=lambda r: r.tokens_per_s or 0)
        return row, f"no row meets the deadline: planned for the fastest, {_row(row)}"
    row = min(pool, key=lambda r: (r.cost_usd or float("inf"), r.count))
    return row, f"no row meets the limits: planned for the cheapest, {_row(row)}"


def _row(row: SizingRow) -> str:
    return f"{row.count} x {row.gpu} ({row.nodes}x{row.gpus_per_node}, {row.setup})"


def account_sizing(
    account: dict[str, Any] | None, sizing: Sizing, ask: SizingAsk
) -> dict[str, Any] | None:
    """The request's accounting with the sizing's hardware, and its deadline and budget decided."""
    if account is None:
        return None
    acc = dict(account)
    reads = [dict(r) for r in acc.get("read") or []]
    why = sizing.notes[0].removeprefix("intake: ")
    for r in reads:
        if r.get("field") == "hardware":
            r["value"] = sizing.hardware
    acc["read"] = reads
    # The count (and the type, unless the words named one) is the sizing's, not the words'.
    assumed = [a for a in acc.get("assumed") or [] if a.get("field") != "hardware"]
    assumed.append({"field": "hardware", "value": sizing.hardware, "why": why})
    acc["assumed"] = assumed
    pick, binding = sizing.plan.pick, sizing.plan.binding
    unchecked = "not checked: the request gives no token count ('on 1T tokens'), so no {}"
    if ask.deadline_words is not None:
        met = pick is not None and pick.meets_deadline is True
        if met and pick is not None and pick.time_s is not None:
            how = f"the sizing's pick takes {pick.time_s / DAY_S:.1f} days"
        elif ask.deadline_s is None:
            how = f"not checked: no duration read from {ask.deadline_words!r}"
        else:
            how = binding.text if binding else unchecked.format("time to check")
        acc = mark_wish(acc, "deadline", met, how) or acc
    if ask.budget_words is not None:
        met = pick is not None and pick.meets_budget is True
        if met and pick is not None and pick.cost_usd is not None:
            how = f"the sizing's pick costs ${pick.cost_usd:,.0f}"
        else:
            how = binding.text if binding else unchecked.format("cost to check")
        acc = mark_wish(acc, "money-budget", met, how) or acc
    return acc
