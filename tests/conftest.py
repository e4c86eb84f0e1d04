"""Shared fixtures: no network, every cache and output path under tmp_path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

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

from langchain_core.language_models.chat_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402


class ScriptedChatModel(BaseChatModel):
    """Replies with the scripted messages in order, recording what it was shown and bound.

    Modeled on LangGraph prebuilt's FakeToolCallingModel: the graph's real tool-calling path
    runs, only the model's choices are fixed.
    """

    script: list[AIMessage]
    seen: list[list[BaseMessage]] = []
    bound_tools: list[list[str]] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        self.bound_tools.append([getattr(t, "name", "?") for t in tools])
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        if not self.script:
            return ChatResult(
                generations=[ChatGeneration(message=AIMessage(content="(script exhausted)"))]
            )
        return ChatResult(generations=[ChatGeneration(message=self.script.pop(0))])


def call(name: str, args: dict[str, Any] | None = None, idx: list[int] = [0]) -> AIMessage:  # noqa: B006
    """An AIMessage that calls one tool."""
    idx[0] += 1
    return AIMessage(
        content="",
        tool_calls=[{"name": name, "args": args or {}, "id": f"c{idx[0]}", "type": "tool_call"}],
    )


@pytest.fixture
def scripted() -> type[ScriptedChatModel]:
    """The scripted fake chat model class."""
    return ScriptedChatModel


@pytest.fixture
def cli_main() -> Any:
    """``cli_main(*args, cwd=..., stdin=...)``: the CLI's ``main`` in process (see inproc.py)."""
    from inproc import run_main

    return run_main
