"""The planning graph as an AutoGen AgentChat agent (for RoundRobinGroupChat and friends)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_core import CancellationToken

from graphs.adapters.core import plan_training
from tools.artifacts.text import summary_paragraph


class TrainingPlannerAgent(BaseChatAgent):
    """Plans from the last text message it was sent and replies with a ``TextMessage``.

    A message whose text is a JSON object is read as a brief; any other text as a request.
    The reply is a one-paragraph summary followed by the summary JSON on its own line, so a
    model reads the prose and code reads the JSON. The graph runs in a worker thread, so the
    team's event loop stays free while it plans.
    """

    def __init__(
        self,
        name: str = "training_planner",
        description: str = (
            "Plans distributed training setups (framework, ZeRO strategy, micro-batch, "
            "DeepSpeed config, smoke test, review) from a request or a JSON brief."
        ),
        *,
        chat_model: Any = None,
        settings: Any = None,
        out_dir: str | None = None,
        smoke: bool | None = None,
    ) -> None:
        """Bind the graph's chat model, settings and output folder; ``smoke`` overrides briefs."""
        super().__init__(name, description)
        self._chat_model = chat_model
        self._settings = settings
        self._out_dir = out_dir
        self._smoke = smoke
        self._last_text: str | None = None
        self.last_summary: dict[str, Any] | None = None

    @property
    def produced_message_types(self) -> Sequence[type[BaseChatMessage]]:
        """Only text replies."""
        return (TextMessage,)

    async def on_messages(
        self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken
    ) -> Response:
        """Plan from the newest text among ``messages`` (or the last one seen before)."""
        for message in reversed(messages):
            if isinstance(message, TextMessage) and message.content.strip():
                self._last_text = message.content.strip()
                break
        if self._last_text is None:
            reply = "Tell me what to train and on which hardware (or send a JSON brief)."
            return Response(chat_message=TextMessage(content=reply, source=self.name))
        request, brief = _request_or_brief(self._last_text)
        future = asyncio.ensure_future(
            asyncio.to_thread(
                plan_training,
                request,
                brief,
                self._smoke,
                chat_model=self._chat_model,
                settings=self._settings,
                out_dir=self._out_dir,
            )
        )
        cancellation_token.link_future(future)
        summary = await future
        self.last_summary = summary
        content = f"{summary_paragraph(summary)}\n{json.dumps(summary)}"
        return Response(chat_message=TextMessage(content=content, source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        """Forget the last request and plan."""
        self._last_text = None
        self.last_summary = None


def _request_or_brief(text: str) -> tuple[str | None, dict[str, Any] | None]:
    """A JSON object is a brief; anything else is a free-text request."""
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return text, None
        if isinstance(value, dict):
            return None, value
    return text, None
