"""One planning run for the adapters: run the graph, return a compact, JSON-able summary."""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from pydantic import BaseModel, Field

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
    the caller is usually a model that can fix its input (STYLE.md 6): ``status`` is
    ``invalid_input`` (with ``field`` and ``error``) or ``needs_input`` (intake's clarifying
    ``question``: call again with a request that answers it).
    """
    from langgraph.checkpoint.memory import InMemorySaver

    from graphs.graph import build_graph

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
    config: dict[str, Any] = {"configurable": {"thread_id": f"adapter-{uuid.uuid4().hex[:12]}"}}
    try:
        graph.invoke(inputs, config)
    except InputError as exc:
        return {"status": "invalid_input", "field": exc.field, "error": exc.message}
    snapshot = graph.get_state(config)
    if snapshot.interrupts:
        value = snapshot.interrupts[0].value
        value = value if isinstance(value, dict) else {"question": str(value)}
        return {
            "status": "needs_input",
            "field": value.get("field", "request"),
            "question": value.get("question", ""),
        }
    plan = snapshot.values.get("plan")
    if not plan:
        return {"status": "failed", "error": "the graph finished without a plan"}
    return summarize_plan(plan)


def summarize_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The few facts another agent needs from a plan (the full plan JSON is in the report)."""
    memory = plan.get("memory") or {}
    chosen = memory.get("chosen")
    row = next((s for s in memory.get("strategies", []) if s.get("name") == chosen), None)
    per_gpu_bytes = row["per_gpu_bytes"]["total"] if row else None
    capacity_bytes = memory.get("capacity_bytes")
    files = (plan.get("launch") or {}).get("files") or {}
    smoke = plan.get("smoke_test") or {}
    review = plan.get("review") or {}
    brief = plan.get("brief") or {}
    return {
        "status": "planned",
        "model": (plan.get("model") or {}).get("name") or brief.get("model"),
        "hardware": brief.get("hardware"),
        "framework": (plan.get("framework") or {}).get("primary"),
        "strategy": chosen,
        "micro_batch_size": memory.get("micro_batch_size"),
        "gradient_accumulation_steps": memory.get("gradient_accumulation_steps"),
        "per_gpu_bytes": per_gpu_bytes,
        "per_gpu_gb": round(per_gpu_bytes / 1e9, 1) if per_gpu_bytes else None,
        "gpu_memory_gb": round(capacity_bytes / 1e9, 1) if capacity_bytes else None,
        "deepspeed_config": files.get("ds_config.json") if plan.get("deepspeed_config") else None,
        "launch_command": " ".join((plan.get("launch") or {}).get("command") or []) or None,
        "smoke_test": {"status": smoke.get("status"), "reason": smoke.get("reason")},
        "review": {"verdict": review.get("verdict"), "rounds": review.get("rounds")},
        "report": (plan.get("report") or {}).get("markdown"),
    }


def summary_text(summary: dict[str, Any]) -> str:
    """One readable paragraph of a :func:`plan_training` summary, for chat replies."""
    status = summary.get("status")
    if status == "needs_input":
        return f"I need one more detail ({summary['field']}): {summary['question']}"
    if status != "planned":
        where = f" ({summary['field']})" if summary.get("field") else ""
        return f"I could not plan this{where}: {summary.get('error')}"
    memory = (
        f"{summary['per_gpu_gb']} GB per GPU of {summary['gpu_memory_gb']} GB"
        if summary.get("per_gpu_gb") is not None
        else "no per-GPU estimate"
    )
    smoke = summary["smoke_test"]
    parts = [
        f"Plan for {summary['model']} on {summary['hardware']}: {summary['framework']} with "
        f"strategy {summary['strategy']}, micro-batch {summary['micro_batch_size']} x "
        f"accumulation {summary['gradient_accumulation_steps']}, {memory}.",
        f"DeepSpeed config: {summary['deepspeed_config']}." if summary["deepspeed_config"] else "",
        f"Smoke test: {smoke['status']}"
        + (f" ({smoke['reason']})." if smoke.get("reason") else "."),
        f"Review: {summary['review']['verdict']} after {summary['review']['rounds']} round(s).",
        f"Report: {summary['report']}.",
    ]
    return " ".join(p for p in parts if p)
