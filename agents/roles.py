"""The graph's nodes: intake, the three roles (researcher, engineer, reviewer) and the reporter.

Each role runs the tool-calling loop with the model from ``agents.models.load_chat_model``.
If a model skips a tool the plan cannot do without, the node runs that tool itself and says so:
the plan's facts always come from tools, whatever the model does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool

from agents.loop import final_text, role_messages, run_tool_loop
from agents.toolkit import (
    AGENT_APP_SMOKE,
    DEEPSPEED_FRAMEWORKS,
    Workspace,
    engineer_tools,
    researcher_tools,
    reviewer_tools,
    smoke_for,
)
from tools.brief import brief_from_dict, parse_request
from tools.schemas import (
    FrameworkChoice,
    HardwareSpec,
    LaunchSpec,
    MemoryPlan,
    ModelSpec,
    Review,
    SmokeResult,
    TrainingPlan,
)
from tools.settings import Settings


class Node(Protocol):
    """A graph node: reads the state, returns the keys it updates."""

    def __call__(self, state: Any) -> dict[str, Any]: ...  # noqa: D102


def _progress() -> Callable[[str], None]:
    """Send progress lines to LangGraph's custom stream when running inside a graph."""
    try:
        from langgraph.config import get_stream_writer

        writer = get_stream_writer()
    except (RuntimeError, ImportError):  # called outside a graph run
        return lambda _text: None
    return lambda text: writer({"progress": text})


def workspace(state: Mapping[str, Any], settings: Settings) -> Workspace:
    """Rebuild the typed workspace from the graph state (state holds plain JSON-able dicts)."""

    def typed(key: str, cls: Any) -> Any:
        value = state.get(key)
        return cls.model_validate(value) if value is not None else None

    return Workspace(
        settings=settings,
        out_dir=Path(state.get("out_dir") or settings.out_dir),
        brief=brief_from_dict(state["brief"]),
        hardware=typed("hardware", HardwareSpec),
        model=typed("model", ModelSpec),
        framework=typed("framework", FrameworkChoice),
        memory=typed("memory", MemoryPlan),
        deepspeed_config=state.get("deepspeed_config"),
        speed=state.get("speed"),
        launch=typed("launch", LaunchSpec),
        smoke=typed("smoke_test", SmokeResult),
        review=typed("review", Review),
        round_no=int(state.get("review_round", 0)) or 1,
        on_progress=_progress(),
    )


def _dump(obj: Any) -> Any:
    return obj.model_dump(mode="json") if obj is not None else None


def _converse(
    model: BaseChatModel,
    settings: Settings,
    ws: Workspace,
    tools: list[BaseTool],
    role: str,
    task: str,
    overrides: dict[str, Any] | None,
    **prompt: Any,
) -> list[BaseMessage]:
    """Run one role's tool-calling conversation over its tools."""
    msgs = role_messages(role, task, overrides=overrides, **prompt)
    return run_tool_loop(
        model, tools, msgs, max_steps=settings.max_agent_steps, on_event=ws.progress
    )


def _run_skipped(
    ws: Workspace, tools: list[BaseTool], role: str, name: str, args: dict[str, Any]
) -> None:
    """Run a tool the model skipped, and say so in the report: facts come from tools regardless."""
    ws.notes.append(f"{role}: the model did not call {name}; ran {name} directly")
    next(t for t in tools if t.name == name).invoke(args)


def make_intake(settings: Settings) -> Node:
    """Intake: a brief dict or a free-text request becomes a validated brief; the hardware spec is checked."""

    def intake(state: Mapping[str, Any]) -> dict[str, Any]:
        from tools.hardware import parse_hardware
        from tools.models import list_models

        if state.get("brief"):
            brief = brief_from_dict(state["brief"])
        else:
            brief = parse_request(str(state.get("request") or ""), list_models())
        # Fail fast on a bad hardware spec, before any agent spends a turn on it.
        parse_hardware(brief.hardware, brief.interconnect)
        _progress()(
            f"intake: {brief.model if isinstance(brief.model, str) else 'custom model'} on {brief.hardware}"
        )
        return {"brief": brief.model_dump(mode="json"), "review_round": 0}

    return intake


def make_researcher(
    model: BaseChatModel, settings: Settings, overrides: dict[str, Any] | None = None
) -> Node:
    """Researcher: hardware, model and framework facts."""

    def researcher(state: Mapping[str, Any]) -> dict[str, Any]:
        ws = workspace(state, settings)
        tools = researcher_tools(ws)
        msgs = _converse(
            model,
            settings,
            ws,
            tools,
            "researcher",
            "research",
            overrides,
            brief=ws.brief.model_dump(mode="json"),
        )
        b = ws.brief
        if ws.hardware is None:
            _run_skipped(
                ws,
                tools,
                "researcher",
                "profile_hardware",
                {"spec": b.hardware, "interconnect": b.interconnect},
            )
        if ws.model is None and b.model is not None:
            model_arg = b.model if isinstance(b.model, str) else b.model.model_dump()
            _run_skipped(
                ws, tools, "researcher", "lookup_model", {"model": model_arg, "seq_len": b.seq_len}
            )
        if ws.framework is None:
            _run_skipped(ws, tools, "researcher", "select_framework", {})
        return {
            "hardware": _dump(ws.hardware),
            "model": _dump(ws.model),
            "framework": _dump(ws.framework),
            "narrative": {"researcher": final_text(msgs)},
            "notes": ws.notes,
        }

    return researcher


