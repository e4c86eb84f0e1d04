"""The graph end to end: offline default model, scripted fake models, checkpoint resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from scripted import call
from specs import LLAMA_8B_BRIEF

from graphs import build_graph
from tools.core.settings import Settings

LLAMA_8B = LLAMA_8B_BRIEF


def _run(graph, brief: dict, out: Path, config: dict | None = None) -> dict:
    return graph.invoke({"brief": brief, "out_dir": str(out)}, config or {})


def test_offline_graph_plans_llama_8b_on_8_a100(settings: Settings, tmp_path: Path) -> None:
    state = _run(build_graph(settings=settings), LLAMA_8B, tmp_path / "p")
    plan = state["plan"]
    assert plan["hardware"]["gpus_per_node"] == 8
    assert plan["model"]["params"] == 8_030_261_248
    assert plan["framework"]["primary"] == "deepspeed"
    # The researcher searched the knowledge index and cites the sections it read.
    assert any(
        c.startswith("knowledge/cards/deepspeed.md#") for c in plan["framework"]["citations"]
    )
    assert "Read: knowledge/cards/" in plan["narrative"]["researcher"]
    names = {s["name"] for s in plan["memory"]["strategies"]}
    assert {"ddp", "zero1", "zero2", "zero3"} <= names
    # plan.json's rows are told apart by label (names repeat: zero1 and zero1+tp2).
    labels = [s["label"] for s in plan["memory"]["strategies"]]
    assert len(labels) == len(set(labels)) and len(labels) > len(names), labels
    cfg = plan["deepspeed_config"]
    assert cfg["train_batch_size"] == 64
    assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 8 == 64
    assert plan["smoke_test"]["status"] == "skipped"
    assert plan["review"]["verdict"] == "approved"
    assert Path(plan["report"]["markdown"]).read_text().startswith("# Training plan")
    assert json.loads(Path(plan["report"]["json"]).read_text())["brief"]["model"] == "llama-3-8b"
    assert Path(plan["launch"]["files"]["ds_config.json"]).is_file()
    # Every role produced its own explanation through the tool-calling path.
    assert set(plan["narrative"]) >= {"researcher", "engineer", "reviewer"}
    assert "fallbacks" not in plan["narrative"]


def test_scripted_model_choices_reach_the_plan(
    scripted, settings: Settings, tmp_path: Path
) -> None:
    model = scripted(
        script=[
            AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": "profile_hardware",
                        "args": {"spec": "1x8xA100-80GB"},
                        "id": "a",
                        "type": "tool_call",
                    },
                    {
                        "name": "lookup_model",
                        "args": {"model": "llama-3-8b", "seq_len": 4096},
                        "id": "b",
                        "type": "tool_call",
                    },
                ],
            ),
            call("select_framework"),
            AIMessage(content="Researched."),
            call(
                "plan_parallelism",
                {"micro_batch_size": 1, "activation_checkpointing": True, "min_strategy": "zero3"},
            ),
            call("emit_deepspeed_config"),
            call("emit_launch", {"steps": 77}),
            AIMessage(content="Engineered."),
            call("review_plan"),
            AIMessage(content="Reviewed."),
        ]
    )
    plan = _run(build_graph(model, settings=settings), LLAMA_8B, tmp_path / "p")["plan"]
    assert plan["memory"]["chosen"] == "zero3"
    assert plan["memory"]["micro_batch_size"] == 1
    assert plan["deepspeed_config"]["zero_optimization"]["stage"] == 3
    assert plan["deepspeed_config"]["gradient_accumulation_steps"] == 8
    assert "77" in plan["launch"]["command"]
    assert plan["narrative"]["engineer"] == "Engineered."
    assert "fallbacks" not in plan["narrative"]
    # The model was shown each role's tools, bound through bind_tools.
    assert [
        "profile_hardware",
        "lookup_model",
        "select_framework",
        "search_knowledge",
    ] in model.bound_tools
    assert ["review_plan"] in model.bound_tools


def test_model_mistakes_go_back_as_messages_and_facts_still_come_from_tools(
    scripted, settings: Settings, tmp_path: Path
) -> None:
    model = scripted(
        script=[
            call("launch_missiles", {"target": "moon"}),
            call("lookup_model", {"model": "llama-3-8b", "seq_len": -5}),
            AIMessage(content="The model has 9 trillion parameters."),  # prose only, no tools
        ]
    )
    plan = _run(build_graph(model, settings=settings), LLAMA_8B, tmp_path / "p")["plan"]
    errors = [m.content for m in model.seen[2] if isinstance(m, ToolMessage)]
    assert "no tool 'launch_missiles'" in errors[0]
    assert "invalid arguments for lookup_model" in errors[1]
    # The invented number never reaches the plan: the node ran the tools itself and said so.
    assert plan["model"]["params"] == 8_030_261_248
    assert "ran lookup_model directly" in plan["narrative"]["fallbacks"]
    assert plan["review"]["verdict"] == "approved"


def test_invalid_hardware_in_brief_is_an_input_error(settings: Settings, tmp_path: Path) -> None:
    from tools.core.errors import InputError

    with pytest.raises(InputError) as err:
        _run(build_graph(settings=settings), {**LLAMA_8B, "hardware": "9xbanana"}, tmp_path / "p")
    assert err.value.field == "hardware"


def test_free_text_request_goes_through_intake(settings: Settings, tmp_path: Path) -> None:
    graph = build_graph(settings=settings)
    state = graph.invoke(
        {
            "request": "fine-tune llama-3-8b on 2 nodes of 8 H100 with sequence length 4096, no smoke",
            "out_dir": str(tmp_path / "p"),
        }
    )
    plan = state["plan"]
    assert plan["hardware"]["nodes"] == 2 and plan["hardware"]["gpus_per_node"] == 8
    assert plan["brief"]["seq_len"] == 4096
    assert plan["smoke_test"]["status"] == "skipped"


def test_sqlite_checkpoint_resumes_a_thread(settings: Settings, tmp_path: Path) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    db = tmp_path / "ck.sqlite"
    config = {"configurable": {"thread_id": "t1"}}
    with SqliteSaver.from_conn_string(str(db)) as saver:
        graph = build_graph(settings=settings, checkpointer=saver)
        # Stop before the engineer, as a crash there would.
        graph.invoke(
            {"brief": LLAMA_8B, "out_dir": str(tmp_path / "p")},
            config,
            interrupt_before=["engineer"],
        )
        assert graph.get_state(config).next == ("engineer",)
    with SqliteSaver.from_conn_string(str(db)) as saver:
        graph = build_graph(settings=settings, checkpointer=saver)
        state = graph.get_state(config)
        assert state.values["model"]["params"] == 8_030_261_248
        final = graph.invoke(None, config)
    assert final["plan"]["review"]["verdict"] == "approved"


@pytest.mark.slow
def test_offline_graph_with_real_smoke_run(settings: Settings, tmp_path: Path) -> None:
    brief = {
        "model": "gpt2",
        "task": "pretrain",
        "seq_len": 128,
        "global_batch_size": 8,
        "hardware": "local",
        "smoke": True,
        "team": {"experience": "beginner", "existing_stack": "none"},
    }
    plan = _run(build_graph(settings=settings), brief, tmp_path / "p")["plan"]
    smoke = plan["smoke_test"]
    assert smoke["status"] == "passed", smoke["reason"]
    assert smoke["world_size"] == 2
    assert sum(smoke["losses"][-5:]) < 0.9 * sum(smoke["losses"][:5])
    assert smoke["step_time_s"] > 0
    assert smoke["predicted_peak_memory_bytes"] > 0
    assert plan["review"]["verdict"] == "approved"


def _engineer_round(plan_args: dict) -> list[AIMessage]:
    return [
        call("plan_parallelism", plan_args),
        call("emit_deepspeed_config"),
        call("emit_launch"),
        AIMessage(content="Engineered."),
    ]


def _research() -> list[AIMessage]:
    return [
        call("profile_hardware", {"spec": "1x8xA100-80GB"}),
        call("lookup_model", {"model": "llama-3-8b", "seq_len": 4096}),
        call("select_framework"),
        AIMessage(content="Researched."),
    ]


def _review() -> list[AIMessage]:
    return [call("review_plan"), AIMessage(content="Reviewed.")]


# Micro-batch 8 without activation checkpointing: llama-3-8b at 8192 tokens fits no strategy,
# not even split 8 ways by tensor parallelism (~85 GB per GPU of 80).
TOO_BIG = {"micro_batch_size": 8, "activation_checkpointing": False}
LLAMA_8B_LONG = {**LLAMA_8B, "seq_len": 8192}


def test_review_sends_findings_back_and_the_engineer_fixes_them(
    scripted, settings: Settings, tmp_path: Path
) -> None:
    model = scripted(
        script=_research() + _engineer_round(TOO_BIG) + _review() + _engineer_round({}) + _review()
    )
    state = _run(build_graph(model, settings=settings), LLAMA_8B_LONG, tmp_path / "p")
    review = state["plan"]["review"]
    assert review["verdict"] == "approved" and review["rounds"] == 2
    # Round two's engineer was shown the memory finding it had to act on.
    engineer_prompts = [
        m[1].content
        for m in model.seen
        if "plan_parallelism" in str(m[1].content) or "review_findings" in str(m[1].content)
    ]
    assert any("memory_headroom" in p for p in engineer_prompts)


def test_review_rounds_are_bounded_then_rejected(
    scripted, settings: Settings, tmp_path: Path
) -> None:
    rounds = settings.max_review_rounds
    script = _research()
    for _ in range(rounds):
        script += _engineer_round(TOO_BIG) + _review()
    model = scripted(script=script)
    review = _run(build_graph(model, settings=settings), LLAMA_8B_LONG, tmp_path / "p")["plan"][
        "review"
    ]
    assert review["verdict"] == "rejected"
    assert review["rounds"] == rounds
    assert any(
        f["check"] == "memory_headroom" and f["severity"] == "error" for f in review["findings"]
    )


@pytest.mark.slow
def test_pytorch_ddp_plan_smoke_tests_with_torchrun(settings: Settings, tmp_path: Path) -> None:
    """An expert team with a model that fits replicas gets plain DDP, proved without DeepSpeed."""
    brief = {
        "model": "gpt2",
        "task": "pretrain",
        "seq_len": 128,
        "global_batch_size": 16,
        "hardware": "1x2xA100-80GB",
        "smoke": True,
        "team": {"experience": "expert", "existing_stack": "pytorch"},
    }
    plan = _run(build_graph(settings=settings), brief, tmp_path / "p")["plan"]
    assert plan["framework"]["primary"] == "pytorch_ddp"
    assert plan["deepspeed_config"] is None
    assert plan["launch"]["command"][0] == "torchrun"
    smoke = plan["smoke_test"]
    assert smoke["status"] == "passed", smoke["reason"]
    assert not (Path(smoke["run_dir"]) / "ds_config.json").exists()
    assert plan["review"]["verdict"] == "approved"


# ---- clarifying question (interrupt) and streaming ----------------------------------------------


def test_intake_asks_for_a_missing_model_and_resumes_with_the_answer(
    settings: Settings, tmp_path: Path
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    graph = build_graph(settings=settings, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "q"}}
    request = {
        "request": "pretrain a model on 2 nodes of 8 H100 with 4k context",
        "overrides": {"smoke": False},
        "out_dir": str(tmp_path / "p"),
    }
    paused = graph.invoke(request, config)
    assert "plan" not in paused or paused["plan"] is None
    state = graph.get_state(config)
    assert state.next == ("intake",)
    (question,) = state.interrupts
    assert question.value["field"] == "model"
    assert question.value["question"].startswith("Which model")
    # An answer that names no model gets the question again, saying why.
    graph.invoke(Command(resume="no idea"), config)
    (again,) = graph.get_state(config).interrupts
    assert again.value["problem"] == "the answer 'no idea' names no model"
    assert again.value["question"].startswith("The answer 'no idea' names no model. Which model")
    # The answer goes through the same parser and is merged into what the request said.
    plan = graph.invoke(Command(resume="llama 3 8b"), config)["plan"]
    assert plan["brief"]["model"] == "llama-3-8b"
    assert plan["brief"]["hardware"] == "2x8xH100-80GB"
    assert plan["brief"]["seq_len"] == 4096 and plan["brief"]["task"] == "pretrain"
    assert plan["model"]["params"] == 8_030_261_248
    assert graph.get_state(config).next == ()


def test_a_request_that_names_its_model_is_not_asked_anything(
    settings: Settings, tmp_path: Path
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    graph = build_graph(settings=settings, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "n"}}
    state = graph.invoke(
        {"request": "build a support assistant with agents", "out_dir": str(tmp_path / "p")},
        config,
    )
    assert state["plan"]["brief"]["task"] == "agent-app"
    assert not graph.get_state(config).interrupts


def _events(graph, inputs: dict) -> list[tuple[str, str, dict]]:
    """(node, kind, payload) for each stream item: kind 'done' for a node's update."""
    seen = []
    for mode, chunk in graph.stream(inputs, {}, stream_mode=["updates", "custom"]):
        if mode == "updates":
            seen += [(node, "done", update) for node, update in chunk.items()]
        else:
            seen.append((chunk["agent"], chunk["kind"], chunk))
    return seen


