"""Fit the speed model's kernel fractions on the published calibration split, and only there.

``python bench/calibration/fit_kernels.py`` grid-searches, per GPU class with rows in the fit split (A100
and H100), the share of dense peak that large GEMMs reach and the share attention kernels reach
(backward fixed at 0.8x forward), minimizing the mean absolute log error of predicted vs
measured tokens/s per GPU on the ``fit`` rows of bench/calibration/published.py. It prints the best values
and their fit-split error; tools/planning/kernels.py ``KERNEL_FACTS`` holds the values it found
(rounded to the grid), and bench/calibration/published.py reports the error on the held-out rows, which
this script never reads. The 16-bit fractions are fitted on the 16-bit rows; then, with them
fixed, the fp8 GEMM share of the FP8 peak (tools/planning/fp8.py ``FP8_GEMM``) on the fp8 rows of
the fit split, per class with such rows.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.calibration.published import Case, fit_rows, map_row, predict, published_dir  # noqa: E402
from tools.planning import fp8, kernels  # noqa: E402

GEMM_GRID = [round(0.50 + 0.025 * i, 3) for i in range(15)]  # 0.50 .. 0.85
ATTENTION_GRID = [round(0.15 + 0.05 * j, 2) for j in range(14)]  # 0.15 .. 0.80
S_HALF_GRID = [0, 256, 512, 1024, 2048]  # tokens: kernels.ATTENTION_S_HALF
FP8_GRID = [round(0.30 + 0.025 * i, 3) for i in range(23)]  # 0.30 .. 0.85
BACKWARD_OVER_FORWARD = 0.8


def _log_error(cases: list[Case]) -> tuple[float, float, int]:
    """Mean and median |log(predicted / measured)| over the cases the model answers."""
    errors = []
    for case in cases:
        done = predict(dataclasses.replace(case, predicted=None))
        if isinstance(done, Case):
            errors.append(abs(math.log(done.ratio)))
    if not errors:
        return math.inf, math.inf, 0
    return statistics.fmean(errors), statistics.median(errors), len(errors)


def by_class(cases: list[Case]) -> dict[str, list[Case]]:
    """The cases per GPU class (tools/planning/kernels.py ``kernel_class``), classes sorted."""
    out: dict[str, list[Case]] = {}
    for c in cases:
        if c.hardware.gpu:
            out.setdefault(kernels.kernel_class(c.hardware.gpu), []).append(c)
    return dict(sorted(out.items()))


def fit(cases: list[Case]) -> dict[str, dict[str, float]]:
    """The grid point with the lowest mean log error, per GPU class with cases."""
    found: dict[str, dict[str, float]] = {}
    original = dict(kernels.KERNEL_FACTS)
    try:
        for arch, mine in by_class(cases).items():
            best: tuple[float, float, float, float, int] | None = None
            for gemm in GEMM_GRID:
                for attn in ATTENTION_GRID:
                    kernels.KERNEL_FACTS[arch] = dataclasses.replace(
                        original[arch],
                        gemm=gemm,
                        attention_fwd=attn,
                        attention_bwd=round(attn * BACKWARD_OVER_FORWARD, 3),
                    )
                    kernels.clear_caches()
                    mean, median, n = _log_error(mine)
                    if best is None or mean < best[0]:
                        best = (mean, median, gemm, attn, n)
            assert best is not None
            found[arch] = {
                "gemm": best[2],
                "attention_fwd": best[3],
                "mean_abs_log_error": round(best[0], 4),
                "median_abs_log_error": round(best[1], 4),
                "rows": best[4],
            }
            kernels.KERNEL_FACTS[arch] = original[arch]
    finally:
        kernels.KERNEL_FACTS.update(original)
        kernels.clear_caches()
    return found


def fit_all(cases: list[Case]) -> dict[str, object]:
    """``fit`` at every ``S_HALF_GRID`` point; the point with the lowest row-weighted error."""
    original = kernels.ATTENTION_S_HALF
    best: tuple[float, int, dict[str, dict[str, float]]] | None = None
    try:
        for s_half in S_HALF_GRID:
            kernels.ATTENTION_S_HALF = s_half
            found = fit(cases)
            rows = sum(int(v["rows"]) for v in found.values())
            error = sum(v["mean_abs_log_error"] * v["rows"] for v in found.values()) / max(1, rows)
            if best is None or error < best[0]:
                best = (error, s_half, found)
    finally:
        kernels.ATTENTION_S_HALF = original
        kernels.clear_caches()
    assert best is not None
    return {
        "attention_s_half": best[1],
        "mean_abs_log_error": round(best[0], 4),
        "by_class": best[2],
    }


def fit_fp8(cases: list[Case]) -> dict[str, dict[str, float]]:
    """The fp8 GEMM share with the lowest mean log error on the fp8 cases, per GPU class."""
    found: dict[str, dict[str, float]] = {}
    original = dict(fp8.FP8_GEMM)
    try:
        for arch, mine in by_class(cases).items():
            best: tuple[float, float, float, int] | None = None
            for share in FP8_GRID:
                fp8.FP8_GEMM[arch] = share
                kernels.clear_caches()
                mean, median, n = _log_error(mine)
                if best is None or mean < best[0]:
                    best = (mean, median, share, n)
            assert best is not None
            found[arch] = {
                "fp8_gemm": best[2],
                "mean_abs_log_error": round(best[0], 4),
                "median_abs_log_error": round(best[1], 4),
                "rows": best[3],
            }
            fp8.FP8_GEMM.clear()
            fp8.FP8_GEMM.update(original)
    finally:
        fp8.FP8_GEMM.clear()
        fp8.FP8_GEMM.update(original)
        kernels.clear_caches()
    return found


def main() -> int:
    """Fit on the fit split and print the values per GPU class."""
    from tools.core.settings import disable_telemetry

    disable_telemetry()
    folder = published_dir()
    if not folder.is_dir():
        print(f"fit_kernels: no published folder at {folder}; skipped")
        return 0
    mapped = [c for c in map(map_row, fit_rows(folder)) if isinstance(c, Case)]
    cases = [c for c in mapped if c.setup["precision"] != "fp8"]
    result = fit_all(cases)
    print(
        f"attention half-efficiency key length: {result['attention_s_half']} tokens (in code "
        f"{kernels.ATTENTION_S_HALF}); row-weighted mean |log error| {result['mean_abs_log_error']}"
    )
    by_class = result["by_class"]
    assert isinstance(by_class, dict)
    for arch, values in by_class.items():
        current = kernels.KERNEL_FACTS[arch]
        print(
            f"{arch}: gemm {values['gemm']:.3f} (in code {current.gemm}), attention forward "
            f"{values['attention_fwd']:.2f} (in code {current.attention_fwd}); "
            f"{values['rows']} fit rows, median |log error| {values['median_abs_log_error']:.3f}"
        )
    for arch, values in fit_fp8([c for c in mapped if c.setup["precision"] == "fp8"]).items():
        print(
            f"{arch} fp8: GEMM share of the FP8 peak {values['fp8_gemm']:.3f} (in code "
            f"{fp8.FP8_GEMM.get(arch)}); {values['rows']} fit rows, median |log error| "
            f"{values['median_abs_log_error']:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