def make_engineer(
    model: BaseChatModel, settings: Settings, overrides: dict[str, Any] | None = None
) -> Node:
    """Engineer: strategy, DeepSpeed config, launch files, smoke run; acts on review findings."""

    def engineer(state: Mapping[str, Any]) -> dict[str, Any]:
        ws = workspace(state, settings)
        if ws.brief.task == "agent-app":
            # Nothing to train: no strategy, config, launch or run to engineer.
            return {
                "memory": None,
                "deepspeed_config": None,
                "launch": {"command": [], "files": {}},
                "smoke_test": SmokeResult(status="skipped", reason=AGENT_APP_SMOKE).model_dump(
                    mode="json"
                ),
                "narrative": {
                    "engineer": "An agent application trains nothing; no parallelism plan is needed."
                },
            }
        previous = ws.memory.chosen if ws.memory else None
        findings = [f for f in (ws.review.findings if ws.review else []) if f.severity != "info"]
        context = {
            "brief": ws.brief.model_dump(mode="json"),
            "smoke": ws.brief.smoke,
            "hardware": _dump(ws.hardware),
            "model": {k: v for k, v in (_dump(ws.model) or {}).items() if k != "hf_config"},
            "framework": (ws.framework.primary if ws.framework else None),
            "previous_strategy": previous,
            "review_findings": [f.model_dump() for f in findings],
        }
        # A new round plans afresh: stale results must not survive into the review.
        ws.memory, ws.deepspeed_config, ws.launch, ws.smoke = None, None, None, None
        tools = engineer_tools(ws)
        msgs = _converse(
            model, settings, ws, tools, "engineer", "engineer", overrides, context=context
        )
        if ws.memory is None:
            _run_skipped(ws, tools, "engineer", "plan_parallelism", {})
        if (
            not ws.config_validated
            and ws.framework
            and ws.framework.primary in DEEPSPEED_FRAMEWORKS
        ):
            _run_skipped(ws, tools, "engineer", "emit_deepspeed_config", {})
        if ws.launch is None:
            _run_skipped(ws, tools, "engineer", "emit_launch", {})
        if ws.smoke is None:
            if ws.brief.smoke:
                ws.notes.append("engineer: the model did not call run_smoke_test; ran it directly")
            ws.smoke = smoke_for(ws)
        return {
            "memory": _dump(ws.memory),
            "speed": ws.speed,
            "deepspeed_config": ws.deepspeed_config,
            "launch": _dump(ws.launch),
            "smoke_test": _dump(ws.smoke),
            "narrative": {"engineer": final_text(msgs)},
            "notes": ws.notes,
        }

    return engineer


def make_reviewer(
    model: BaseChatModel, settings: Settings, overrides: dict[str, Any] | None = None
) -> Node:
    """Reviewer: mechanical checks decide the verdict; the model explains it."""

    def reviewer(state: Mapping[str, Any]) -> dict[str, Any]:
        ws = workspace(state, settings)
        ws.round_no = int(state.get("review_round", 0)) + 1
        ws.review = None
        tools = reviewer_tools(ws)
        summary = {
            "strategy": ws.memory.chosen if ws.memory else None,
            "deepspeed_config": ws.deepspeed_config,
            "smoke_test": {
                k: v for k, v in (_dump(ws.smoke) or {}).items() if k in {"status", "reason"}
            },
        }
        msgs = _converse(
            model, settings, ws, tools, "reviewer", "review", overrides, context=summary
        )
        if ws.review is None:
            _run_skipped(ws, tools, "reviewer", "review_plan", {})
        return {
            "review": _dump(ws.review),
            "review_round": ws.round_no,
            "narrative": {"reviewer": final_text(msgs)},
            "notes": ws.notes,
        }

    return reviewer


def make_reporter(settings: Settings) -> Node:
    """Reporter: assemble the TrainingPlan and write report.md, report.html and plan.json."""

    def reporter(state: Mapping[str, Any]) -> dict[str, Any]:
        from tools.report import write_report

        ws = workspace(state, settings)
        narrative = dict(state.get("narrative") or {})
        if state.get("notes"):
            narrative["fallbacks"] = " ".join(state["notes"])
        plan = TrainingPlan(
            brief=ws.brief,
            hardware=ws.hardware,  # type: ignore[arg-type]
            model=ws.model,  # type: ignore[arg-type]
            framework=ws.framework,  # type: ignore[arg-type]
            memory=ws.memory,  # type: ignore[arg-type]
            deepspeed_config=ws.deepspeed_config,
            launch=ws.launch,  # type: ignore[arg-type]
            smoke_test=ws.smoke or SmokeResult(status="skipped", reason="no smoke run"),
            review=ws.review,  # type: ignore[arg-type]
            speed=ws.speed,
            narrative=narrative,
        )
        paths = write_report(plan, ws.out_dir)
        ws.progress(f"report: {paths.markdown}")
        plan = plan.model_copy(update={"report": paths})
        return {"report": _dump(paths), "plan": json.loads(plan.model_dump_json())}

    return reporter
