"""The published comparisons per GPU family and model family, against issue 30's targets.

``python bench/calibration/families.py [--md FILE] [--json FILE]``

Runs the three comparisons on every folder of published rows it finds (the shared folder,
``../shared/published`` or ``TRAINWRIGHT_PUBLISHED=DIR``, and the project's own rows in
``bench/calibration/published_extra/`` where present; images/s from ``vision_published.tsv``)
and groups each row by split, GPU family (tools/planning/kernels.py ``kernel_class``) and
model family (dense LLM, MoE, vision). Each group's figures are set against the targets:

- speed (tokens/s or images/s per GPU): median |error| <= 10%, >= 80% of rows within 20%,
  none off by 2x;
- peak memory: median |error| <= 8%, >= 80% within 15%, and no run that ran out of memory
  called "fits" (every published row ran; an OOM row would carry ``oom`` in its notes).

Split: ``fit`` when sha256(row_id) % 4 == 0 (bench/calibration/published.py), else
``held-out``; figures are given on each, never pooled across them, so a fitted constant's
rows are never the evidence for its accuracy. Nothing of the published data is stored: the
outputs hold counts, medians and shares only. Exit 0; 2 for bad input (one line).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.calibration import published, published_memory, vision  # noqa: E402
from bench.calibration.bands import EXTRA, family_of  # noqa: E402
from tools.core.errors import InputError, one_line  # noqa: E402

# Targets (issue 30, "Done when"): (median |error| at most, share within the band at least, band).
SPEED_TARGET = (0.10, 0.80, 0.20)
MEMORY_TARGET = (0.08, 0.80, 0.15)
SPLITS = ("fit", "held-out")

Key = tuple[str, str, str, str]  # quantity, split, GPU family, model family


def folders() -> list[Path]:
    """The shared published folder and the project's own rows, those that exist."""
    return [f for f in (published.published_dir(), EXTRA) if f.is_dir()]


def model_family(model: Any) -> str:
    """Dense LLM or MoE (fewer parameters active per token than the model holds)."""
    active = getattr(model, "active_params", None)
    return "moe" if active and active < model.params else "dense"


def speed_errors(folder: Path) -> dict[Key, list[float]]:
    """Predicted / measured tokens/s per GPU for every mapped row of ``folder``."""
    if not (folder / published.TSV).is_file():
        return {}
    out: dict[Key, list[float]] = defaultdict(list)
    for case in published.evaluate(published.read_rows(folder))["_cases"]:
        key = ("speed", case.split, family_of(case.hardware.gpu), model_family(case.model))
        out[key].append(case.ratio)
    return out


def memory_errors(folder: Path) -> tuple[dict[Key, list[float]], list[str]]:
    """Predicted / measured peak memory per mapped row, and OOM rows that were called fits."""
    if not (folder / published_memory.TSV).is_file():
        return {}, []
    by_id = {r["row_id"]: r for r in published_memory.read_rows(folder)}
    result = published_memory.evaluate(folder)
    out: dict[Key, list[float]] = defaultdict(list)
    for case in result["_cases"]:
        fam = family_of(case.kwargs["hardware"].gpu)
        key = ("memory", case.split, fam, model_family(case.kwargs["model"]))
        out[key].append(1 + case.error)
    called = set(result["verdict"]["false_alarms"])
    oom_called_fits = [
        c.row_id
        for c in result["_cases"]
        if "oom" in by_id[c.row_id].get("notes", "").lower() and c.row_id not in called
    ]
    return out, oom_called_fits


def image_errors() -> dict[Key, list[float]]:
    """Predicted / measured images/s per GPU for every vision row the planner can price."""
    out: dict[Key, list[float]] = defaultdict(list)
    for row, gpu, ratio in vision.priced_rows():
        out[("speed", published.split_of(row["row_id"]), family_of(gpu), "vision")].append(ratio)
    return out


def judge(quantity: str, ratios: list[float]) -> dict[str, Any]:
    """The group's figures and whether each meets its target."""
    med_max, share_min, band = SPEED_TARGET if quantity == "speed" else MEMORY_TARGET
    errors = [abs(r - 1) for r in ratios]
    median = statistics.median(errors)
    within = sum(e <= band for e in errors) / len(errors)
    off2 = sum(r >= 2 or r <= 0.5 for r in ratios)
    return {
        "n": len(ratios),
        "median_abs_error": round(median, 4),
        "within_band": round(within, 3),
        "band": band,
        "off_by_2x": off2,
        "worst_over": round(max(ratios), 3),
        "worst_under": round(min(ratios), 3),
        "meets": median <= med_max and within >= share_min and (quantity != "speed" or not off2),
    }


