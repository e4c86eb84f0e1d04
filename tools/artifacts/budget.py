"""Time to train and cost as values for a plan's headline: hours, GPU-hours and money.

From the speed model's time to train (``SpeedEstimate.time_to_train_s``: the brief's
``dataset_tokens`` over the chosen setup's tokens/s), the GPUs the plan uses and the price per
GPU-hour the plan's scaling section states (the brief's ``price_per_gpu_hour``, else the cited
list price of the GPU, tools/research/prices.py), with where that price came from; a plan
without that section uses the brief's price. Without ``dataset_tokens`` the line gives tokens/s
and the cost of a billion tokens instead. Whatever is missing is named as the field to give,
never left as a formula for the reader to work out.
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


def _price(brief: dict[str, Any], scaling: dict[str, Any]) -> tuple[float | None, str, str]:
    """(price per GPU-hour, its unit as written, where it came from) from a plan's parts."""
    if scaling.get("price_source") and scaling.get("price_per_gpu_hour"):
        currency = scaling.get("currency")
        unit = f"{currency} per GPU-hour" if currency else "per GPU-hour"
        return float(scaling["price_per_gpu_hour"]), unit, str(scaling["price_source"])
    price = brief.get("price_per_gpu_hour")
    return (
        (float(price), "per GPU-hour", "the brief's price_per_gpu_hour")
        if price
        else (None, "", "")
    )


def _money(value: float, unit: str) -> str:
    """An amount with the price's currency when it has one ("5,085 USD")."""
    currency = unit.removesuffix("per GPU-hour").strip()
    return f"{_amount(value)} {currency}" if currency else _amount(value)


def per_billion_tokens(tokens_per_s: float, gpus: int, price: float) -> float:
    """What a billion tokens cost: GPUs x the hours a billion tokens take x the price."""
    return gpus * (1e9 / tokens_per_s / 3600) * price


def plan_budget(plan: TrainingPlan) -> Budget | None:
    """The time to train and cost of ``plan``'s chosen setup (None: nothing is trained)."""
    if plan.memory is None or plan.model is None:
        return None
    brief, speed, hw = plan.brief, plan.speed, plan.hardware
    price, unit, source = _price(
        brief.model_dump(include={"price_per_gpu_hour"}), plan.scaling.model_dump()
    )
    at = f"at {price:g} {unit} ({source})" if price else ""
    if speed is None or speed.tokens_per_s is None:
        why = "no GPU speed model for a CPU-only machine" if hw.gpu is None else "no step time"
        return Budget(None, None, None, f"**Time to train:** unknown ({why}).")
    rate = f"{speed.tokens_per_s:,.0f} tokens/s"
    gpus = hw.nodes * hw.gpus_per_node
    if brief.dataset_tokens is None or speed.time_to_train_s is None:
        per_billion = (
            f"{_money(per_billion_tokens(speed.tokens_per_s, gpus, price), unit)} per billion "
            f"tokens {at}; give dataset_tokens for the total."
            if price
            else "give dataset_tokens and price_per_gpu_hour."
        )
        return Budget(
            None,
            None,
            None,
            f"**Time to train:** give dataset_tokens (tokens to train on); the setup runs "
            f"{rate}, {speed.step_time_s or 0:.2f} s per step. **Cost:** {per_billion}",
        )
    hours = speed.time_to_train_s / 3600
    gpu_hours = hours * gpus
    time_text = (
        f"**Time to train:** {_hours(hours)}, {gpu_hours:,.0f} GPU-hours on {gpus} GPU(s) "
        f"({_tokens(brief.dataset_tokens)} tokens at {rate})."
    )
    if price is None:
        return Budget(hours, gpu_hours, None, f"{time_text} **Cost:** give price_per_gpu_hour.")
    cost = gpu_hours * price
    return Budget(hours, gpu_hours, cost, f"{time_text} **Cost:** {_money(cost, unit)} {at}.")


def budget_line(plan: dict[str, Any]) -> str | None:
    """The budget as one terminal line, from a plan's contract JSON (None: nothing to state).

    Without dataset_tokens but with a price, the line gives tokens/s and the cost of a billion
    tokens; without either, or without a throughput, there is no line.

    The same values as the report's headline (``plan_budget``), for the CLI and chat summary.
    """
    brief, speed, hw = plan.get("brief") or {}, plan.get("speed") or {}, plan.get("hardware") or {}
    seconds, tokens = speed.get("time_to_train_s"), brief.get("dataset_tokens")
    price, unit, source = _price(brief, plan.get("scaling") or {})
    gpus = int(hw.get("nodes") or 1) * int(hw.get("gpus_per_node") or 0)
    rate = speed.get("tokens_per_s")
    if not rate:
        return None
    if not seconds or not tokens:
        if not price or not gpus:
            return None
        return (
            f"time to train: give dataset_tokens (the setup runs {rate:,.0f} tokens/s); cost "
            f"{_money(per_billion_tokens(rate, gpus, price), unit)} per billion tokens at "
            f"{price:g} {unit} ({source})"
        )
    hours = seconds / 3600
    gpu_hours = hours * gpus
    cost = (
        f"cost {_money(gpu_hours * price, unit)} at {price:g} {unit} ({source})"
        if price
        else "cost: give price_per_gpu_hour"
    )
    return (
        f"time to train: {_hours(hours)}, {gpu_hours:,.0f} GPU-hours "
        f"({_tokens(tokens)} tokens at {speed['tokens_per_s']:,.0f} tokens/s); {cost}"
    )
