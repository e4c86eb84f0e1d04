"""Every published run that states its GPU memory lies in the set the sizing calls fitting.

The rows are read at run time from ``../shared/published/memory.tsv`` (or
``$TRAINWRIGHT_PUBLISHED``), mapped by bench/calibration/published_sizing.py; nothing of them
is stored here. The folder lies outside the repository (a clone may not have it): without it
the tests skip, naming the folder they looked in.
"""

from __future__ import annotations

import pytest

from bench.calibration.published import published_dir
from bench.calibration.published_sizing import SizingCase, sizing_cases, verdict
from tools.core.strategies import MIN_HEADROOM, SAFE_HEADROOM


def _cases() -> list[SizingCase]:
    if not (published_dir() / "memory.tsv").is_file():
        return []
    return sizing_cases()[0]


CASES = _cases()


def test_the_published_folder_is_there() -> None:
    if CASES:
        return
    pytest.skip(f"no memory.tsv in {published_dir()} (set TRAINWRIGHT_PUBLISHED)")


@pytest.mark.parametrize("case", CASES, ids=[c.row_id for c in CASES])
def test_the_published_gpu_and_count_are_called_fitting(case: SizingCase) -> None:
    kind, row = verdict(case)
    assert row.count == case.count and row.gpus_per_node * row.nodes == case.count
    if case.measured_share > 1 - MIN_HEADROOM and kind == "edge":
        # The run itself left less than the headroom the sizing demands: the sizing may not
        # call it fitting, but must predict it past the safe margin, as the run measured.
        assert row.memory_share is not None and row.memory_share > 1 - SAFE_HEADROOM
        return
    if kind == "host RAM":
        # Fits the GPU only with offload, on a node whose host RAM the row does not state.
        assert "fits the GPU" in row.note, row.note
        return
    assert kind == "fits", f"{case.label}: {row.note}"
    assert row.setup and row.fit in ("fits", "tight") and row.tokens_per_s


def test_most_published_runs_fit_outright() -> None:
    if not CASES:
        pytest.skip("no published rows")
    kinds = [verdict(c)[0] for c in CASES]
    assert kinds.count("fits") >= 0.9 * len(kinds), kinds
