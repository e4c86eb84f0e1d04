"""Error bands per GPU family and framework: ``python bench/calibration/bands.py [--write]``.

Runs the three published comparisons (speed: ``published.py``, memory: ``published_memory.py``,
images/s: ``vision.py``) on the shared published folder and the project's own rows
(``published_extra/``) and groups each row's |predicted / measured - 1| by (quantity, GPU
family, framework). A group's band is the BAND_QUANTILE quantile of its |errors| on the rows the
model was not fitted on (speed and memory: the ``held-out`` split; images/s: every row, since
nothing of the vision model is fitted on them), with the row count. Each quantity also gets a
``*`` framework group per GPU family (all frameworks on that family).

``--write`` stores the bands in ``knowledge/error_bands.yaml`` (aggregates only: quantiles and
counts, never a row id or a measured value), which ``tools/planning/bands.py`` reads at run
time; the product never reads the published folder. Exit 0, also when the folder is absent
(one line says so, nothing written); 2 for bad input.
"""

from __future__ import annotations

import argparse
import datetime
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.calibration import published, published_memory, vision  # noqa: E402
from tools.core.errors import InputError, one_line  # noqa: E402
from tools.planning.bands import FP8_SUFFIX  # noqa: E402

OUT = ROOT / "knowledge" / "error_bands.yaml"
# The project's own published rows (bench/calibration/published_extra/README.md cites each).
EXTRA = Path(__file__).with_name("published_extra")
BAND_QUANTILE = 0.8
COMMAND = "TRAINWRIGHT_PUBLISHED=DIR python bench/calibration/bands.py --write"

Key = tuple[str, str, str]  # quantity, GPU family, framework


def framework_of(text: str) -> str:
    """The planner's framework name (tools/planning/recipe.py FRAMEWORKS) for a row's cell.

    The vision rows' own names (tensorflow, pytorch, ...) are kept.
    """
    t = text.lower()
    for needle, name in (("torchtitan", "torchtitan"), ("torchtune", "torchtune"),
                         ("megatron", "megatron"), ("deepspeed", "deepspeed"),
                         ("nanotron", "nanotron"), ("fsdp", "fsdp"), ("llm-foundry", "fsdp"),
                         ("composer", "fsdp")):  # fmt: skip
        if needle in t:
            return name
    return t.split()[0] if t.split() else "unknown"


def family_of(gpu: Any) -> str:
    """The speed model's GPU class (tools/planning/kernels.py ``kernel_class``)."""
    from tools.planning.kernels import kernel_class

    return kernel_class(gpu) if gpu is not None else "unknown"


def quantile(values: list[float], q: float) -> float:
    """The q quantile of ``values`` by linear interpolation between order statistics."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def speed_errors(folder: Path) -> dict[Key, list[float]]:
    """Held-out tokens/s rows: |error| per (tokens_per_s, family, framework)."""
    rows = published.read_rows(folder)
    by_id = {r["row_id"]: r for r in rows}
    result = published.evaluate(rows, "held-out")
    out: dict[Key, list[float]] = defaultdict(list)
    for case in result["_cases"]:
        fw = framework_of(by_id[case.row_id]["framework"])
        if case.setup["precision"] == "fp8":
            fw += FP8_SUFFIX  # fp8 linears get bands of their own (tools/planning/bands.py)
        out[("tokens_per_s", family_of(case.hardware.gpu), fw)].append(abs(case.ratio - 1))
    return out


def memory_errors(folder: Path) -> dict[Key, list[float]]:
    """Held-out peak memory rows (allocated and reserved): |error| per kind."""
    by_id = {r["row_id"]: r for r in published_memory.read_rows(folder)}
    out: dict[Key, list[float]] = defaultdict(list)
    for case in published_memory.evaluate(folder)["_cases"]:
        if case.split != "held-out":
            continue
        fw = framework_of(by_id[case.row_id]["framework"])
        gpu = case.kwargs["hardware"].gpu
        out[("peak_memory", family_of(gpu), fw)].append(abs(case.error))
    return out


def image_errors() -> dict[Key, list[float]]:
    """Every vision row (none is fitted on): |error| of images/s per kind."""
    out: dict[Key, list[float]] = defaultdict(list)
    for row, gpu, ratio in vision.priced_rows():
        out[("images_per_s", family_of(gpu), framework_of(row["framework"]))].append(abs(ratio - 1))
    return out


def all_errors(folders: list[Path]) -> dict[Key, list[float]]:
    """Every comparison's |errors| by kind, over the folders that exist, plus the vision rows.

    The shared published folder and the project's own rows (``published_extra/``, each row
    citing its source) are read alike; a folder without a memory file adds speed rows only.
    """
    out: dict[Key, list[float]] = defaultdict(list)
    parts = [image_errors()]
    for folder in folders:
        if (folder / published.TSV).is_file():
            parts.append(speed_errors(folder))
        if (folder / published_memory.TSV).is_file():
            parts.append(memory_errors(folder))
    for part in parts:
        for key, errs in part.items():
            out[key] += errs
    return dict(out)


def bands(errors: dict[Key, list[float]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Quantity -> "family/framework" -> {band, n}; plus "family/*" over all frameworks.

    fp8 rows (framework "NAME+fp8") pool into "family/*+fp8", apart from the 16-bit ones.
    """
    pooled: dict[Key, list[float]] = defaultdict(list)
    for (qty, fam, fw), errs in errors.items():
        pooled[(qty, fam, fw)] += errs
        pooled[(qty, fam, "*" + FP8_SUFFIX if fw.endswith(FP8_SUFFIX) else "*")] += errs
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for (qty, fam, fw), errs in sorted(pooled.items()):
        out[qty][f"{fam}/{fw}"] = {"band": round(quantile(errs, BAND_QUANTILE), 3), "n": len(errs)}
    return dict(out)


