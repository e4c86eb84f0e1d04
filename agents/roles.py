"""The graph's working nodes: the three roles, run by one role runner, and the reporter.

A role is data (``RoleSpec``): its tools, what its task message shows, the tools the node runs
itself if the model skipped them, and the work products it writes. ``run_role`` is the same for
all three: the tool-calling loop with the graph's chat model, then the fallbacks, so the plan's
facts always come from tools, whatever the model does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool

from agents.events import Events, watched
from agents.loop import final_text, role_messages, run_tool_loop
from agents.smoke_run import smoke_for
from agents.toolkit import engineer_tools, researcher_tools, reviewer_tools
from agents.workspace import PRODUCT_KEYS, Workspace, dump, from_state, to_state
from prompts import load_prompts, task_of
from tools.core.imports import warm_up
from tools.core.request_account import closed_account
from tools.core.schemas import ScalingPlan, SizingPlan, SmokeResult, TrainingPlan
from tools.core.settings import Settings
from tools.core.strategies import ZERO_STAGE
from tools.core.untrusted import cap_text
from tools.research.framework import DEEPSPEED_FRAMEWORKS
from tools.smoke.policy import AGENT_APP_SMOKE, INFERENCE_SMOKE


class Node(Protocol):
    """A graph node: reads the state, returns the keys it updates."""

    def __call__(self, state: Any) -> dict[str, Any]: ...  # noqa: D102


@dataclass(frozen=True)
class Fallback:
    """A tool the node runs itself when the model did not, with the arguments it needs."""

    tool: str
    missing: Callable[[Workspace], bool]
    args: Callable[[Workspace], dict[str, Any]] = lambda ws: {}


@dataclass(frozen=True)
class RoleSpec:
    """One role: prompts/agents.yaml names it, the toolkit equips it, the state receives its work."""

    name: str
    tools: Callable[[Workspace], list[BaseTool]]
    # Keyword arguments of agents.loop.role_messages: the brief or the context it shows.
    prompt: Callable[[Workspace], dict[str, Any]]
    fallbacks: tuple[Fallback, ...]
    products: tuple[str, ...]
    # Runs after the prompt is built and before the model: may reset the workspace, or return
    # the node's whole update when there is nothing for the model to do.
    start: Callable[[Workspace, Mapping[str, Any]], dict[str, Any] | None] = lambda ws, state: None
    # Runs after the fallbacks: what the node does itself, whatever the model did.
    finish: Callable[[Workspace], None] = lambda ws: None


def _converse(
    model: BaseChatModel,
    settings: Settings,
    events: Events,
    tools: list[BaseTool],
    role: str,
    prompt: dict[str, Any],
) -> list[BaseMessage]:
    """Run one role's tool-calling conversation over its tools."""
    names = {t.name for t in tools}

    def on_event(text: str) -> None:
        # Calls of real tools are reported by their callbacks (agents.events.ToolEvents); the
        # loop's own line matters only for a tool that does not exist, which no callback sees.
        name = text[5:].split("(", 1)[0] if text.startswith("tool ") else ""
        if name not in names:
            events("tool_error", f"{name}: no such tool" if name else text, tool=name or None)

    msgs = role_messages(role, task_of(role), **prompt)
    return run_tool_loop(model, tools, msgs, max_steps=settings.max_agent_steps, on_event=on_event)


def run_role(
    spec: RoleSpec, model: BaseChatModel, settings: Settings, state: Mapping[str, Any]
) -> dict[str, Any]:
    """One role's turn: its tools and task for the model, then whatever the model skipped."""
    if settings.warm_imports:
        warm_up()
    events = Events(spec.name)
    events("start", "started")
    ws = from_state(state, settings, events.progress)
    prompt = spec.prompt(ws)
    early = spec.start(ws, state)
    if early is not None:
        return early
    allowed = set(load_prompts()[0][spec.name]["tools"])
    tools = watched([t for t in spec.tools(ws) if t.name in allowed], events)
    msgs = _converse(model, settings, events, tools, spec.name, prompt)
    for fallback in spec.fallbacks:
        if fallback.missing(ws):
            # Say so in the report: the facts come from tools regardless.
            ws.notes.append(
                f"{spec.name}: the model did not call {fallback.tool}; ran {fallback.tool} directly"
            )
            next(t for t in tools if t.name == fallback.tool).invoke(fallback.args(ws))
    spec.finish(ws)
    return {
        **to_state(ws, spec.products),
        "narrative": {spec.name: final_text(msgs)},
        "notes": [cap_text(note) for note in ws.notes],
    }


def make_role(spec: RoleSpec, model: BaseChatModel, settings: Settings) -> Node:
    """The graph node that runs ``spec`` with ``model``."""

    def node(state: Mapping[str, Any]) -> dict[str, Any]:
        return run_role(spec, model, settings, state)

    node.__name__ = spec.name
    return node


# ---- the three roles ---------------------------------------------------------------------------


