"""Shared fixtures: no network, every cache and output path under tmp_path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.settings import TELEMETRY_OFF, Settings  # noqa: E402

os.environ.update(TELEMETRY_OFF)


@pytest.fixture(autouse=True)
def _isolated_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point trainwright's home and output at this test's tmp_path."""
    monkeypatch.setenv("TRAINWRIGHT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINWRIGHT_OUT", str(tmp_path / "out"))
    for key, value in TELEMETRY_OFF.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings rooted in this test's tmp_path."""
    return Settings(home=tmp_path / "home", out_dir=tmp_path / "out")
