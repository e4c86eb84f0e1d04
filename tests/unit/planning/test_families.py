"""bench/calibration/families.py: the per GPU family and model family verdicts against targets."""

from __future__ import annotations

from bench.calibration.families import judge, render, table


def test_a_group_meets_the_speed_target_only_with_all_three_conditions() -> None:
    good = judge("speed", [1.0, 1.05, 0.95, 1.1, 0.9])
    assert good["meets"] and good["n"] == 5 and good["median_abs_error"] == 0.05
    # The median is fine and 80% lie within 20%, but one row is off 2x: not met.
    assert not judge("speed", [1.0, 1.0, 1.0, 1.0, 2.1])["meets"]
    # Median 15%: over the 10% target.
    assert not judge("speed", [1.15, 0.85, 1.15, 0.85, 1.15])["meets"]


def test_memory_uses_its_own_band_and_ignores_2x_for_the_verdict() -> None:
    r = judge("memory", [1.07, 0.93, 1.0, 1.16, 1.0])
    assert r["band"] == 0.15 and r["within_band"] == 0.8 and r["meets"]
    assert not judge("memory", [1.09, 0.91, 1.09, 1.0, 1.0])["meets"]  # median 9% > 8%


def test_the_table_keeps_splits_apart_and_drops_totals_that_repeat_one_member() -> None:
    ratios = {
        ("speed", "fit", "a100", "dense"): [1.0, 1.1],
        ("speed", "held-out", "a100", "dense"): [1.2],
        ("speed", "held-out", "v100", "vision"): [0.5],
    }
    lines = table(ratios)
    keys = {(r["split"], r["gpu_family"], r["model_family"]): r["n"] for r in lines}
    assert keys[("fit", "a100", "dense")] == 2 and keys[("fit", "all", "all")] == 2
    assert keys[("held-out", "all", "all")] == 2  # never pooled with the fit split
    assert ("fit", "a100", "all") not in keys and ("fit", "all", "dense") not in keys
    assert ("held-out", "all", "dense") not in keys and ("held-out", "a100", "all") not in keys
    text = render(lines, [], ["x/throughput.tsv"])
    assert "| speed | held-out | v100 | vision | 1 | 50.0% |" in text and "none." in text
