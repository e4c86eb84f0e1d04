"""A report says one thing: every place that states the chosen setup names the same one.

Twelve briefs through the real graph (offline model), from data parallelism to tensor x
pipeline splits, offload, LoRA, TensorFlow, an agent application, a cluster on which nothing
fits, and real smoke runs on CPU ranks (one with an injected OOM, so the review takes two
rounds). In each report.md every strategy name is the chosen setup's, except where the report
lists the alternatives (the memory table's other rows, "why not the others", the review
history); and the smoke section and the review quote the same memory comparison.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from graphs import build_graph
from graphs.run import run_plan
from tools.core.settings import Settings
from tools.core.strategies import STRATEGY_ORDER

# Where a line names a setup that is not the choice: what it was (history), the previous
# strategy an engineer moved from, a strategy floor a fix suggests (plan_parallelism's argument).
# The one line on what would fit instead (tools/planning/alternatives.py fit_line) names the
# setups it measured, up to the end of its table cell or line; so does the reviewer's fix.
NOT_A_CHOICE = re.compile(
    r'\(was [^)]*\)|\(previous strategy [^)]*\)|\\?"min_strategy\\?": \\?"[^"\\]*\\?"'
    r"|does not fit: [^|]*|options that fit \([^|]*"
)
# A setup label: a strategy name, optionally with its tensor and pipeline degrees.
LABEL = re.compile(
    r"(?<![\w-])("
    + "|".join(sorted(STRATEGY_ORDER, key=len, reverse=True))
    + r")((?:\+tp\d+)?(?:\+pp\d+)?)(?![\w-])"
)

BRIEFS: dict[str, dict[str, Any]] = {
    "qwen-offload": {
        "model": "qwen2.5-7b",
        "hardware": "1x2xA100-80GB",
        "seq_len": 8192,
        "global_batch_size": 16,
    },
    "llama8b-a100": {"model": "llama-3-8b", "hardware": "1x8xA100-80GB", "seq_len": 4096},
    "gpt2-ddp": {"model": "gpt2", "hardware": "1x8xA100-80GB", "seq_len": 1024},
    "llama70b-2nodes": {
        "model": "llama-3-70b",
        "hardware": "2x8xH100-80GB",
        "seq_len": 4096,
        "global_batch_size": 64,
        "interconnect": "ib400",
    },
    "llama405b-3d": {
        "model": "llama-3.1-405b",
        "hardware": "16x8xH100-80GB",
        "task": "pretrain",
        "seq_len": 4096,
        "global_batch_size": 1024,
    },
    "llama70b-lora": {"model": "llama-3-70b", "hardware": "1x8xA100-80GB", "task": "lora"},
    "mixtral-h100": {"model": "mixtral-8x7b", "hardware": "1x8xH100-80GB", "seq_len": 4096},
    "tensorflow-team": {
        "model": "gpt2",
        "hardware": "1x4xA100-80GB",
        "seq_len": 1024,
        "team": {"experience": "intermediate", "existing_stack": "tensorflow"},
    },
    "agent-app": {"goal": "a multi-agent support assistant", "task": "agent-app"},
    "nothing-fits": {"model": "llama-3.1-405b", "hardware": "1x1xRTX4090", "global_batch_size": 8},
}
SMOKE_BRIEF = {
    "model": "gpt2",
    "task": "pretrain",
    "seq_len": 128,
    "global_batch_size": 8,
    "hardware": "local",
    "smoke": True,
}


def _plan(settings: Settings, name: str, brief: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    graph = build_graph(checkpointer=InMemorySaver(), settings=settings)
    inputs = {"brief": {"smoke": False, **brief}, "out_dir": str(tmp_path / name)}
    result = run_plan(graph, inputs, f"consistency-{name}")
    assert result.plan is not None, name
    return result.plan


def _choice_statements(report: str) -> list[tuple[int, str]]:
    """Every strategy label on a line that states the plan's choice: (line number, label)."""
    found: list[tuple[int, str]] = []
    listing_alternatives = False
    for number, raw in enumerate(report.splitlines(), 1):
        line = NOT_A_CHOICE.sub("", raw)
        if line.startswith("What would fit instead"):
            listing_alternatives = True  # LoRA, QLoRA, offload, ... with the setups measured
            continue
        if line.startswith("Why not the others"):
            listing_alternatives = True
            found += [(number, m.group(0)) for m in LABEL.finditer(line.split("chosen:", 1)[1])]
            continue
        if listing_alternatives and not line.startswith("- ") and line.strip():
            listing_alternatives = False
        if listing_alternatives:
            continue  # "- zero2: does not fit ...": an alternative and why it lost
        if line.startswith("| ") and "(chosen)" not in line and "---" not in line:
            if LABEL.match(line[2:]):
                continue  # a memory-table row of another setup
        if "review_history" in line:
            continue  # "round 1: smoke oom -> round 2: strategy zero2 (was zero1)"
        found += [(number, m.group(0)) for m in LABEL.finditer(line)]
    return found


