"""The graph's nodes: intake, the three roles (researcher, engineer, reviewer) and the reporter.

Each role runs the tool-calling loop with the model from ``agents.models.load_chat_model``.
If a model skips a tool the plan cannot do without, the node runs that tool itself and says so:
the plan's facts always come from tools, whatever the model does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.exceptions import (
    ContextOverflowError,
    ModelError,
    ModelInvalidRequestError,
    ModelRefusalError,
)
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool
from langgraph.types import Overwrite, interrupt

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
from tools.core.errors import InputError, printable
from tools.core.imports import warm_up
from tools.core.schemas import (
    FrameworkChoice,
    HardwareSpec,
    LaunchSpec,
    MemoryPlan,
    ModelSpec,
    Review,
    SmokeResult,
    SpeedEstimate,
    TrainingBrief,
    TrainingPlan,
)
from tools.core.settings import Settings
from tools.intake.brief import brief_from_dict


class Node(Protocol):
    """A graph node: reads the state, returns the keys it updates."""

    def __call__(self, state: Any) -> dict[str, Any]: ...  # noqa: D102


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


class _ToolEvents(BaseCallbackHandler):
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


def _watched(tools: list[BaseTool], events: Events) -> list[BaseTool]:
    """Attach the stream-event handler to a role's (freshly built) tools."""
    handler = _ToolEvents(events)
    for tool in tools:
        tool.callbacks = [handler]
    return tools


def workspace(
    state: Mapping[str, Any], settings: Settings, events: Events | None = None
) -> Workspace:
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
        speed=typed("speed", SpeedEstimate),
        launch=typed("launch", LaunchSpec),
        smoke=typed("smoke_test", SmokeResult),
        review=typed("review", Review),
        round_no=int(state.get("review_round", 0)) or 1,
        on_progress=events.progress if events else None,
    )


def _dump(obj: Any) -> Any:
    return obj.model_dump(mode="json") if obj is not None else None


def _converse(
    model: BaseChatModel,
    settings: Settings,
    events: Events,
    tools: list[BaseTool],
    role: str,
    task: str,
    overrides: dict[str, Any] | None,
    **prompt: Any,
) -> list[BaseMessage]:
    """Run one role's tool-calling conversation over its tools."""
    names = {t.name for t in tools}

    def on_event(text: str) -> None:
        # Calls of real tools are reported by their callbacks (_ToolEvents); the loop's own
        # line matters only for a tool that does not exist, which no callback sees.
        name = text[5:].split("(", 1)[0] if text.startswith("tool ") else ""
        if name not in names:
            events("tool_error", f"{name}: no such tool" if name else text, tool=name or None)

    msgs = role_messages(role, task, overrides=overrides, **prompt)
    return run_tool_loop(model, tools, msgs, max_steps=settings.max_agent_steps, on_event=on_event)


def _run_skipped(
    ws: Workspace, tools: list[BaseTool], role: str, name: str, args: dict[str, Any]
) -> None:
    """Run a tool the model skipped, and say so in the report: facts come from tools regardless."""
    ws.notes.append(f"{role}: the model did not call {name}; ran {name} directly")
    next(t for t in tools if t.name == name).invoke(args)


# Everything a plan's later nodes write: a fresh request on a used thread starts clean.
_FRESH: dict[str, Any] = dict.fromkeys(
    (
        "hardware",
        "model",
        "framework",
        "memory",
        "deepspeed_config",
        "launch",
        "speed",
        "smoke_test",
        "review",
        "report",
        "plan",
    )
)


def _default_out_dir(brief: TrainingBrief, settings: Settings) -> Path:
    """out/<model name>, or out/<task> for an agent application."""
    if isinstance(brief.model, str):
        name = Path(brief.model).stem
    else:
        name = brief.task if brief.model is None else "custom"
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:64] or "plan"
    return settings.out_dir / safe


# Provider failures after which intake still has the offline parser's reading: the server
# refused this structured request (e.g. no tool_choice support), or the model would not answer
# it. Any other provider failure (down, timed out, HTTP 5xx, a rejected key) ends the run.
_STRUCTURED_REFUSALS = (ModelInvalidRequestError, ModelRefusalError, ContextOverflowError)


