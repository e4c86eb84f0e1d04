"""A scripted fake chat model for tests: the graph's real tool-calling path, fixed choices."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult


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
