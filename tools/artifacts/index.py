"""The batch index: one row per brief (index.md and index.html), failed briefs with their error."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tools.artifacts.report import CSP_META, STYLE
from tools.artifacts.text import plan_facts
from tools.core.outputs import write_file

Status = Literal["ok", "failed", "skipped"]


@dataclass
class BriefOutcome:
    """What became of one brief: ok (planned now), skipped (unchanged), or failed (``error``)."""

    name: str
    path: Path
    status: Status
    summary: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    elapsed_s: float = 0.0


COLUMNS = (
    ("brief", "brief"),
    ("file", "brief file"),
    ("model", "model"),
    ("hardware", "hardware"),
    ("strategy", "strategy"),
    ("batching", "micro-batch x accum"),
    ("per_gpu_gb", "per-GPU GB"),
    ("tokens_per_s", "tokens/s"),
    ("smoke", "smoke"),
    ("review", "review"),
)


# Right-aligned in the Markdown table.
NUMERIC = ("per_gpu_gb", "tokens_per_s")


def source_file(path: Path) -> str:
    """The brief's file as the reader would find it: relative to the working folder when near it.

    Two briefs named a.yaml in different folders plan into a/ and a-2/; the index says which
    file each folder is. Relative when at most two folders up (``../shared/briefs/a.yaml``),
    else the absolute path.
    """
    rel = os.path.relpath(path.resolve(), Path.cwd().resolve())
    return rel if rel.split(os.sep)[:3].count("..") < 3 else str(path.resolve())


def _cells(o: BriefOutcome) -> dict[str, str]:
    s = o.summary
    if o.status == "failed":
        return {"brief": o.name, "file": source_file(o.path), "model": f"error: {o.error}"}
    gb, tps = s.get("per_gpu_gb"), s.get("tokens_per_s")
    return {
        "brief": o.name,
        "file": source_file(o.path),
        "model": str(s.get("model", "-")),
        "hardware": str(s.get("hardware", "-")),
        "strategy": str(s.get("strategy", "-")),
        "batching": str(s.get("batching", "-")),
        "per_gpu_gb": "-" if gb is None else f"{gb:.2f}",
        "tokens_per_s": "-" if not tps else f"{tps:,.0f}",
        "smoke": str(s.get("smoke", "-")),
        "review": str(s.get("review", "-")),
    }


def render_index_markdown(outcomes: list[BriefOutcome]) -> str:
    """The comparison table as Markdown, failed briefs with their one-line error."""
    ok = sum(o.status != "failed" for o in outcomes)
    lines = [
        "# Training plans",
        "",
        f"{len(outcomes)} brief(s): {ok} planned, {len(outcomes) - ok} failed.",
        "",
        "| " + " | ".join(title for _, title in COLUMNS) + " | report |",
        "|" + "".join("---:|" if key in NUMERIC else "---|" for key, _ in COLUMNS) + "---|",
    ]
    for o in outcomes:
        c = {k: v.replace("|", "\\|") for k, v in _cells(o).items()}
        if o.status == "failed":
            cells = [c["brief"], c["file"], c["model"], *["-"] * (len(COLUMNS) - 3), "-"]
        else:
            cells = [c[key] for key, _ in COLUMNS] + [f"[report]({o.name}/report.md)"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_index_html(outcomes: list[BriefOutcome]) -> str:
    """The comparison table as a self-contained HTML page linking each report.html."""
    e = html.escape
    head = "".join(f"<th>{e(title)}</th>" for _, title in COLUMNS) + "<th>report</th>"
    rows = []
    for o in outcomes:
        c = _cells(o)
        if o.status == "failed":
            rows.append(
                f"<tr class='failed'><td>{e(o.name)}</td><td>{e(c['file'])}</td>"
                f"<td colspan='{len(COLUMNS) - 1}'>error: {e(o.error)}</td></tr>"
            )
            continue
        cells = "".join(f"<td>{e(c[key])}</td>" for key, _ in COLUMNS)
        rows.append(f"<tr>{cells}<td><a href='{e(o.name)}/report.html'>report</a></td></tr>")
    ok = sum(o.status != "failed" for o in outcomes)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'>{CSP_META}<title>Training plans</title>"
        f"<style>{STYLE}tr.failed td{{color:#b00020}}</style></head><body>"
        f"<h1>Training plans</h1><p>{len(outcomes)} brief(s): {ok} planned, "
        f"{len(outcomes) - ok} failed.</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "</body></html>\n"
    )


INDEX_FILES = ("index.md", "index.html")


def write_index(out_dir: Path, outcomes: list[BriefOutcome]) -> None:
    """Write ``index.md`` and ``index.html`` (``INDEX_FILES``) under ``out_dir``."""
    md, html = INDEX_FILES
    write_file(out_dir, md, render_index_markdown(outcomes), field="--out")
    write_file(out_dir, html, render_index_html(outcomes), field="--out")


def index_row(plan: dict[str, Any], name: str) -> dict[str, Any]:
    """The index row of a plan (contract JSON): model, hardware, choice, memory, speed, verdicts."""
    f = plan_facts(plan)
    per_gpu = f["per_gpu_bytes"]
    return {
        "model": (plan.get("model") or {}).get("name", "-"),
        "hardware": f["machine"],
        "strategy": f["strategy"] or "none",
        "batching": f"{f['micro_batch_size']} x {f['gradient_accumulation_steps']}"
        if f["strategy"]
        else "-",
        "per_gpu_gb": round(per_gpu / 1e9, 2) if per_gpu is not None else None,
        "tokens_per_s": f["tokens_per_s"],
        "smoke": f["smoke_status"],
        "review": f["verdict"],
        "link": f"{name}/report.html",
    }
