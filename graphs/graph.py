"""Wiring only: intake -> researcher -> engineer -> reviewer -> (engineer | reporter)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from langchain_core.language_models.chat_models import BaseChatModel
from langgraph.graph import END, START, StateGraph

from agents.chat_models import load_chat_model
from agents.intake import make_intake
from agents.roles import ENGINEER, RESEARCHER, REVIEWER, make_reporter, make_role
from graphs.state import PlanInput, PlanState
from tools.core.settings import Settings


def after_review(state: PlanState) -> Literal["engineer", "reporter"]:
    """Back to the engineer while the reviewer requests changes, else on to the report."""
    review = state.get("review") or {}
    return "engineer" if review.get("verdict") == "changes_requested" else "reporter"


def build_graph(
    chat_model: BaseChatModel | None = None,
    checkpointer: Any | None = None,
    settings: Settings | None = None,
    wrap: Callable[[str, Any], Any] | None = None,
) -> Any:
    """Compile the planning graph; pass a checkpointer (e.g. SqliteSaver) to resume by thread id.

    Input: ``{"brief": {...}}`` or ``{"request": "fine-tune ..."}`` (plus ``overrides`` and
    ``out_dir``). A request that names no model pauses at intake with an ``interrupt`` whose
    value is ``{"field", "question", "problem"}``; resume it with ``Command(resume=answer)``,
    which needs the checkpointer. Stream with ``stream_mode=["updates", "custom"]`` to see
    each node finish and each tool call as it happens (events: agents/events.py ``Events``).
    graphs/run.py runs it the way the CLI, chat, batch and adapters do. ``wrap(name, node)``,
    if given, turns each node into what is added (the server's: graphs/cancel.py).
    """
    settings = settings or Settings.load()
    model = chat_model or load_chat_model(settings)
    builder = StateGraph(PlanState, input_schema=PlanInput)
    nodes = {
        "intake": make_intake(settings, model),
        "researcher": make_role(RESEARCHER, model, settings),
        "engineer": make_role(ENGINEER, model, settings),
        "reviewer": make_role(REVIEWER, model, settings),
        "reporter": make_reporter(settings),
    }
    for name, node in nodes.items():
        builder.add_node(name, wrap(name, node) if wrap else node)
    builder.add_edge(START, "intake")
    builder.add_edge("intake", "researcher")
    builder.add_edge("researcher", "engineer")
    builder.add_edge("engineer", "reviewer")
    builder.add_conditional_edges("reviewer", after_review, ["engineer", "reporter"])
    builder.add_edge("reporter", END)
    return builder.compile(checkpointer=checkpointer, name="trainwright")
