"""The review loop: concrete checks and fixes, the engineer acting on them, bounded rounds.

The slow test forces a real OOM (Settings.smoke_inject) into a real 2-rank CPU DeepSpeed smoke
run and watches the offline engineer re-plan with less memory through the tool-calling path;
the test of a loop that runs out of rounds scripts its OOMs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from specs import LLAMA_8B_BRIEF

from agents.loop import role_messages, run_tool_loop
from agents.offline import OfflinePlaybookModel
from agents.toolkit import engineer_tools
from agents.workspace import Workspace
from graphs import build_graph
from tools.artifacts.deepspeed_config import emit_deepspeed_config
from tools.core.errors import InputError
from tools.core.schemas import (
    Finding,
    FrameworkChoice,
    MemoryPlan,
    ModelSpec,
    Review,
    SmokeResult,
)
from tools.core.settings import Settings
from tools.core.strategies import STRATEGY_ORDER
from tools.intake.brief import brief_from_dict
from tools.planning import SearchOptions, search_strategy
from tools.research.framework import select_framework
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model
from tools.review.checks import check_plan, memory_fix
from tools.review.config_keys import (
    DEEPSPEED_REMOVED_KEYS,
    DEEPSPEED_TOP_LEVEL_KEYS,
    config_key_findings,
)
from tools.review.rounds import decide, round_findings, setup_of

LLAMA_8B = {**LLAMA_8B_BRIEF, "smoke": True}
OOM = SmokeResult(status="failed").failed("oom", "out of memory on rank(s) [0, 1]: RuntimeError")
DEEPSPEED = FrameworkChoice(primary="deepspeed", stack=["deepspeed"], rationale="test")


@pytest.fixture(scope="module")
def llama() -> dict[str, Any]:
    """The facts of the LLAMA_8B brief, and a round-one setup: zero1, micro-batch 1, no checkpointing.

    The setup is pinned (not searched) so these tests do not move with the planner's choices.
    """
    brief = brief_from_dict({**LLAMA_8B, "smoke": False})
    hardware = parse_hardware(brief.hardware)
    model = lookup_model("llama-3-8b", brief.seq_len)
    framework = select_framework(
        brief,
        hardware,
        model,
        search_strategy(model, hardware, brief, SearchOptions(objective="memory")),
    )
    memory = search_strategy(model, hardware, brief).model_copy(
        update={
            "chosen": "zero1",
            "micro_batch_size": 1,
            "gradient_accumulation_steps": 8,
            "activation_checkpointing": False,
        }
    )
    config = emit_deepspeed_config(memory, model, hardware, brief)
    return dict(
        brief=brief,
        hardware=hardware,
        model=model,
        framework=framework,
        memory=memory,
        config=config,
    )


def _round_one_review(llama: dict[str, Any]) -> Review:
    """Round one as the reviewer sees it after the injected OOM."""
    findings = check_plan(
        llama["brief"], llama["hardware"], llama["framework"], llama["memory"], llama["config"], OOM
    )
    findings += round_findings(llama["memory"], llama["config"], None, 1)
    return decide(findings, 1, 2, setup_of(llama["memory"], llama["config"]))


def _next(strategy: str) -> str:
    return STRATEGY_ORDER[STRATEGY_ORDER.index(strategy) + 1]  # type: ignore[arg-type]


# ---- config keys DeepSpeed ignores ---------------------------------------------------------


def test_key_sets_are_what_the_installed_deepspeed_reads() -> None:
    """Re-record the top-level keys DeepSpeedConfig looks up; a DeepSpeed upgrade shows here."""
    from deepspeed.runtime import config as config_module

    from tools.artifacts.ds_validate import parse_recording

    _, recorded = parse_recording({"train_batch_size": 1}, 1)
    read = {key for key in recorded if isinstance(key, str)}
    # sequence_parallel_size is read only when DeepSpeedConfig gets no mpu.
    assert read == (DEEPSPEED_TOP_LEVEL_KEYS | DEEPSPEED_REMOVED_KEYS) - {"sequence_parallel_size"}
    assert set(config_module._REMOVED_TOP_LEVEL_CONFIG_KEYS) == DEEPSPEED_REMOVED_KEYS


def test_config_keys_check_flags_typos_removed_blocks_and_auto(llama: dict[str, Any]) -> None:
    clean = config_key_findings(llama["config"])
    assert [(f.severity, f.check) for f in clean] == [("info", "config_keys")]

    config = json.loads(json.dumps(llama["config"]))
    config["zero_optimisation"] = config.pop("zero_optimization")
    config["amp"] = {"enabled": True}
    config["gradient_clipping"] = "auto"
    config["data_types"] = {"keep_in_fp32_modules": "auto"}  # DeepSpeed's own default
    by_message = {f.message: f for f in config_key_findings(config)}
    assert all(f.severity == "error" for f in by_message.values())
    typo = next(f for m, f in by_message.items() if "'zero_optimisation'" in m)
    assert "silently ignored" in typo.message and typo.fix == "rename it to 'zero_optimization'"
    assert any("'amp'" in m and "removed" in m for m in by_message)
    assert [m for m in by_message if '"auto"' in m] == [
        'gradient_clipping is "auto": only the Hugging Face Trainer integration resolves '
        '"auto"; launched with deepspeed the value is not a number'
    ]
    # The check is part of every review of a DeepSpeed plan; an "auto" batch size is reported
    # there, not tripped over by the batch arithmetic.
    config["train_batch_size"] = "auto"
    findings = check_plan(
        llama["brief"],
        llama["hardware"],
        llama["framework"],
        llama["memory"],
        config,
        SmokeResult(status="skipped", reason="off"),
    )
    assert sum(f.check == "config_keys" and f.severity == "error" for f in findings) == 4
    assert not [f for f in findings if f.check == "batch_arithmetic"]
    assert decide(findings, 1, 2).verdict == "changes_requested"


# ---- fixes, the engineer acting on them, the record of rounds --------------------------------


def test_oom_fix_names_plan_parallelism_changes_cheapest_first(llama: dict[str, Any]) -> None:
    memory: MemoryPlan = llama["memory"].model_copy(update={"micro_batch_size": 4})
    fix = memory_fix(DEEPSPEED, memory)
    ladder = [
        'plan_parallelism {"min_strategy": "zero2"}',
        'plan_parallelism {"activation_checkpointing": true}',
        'plan_parallelism {"micro_batch_size": 2}',
    ]
    assert [fix.index(step) for step in ladder] == sorted(fix.index(step) for step in ladder)
    # Plain PyTorch runs no ZeRO: only checkpointing and the micro-batch are left.
    ddp = FrameworkChoice(primary="pytorch_ddp", stack=["pytorch"], rationale="test")
    assert "min_strategy" not in memory_fix(ddp, memory)
    lean = memory.model_copy(
        update={
            "chosen": "zero3_offload_all",
            "activation_checkpointing": True,
            "micro_batch_size": 1,
        }
    )
    assert "plan_parallelism" not in memory_fix(DEEPSPEED, lean)
    assert "more GPUs" in memory_fix(DEEPSPEED, lean)


def test_offline_engineer_acts_on_the_oom_fix_through_its_tools(
    llama: dict[str, Any], settings: Settings, tmp_path: Path
) -> None:
    """Round two's engineer reads the fix in its task and re-plans through tool calls."""
    review = _round_one_review(llama)
    assert review.verdict == "changes_requested"
    # What the engineer node puts in the task (agents/roles.py): findings above info.
    context = {
        "smoke": False,
        "framework": llama["framework"].primary,
        "previous_strategy": llama["memory"].chosen,
        "review_findings": [f.model_dump() for f in review.findings if f.severity != "info"],
    }
    ws = Workspace(
        settings=settings,
        out_dir=tmp_path / "p",
        brief=llama["brief"],
        hardware=llama["hardware"],
        model=llama["model"],
        framework=llama["framework"],
        review=review,
    )
    messages = role_messages("engineer", "engineer", context=context)
    assert 'plan_parallelism {\\"min_strategy\\": \\"zero2\\"}' in str(messages[1].content)
    run_tool_loop(OfflinePlaybookModel(), engineer_tools(ws), messages)
    calls = [c for m in messages for c in getattr(m, "tool_calls", [])]
    assert calls[0]["name"] == "plan_parallelism"
    assert calls[0]["args"] == {"min_strategy": "zero2"}
    assert [c["name"] for c in calls[1:]] == ["emit_deepspeed_config", "emit_launch"]
    # The planner chose among zero2 and heavier setups, and the config follows it.
    assert ws.memory is not None and ws.memory.chosen in STRATEGY_ORDER[2:]
    assert ws.deepspeed_config is not None and ws.config_validated
    assert ws.deepspeed_config["zero_optimization"]["stage"] >= 2
    assert "re-planned with" in str(messages[-1].content)