def _check(plan: dict[str, Any]) -> None:
    report = Path(plan["report"]["markdown"]).read_text()
    memory = plan["memory"]
    statements = _choice_statements(report)
    if memory is None:
        assert statements == [], statements
        return
    chosen = memory["chosen"] + "".join(
        f"+{axis}{memory[key]}"
        for axis, key in (("tp", "tensor_parallel"), ("pp", "pipeline_parallel"))
        if memory[key] > 1
    )
    wrong = [(n, label) for n, label in statements if label != chosen]
    assert statements and not wrong, f"chosen {chosen}; other setups named at {wrong}"
    # The headline, the table's mark and the review's headroom line all name it.
    assert f"**Strategy:** {chosen}," in report
    assert f"| {chosen} (chosen) |" in report
    assert f"| info | setup | reviewed strategy={chosen} " in report or (
        f"| warning | setup | reviewed strategy={chosen} " in report
    )


@pytest.mark.parametrize("name", sorted(BRIEFS))
def test_every_strategy_a_report_names_is_the_chosen_one(
    name: str, settings: Settings, tmp_path: Path
) -> None:
    _check(_plan(settings, name, BRIEFS[name], tmp_path))


def test_the_qwen_report_has_one_strategy(settings: Settings, tmp_path: Path) -> None:
    """The case that contradicted itself: offload in the headline, ZeRO-3 in the rationale."""
    plan = _plan(settings, "qwen", BRIEFS["qwen-offload"], tmp_path)
    rationale = plan["framework"]["rationale"]
    assert not LABEL.search(rationale), rationale
    _check(plan)


def _memory_quotes(report: str) -> tuple[str, str]:
    smoke = next(line for line in report.splitlines() if line.startswith("- Peak memory per rank:"))
    review = next(
        line
        for line in report.splitlines()
        if line.startswith("| ") and "predicted_vs_measured" in line
    )
    return smoke.split(": ", 1)[1], review.split(" | ")[2]


@pytest.mark.slow
@pytest.mark.parametrize("inject", [None, "oom:first"])
def test_smoke_and_review_quote_the_same_memory(
    inject: str | None, settings: Settings, tmp_path: Path
) -> None:
    settings = settings.with_(smoke_inject=inject)
    plan = _plan(settings, f"smoke-{inject}", SMOKE_BRIEF, tmp_path)
    assert plan["smoke_test"]["status"] == "passed", plan["smoke_test"]["reason"]
    if inject:
        assert plan["review"]["rounds"] == 2
    report = Path(plan["report"]["markdown"]).read_text()
    smoke_says, review_says = _memory_quotes(report)
    assert smoke_says.startswith("measured ") and "MiB vs predicted" in smoke_says
    assert review_says.startswith(smoke_says), (smoke_says, review_says)
    _check(plan)
