"""The report's sizing section: the answers, the table per GPU type, the pick and the Pareto set.

For a plan made from a sizing question (plan JSON ``sizing``); the chart beside it is
tools/artifacts/charts.py ``sizing_chart``, the terminal's lines tools/artifacts/sizing_text.py.
"""

from __future__ import annotations

from collections.abc import Callable

from tools.artifacts.sizing_text import (
    ANSWER_HEAD,
    answer_table,
    duration_text,
    row_text,
    sizing_lines,
    usd_text,
)
from tools.core.schemas import SizingPlan


def sizing_section(sizing: SizingPlan | None, md_text: Callable[[object], str]) -> list[str]:
    """Markdown for the sizing ([] without one); ``md_text`` escapes text for Markdown."""
    if sizing is None:
        return []
    head = sizing_lines(sizing)[0]
    lines = ["", "## Sizing: which GPUs, how many, how long, how much", "", md_text(head), ""]
    lines += [f"- {md_text(line)}" for line in sizing_lines(sizing) if line.startswith("How many")]
    lines += [
        "",
        "| " + " | ".join(ANSWER_HEAD) + " |",
        "|" + "---|" * len(ANSWER_HEAD),
        *("| " + " | ".join(md_text(c) for c in row) + " |" for row in answer_table(sizing)),
        "",
    ]
    if sizing.pick is not None:
        lines.append(f"**Pick ({sizing.objective}):** {md_text(row_text(sizing.pick))}.")
    if sizing.binding is not None:
        lines.append(f"**Nothing meets the limits:** {md_text(sizing.binding.text)}.")
    if sizing.pareto:
        lines += ["", "Pareto set (no other row is both faster and cheaper), fastest first:", ""]
        lines += [
            f"- {r.count} x {md_text(r.gpu)} ({md_text(r.setup)}): "
            f"{duration_text(r.time_s)}, {usd_text(r.cost_usd)}, {r.fit}"
            for r in sizing.pareto
        ]
    offload = [r for r in sizing.rows if r.offload and r.fit != "does not fit"]
    lines += ["", f"Rows considered: {len(sizing.rows)} (every row in plan.json `sizing.rows`)."]
    lines.append(f"Speed error: {md_text(sizing.speed_error_source)}.")
    if offload:
        lines.append(
            "Rows that depend on offload and host RAM: "
            + "; ".join(f"{r.count} x {md_text(r.gpu)}: {md_text(r.offload)}" for r in offload)
            + "."
        )
    prices = [f"{a.gpu}: {md_text(a.price_source)}" for a in sizing.answers if a.price_source]
    if prices:
        lines.append("Prices: " + "; ".join(prices) + " (list prices change).")
    return [*lines, *(f"- {md_text(n)}" for n in sizing.notes), ""]