def test_stream_reports_nodes_in_order_with_each_tool_call_inside_its_node(
    settings: Settings, tmp_path: Path
) -> None:
    events = _events(
        build_graph(settings=settings), {"brief": LLAMA_8B, "out_dir": str(tmp_path / "p")}
    )
    order = [node for node, kind, _ in events if kind == "done"]
    assert order == ["intake", "researcher", "engineer", "reviewer", "reporter"]
    # Every custom event comes from the node running at that moment: before its update.
    running = iter(order)
    node = next(running)
    tools: dict[str, list[str]] = {}
    for agent, kind, payload in events:
        assert agent == node, (agent, kind, node)
        if kind == "done":
            node = next(running, "")
        elif kind == "tool":
            tools.setdefault(agent, []).append(payload["tool"])
            assert payload["text"].startswith(payload["tool"] + " ")
    assert tools == {
        "researcher": ["profile_hardware", "lookup_model", "select_framework", "search_knowledge"],
        "engineer": ["plan_parallelism", "emit_deepspeed_config", "emit_launch"],
        "reviewer": ["review_plan"],
    }
    # What each tool found follows its call.
    texts = [(agent, kind, p.get("text", "")) for agent, kind, p in events if kind != "done"]
    call = texts.index(("engineer", "tool", "plan_parallelism {}"))
    assert texts[call + 1][1] == "progress" and texts[call + 1][2].startswith("strategy: ")
    starts = [agent for agent, kind, _ in events if kind == "start"]
    assert starts == ["researcher", "engineer", "reviewer"]


