"""Shared fixtures: no network, every cache and output path under tmp_path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# The standalone scripts import their siblings by plain name, as their launchers run them (the
# script's folder first on sys.path): tests import them the same way (``import train``).
SCRIPTS = ROOT / "tools" / "smoke" / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(1, str(SCRIPTS))

from tools.core.settings import TELEMETRY_OFF, Settings  # noqa: E402

os.environ.update(TELEMETRY_OFF)

# pytester: tests/unit/core/test_unit_rule.py runs the unit tier's guard on small sessions.
pytest_plugins = ("pytester",)


@pytest.fixture(scope="session")
def knowledge_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One knowledge index for the session: building it embeds every card (seconds)."""
    return tmp_path_factory.mktemp("knowledge")


@pytest.fixture(autouse=True)
def _isolated_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, knowledge_dir: Path) -> None:
    """Point trainwright's home and output at this test's tmp_path."""
    monkeypatch.setenv("TRAINWRIGHT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINWRIGHT_KNOWLEDGE_DIR", str(knowledge_dir))
    monkeypatch.setenv("TRAINWRIGHT_OUT", str(tmp_path / "out"))
    for key, value in TELEMETRY_OFF.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def settings(tmp_path: Path, knowledge_dir: Path) -> Settings:
    """Settings rooted in this test's tmp_path (the knowledge index is shared by the session)."""
    return Settings(home=tmp_path / "home", out_dir=tmp_path / "out", knowledge_dir=knowledge_dir)


from typing import Any  # noqa: E402

# Test modules import these from scripted.py ("from conftest import" would reach whichever
# tier's conftest.py was imported last); re-exported here for the fixture below.
from scripted import ScriptedChatModel, call  # noqa: E402, F401


@pytest.fixture
def scripted() -> type[ScriptedChatModel]:
    """The scripted fake chat model class."""
    return ScriptedChatModel


@pytest.fixture
def cli_main() -> Any:
    """``cli_main(*args, cwd=..., stdin=...)``: the CLI's ``main`` in process (see inproc.py)."""
    from inproc import run_main

    return run_main