def _commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return done.stdout.strip()


def to_yaml(table: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The generated file: a header (how, when, from which commit) and the aggregates."""
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    lines = [
        "# GENERATED by bench/calibration/bands.py; do not edit by hand.",
        f"# Command: {COMMAND}",
        f"# Date: {today}; code commit: {_commit()}.",
        "# Aggregates only: per quantity and 'GPU family/framework', the "
        f"{BAND_QUANTILE:.0%} quantile of |predicted/measured - 1| (band)",
        "# on published rows the model was not fitted on, and how many rows (n). No row ids,",
        "# no measured values. GPU family: tools/planning/kernels.py kernel_class; framework:",
        "# tools/planning/recipe.py names ('*': all frameworks on that family; '+fp8': fp8 linears).",
        f"quantile: {BAND_QUANTILE}",
    ]
    for qty, kinds in table.items():
        lines.append(f"{qty}:")
        for kind, v in kinds.items():
            lines.append(f'  "{kind}": {{band: {v["band"]}, n: {v["n"]}}}')
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the band table; with ``--write`` store it in knowledge/error_bands.yaml."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"exit 1 when {OUT.relative_to(ROOT)} differs from what the model gives now",
    )
    args = parser.parse_args(argv)
    from tools.core.settings import disable_telemetry

    disable_telemetry()
    folder = published.published_dir()
    if not folder.is_dir():
        print(f"bands: no published folder at {folder} (set {published.ENV_VAR}=DIR); skipped")
        return 0
    try:
        errors = all_errors([folder, EXTRA])
    except InputError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    table = bands(errors)
    print(f"{'quantity':<14} {'GPU family/framework':<24} {'band':>6} {'rows':>5}")
    for qty, kinds in table.items():
        for kind, v in kinds.items():
            print(f"{qty:<14} {kind:<24} {v['band']:>6.1%} {v['n']:>5}")
    if args.check:
        stale = stale_kinds(table, yaml.safe_load(OUT.read_text(encoding="utf-8")) or {})
        for line in stale:
            print(f"stale: {line}")
        if stale:
            print(f"{OUT.relative_to(ROOT)} is stale: run {COMMAND}")
            return 1
        print(f"{OUT.relative_to(ROOT)} matches the model")
    if args.write:
        OUT.write_text(to_yaml(table))
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


def stale_kinds(now: dict[str, dict[str, dict[str, Any]]], stored: dict[str, Any]) -> list[str]:
    """Kinds whose band or row count differs between the model now and the stored file."""
    out = []
    for qty in sorted(set(now) | {k for k in stored if k != "quantile"}):
        a, b = now.get(qty, {}), stored.get(qty) or {}
        for kind in sorted(set(a) | set(b)):
            x, y = a.get(kind), b.get(kind)
            if x is None or y is None or x["n"] != y["n"] or abs(x["band"] - y["band"]) > 0.0015:
                out.append(f"{qty} {kind}: now {x}, stored {y}")
    return out


if __name__ == "__main__":
    sys.exit(main())
