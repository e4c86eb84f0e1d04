"""The locked dependency set imports together in one process (the protobuf trap, DEVELOPERS.md)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_dependency_imports_in_one_process() -> None:
    code = (
        "import langgraph, langchain, langchain_core, langgraph.checkpoint.sqlite, crewai, "
        "autogen_agentchat, autogen_core, chromadb, pydantic, torch, deepspeed, transformers, pytest; "
        "from autogen_agentchat.agents import AssistantAgent; from crewai import Agent; print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().endswith("ok")


def test_autogen_is_the_agentchat_07_line() -> None:
    assert md.version("autogen-agentchat").startswith("0.7.")
    assert md.version("autogen-core").startswith("0.7.")


def test_pip_check_is_clean() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout


def test_cli_help_does_not_import_heavy_libraries() -> None:
    code = (
        "import sys, app; app._build_parser(); "
        "print(sorted(m for m in ('torch', 'deepspeed', 'chromadb', 'crewai', 'transformers') if m in sys.modules))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert res.stdout.strip() == "[]", res.stdout + res.stderr
    assert importlib.util.find_spec("app") is not None
