"""Time to train and cost as values for a plan's headline: hours, GPU-hours and money.

From the speed model's time to train (``SpeedEstimate.time_to_train_s``: the brief's
``dataset_tokens`` over the chosen setup's tokens/s), the GPUs the plan uses and the brief's
``price_per_gpu_hour``. Whatever is missing is named as the field to give, never left as a
formula for the reader to work out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.core.schemas import TrainingPlan


@dataclass(frozen=True)
class Budget:
    """The headline's numbers (None where unknown) and the line that states them."""

    hours: float | None
    gpu_hours: float | None
    cost: float | None
    text: str


def _hours(hours: float) -> str:
    if hours < 1:
        return f"{hours * 60:.0f} min"
    text = f"{hours:,.1f} h"
    return text + (f" ({hours / 24:,.1f} days)" if hours >= 48 else "")


def _tokens(value: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:,.0f}"


def _amount(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"


def plan_budget(plan: TrainingPlan) -> Budget | None:
    """The time to train and cost of ``plan``'s chosen setup (None: nothing is trained)."""
    if plan.memory is None or plan.model is None:
        return None
    brief, speed, hw = plan.brief, plan.speed, plan.hardware
    price = brief.price_per_gpu_hour
    if speed is None or speed.tokens_per_s is None:
        why = "no GPU speed model for a CPU-only machine" if hw.gpu is None else "no step time"
        return Budget(None, None, None, f"**Time to train:** unknown ({why}).")
    rate = f"{speed.tokens_per_s:,.0f} tokens/s"
    if brief.dataset_tokens is None or speed.time_to_train_s is None:
        return Budget(
            None,
            None,
            None,
            f"**Time to train:** give dataset_tokens (tokens to train on); the setup runs "
            f"{rate}, {speed.step_time_s or 0:.2f} s per step. **Cost:** give dataset_tokens"
            + ("." if price else " and price_per_gpu_hour."),
        )
    hours = speed.time_to_train_s / 3600
    gpus = hw.nodes * hw.gpus_per_node
    gpu_hours = hours * gpus
    time_text = (
        f"**Time to train:** {_hours(hours)}, {gpu_hours:,.0f} GPU-hours on {gpus} GPU(s) "
        f"({_tokens(brief.dataset_tokens)} tokens at {rate})."
    )
    if price is None:
        return Budget(hours, gpu_hours, None, f"{time_text} **Cost:** give price_per_gpu_hour.")
    cost = gpu_hours * price
    return Budget(
        hours,
        gpu_hours,
        cost,
        f"{time_text} **Cost:** {_amount(cost)} at {price:g} per GPU-hour.",
    )


def budget_line(plan: dict[str, Any]) -> str | None:
    """The budget as one terminal line, from a plan's contract JSON (None: no time to train).

    The same values as the report's headline (``plan_budget``), for the CLI and chat summary.
    """
    brief, speed, hw = plan.get("brief") or {}, plan.get("speed") or {}, plan.get("hardware") or {}
    seconds, tokens = speed.get("time_to_train_s"), brief.get("dataset_tokens")
    if not seconds or not tokens or not speed.get("tokens_per_s"):
        return None
    hours = seconds / 3600
    gpu_hours = hours * int(hw.get("nodes") or 1) * int(hw.get("gpus_per_node") or 0)
    price = brief.get("price_per_gpu_hour")
    cost = (
        f"cost {_amount(gpu_hours * price)} at {price:g} per GPU-hour"
        if price
        else "cost: give price_per_gpu_hour"
    )
    return (
        f"time to train: {_hours(hours)}, {gpu_hours:,.0f} GPU-hours "
        f"({_tokens(tokens)} tokens at {speed['tokens_per_s']:,.0f} tokens/s); {cost}"
    )