def test_rounds_record_what_failed_and_what_changed(llama: dict[str, Any]) -> None:
    round_one = _round_one_review(llama)
    setup = [f for f in round_one.findings if f.check == "setup"]
    assert setup[0].message == (
        "reviewed strategy=zero1 zero_stage=1 micro_batch=1 accumulation=8 "
        "activation_checkpointing=off"
    )
    memory = llama["memory"].model_copy(update={"chosen": "zero2"})
    config = emit_deepspeed_config(memory, llama["model"], llama["hardware"], llama["brief"])
    history = [f for f in round_findings(memory, config, round_one, 2) if f.check != "setup"]
    assert len(history) == 1 and history[0].check == "review_history"
    assert history[0].message.startswith("round 1: smoke oom")
    assert history[0].message.endswith(
        " -> round 2: strategy zero2 (was zero1), zero_stage 2 (was 1)"
    )
    # A third round carries the earlier line forward and adds its own.
    round_two = Review(
        verdict="changes_requested",
        rounds=2,
        findings=[
            *history,
            Finding(severity="error", check="memory_headroom", message="does not fit"),
            *round_findings(memory, config, None, 2)[-1:],
        ],
    )
    lines = [f.message for f in round_findings(memory, config, round_two, 3)]
    assert lines[:2] == [
        history[0].message,
        "round 2: memory_headroom -> round 3: no change to the setup",
    ]
    # A review that did not ask for changes (or is not the previous round) starts no history.
    approved = round_one.model_copy(update={"verdict": "approved"})
    assert [f.check for f in round_findings(memory, config, approved, 2)] == ["setup"]
    assert [f.check for f in round_findings(memory, config, round_one, 3)] == ["setup"]


