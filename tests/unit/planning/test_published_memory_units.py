"""Published memory figures are read in the unit their producer printed (issue 30).

torchao's B200 table (copied into torchtitan's mxfp8.md) and torchtune's README memory table
head GiB figures "GB": the numbers come from training logs that print GiB (torchao's
parse_torchtitan_logs.py, torchtune's log_memory_stats). Other "GB" cells stay 10^9 bytes.
"""

from __future__ import annotations

import pytest

from bench.calibration.published_memory import GIB, GIB_HEADED_GB, _measured

TITAN = "pytorch/torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a:torchtitan/components/quantization/mxfp8.md"
TUNE = "pytorch/torchtune@bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1:README.md 'Memory and training speed'"


@pytest.mark.parametrize("source", [TITAN, TUNE])
def test_a_gib_figure_headed_gb_is_read_as_gib(source: str) -> None:
    row = {"memory_value": "33.71", "memory_unit": "GB", "source": source}
    assert _measured(row) == pytest.approx(33.71 * GIB)
    assert all(reason for _, reason in GIB_HEADED_GB)


def test_other_gb_and_gib_cells_keep_their_unit() -> None:
    other = {"memory_value": "33.71", "memory_unit": "GB", "source": "someone/else@abc:README.md"}
    assert _measured(other) == pytest.approx(33.71e9)
    gib = {"memory_value": "16.2", "memory_unit": "GiB", "source": TUNE}
    assert _measured(gib) == pytest.approx(16.2 * GIB)