def test_stream_shows_model_mistakes_and_the_tools_a_node_ran_itself(
    scripted, settings: Settings, tmp_path: Path
) -> None:
    model = scripted(script=[call("launch_missiles", {"target": "moon"})])
    events = _events(
        build_graph(model, settings=settings), {"brief": LLAMA_8B, "out_dir": str(tmp_path / "p")}
    )
    researcher = [
        (kind, p["text"]) for agent, kind, p in events if agent == "researcher" and kind != "done"
    ]
    assert ("tool_error", "launch_missiles: no such tool") in researcher
    # The model called none of the real tools; the node ran them, and they are reported too.
    assert [t for kind, t in researcher if kind == "tool"][:3] == [
        'profile_hardware {"spec": "1x8xA100-80GB", "interconnect": null}',
        'lookup_model {"model": "llama-3-8b", "seq_len": 4096}',
        "select_framework {}",
    ]


def test_intake_reads_a_request_with_the_chat_model_it_is_given(
    scripted, settings: Settings
) -> None:
    from agents.intake import make_intake

    read = {"model": "llama-2-7b", "seq_len": 8192, "hardware": "2x8xH100-80GB", "task": "dance"}
    model = scripted(
        script=[
            AIMessage(
                content="",
                tool_calls=[{"name": "RequestBrief", "args": read, "id": "r", "type": "tool_call"}],
            )
        ]
    )
    # (Hardware the text names but cannot be read, "on our cluster", is asked about instead:
    # tests/graph/test_requests_hw.py.)
    update = make_intake(settings, model)(
        {"request": "fine-tune llama-3-8b with a long context, as the team does"}
    )
    brief = update["brief"]
    # The text named the model, so the parser's stands; the LLM filled what the text only hinted.
    assert brief["model"] == "llama-3-8b"
    assert (brief["seq_len"], brief["hardware"]) == (8192, "2x8xH100-80GB")
    assert brief["task"] == "finetune"  # the LLM's "dance" is no task, and the text said fine-tune
    notes = " | ".join(update["notes"].value)
    assert "intake: model: kept 'llama-3-8b' from the text over the LLM's 'llama-2-7b'" in notes
    assert "intake: dropped the LLM's brief.task: Input should be" in notes
    # The model was shown the request itself, after the instruction naming the schema.
    system, human = model.seen[-1]
    assert "RequestBrief" in system.content and human.content.startswith("fine-tune llama-3-8b")
