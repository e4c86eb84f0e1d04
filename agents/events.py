"""What a node tells whoever watches the graph: LangGraph custom stream events, as plain dicts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tools import BaseTool

from tools.core.errors import printable


class Events:
    """One node's custom stream events (LangGraph ``stream_mode="custom"``), as plain dicts.

    Each event is ``{"agent": node, "kind": kind, "text": line, ...}``; kinds: ``start``,
    ``tool`` (a tool call, with ``tool`` and ``args``), ``tool_error``, ``progress`` (what a
    tool found, smoke-run steps) and ``answer`` (the clarifying question's answer, at intake).
    Outside a graph run, or when nobody streams "custom", events go nowhere.
    """

    def __init__(self, agent: str) -> None:
        """Bind to the running graph's stream writer, if any."""
        self.agent = agent
        try:
            from langgraph.config import get_stream_writer

            self._writer: Callable[[Any], None] | None = get_stream_writer()
        except (RuntimeError, ImportError):  # called outside a graph run
            self._writer = None

    def __call__(self, kind: str, text: str, **extra: Any) -> None:
        """Send one event."""
        if self._writer is not None:
            self._writer({"agent": self.agent, "kind": kind, "text": printable(text), **extra})

    def progress(self, text: str) -> None:
        """A progress line (the Workspace's ``on_progress``)."""
        self("progress", text)


class ToolEvents(BaseCallbackHandler):
    """Turns every run of a role's tools into stream events, whoever called it (model or node)."""

    run_inline = True

    def __init__(self, events: Events) -> None:
        self.events = events
        self._names: dict[Any, str] = {}

    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: Any = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Report the call before the tool runs."""
        name = str((serialized or {}).get("name", "?"))
        self._names[run_id] = name
        args = inputs if inputs is not None else input_str
        shown = json.dumps(args, default=str)
        self.events(
            "tool",
            f"{name} {shown if len(shown) <= 160 else shown[:157] + '...'}",
            tool=name,
            args=args,
        )

    def on_tool_error(self, error: BaseException, *, run_id: Any = None, **kwargs: Any) -> None:
        """Report a failed call (it goes back to the model as a message)."""
        name = self._names.pop(run_id, "?")
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        self.events("tool_error", f"{name} failed: {first}", tool=name)

    def on_tool_end(self, output: Any, *, run_id: Any = None, **kwargs: Any) -> None:
        """Forget the finished call."""
        self._names.pop(run_id, None)


def watched(tools: list[BaseTool], events: Events) -> list[BaseTool]:
    """Attach the stream-event handler to a role's (freshly built) tools."""
    handler = ToolEvents(events)
    for tool in tools:
        tool.callbacks = [handler]
    return tools