def test_rejection_states_its_reasons() -> None:
    errors = [
        Finding(
            severity="error",
            check="smoke_verdict",
            message="smoke run failed: oom: x",
            failure_kind="oom",
        ),
        Finding(severity="error", check="batch_arithmetic", message="8 != 64"),
    ]
    assert decide(errors, 1, 2).verdict == "changes_requested"
    review = decide(errors, 2, 2)
    assert review.verdict == "rejected" and review.rounds == 2
    verdict = review.findings[-1]
    assert verdict.check == "verdict" and verdict.severity == "error"
    assert "rejected after 2 of at most 2" in verdict.message
    assert "still failing: smoke oom, batch_arithmetic" in verdict.message
    assert verdict.fix


# ---- the injection setting -------------------------------------------------------------------


def test_smoke_inject_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.load().smoke_inject is None
    monkeypatch.setenv("TRAINWRIGHT_SMOKE_INJECT", "oom")
    once = Settings.load()
    assert once.smoke_inject == "oom"
    assert (once.smoke_fault(first_run=True), once.smoke_fault(first_run=False)) == ("oom", None)
    always = Settings.load(smoke_inject="crash:always")  # explicit beats the environment
    assert (always.smoke_fault(True), always.smoke_fault(False)) == ("crash", "crash")
    for bad in ("segfault", "oom:sometimes"):
        monkeypatch.setenv("TRAINWRIGHT_SMOKE_INJECT", bad)
        with pytest.raises(InputError) as err:
            Settings.load()
        assert err.value.field == "smoke_inject"


# ---- real runs -------------------------------------------------------------------------------


def _rounds(settings: Settings, out: Path) -> tuple[list[dict], list[dict], dict]:
    """Run the offline graph; return each engineer and reviewer update in order, and the plan."""
    engineers: list[dict] = []
    reviews: list[dict] = []
    plan: dict = {}
    graph = build_graph(settings=settings)
    for chunk in graph.stream({"brief": LLAMA_8B, "out_dir": str(out)}, stream_mode="updates"):
        for node, update in chunk.items():
            if node == "engineer":
                engineers.append(update)
            elif node == "reviewer":
                reviews.append(update["review"])
            elif node == "reporter":
                plan = update["plan"]
    return engineers, reviews, plan


