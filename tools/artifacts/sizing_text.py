"""The sizing in words: the three answers (how many X, which GPUs, the pick) for the terminal.

``sizing_lines`` writes what ``app.py size`` prints and what a plan's summary shows for a sizing
question; the report's table and chart are tools/artifacts/report.py's and charts.py's.
"""

from __future__ import annotations

from typing import Any

from tools.core.schemas import SizingAnswer, SizingPlan, SizingRow

DAY_S = 86_400.0


def duration_text(seconds: float | None) -> str:
    """A training time: minutes, hours below two days, else days ("-" when unknown)."""
    if seconds is None:
        return "-"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * DAY_S:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / DAY_S:.1f} days"


def tokens_text(tokens: float) -> str:
    """A token count with its scale: 1B, 300B, 1.5T."""
    for scale, word in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if tokens >= scale:
            return f"{tokens / scale:,.3g}{word}"
    return f"{tokens:,.0f}"


def usd_text(value: float | None) -> str:
    """Dollars, whole above 100 ("-" when unknown)."""
    if value is None:
        return "-"
    return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"


def row_text(row: SizingRow) -> str:
    """One row in a line: count x GPU (nodes), setup, speed, time, cost, fit."""
    shape = f"{row.nodes} nodes x {row.gpus_per_node}" if row.nodes > 1 else "one node"
    band = f" (+-{_band(row):.0%}, {row.speed_error_kind})" if row.tokens_per_s_band else ""
    if row.tokens_per_s and not row.tokens_per_s_band:
        band = f" ({row.speed_error_kind or 'uncalibrated'})"
    tps = f"{row.tokens_per_s:,.0f} tokens/s{band}" if row.tokens_per_s else "no speed"
    parts = [f"{row.count} x {row.gpu} ({shape}), {row.setup or 'nothing fits'}", tps]
    if row.time_s is not None:
        parts.append(duration_text(row.time_s))
    if row.cost_usd is not None:
        parts.append(usd_text(row.cost_usd))
    parts.append(row.fit)
    if row.offload:
        parts.append(row.offload)
    return ", ".join(parts)


def _band(row: SizingRow) -> float:
    assert row.tokens_per_s_band and row.tokens_per_s
    return row.tokens_per_s_band[1] / row.tokens_per_s - 1


def _how_many(plan: SizingPlan, answer: SizingAnswer) -> str:
    """The "how many X" line: the least count with its margin, and the cost-optimal count."""
    if answer.min_count is None:
        last = answer.counts_searched[-1] if answer.counts_searched else 0
        return f"How many {answer.gpu}: nothing fits on up to {last}"
    free = f", {answer.min_free_share:.0%} of the GPU free" if answer.min_free_share else ""
    line = (
        f"How many {answer.gpu}: at least {answer.min_count} ({answer.min_setup}; "
        f"{answer.min_fit}{free})"
    )
    best = next(
        (r for r in plan.rows if r.gpu == answer.gpu and r.count == answer.cost_optimal_count),
        None,
    )
    if best is not None and plan.tokens:
        line += (
            f"; cost-optimal for {tokens_text(plan.tokens)} tokens: {best.count} ({best.setup}), "
            f"{duration_text(best.time_s)}, {usd_text(best.cost_usd)}"
        )
    elif best is not None:
        line += f"; cost-optimal per token: {best.count} ({best.setup})"
    return line


def answer_table(plan: SizingPlan) -> list[tuple[str, ...]]:
    """The "which GPUs" table: per type, the least count and the cost-optimal row, as table cells."""
    out: list[tuple[str, ...]] = []
    for a in plan.answers:
        best = next(
            (r for r in plan.rows if r.gpu == a.gpu and r.count == a.cost_optimal_count), None
        )
        price = f"{a.price_per_gpu_hour:.2f}" if a.price_per_gpu_hour else "-"
        free = f"{a.min_free_share:.0%}" if a.min_free_share is not None else "-"
        out.append(
            (
                a.gpu + ("*" if a.asked else ""),
                price,
                str(a.min_count or "-"),
                a.min_setup or "-",
                a.min_fit,
                free,
                str(best.count) if best else "-",
                f"{best.tokens_per_s:,.0f}" if best and best.tokens_per_s else "-",
                duration_text(best.time_s) if best else "-",
                usd_text(best.cost_usd) if best else "-",
            )
        )
    return out


