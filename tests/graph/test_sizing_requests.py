"""Sizing questions in free text: the plan answers which GPUs and how many, and is made for the pick.

`plan "cheapest way to pretrain a 1B llama on 1T tokens within 30 days"` returns the pick
(its time within 30 days), the Pareto set and the table, and the plan is the pick's; the
same with a budget instead picks the fastest within it; "how many A100 40GB" sizes A100s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from inproc import run_main

from tools.core.schemas import SizingPlan

DAY = 86_400.0


def _plan(tmp: Path, text: str) -> tuple[Any, dict[str, Any]]:
    done = run_main(
        "plan", text, "--no-smoke", "--out", tmp / "out", "--json", tmp / "plan.json", cwd=tmp
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done, json.loads((tmp / "plan.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def deadline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("deadline")
    return _plan(tmp, "cheapest way to pretrain a 1B llama on 1T tokens within 30 days")


def test_a_deadline_question_gets_the_cheapest_pick_within_it(
    deadline: tuple[Any, dict[str, Any]],
) -> None:
    done, plan = deadline
    sizing = SizingPlan.model_validate(plan["sizing"])
    pick = sizing.pick
    assert pick is not None and sizing.binding is None and sizing.objective == "cheapest"
    assert sizing.deadline_s == 30 * DAY and sizing.tokens == 1e12
    assert pick.time_s is not None and pick.time_s <= 30 * DAY
    within = [r for r in sizing.rows if r.time_s and r.time_s <= 30 * DAY and r.cost_usd]
    assert pick.cost_usd == min(r.cost_usd or 0 for r in within)
    assert sizing.pareto and len({r.gpu for r in sizing.rows}) > 3
    # The plan is made for the pick, and says so.
    hw = plan["hardware"]
    assert (hw["nodes"], hw["gpus_per_node"]) == (pick.nodes, pick.gpus_per_node)
    assert plan["brief"]["hardware"] == f"{pick.nodes}x{pick.gpus_per_node}x{pick.gpu}"
    # The plan's setup and speed are the pick's: the same search on the same hardware.
    assert plan["speed"]["tokens_per_s"] == pytest.approx(pick.tokens_per_s, rel=1e-9)
    assert plan["memory"]["setup"]["strategy"] == plan["memory"]["chosen"]
    assert pick.setup.startswith(plan["memory"]["chosen"])
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == "deadline")
    assert wish["honoured"] is True and "days" in wish["how"]
    assumed = next(a for a in plan["request"]["assumed"] if a["field"] == "hardware")
    assert "sizing's pick" in assumed["why"]
    # The terminal: the table, the pick and the Pareto set.
    assert "Which GPUs (least count that fits" in done.stdout
    assert "Pick (cheapest within 30 days): " in done.stdout
    assert "Pareto set (time vs cost, fastest first): " in done.stdout


def test_the_report_has_the_sizing_table_and_the_time_vs_cost_chart(
    deadline: tuple[Any, dict[str, Any]],
) -> None:
    _done, plan = deadline
    md = Path(plan["report"]["markdown"]).read_text(encoding="utf-8")
    assert "## Sizing: which GPUs, how many, how long, how much" in md
    assert "| GPU | $/GPU-h | least |" in md and "**Pick (cheapest):**" in md
    assert "Pareto set (no other row is both faster and cheaper)" in md
    html = Path(plan["report"]["html"]).read_text(encoding="utf-8")
    assert "Time against cost of every fitting row the sizing considered" in html


def test_a_budget_question_gets_the_fastest_pick_within_it(tmp_path: Path) -> None:
    _done, plan = _plan(
        tmp_path, "fastest way to pretrain a 1B llama on 100B tokens with a budget of $3,000"
    )
    sizing = SizingPlan.model_validate(plan["sizing"])
    assert sizing.objective == "fastest" and sizing.budget_usd == 3000
    pick = sizing.pick
    assert pick is not None and pick.cost_usd is not None and pick.cost_usd <= 3000
    within = [r for r in sizing.rows if r.cost_usd is not None and r.cost_usd <= 3000]
    assert pick.time_s == min(r.time_s or 0 for r in within)
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == "money-budget")
    assert wish["honoured"] is True


def test_how_many_a100_40gb_sizes_a100s_and_plans_the_answer(tmp_path: Path) -> None:
    done, plan = _plan(tmp_path, "how many A100 40GB do I need to fully fine-tune llama-2-13b")
    sizing = SizingPlan.model_validate(plan["sizing"])
    answer = next(a for a in sizing.answers if a.gpu == "A100-40GB")
    assert answer.asked and answer.min_count and answer.min_count > 1
    assert sizing.pick is not None and sizing.pick.gpu == "A100-40GB"
    assert plan["hardware"]["gpu"]["memory_gb"] == 40
    assert plan["hardware"]["nodes"] * plan["hardware"]["gpus_per_node"] == sizing.pick.count
    assert f"How many A100-40GB: at least {answer.min_count} (" in done.stdout
    # Not the one GPU the words alone would have planned ("no GPU count given: one assumed").
    assert "one A100-40GB assumed" not in json.dumps(plan)


def test_how_many_h100s_with_a_deadline_picks_h100s(tmp_path: Path) -> None:
    """A plural part with no count ("H100s") is the type asked: before, the words were dropped as
    unclear hardware and the deadline's cheapest pick was 64 B200."""
    done, plan = _plan(
        tmp_path, "how many H100s do I need to pretrain a 1B llama on 100B tokens in 2 weeks?"
    )
    sizing = SizingPlan.model_validate(plan["sizing"])
    assert any(a.asked and a.gpu == "H100-80GB" for a in sizing.answers)
    assert sizing.pick is not None and sizing.pick.gpu == "H100-80GB", done.stdout[-1500:]
    assert plan["brief"]["hardware"].endswith("xH100-80GB")


def test_chat_answers_a_sizing_question_and_plan_it_names_the_planned_pick(tmp_path: Path) -> None:
    script = "how many H100 do I need to fine-tune llama-3-8b\nplan it\n/quit\n"
    done = run_main("chat", "--no-smoke", "--thread", "sizing-1", cwd=tmp_path, stdin=script)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    line = next(x for x in out.splitlines() if x.startswith("How many H100-80GB: at least "))
    assert "Which GPUs (least count that fits" in out
    plan = next(x for x in out.splitlines() if x.startswith("plan: llama-3-8b on "))
    assert "already planned: the plan above is the sizing's pick, " in out
    assert line and "H100" in plan


BRIEF = """\
goal: Which GPUs should we rent to fine-tune llama-3-8b on 2B tokens within 3 days?
model: llama-3-8b
task: finetune
dataset_tokens: 2.0e9
smoke: false
"""


def test_a_brief_whose_goal_asks_on_the_default_hardware_is_sized(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(BRIEF, encoding="utf-8")
    done = run_main(
        "plan", "--brief", tmp_path / "b.yaml", "--out", tmp_path / "out",
        "--json", tmp_path / "plan.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads((tmp_path / "plan.json").read_text(encoding="utf-8"))
    sizing = SizingPlan.model_validate(plan["sizing"])
    assert sizing.deadline_s == 3 * DAY and sizing.pick is not None
    assert sizing.pick.time_s is not None and sizing.pick.time_s <= 3 * DAY
    pick = sizing.pick
    assert plan["brief"]["hardware"] == f"{pick.nodes}x{pick.gpus_per_node}x{pick.gpu}"
    assert "its hardware is the default, local" in plan["narrative"]["fallbacks"]