@pytest.mark.slow
def test_injected_oom_in_round_one_is_fixed_in_round_two(
    settings: Settings, tmp_path: Path
) -> None:
    engineers, reviews, plan = _rounds(settings.with_(smoke_inject="oom"), tmp_path / "p")
    assert len(engineers) == len(reviews) == 2
    first, second = engineers
    # Round one: a real OOM in the real 2-rank DeepSpeed run, sent back with its fix.
    assert first["smoke_test"]["status"] == "failed" and first["smoke_test"]["inject"] == "oom"
    assert first["smoke_test"]["reason"].startswith("oom:")
    assert reviews[0]["verdict"] == "changes_requested" and reviews[0]["rounds"] == 1
    oom = next(f for f in reviews[0]["findings"] if f["check"] == "smoke_verdict")
    assert oom["severity"] == "error"
    # Round two: the engineer took the next strategy up, re-emitted the config, reran clean.
    before, after = (e["memory"]["chosen"] for e in engineers)
    up = _next(before)
    assert f'plan_parallelism {{"min_strategy": "{up}"}}' in oom["fix"]
    assert f're-planned with {{"min_strategy": "{up}"}}' in second["narrative"]["engineer"]
    assert after in STRATEGY_ORDER[STRATEGY_ORDER.index(up) :]
    assert second["smoke_test"]["status"] == "passed", second["smoke_test"]["reason"]
    assert second["smoke_test"]["inject"] is None and second["smoke_test"]["strategy"] == after
    # The plan: approved after two rounds, with the story of the rounds in its review and report.
    review = plan["review"]
    assert review["verdict"] == "approved" and review["rounds"] == 2
    assert plan["deepspeed_config"] == second["deepspeed_config"] != first["deepspeed_config"]
    stages = [e["deepspeed_config"]["zero_optimization"]["stage"] for e in engineers]
    history = [f["message"] for f in review["findings"] if f["check"] == "review_history"]
    assert len(history) == 1 and history[0].startswith("round 1: smoke oom -> round 2: ")
    assert f"strategy {after} (was {before})" in history[0]
    assert stages[0] == stages[1] or f"zero_stage {stages[1]} (was {stages[0]})" in history[0]
    assert history[0] in Path(plan["report"]["markdown"]).read_text()


@pytest.mark.slow
def test_oom_every_round_runs_out_of_rounds_and_is_rejected(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every round's smoke run ends in an OOM (scripted here: the test above runs a real one)."""
    import tools.smoke

    def oom(_model: ModelSpec, spec: Any, *_args: object, **_kwargs: object) -> SmokeResult:
        ran = SmokeResult(status="failed", strategy=spec.strategy, inject=spec.inject)
        return ran.failed("oom", "out of memory on rank(s) [0, 1]: RuntimeError")

    monkeypatch.setattr(tools.smoke, "run_smoke_test", oom)
    settings = settings.with_(smoke_inject="oom:always")
    engineers, reviews, plan = _rounds(settings, tmp_path / "p")
    rounds = settings.max_review_rounds
    assert len(engineers) == len(reviews) == rounds
    assert all(e["smoke_test"]["reason"].startswith("oom:") for e in engineers)
    # The engineer still acted each round: every round ran a heavier strategy.
    chosen = [e["memory"]["chosen"] for e in engineers]
    assert all(
        STRATEGY_ORDER.index(b) > STRATEGY_ORDER.index(a)
        for a, b in zip(chosen, chosen[1:], strict=False)
    )
    assert [r["verdict"] for r in reviews] == ["changes_requested", "rejected"]
    review = plan["review"]
    assert review["verdict"] == "rejected" and review["rounds"] == rounds
    verdict = review["findings"][-1]
    assert verdict["check"] == "verdict" and "still failing: smoke oom" in verdict["message"]
    assert any(
        f["check"] == "smoke_verdict" and f["severity"] == "error" for f in review["findings"]
    )
