"""knowledge/error_bands.yaml is what bench/calibration/bands.py gives for the code as it is.

A change to the speed or memory model changes its errors on the published runs; the bands the
product quotes must follow, or they describe a model that no longer exists. Needs the published
folder (``../shared/published`` or ``TRAINWRIGHT_PUBLISHED``); without it there is nothing to
recompute from, and the test says so.
"""

from __future__ import annotations

import pytest

from bench.calibration import bands, published


def test_the_stored_bands_match_the_model_now(capsys: pytest.CaptureFixture[str]) -> None:
    if not (published.published_dir() / published.TSV).is_file():
        pytest.skip(f"no published folder at {published.published_dir()}")
    code = bands.main(["--check"])
    out = capsys.readouterr().out
    assert code == 0, "\n".join(line for line in out.splitlines() if "stale" in line)
    assert "matches the model" in out
