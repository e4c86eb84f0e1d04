"""The speed model's images/s against published image-model training runs.

``python bench/calibration/vision.py [--split fit|held-out|all] [--json FILE]``

Reads ``vision_published.tsv`` beside this script (each row cites its repository, commit, file
and table), turns each row into the planner's inputs (the catalog model, ``1xNxGPU`` of the
catalog GPU, data parallel with the row's batch per GPU, one micro-batch per step, the row's
precision (tf32: fp32 tensors on TF32 tensor cores), its memory format (nhwc / nchw, from the
source's command line or file name) and, where the source says so, its attention kernel) and calls
``tools.planning.speed.estimate_speed`` for exactly that setup. Images/s per GPU, predicted
over published, per row on stdout; per split, GPU family and model family in the summary.

Split: the rule of bench/calibration/published.py (``sha256(row_id) % 4 == 0`` is ``fit``).
No constant of tools/planning/vision.py was fitted on these rows (the kernel fractions come
from the LLM rows' fit split, the input-pipeline rate is an assumption), so both splits are
out of sample; the split is kept so that a later fit has rows it never saw.

Rows the planner cannot price are listed as skipped with why. Exit 0; 2 for bad input (one
line).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.calibration.published import check_split, split_of  # noqa: E402
from tools.core.errors import InputError, one_line  # noqa: E402

TSV = Path(__file__).with_name("vision_published.tsv")
PRECISION = {"amp": "fp16", "fp32": "fp32", "bf16": "bf16", "tf32": "tf32"}
WITHIN = (0.10, 0.20)


def read_rows(path: Path = TSV) -> list[dict[str, str]]:
    """The rows of the data file (``#`` lines are its header comments)."""
    if not path.is_file():
        raise InputError("vision_published.tsv", f"not found: {path}")
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if not ln.startswith("#")]
    return [dict(r) for r in csv.DictReader(lines, delimiter="\t")]


def sample_len(model: Any) -> int:
    """One image's sample length: the planner's own rule."""
    from tools.intake.brief import image_seq_len

    seq = image_seq_len(model.name, model.params, model.hf_config or {})
    if seq is None:
        raise InputError("model", f"{model.name} is not an image model")
    return seq


def predict(row: dict[str, str]) -> tuple[float | None, str]:
    """Predicted images/s per GPU for the row, or None and why it was skipped."""
    from tools.planning.speed import estimate_speed
    from tools.research.hardware import parse_hardware
    from tools.research.model_catalog import lookup_model

    precision = PRECISION.get(row["precision"])
    if precision is None:
        return None, f"precision {row['precision']}: no such mode in the GPU catalog"
    n = int(row["n_gpus"])
    spec = lookup_model(row["model"], 1)
    seq = sample_len(spec)
    model = lookup_model(row["model"], seq)
    hardware = parse_hardware(f"1x{n}x{row['gpu']}")
    est = estimate_speed(
        model,
        hardware,
        "ddp",
        micro_batch_size=int(row["batch_per_gpu"]),
        gradient_accumulation_steps=1,
        precision=precision,
        seq_len=seq,
        attention=row.get("attention") or "sdpa",
        memory_format=row.get("memory_format") or "nhwc",
    )
    if not est.tokens_per_s:
        return None, "no speed"
    return est.tokens_per_s / seq / n, ""


def priced_rows() -> list[tuple[dict[str, str], Any, float]]:
    """(row, its catalog GPU, predicted / measured images/s per GPU) for each row it prices."""
    from tools.research.hardware import parse_hardware

    out = []
    for row in read_rows():
        predicted, _why = predict(row)
        if predicted is None:
            continue
        measured = float(row["images_per_s_total"]) / int(row["n_gpus"])
        out.append((row, parse_hardware(f"1x1x{row['gpu']}").gpu, predicted / measured))
    return out


def family(row: dict[str, str]) -> str:
    """The model family of the row: a convolutional network (cnn) or a vision transformer (vit)."""
    return "vit" if row["model"].startswith("vit") else "cnn"


def stats(ratios: list[float]) -> dict[str, Any]:
    """Median |error|, worst both ways, shares within 10/20%, count off by 2x."""
    if not ratios:
        return {"n": 0}
    errors = [abs(r - 1) for r in ratios]
    return {
        "n": len(ratios),
        "median_abs_error": round(statistics.median(errors), 4),
        "worst_over": round(max(ratios), 3),
        "worst_under": round(min(ratios), 3),
        "within_10pct": round(sum(e <= WITHIN[0] for e in errors) / len(errors), 3),
        "within_20pct": round(sum(e <= WITHIN[1] for e in errors) / len(errors), 3),
        "off_by_2x": sum(r >= 2 or r <= 0.5 for r in ratios),
    }


def measure(split: str = "all") -> dict[str, Any]:
    """Per-row ratios (printed) and the summary by split, GPU and model family."""
    check_split(split)
    groups: dict[str, list[float]] = defaultdict(list)
    skipped: list[dict[str, str]] = []
    for row in read_rows():
        which = split_of(row["row_id"])
        if split != "all" and which != split:
            continue
        predicted, why = predict(row)
        if predicted is None:
            skipped.append({"row_id": row["row_id"], "reason": why})
            continue
        measured = float(row["images_per_s_total"]) / int(row["n_gpus"])
        ratio = predicted / measured
        print(
            f"{row['row_id']:<44} {which:<8} {measured:8.0f} published {predicted:8.0f} "
            f"predicted  x{ratio:.2f}"
        )
        for key in ("all", which, f"gpu:{row['gpu']}", f"family:{family(row)}",
                    f"source:{row['source'].split('@')[0]}"):  # fmt: skip
            groups[key].append(ratio)
    return {
        "split": split,
        "fitted_on_these_rows": "nothing (both splits are out of sample)",
        "groups": {k: stats(v) for k, v in sorted(groups.items())},
        "skipped": skipped,
    }


def main(argv: list[str] | None = None) -> int:
    """Print per-row ratios and the summary; ``--json`` writes the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="all")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        result = measure(args.split)
    except InputError as exc:
        print(f"vision.py: {one_line(exc)}", file=sys.stderr)
        return 2
    for key, value in result["groups"].items():
        if value["n"]:
            print(
                f"{key:<52} n={value['n']:<3} median |err| {value['median_abs_error']:.1%}, "
                f"within 20% {value['within_20pct']:.0%}, worst x{value['worst_under']:.2f}"
                f"..x{value['worst_over']:.2f}"
            )
    for skip in result["skipped"]:
        print(f"skipped {skip['row_id']}: {skip['reason']}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
