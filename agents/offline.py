"""The offline default chat model: deterministic, and driven through the same tool-calling path.

It reads exactly what a real LLM would read (the bound tools, the task message with the brief,
and the tool results so far) and follows the role's playbook: which tool to call next and with
which arguments. It never produces a number of its own; its final answer quotes tool results.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

from tools.core.schemas import MemoryPlan

_JSON_BLOCK = re.compile(r"```json\s*(.*?)```", re.S)


def _task_json(messages: list[BaseMessage]) -> dict[str, Any]:
    for msg in reversed(messages):
        if isinstance(msg, HumanMessage) and isinstance(msg.content, str):
            m = _JSON_BLOCK.search(msg.content)
            if m:
                try:
                    data = json.loads(m.group(1))
                except json.JSONDecodeError:
                    return {}
                return data if isinstance(data, dict) else {}
    return {}


def _results(messages: list[BaseMessage]) -> dict[str, Any]:
    """Tool name -> parsed result of its latest successful call ("error" text otherwise)."""
    out: dict[str, Any] = {}
    for msg in messages:
        if isinstance(msg, ToolMessage) and msg.name:
            text = msg.content if isinstance(msg.content, str) else str(msg.content)
            try:
                out[msg.name] = json.loads(text)
            except json.JSONDecodeError:
                out[msg.name] = {"error": text}
    return out


def _sources(passages: Any) -> str:
    """Name the knowledge passages the researcher read."""
    if not isinstance(passages, list) or not passages:
        return ""
    return (
        " Read: "
        + "; ".join(p["cite"] for p in passages if isinstance(p, dict) and "cite" in p)
        + "."
    )


_COUNTER_LOCK = threading.Lock()


class OfflinePlaybookModel(BaseChatModel):
    """A deterministic chat model that follows the researcher/engineer/reviewer playbooks."""

    call_counter: int = 0

    @property
    def _llm_type(self) -> str:
        return "trainwright-offline"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        """Bind tools the way provider models do: as OpenAI-format schemas in the call kwargs."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        names = {t["function"]["name"] for t in kwargs.get("tools", [])}
        task = _task_json(messages)
        done = _results(messages)
        if "profile_hardware" in names:
            reply = self._researcher(task, done)
        elif "plan_parallelism" in names:
            reply = self._engineer(task, done)
        elif "review_plan" in names:
            reply = self._reviewer(done)
        else:
            reply = AIMessage(content="I have no tools for this task; nothing to do offline.")
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def _call(self, *calls: tuple[str, dict[str, Any]]) -> AIMessage:
        tool_calls = []
        for name, args in calls:
            # One model serves every plan of a graph, and plans may run in parallel threads:
            # the lock keeps each call id unique (``+=`` on a field is not atomic).
            with _COUNTER_LOCK:
                self.call_counter += 1
                number = self.call_counter
            tool_calls.append(
                {"name": name, "args": args, "id": f"call_{number}", "type": "tool_call"}
            )
        return AIMessage(content="", tool_calls=tool_calls)

    def _researcher(self, brief: dict[str, Any], done: dict[str, Any]) -> AIMessage:
        if "profile_hardware" not in done and "lookup_model" not in done:
            calls: list[tuple[str, dict[str, Any]]] = [
                (
                    "profile_hardware",
                    {
                        "spec": brief.get("hardware", "local"),
                        "interconnect": brief.get("interconnect"),
                    },
                )
            ]
            if brief.get("model") is not None:  # an agent app trains no model
                calls.append(
                    (
                        "lookup_model",
                        {"model": brief["model"], "seq_len": brief.get("seq_len", 2048)},
                    )
                )
            return self._call(*calls)
        if "select_framework" not in done:
            return self._call(("select_framework", {}))
        fw_done = done["select_framework"]
        if "search_knowledge" not in done and "error" not in fw_done:
            query = f"when to choose {fw_done['primary']}: {brief.get('goal') or brief.get('task')}"
            return self._call(("search_knowledge", {"query": query[:500], "k": 3}))
        hw, model, fw = (
            done.get("profile_hardware", {}),
            done.get("lookup_model", {}),
            done["select_framework"],
        )
        if "error" in fw:
            return AIMessage(content=f"I could not complete the research: {fw['error']}")
        gpu = (hw.get("gpu") or {}).get("name", "CPU only")
        return AIMessage(
            content=f"Target: {hw.get('nodes')} node(s) x {hw.get('gpus_per_node')} GPU(s) ({gpu}). "
            + (
                f"Model {model.get('name')}: {model.get('params', 0):,} parameters, {model.get('layers')} layers. "
                if model
                else "No model is trained. "
            )
            + f"Framework: {fw['primary']}. {fw['rationale']}"
            + _sources(done.get("search_knowledge"))
        )

    def _engineer(self, context: dict[str, Any], done: dict[str, Any]) -> AIMessage:
        if "plan_parallelism" not in done:
            return self._call(("plan_parallelism", self._adjustments(context)))
        if "emit_deepspeed_config" not in done:
            return self._call(("emit_deepspeed_config", {}))
        if "emit_launch" not in done:
            return self._call(("emit_launch", {}))
        if context.get("smoke", True) and "run_smoke_test" not in done:
            return self._call(("run_smoke_test", {}))
        mem = done["plan_parallelism"]
        smoke = done.get("run_smoke_test", {"status": "skipped"})
        if "error" in mem:
            return AIMessage(content=f"I could not plan the parallelism: {mem['error']}")
        plan = MemoryPlan.model_validate(mem)
        chosen = plan.chosen_row
        per_gpu = (
            f"{chosen.per_gpu_bytes.total / 1e9:.2f} GB per device" if chosen else "unknown memory"
        )
        acted = self._adjustments(context)
        review_note = (
            f"Acting on the review (previous strategy {context.get('previous_strategy')}), I "
            f"re-planned with {json.dumps(acted)}. "
            if acted
            else ""
        )
        return AIMessage(
            content=review_note
            + f"Chose {plan.chosen_label} with micro-batch {plan.micro_batch_size} and "
            f"{plan.gradient_accumulation_steps} accumulation steps ({per_gpu}). "
            f"Smoke test: {smoke.get('status')}"
            + (f" ({smoke.get('reason')})" if smoke.get("reason") else "")
            + "."
        )

    @staticmethod
    def _adjustments(context: dict[str, Any]) -> dict[str, Any]:
        """Act on the reviewer's findings: take the change the first error suggests.

        After an OOM the reviewer suggests the cheapest plan_parallelism arguments that lower
        memory per GPU (``Finding.suggested_args``: the next ZeRO stage, else activation
        checkpointing, else half the micro-batch). Without one, re-plan from scratch.
        """
        for finding in context.get("review_findings") or []:
            args = finding.get("suggested_args")
            if finding.get("severity") == "error" and isinstance(args, dict) and args:
                return dict(args)
        return {}

    @staticmethod
    def _reviewer(done: dict[str, Any]) -> AIMessage:
        if "review_plan" not in done:
            return AIMessage(
                content="",
                tool_calls=[
                    {"name": "review_plan", "args": {}, "id": "call_review", "type": "tool_call"}
                ],
            )
        review = done["review_plan"]
        if "error" in review:
            return AIMessage(content=f"I could not review the plan: {review['error']}")
        errors = [f["message"] for f in review.get("findings", []) if f["severity"] == "error"]
        warns = [f["message"] for f in review.get("findings", []) if f["severity"] == "warning"]
        history = [
            f["message"] for f in review.get("findings", []) if f.get("check") == "review_history"
        ]
        text = f"Verdict: {review['verdict']} after {review.get('rounds', 1)} round(s)."
        if history:
            text += " Rounds: " + "; ".join(history) + "."
        if errors:
            text += " Blocking: " + "; ".join(errors) + "."
        if warns:
            text += " Warnings: " + "; ".join(warns) + "."
        return AIMessage(content=text)
