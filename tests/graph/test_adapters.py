"""The adapters run the real graph inside a LangChain tool call, a real Crew and a real AutoGen team.

The frameworks' own loops run; only the models are offline: the graph's offline playbook
model, a CrewAI ``BaseLLM`` subclass that calls the tool through native function calling, and
AutoGen's ``ReplayChatCompletionClient``. Briefs turn the smoke run off to keep these fast.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tools.core.settings import Settings

BRIEF = {"model": "llama-3-8b", "hardware": "1x8xA100-80GB", "smoke": False}


def _check_summary(summary: dict[str, Any], out: Path) -> None:
    assert summary["status"] == "planned"
    assert summary["model"] == "llama-3-8b" or "llama" in str(summary["model"]).lower()
    assert summary["hardware"] == "1x8xA100-80GB"
    assert summary["strategy"] in {"zero1", "zero2", "zero3"}
    assert summary["micro_batch_size"] >= 1
    assert 0 < summary["per_gpu_gb"] <= summary["gpu_memory_gb"] == 80.0
    assert summary["smoke_test"]["status"] == "skipped"
    assert summary["review"]["verdict"] == "approved"
    ds_config = Path(summary["deepspeed_config"])
    assert ds_config.parent == out and ds_config.name == "ds_config.json"
    assert (
        json.loads(ds_config.read_text())["train_micro_batch_size_per_gpu"]
        == (summary["micro_batch_size"])
    )
    assert Path(summary["report"]).is_file()


def test_langchain_tool_plans_a_brief(settings: Settings, tmp_path: Path) -> None:
    from graphs.adapters.langchain_tool import make_plan_training_tool

    tool = make_plan_training_tool(settings=settings, out_dir=str(tmp_path / "lc"))
    assert tool.name == "plan_training"
    # The calling model sees only request, brief and smoke, each described.
    schema = tool.args_schema.model_json_schema()  # type: ignore[union-attr]
    assert set(schema["properties"]) == {"request", "brief", "smoke"}
    assert all(p.get("description") for p in schema["properties"].values())
    summary = json.loads(tool.invoke({"brief": BRIEF}))
    _check_summary(summary, tmp_path / "lc")


def test_langchain_tool_returns_input_problems_to_the_model(settings: Settings) -> None:
    from graphs.adapters.langchain_tool import make_plan_training_tool

    tool = make_plan_training_tool(settings=settings)
    both = json.loads(tool.invoke({"request": "fine-tune gpt2", "brief": BRIEF}))
    assert both["status"] == "invalid_input" and "either" in both["error"]
    bad = json.loads(tool.invoke({"brief": {**BRIEF, "hardware": "eight big GPUs"}}))
    assert bad["status"] == "invalid_input" and bad["field"] == "hardware"
    # A request that names no model: intake's clarifying question comes back as the answer.
    vague = json.loads(tool.invoke({"request": "train something on 1x8xA100-80GB"}))
    assert vague["status"] == "needs_input" and vague["field"] == "model"
    assert vague["question"]


def _crewai_offline_llm() -> Any:
    from crewai import BaseLLM

    class OfflineCrewLLM(BaseLLM):
        """Calls plan_training once through native function calling, then answers with its result.

        CrewAI 1.15 takes the native path when ``supports_function_calling()`` is true: the
        executor passes OpenAI-style tool schemas, expects a list of tool calls back, runs the
        tool, appends a ``tool`` message and calls the model again.
        """

        calls: list[dict[str, Any]] = []

        def supports_function_calling(self) -> bool:
            return True

        def call(
            self,
            messages: Any,
            tools: list[dict[str, Any]] | None = None,
            callbacks: Any = None,
            available_functions: Any = None,
            from_task: Any = None,
            from_agent: Any = None,
            response_model: Any = None,
        ) -> Any:
            msgs = (
                [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
            )
            self.calls.append({"messages": list(msgs), "tools": tools})
            results = [m for m in msgs if m.get("role") == "tool"]
            if results:
                summary = json.loads(results[-1]["content"])
                return (
                    f"Use {summary['strategy']} with micro-batch {summary['micro_batch_size']}; "
                    f"review {summary['review']['verdict']}; report at {summary['report']}."
                )
            names = [t["function"]["name"] for t in tools or []]
            assert "plan_training" in names, names
            args = {"brief": BRIEF}
            return [
                {
                    "id": "call_plan_1",
                    "type": "function",
                    "function": {"name": "plan_training", "arguments": json.dumps(args)},
                }
            ]

    return OfflineCrewLLM(model="offline-crew")


def test_crewai_tool_runs_inside_a_real_crew(settings: Settings, tmp_path: Path) -> None:
    from crewai import Crew, Task

    from graphs.adapters.crewai_tool import PlanTrainingTool, make_crewai_agent

    llm = _crewai_offline_llm()
    agent = make_crewai_agent(llm, settings=settings, out_dir=str(tmp_path / "crew"))
    assert agent.role == "Distributed Training Engineer"
    assert [type(t) for t in agent.tools] == [PlanTrainingTool]
    task = Task(
        description="Plan fine-tuning llama-3-8b on one node of 8 A100-80GB GPUs.",
        expected_output="The strategy, micro-batch, review verdict and report path.",
        agent=agent,
    )
    result = Crew(agents=[agent], tasks=[task]).kickoff()

    # The model was called twice: once with the tool schema, once with the tool's result.
    assert len(llm.calls) == 2
    tool_messages = [m for m in llm.calls[1]["messages"] if m.get("role") == "tool"]
    summary = json.loads(tool_messages[-1]["content"])
    _check_summary(summary, tmp_path / "crew")
    assert f"Use {summary['strategy']} with micro-batch" in result.raw
    assert summary["report"] in result.raw


def test_autogen_agent_plans_inside_a_round_robin_team(settings: Settings, tmp_path: Path) -> None:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
    from autogen_agentchat.messages import TextMessage
    from autogen_agentchat.teams import RoundRobinGroupChat
    from autogen_ext.models.replay import ReplayChatCompletionClient

    from graphs.adapters.autogen_agent import TrainingPlannerAgent

    planner = TrainingPlannerAgent(settings=settings, out_dir=str(tmp_path / "ag"), smoke=False)
    critic = AssistantAgent(
        "critic",
        model_client=ReplayChatCompletionClient(["The plan fits in memory and was approved. DONE"]),
        system_message="Check the planner's plan; say DONE when it is approved.",
    )
    team = RoundRobinGroupChat(
        [planner, critic],
        termination_condition=TextMentionTermination("DONE") | MaxMessageTermination(6),
    )
    result = asyncio.run(team.run(task=json.dumps(BRIEF)))

    texts = [m for m in result.messages if isinstance(m, TextMessage)]
    assert [m.source for m in texts] == ["user", "training_planner", "critic"]
    reply = texts[1].content
    summary = json.loads(reply.splitlines()[-1])
    _check_summary(summary, tmp_path / "ag")
    assert reply.startswith(f"Plan for {summary['model']} on 1x8xA100-80GB")
    assert f"strategy {summary['strategy']}, micro-batch {summary['micro_batch_size']}" in reply
    assert "DONE" in texts[2].content
    assert result.stop_reason and "DONE" in result.stop_reason
    assert planner.last_summary == summary


def test_autogen_agent_reads_free_text_and_resets(settings: Settings, tmp_path: Path) -> None:
    from autogen_agentchat.messages import TextMessage
    from autogen_core import CancellationToken

    from graphs.adapters.autogen_agent import TrainingPlannerAgent

    planner = TrainingPlannerAgent(settings=settings, out_dir=str(tmp_path / "ag2"), smoke=False)

    async def scenario() -> tuple[str, str]:
        token = CancellationToken()
        first = await planner.on_messages(
            [TextMessage(content="fine-tune gpt2 on 1x2xA100-80GB", source="user")], token
        )
        await planner.on_reset(token)
        empty = await planner.on_messages([], token)
        return first.chat_message.to_text(), empty.chat_message.to_text()

    first, empty = asyncio.run(scenario())
    assert first.startswith("Plan for ") and "1x2xA100-80GB" in first
    assert json.loads(first.splitlines()[-1])["smoke_test"]["status"] == "skipped"
    assert planner.last_summary is None and "what to train" in empty


def test_langgraph_json_points_at_a_compiled_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    root = Path(__file__).resolve().parents[2]
    config = json.loads((root / "langgraph.json").read_text())
    module, _, attr = config["graphs"]["trainwright"].partition(":")
    # A module, not a file path: the server opens a path relative to its cwd (tests/e2e/test_server.py).
    assert "/" not in module and not module.endswith(".py")
    graph = getattr(importlib.import_module(module), attr)
    assert graph.name == "trainwright"
    assert graph.checkpointer is None  # the server brings its own
    assert {"intake", "researcher", "engineer", "reviewer", "reporter"} <= set(graph.nodes)


def test_build_graph_is_the_package_entry_point() -> None:
    import graphs
    from graphs.graph import build_graph

    assert graphs.build_graph is build_graph