def _llm_read(
    model: BaseChatModel, text: str, known_models: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """Ask a real LLM for a request's brief fields by structured output: (fields, notes).

    Method ``function_calling``: the tool-calling API the roles already need, so any server
    that can run the roles (vLLM, llama.cpp, Ollama, LM Studio) can answer it, where
    ``json_schema`` response formats are less widely served. A reply that cannot be used
    (unparsable, not the schema, values a brief would refuse) leaves a note and the offline
    parser's reading; a provider that is down, times out or rejects the key raises the
    same error the roles would (``provider_error``).
    """
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from pydantic import ValidationError

    from agents.chat_models import provider_error
    from tools.intake.brief import RequestBrief, llm_request_fields

    schema = convert_to_openai_tool(RequestBrief)
    messages = [
        SystemMessage(
            f"{' '.join((RequestBrief.__doc__ or '').split())} Reply by calling "
            f"{schema['function']['name']}."
        ),
        HumanMessage(text),
    ]
    fallback = "intake: the LLM's structured reading of the request could not be used"
    try:
        # A dict schema (not the class) so the reply comes back unvalidated: each field is
        # then checked on its own, and one bad value does not cost the others.
        try:
            reader = model.with_structured_output(
                schema, method="function_calling", include_raw=True
            )
        except (TypeError, ValueError):  # a chat model whose structured output has one method
            reader = model.with_structured_output(schema, include_raw=True)
        answer = reader.invoke(messages)  # include_raw: {raw, parsed, parsing_error}
    except NotImplementedError:
        return {}, [f"{fallback} ({model._llm_type} has no structured output); parser only"]
    except ValidationError as exc:
        # The client could not build a message from the reply (arguments not an object).
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        return {}, [f"{fallback} (unreadable reply: {where}: {first['msg']}); parser only"]
    except Exception as exc:
        error = provider_error(exc, model)
        if error is None:
            raise  # our own model: a bug, not a provider failure
        status = getattr(exc, "status_code", None)
        refused = isinstance(exc, _STRUCTURED_REFUSALS) or status in (400, 422)
        if not refused and (isinstance(exc, ModelError) or isinstance(status, int)):
            raise error from exc
        return {}, [f"{fallback} ({error}); parser only"]
    result: dict[str, Any] = answer if isinstance(answer, dict) else {"parsed": answer}
    if result.get("parsing_error") is not None:
        line = (str(result["parsing_error"]).strip().splitlines() or ["?"])[0][:160]
        return {}, [f"{fallback} (unparsable: {line}); parser only"]
    if result.get("parsed") is None:
        raw = result.get("raw")
        bad = getattr(raw, "invalid_tool_calls", None)
        why = "its arguments are not valid JSON" if bad else "it answered without the fields"
        return {}, [f"{fallback} ({why}); parser only"]
    fields, dropped = llm_request_fields(result["parsed"], known_models)
    return fields, [f"intake: dropped the LLM's {d}" for d in dropped]


def make_intake(settings: Settings, model: BaseChatModel | None = None) -> Node:
    """Intake: a brief or a free-text request becomes a validated brief; the hardware is checked.

    A free-text request is read by the offline parser and, when the chat model is a real LLM,
    also by the LLM through structured output: the LLM fills what the parser did not find,
    and the parser wins where both found a value (``tools.brief.merge_read_fields``).
    ``model`` is the graph's chat model; None builds the one ``settings`` names, on the
    first request. A request that lacks something essential (a training request naming no
    model) gets one clarifying question through LangGraph's ``interrupt``: the run pauses (it
    needs a checkpointer) and resumes with ``Command(resume=answer)``; the answer goes
    through the parser and is merged into the request. Flags the caller set (``overrides``)
    win.
    """
    built: list[BaseChatModel] = []

    def reader() -> BaseChatModel:
        if model is not None:
            return model
        if not built:
            from agents.chat_models import load_chat_model

            built.append(
                load_chat_model(
                    settings.llm,
                    base_url=settings.base_url,
                    api_key=settings.api_key,
                    timeout_s=settings.llm_timeout_s,
                )
            )
        return built[0]

    def intake(state: Mapping[str, Any]) -> dict[str, Any]:
        from agents.offline import OfflinePlaybookModel
        from tools.intake.brief import (
            QUESTIONS,
            brief_from_request,
            merge_answer,
            merge_read_fields,
            missing_field,
            request_fields,
        )
        from tools.research.hardware import parse_hardware
        from tools.research.model_catalog import list_models

        events = Events("intake")
        overrides = dict(state.get("overrides") or {})
        notes: list[str] = []
        if state.get("brief"):
            brief = brief_from_dict({**state["brief"], **overrides})
        else:
            models = list_models()
            text = str(state.get("request") or "")
            parsed = request_fields(text, models)
            llm = reader()
            if not isinstance(llm, OfflinePlaybookModel):
                # On a resume after the clarifying question this node runs again and so asks
                # the LLM again; whatever it says then, the answers given stay matched to
                # the question (the model is the only field asked about).
                read, notes = _llm_read(llm, text, models)
                parsed, disagreements = merge_read_fields(parsed, read)
                notes += [f"intake: {d}" for d in disagreements]
                if read:
                    events.progress(f"LLM read: {', '.join(sorted(read))}")
            fields = {**parsed, **overrides}
            if field := missing_field(fields):
                # On resume the node runs again from the top and each interrupt() returns its
                # answer, in order (LangGraph matches resume values to interrupts by position).
                # An answer that still names no model is asked about again, saying why: the
                # answers given stay with the task, so failing here would replay the bad one
                # on every resume of this thread.
                problem = None
                while True:
                    question = QUESTIONS[field]
                    if problem:
                        question = f"{problem[0].upper()}{problem[1:]}. {question}"
                    answer = str(
                        interrupt({"field": field, "question": question, "problem": problem}) or ""
                    )
                    try:
                        fields = {**merge_answer(fields, field, answer, models), **overrides}
                        break
                    except InputError as exc:
                        problem = exc.message.split(";")[0]
                events("answer", f"{field}: {answer.strip()[:120]}", field=field)
            brief = brief_from_request(fields)
        # Fail fast on a bad hardware spec, before any agent spends a turn on it.
        parse_hardware(brief.hardware, brief.interconnect)
        name = brief.model if isinstance(brief.model, str) else "custom model"
        events.progress(f"{name if brief.model is not None else brief.task} on {brief.hardware}")
        return {
            **_FRESH,
            "brief": brief.model_dump(mode="json"),
            "out_dir": state.get("out_dir") or str(_default_out_dir(brief, settings)),
            "review_round": 0,
            "narrative": Overwrite({}),
            "notes": Overwrite(notes),
        }

    return intake


def make_researcher(
    model: BaseChatModel, settings: Settings, overrides: dict[str, Any] | None = None
) -> Node:
    """Researcher: hardware, model and framework facts."""

    def researcher(state: Mapping[str, Any]) -> dict[str, Any]:
        warm_up()
        events = Events("researcher")
        events("start", "started")
        ws = workspace(state, settings, events)
        tools = _watched(researcher_tools(ws), events)
        msgs = _converse(
            model,
            settings,
            events,
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
        warm_up()
        events = Events("engineer")
        events("start", "started")
        ws = workspace(state, settings, events)
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
        tools = _watched(engineer_tools(ws), events)
        msgs = _converse(
            model, settings, events, tools, "engineer", "engineer", overrides, context=context
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
            "speed": _dump(ws.speed),
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
        warm_up()
        events = Events("reviewer")
        events("start", "started")
        ws = workspace(state, settings, events)
        ws.round_no = int(state.get("review_round", 0)) + 1
        ws.review = None
        tools = _watched(reviewer_tools(ws), events)
        summary = {
            "strategy": ws.memory.chosen if ws.memory else None,
            "deepspeed_config": ws.deepspeed_config,
            "smoke_test": {
                k: v for k, v in (_dump(ws.smoke) or {}).items() if k in {"status", "reason"}
            },
        }
        msgs = _converse(
            model, settings, events, tools, "reviewer", "review", overrides, context=summary
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
        warm_up()
        from tools.artifacts.report import write_report

        ws = workspace(state, settings, Events("reporter"))
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