ANSWER_HEAD = (
    "GPU",
    "$/GPU-h",
    "least",
    "setup at least",
    "fit",
    "free",
    "cost-opt.",
    "tokens/s",
    "time",
    "cost",
)


def sizing_lines(plan: SizingPlan) -> list[str]:
    """The sizing for the terminal: how many, which GPUs, the pick and Pareto set, what binds."""
    tokens = (
        f"; {tokens_text(plan.tokens)} tokens"
        if plan.tokens
        else "; no token budget: give --tokens for time and cost"
    )
    lines = [f"Sizing: {plan.model}, {plan.task}, seq {plan.seq_len}{tokens}{_limits(plan)}"]
    asked = [a for a in plan.answers if a.asked] or plan.answers[:0]
    lines += [_how_many(plan, a) for a in asked]
    lines.append(
        "Which GPUs (least count that fits; the cost-optimal count and its time and cost):"
    )
    cells = [ANSWER_HEAD, *answer_table(plan)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(ANSWER_HEAD))]
    for row in cells:
        lines.append(
            ("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
        )
    if asked:
        lines.append("  (* asked for)")
    what = "fastest within the budget" if plan.objective == "fastest" else "cheapest"
    if plan.deadline_s is not None:
        what += f" within {plan.deadline_s / DAY_S:g} days"
        if plan.budget_usd is not None:
            what += f" and {usd_text(plan.budget_usd)}"
    if asked:
        what += " of the asked types"
    if plan.pick is not None:
        lines.append(f"Pick ({what}): {row_text(plan.pick)}")
    if plan.binding is not None:
        lines.append(f"Nothing meets it: {plan.binding.text}")
    if plan.pareto:
        front = "; ".join(
            f"{r.count} x {r.gpu} {duration_text(r.time_s)} {usd_text(r.cost_usd)}"
            if plan.tokens
            else f"{r.count} x {r.gpu} {r.usd_per_billion_tokens or 0:,.0f} $/B tokens"
            for r in plan.pareto
        )
        lines.append(f"Pareto set (time vs cost, fastest first): {front}")
    lines.append(f"  rows considered: {len(plan.rows)}; speed error: {plan.speed_error_source}")
    lines += [f"  note: {n}" for n in plan.notes]
    offload = sorted({r.gpu for r in plan.rows if r.offload})
    if offload:
        lines.append(
            f"  note: rows on {', '.join(offload)} use offload and depend on the host RAM they name"
        )
    return lines


def plan_it_line(plan: dict[str, Any]) -> str:
    """The chat's answer to "plan it" after a sizing: the plan shown is already the pick's."""
    hw = plan.get("hardware") or {}
    gpu = (hw.get("gpu") or {}).get("name", "GPU")
    where = (plan.get("report") or {}).get("markdown") or "the report"
    what = (
        "the sizing's pick"
        if (plan.get("sizing") or {}).get("pick")
        else "the closest row (nothing met the limits)"
    )
    return (
        f"already planned: the plan above is {what}, {hw.get('nodes')}x{hw.get('gpus_per_node')} "
        f"{gpu}; its files and report: {where}. To plan another row, say e.g. 'what if I had "
        "16 H100-80GB?'"
    )


def _limits(plan: SizingPlan) -> str:
    parts = []
    if plan.deadline_s is not None:
        parts.append(f"deadline {plan.deadline_s / DAY_S:g} days")
    if plan.budget_usd is not None:
        parts.append(f"budget {usd_text(plan.budget_usd)}")
    if plan.one_node:
        parts.append("one node only")
    elif plan.max_gpus < 1024:
        parts.append(f"at most {plan.max_gpus} GPUs")
    return "; " + ", ".join(parts) if parts else ""
