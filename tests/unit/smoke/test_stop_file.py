"""train.py's word that a SIGTERM stop saved (harness.record_stop), read by train.sbatch."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import STOP_FILE_ENV, record_stop


def test_the_stop_file_names_the_step_and_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = tmp_path / ".trainwright-stopped.7"
    monkeypatch.setenv(STOP_FILE_ENV, str(where))
    record_stop(12, Path("checkpoints/step12"))
    assert where.read_text() == "stopped at step 12 on SIGTERM, saved in checkpoints/step12\n"
    assert [p.name for p in tmp_path.iterdir()] == [where.name]  # no temporary file left


def test_no_stop_file_without_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STOP_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    record_stop(12, Path("checkpoints/step12"))
    assert list(tmp_path.iterdir()) == []
