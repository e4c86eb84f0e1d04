"""One planning run for the adapters: run the graph, return a compact, JSON-able summary."""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from pydantic import BaseModel, Field

from tools.artifacts.inference_report import inference_line
from tools.artifacts.text import plan_facts
from tools.core.errors import InputError
from tools.core.settings import Settings, disable_telemetry


class PlanTrainingInput(BaseModel):
    """What a calling model may set; settings, paths and the chat model are bound by the host."""

    request: str | None = Field(
        default=None,
        description=(
            "What to train, in plain words, e.g. 'fine-tune llama-3-8b on 1x8xA100-80GB with "
            "seq 4096'. It must name a model; give either this or brief."
        ),
    )
    brief: dict[str, Any] | None = Field(
        default=None,
        description=(
            "A training brief instead of request: {model, hardware, task, seq_len, "
            "global_batch_size, precision, ...}; model is a catalog id such as 'llama-3-8b' "
            "or {params: 7.0e9}; hardware is 'NODESxGPUSxTYPE' such as '1x8xA100-80GB' or 'local'."
        ),
    )
    smoke: bool | None = Field(
        default=None,
        description=(
            "Run the real smoke-test training run (seconds to minutes on CPU); false skips it. "
            "Leave unset to follow the brief."
        ),
    )


def plan_training(
    request: str | None = None,
    brief: dict[str, Any] | None = None,
    smoke: bool | None = None,
    *,
    chat_model: BaseChatModel | None = None,
    settings: Settings | None = None,
    out_dir: str | None = None,
) -> dict[str, Any]:
    """Run the planning graph once and return :func:`summarize_plan` of its plan.

    A request the graph cannot plan from comes back as a summary, not an exception, because
    the caller is usually a model that can fix its input: ``status`` is
    ``invalid_input`` (with ``field`` and ``error``) or ``needs_input`` (intake's clarifying
    ``question``: call again with a request that answers it).
    """
    from langgraph.checkpoint.memory import InMemorySaver

    from graphs.graph import build_graph
    from graphs.run import run_plan

    disable_telemetry()
    if (request is None) == (brief is None):
        return {
            "status": "invalid_input",
            "field": "request",
            "error": "give either a request text or a brief, not both or neither",
        }
    overrides: dict[str, Any] = {} if smoke is None else {"smoke": smoke}
    inputs: dict[str, Any] = {
        "request": request,
        "brief": {**brief, **overrides} if brief is not None else None,
        "overrides": overrides,
        "out_dir": out_dir,
    }
    # Intake's clarifying question is an interrupt, which needs a checkpointer; this run is
    # one call, so an in-memory one on a fresh thread is enough.
    graph = build_graph(chat_model, InMemorySaver(), settings or Settings.load())
    try:
        result = run_plan(graph, inputs, f"adapter-{uuid.uuid4().hex[:12]}")
    except InputError as exc:
        return {"status": "invalid_input", "field": exc.field, "error": exc.message}
    if result.question is not None:
        return {
            "status": "needs_input",
            "field": result.question.get("field", "request"),
            "question": result.question.get("question", ""),
        }
    if result.plan is None:
        return {"status": "failed", "error": "the graph finished without a plan"}
    return summarize_plan(result.plan)


def summarize_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The few facts another agent needs from a plan (the full plan JSON is in the report)."""
    f = plan_facts(plan)
    per_gpu, capacity = f["per_gpu_bytes"], f["capacity_bytes"]
    return {
        "status": "planned",
        "model": f["model"],
        "hardware": f["hardware"],
        "framework": f["framework"],
        "strategy": f["strategy"],
        "micro_batch_size": f["micro_batch_size"],
        "gradient_accumulation_steps": f["gradient_accumulation_steps"],
        "per_gpu_bytes": per_gpu,
        "per_gpu_gb": round(per_gpu / 1e9, 1) if per_gpu else None,
        "gpu_memory_gb": round(capacity / 1e9, 1) if capacity else None,
        "deepspeed_config": f["deepspeed_config"],
        "launch_command": f["launch_command"],
        # An inference plan's one line (engine, TP, concurrency, KV cache, decode tokens/s).
        "inference": inference_line(plan["inference"]) if plan.get("inference") else None,
        "smoke_test": {
            "status": f["smoke_status"],
            "reason": (plan.get("smoke_test") or {}).get("reason"),
        },
        "review": {"verdict": f["verdict"], "rounds": f["rounds"]},
        "report": f["report"],
    }