def collect() -> tuple[dict[Key, list[float]], list[str], list[str]]:
    """Every comparison's ratios by key, OOM rows called fits, and the folders read."""
    ratios: dict[Key, list[float]] = defaultdict(list)
    oom: list[str] = []
    read = folders()
    for folder in read:
        for key, rs in speed_errors(folder).items():
            ratios[key] += rs
        mem, bad = memory_errors(folder)
        for key, rs in mem.items():
            ratios[key] += rs
        oom += bad
    for key, rs in image_errors().items():
        ratios[key] += rs
    return ratios, oom, [str(f) for f in read] + [str(vision.TSV)]


def table(ratios: dict[Key, list[float]]) -> list[dict[str, Any]]:
    """One line per (quantity, split, GPU family, model family), plus per-split totals."""
    pooled: dict[Key, list[float]] = defaultdict(list)
    for (qty, split, gpu, fam), rs in ratios.items():
        for key in ((qty, split, gpu, fam), (qty, split, "all", fam), (qty, split, gpu, "all"),
                    (qty, split, "all", "all")):  # fmt: skip
            pooled[key] += rs
    # A total that repeats its only member (a GPU family with one model family, or the
    # reverse) is dropped: the same figures twice make the table harder to read.
    members: dict[tuple[str, str, str, int], set[str]] = defaultdict(set)
    for qty, split, gpu, fam in ratios:
        members[(qty, split, gpu, 0)].add(fam)
        members[(qty, split, fam, 1)].add(gpu)
    for qty, split, gpu, fam in list(pooled):
        if gpu != "all" and fam == "all" and len(members[(qty, split, gpu, 0)]) == 1:
            del pooled[(qty, split, gpu, fam)]
        elif (
            gpu == "all"
            and fam != "all"
            and (
                len(members[(qty, split, fam, 1)]) == 1
                or len({f for q, sp, _g, f in ratios if (q, sp) == (qty, split)}) == 1
            )
        ):
            del pooled[(qty, split, gpu, fam)]
    order = {"speed": 0, "memory": 1}
    keys = sorted(pooled, key=lambda k: (order[k[0]], SPLITS.index(k[1]), k[2] == "all",
                                         k[2], k[3] == "all", k[3]))  # fmt: skip
    return [
        {"quantity": q, "split": s, "gpu_family": g, "model_family": f, **judge(q, pooled[k])}
        for k in keys
        for q, s, g, f in [k]
    ]


def render(lines: list[dict[str, Any]], oom: list[str], read: list[str]) -> str:
    """The markdown report: the targets, then one table row per group."""
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    out = [
        f"# Published comparison per GPU family and model family ({today})",
        "",
        "Command: `python bench/calibration/families.py`. Rows read from: "
        + ", ".join(f"`{Path(r).name}`" for r in read)
        + ". Split: fit when sha256(row_id) % 4 == 0, else held-out. Speed: tokens/s per GPU "
        "(LLMs) or images/s per GPU (vision); memory: the quantity each row measured.",
        "",
        f"Targets: speed median |err| <= {SPEED_TARGET[0]:.0%}, >= {SPEED_TARGET[1]:.0%} within "
        f"{SPEED_TARGET[2]:.0%}, none off 2x; memory median <= {MEMORY_TARGET[0]:.0%}, >= "
        f"{MEMORY_TARGET[1]:.0%} within {MEMORY_TARGET[2]:.0%}. A group of fewer than 5 rows "
        "is listed but its verdict is weak evidence.",
        "",
        "| quantity | split | GPU family | model family | rows | median abs err | within band "
        "| off 2x | worst over | worst under | meets |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in lines:
        out.append(
            f"| {r['quantity']} | {r['split']} | {r['gpu_family']} | {r['model_family']} "
            f"| {r['n']} | {r['median_abs_error']:.1%} | {r['within_band']:.0%} "
            f"(<= {r['band']:.0%}) | {r['off_by_2x']} | {r['worst_over']:.2f}x "
            f"| {r['worst_under']:.2f}x | {'yes' if r['meets'] else 'no'} |"
        )
    out += ["", "Runs that ran out of memory called fits: " + (", ".join(oom) or "none") + "."]
    return "\n".join(out) + "\n"


def measure() -> dict[str, Any]:
    """bench/run.py's ``families`` section: the groups against the targets (aggregates only)."""
    ratios, oom, read = collect()
    return {
        "targets": {"speed": SPEED_TARGET, "memory": MEMORY_TARGET},
        "groups": table(ratios),
        "oom_called_fits": oom,
        "read": read,
    }


def main(argv: list[str] | None = None) -> int:
    """Print the report; ``--md``/``--json`` write it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--md", type=Path, help="write the markdown report here")
    parser.add_argument("--json", type=Path, help="write the aggregates here")
    args = parser.parse_args(argv)
    from tools.core.settings import disable_telemetry

    disable_telemetry()
    try:
        result = measure()
    except InputError as exc:
        print(f"families.py: {one_line(str(exc))}", file=sys.stderr)
        return 2
    text = render(result["groups"], result["oom_called_fits"], result["read"])
    print(text, end="")
    if args.md:
        args.md.write_text(text, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