def _model_arg(ws: Workspace) -> dict[str, Any]:
    b = ws.brief
    model = b.model if isinstance(b.model, str) or b.model is None else b.model.model_dump()
    return {"model": model, "seq_len": b.seq_len}


RESEARCHER = RoleSpec(
    name="researcher",
    tools=researcher_tools,
    prompt=lambda ws: {"brief": ws.brief.model_dump(mode="json")},
    fallbacks=(
        Fallback(
            "profile_hardware",
            lambda ws: ws.hardware is None,
            lambda ws: {"spec": ws.brief.hardware, "interconnect": ws.brief.interconnect},
        ),
        Fallback(
            "lookup_model", lambda ws: ws.model is None and ws.brief.model is not None, _model_arg
        ),
        Fallback("select_framework", lambda ws: ws.framework is None),
    ),
    products=("hardware", "model", "framework", "searched"),
)


def _engineer_context(ws: Workspace) -> dict[str, Any]:
    """What the engineer's task shows: the facts so far and the review findings to act on."""
    findings = [f for f in (ws.review.findings if ws.review else []) if f.severity != "info"]
    return {
        "context": {
            "brief": ws.brief.model_dump(mode="json"),
            "smoke": ws.brief.smoke,
            "hardware": dump(ws.hardware),
            "model": {k: v for k, v in (dump(ws.model) or {}).items() if k != "hf_config"},
            "framework": ws.framework.primary if ws.framework else None,
            "previous_strategy": ws.memory.chosen if ws.memory else None,
            "review_findings": [f.model_dump() for f in findings],
        }
    }


def _engineer_start(ws: Workspace, state: Mapping[str, Any]) -> dict[str, Any] | None:
    if ws.brief.task == "agent-app":
        # Nothing to train: no strategy, config, launch or run to engineer.
        return {
            "memory": None,
            "deepspeed_config": None,
            "launch": {"command": [], "files": {}},
            "smoke_test": dump(SmokeResult(status="skipped", reason=AGENT_APP_SMOKE)),
            "narrative": {
                "engineer": "An agent application trains nothing; no parallelism plan is needed."
            },
        }
    if ws.brief.task == "inference":
        return _inference_round(ws)
    # A new round plans afresh: stale results must not survive into the review.
    ws.memory, ws.deepspeed_config, ws.launch, ws.smoke = None, None, None, None
    return None


def _inference_round(ws: Workspace) -> dict[str, Any]:
    """An inference plan: no strategy search, training config or smoke run; serve files instead.

    Deterministic arithmetic (tools/planning/inference.py), so the node runs it itself.
    """
    from agents.workspace import need
    from tools.artifacts.serving import emit_serving
    from tools.planning.inference import plan_inference

    model = need(ws.model, "the model", "the researcher's lookup_model")
    hardware = need(ws.hardware, "the hardware", "the researcher's profile_hardware")
    plan = plan_inference(model, hardware, ws.brief)
    launch = emit_serving(ws.out_dir, plan)
    ws.progress(
        f"inference: {plan.engine} tensor parallel {plan.tensor_parallel}"
        + (f" x pipeline {plan.pipeline_parallel}" if plan.pipeline_parallel > 1 else "")
        + f", up to {plan.max_concurrency} sequences of {plan.context_len} tokens"
    )
    return {
        "memory": None,
        "speed": None,
        "deepspeed_config": None,
        "inference": dump(plan),
        "launch": dump(launch),
        "smoke_test": dump(SmokeResult(status="skipped", reason=INFERENCE_SMOKE)),
        "narrative": {
            "engineer": f"Inference plan: {plan.engine} with tensor parallel "
            f"{plan.tensor_parallel}; no training config and no training smoke run."
        },
    }


def _engineer_finish(ws: Workspace) -> None:
    if ws.smoke is None and ws.smoke_runs:
        # The round's one smoke run was started and did not finish with a result: no second.
        ws.smoke = SmokeResult(status="failed").failed(
            "launcher_error", "the smoke run of this round did not finish"
        )
    if ws.smoke is None:
        if ws.brief.smoke:
            ws.notes.append("engineer: the model did not call run_smoke_test; ran it directly")
        ws.smoke = smoke_for(ws)


ENGINEER = RoleSpec(
    name="engineer",
    tools=engineer_tools,
    prompt=_engineer_context,
    fallbacks=(
        Fallback("plan_parallelism", lambda ws: ws.memory is None),
        Fallback(
            "emit_deepspeed_config",
            lambda ws: (
                not ws.config_validated
                and ws.framework is not None
                and ws.framework.primary in DEEPSPEED_FRAMEWORKS
            ),
        ),
        Fallback("emit_launch", lambda ws: ws.launch is None),
    ),
    products=("memory", "speed", "deepspeed_config", "launch", "smoke_test"),
    start=_engineer_start,
    finish=_engineer_finish,
)


def _review_context(ws: Workspace) -> dict[str, Any]:
    smoke = dump(ws.smoke) or {}
    return {
        "context": {
            "inference": (
                {k: v for k, v in dump(ws.inference).items() if k in _INFERENCE_SHOWN}
                if ws.inference
                else None
            ),
            "strategy": ws.memory.chosen if ws.memory else None,
            "deepspeed_config": ws.deepspeed_config,
            "smoke_test": {k: v for k, v in smoke.items() if k in {"status", "reason"}},
        }
    }


_INFERENCE_SHOWN = ("engine", "tensor_parallel", "pipeline_parallel", "max_concurrency", "fits")


def _reviewer_start(ws: Workspace, state: Mapping[str, Any]) -> None:
    ws.round_no = int(state.get("review_round", 0)) + 1
    ws.review = None


REVIEWER = RoleSpec(
    name="reviewer",
    tools=reviewer_tools,
    prompt=_review_context,
    fallbacks=(Fallback("review_plan", lambda ws: ws.review is None),),
    products=("review", "review_round"),
    start=_reviewer_start,
)
ROLES = (RESEARCHER, ENGINEER, REVIEWER)


# ---- the reporter ------------------------------------------------------------------------------


def _used_frameworks(ws: Workspace) -> list[str]:
    """The frameworks a finished plan uses: its stack, and deepspeed when it has a DeepSpeed config."""
    used: list[str] = [*ws.framework.stack, ws.framework.primary] if ws.framework else []
    return used + (["deepspeed"] if ws.deepspeed_config is not None else [])


def _fp8_marked(ws: Workspace, account: dict[str, Any] | None) -> dict[str, Any] | None:
    """The account with the fp8 wish marked from the plan made (tools/artifacts/fp8_launch.py)."""
    from tools.artifacts.fp8_launch import mark_fp8_wish

    return mark_fp8_wish(
        account,
        primary=ws.framework.primary if ws.framework else None,
        gemm_precision=ws.speed.gemm_precision if ws.speed else None,
        # The search's own line counts too (a setup that rules Megatron's fp8 out).
        launch_notes=[
            *(ws.launch.notes if ws.launch else []),
            *(ws.memory.not_honoured if ws.memory else []),
        ],
        precision_note=ws.precision_note,
    )


def _plan_marked(
    ws: Workspace, account: dict[str, Any] | None, scaling: ScalingPlan
) -> dict[str, Any] | None:
    """The account with the deadline, budget and techniques the plan decides marked."""
    from tools.artifacts.plan_wishes import mark_plan_wishes

    model = ws.model
    return mark_plan_wishes(
        account,
        memory=ws.memory,
        scaling=scaling,
        primary=ws.framework.primary if ws.framework else None,
        brief=ws.brief,
        experts=model is not None and (model.active_params or model.params) < model.params,
        nodes=ws.hardware.nodes if ws.hardware is not None else 1,
        gpu=ws.hardware.gpu if ws.hardware is not None else None,
    )


def make_reporter(settings: Settings) -> Node:
    """Reporter: assemble the TrainingPlan, write report.md, report.html and plan.json.

    The assembled plan replaces the work products in the state, so a finished thread holds the
    plan once.
    """

    def reporter(state: Mapping[str, Any]) -> dict[str, Any]:
        if settings.warm_imports:
            warm_up()
        from tools.artifacts.report import write_report
        from tools.planning.scaling import plan_scaling

        ws = from_state(state, settings, Events("reporter").progress)
        narrative = dict(state.get("narrative") or {})
        if state.get("notes"):
            narrative["fallbacks"] = " ".join(state["notes"])
        # Time and cost at other sizes of the same GPU, from the same chooser (no GPU: a note).
        scaling = (
            plan_scaling(ws.model, ws.hardware, ws.brief, ws.memory, ws.speed)
            if ws.hardware is not None
            else ScalingPlan()
        )
        plan = TrainingPlan(
            brief=ws.brief,
            hardware=ws.hardware,  # type: ignore[arg-type]
            model=ws.model,
            framework=ws.framework,  # type: ignore[arg-type]
            memory=ws.memory,
            deepspeed_config=ws.deepspeed_config,
            launch=ws.launch,  # type: ignore[arg-type]
            smoke_test=ws.smoke or SmokeResult(status="skipped", reason="no smoke run"),
            review=ws.review,  # type: ignore[arg-type]
            speed=ws.speed,
            inference=ws.inference,
            scaling=scaling,
            sizing=SizingPlan.model_validate(state["sizing"]) if state.get("sizing") else None,
            narrative=narrative,
            request=closed_account(
                _plan_marked(ws, _fp8_marked(ws, state.get("request_account")), scaling),
                _used_frameworks(ws),
                ZERO_STAGE.get(ws.memory.chosen) if ws.memory else None,
                primary=ws.framework.primary if ws.framework else None,
                not_honoured=ws.framework.not_honoured if ws.framework else None,
                objective=ws.brief.objective,
            ),
        )
        paths = write_report(plan, ws.out_dir)
        ws.progress(f"report: {paths.markdown}")
        plan = plan.model_copy(update={"report": paths})
        return {
            **dict.fromkeys(PRODUCT_KEYS),
            "sizing": None,
            "plan": json.loads(plan.model_dump_json()),
        }

    return reporter
