"""Report and follow-ups (issue 16 part 8): the title follows the request, time and cost are
values, and the charts read at a glance.

Requests through the parser (the budget words), plans from the real strategy search rendered by
the real report and chart code (matplotlib figure objects inspected, not pictures), one real
graph run of a priced request, and one piped chat whose follow-up must change the report's
title and ``/brief``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from graphs import build_graph
from graphs.run import run_plan
from tools.artifacts import charts
from tools.artifacts.budget import plan_budget
from tools.artifacts.report import plan_title, render_html, render_markdown
from tools.artifacts.text import summary_lines
from tools.core.errors import InputError
from tools.core.schemas import (
    FrameworkChoice,
    LaunchSpec,
    Review,
    SmokeResult,
    TrainingPlan,
)
from tools.core.settings import Settings
from tools.intake.brief import (
    brief_from_dict,
    brief_from_request,
    request_fields,
)
from tools.intake.follow_up import MAX_GOAL_CHARS, follow_up_fields, follow_up_goal
from tools.planning import search_strategy
from tools.planning.memory import GB
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import list_models, lookup_model

ROOT = Path(__file__).resolve().parents[2]
MODELS = list_models()


def _plan(model: str, hardware: str, **brief: Any) -> TrainingPlan:
    """A plan of the real strategy search (no agents): what the report and charts are given."""
    b = brief_from_dict({"model": model, "hardware": hardware, **brief})
    hw = parse_hardware(b.hardware, b.interconnect)
    spec = lookup_model(b.model, b.seq_len)  # type: ignore[arg-type]
    memory = search_strategy(spec, hw, b)
    return TrainingPlan(
        brief=b,
        hardware=hw,
        model=spec,
        framework=FrameworkChoice(
            primary="deepspeed", stack=["pytorch", "deepspeed"], rationale=""
        ),
        memory=memory,
        deepspeed_config=None,
        launch=LaunchSpec(command=[]),
        smoke_test=SmokeResult(status="skipped", reason="test"),
        review=Review(verdict="approved"),
        speed=memory.speed,
    )


# ---- the request table: the budget words a request states --------------------------------
# (request, fields it must yield; None: the field must stay unset)
REQUESTS = [
    ("fine-tune llama-3-8b on 8 A100s on 20B tokens", {"dataset_tokens": 20e9}),
    ("pretrain a 7B model over 1.5 trillion tokens on 64 H100", {"dataset_tokens": 1.5e12}),
    # A price per GPU-hour names no hardware: no clarifying question about "GPU".
    ("train llama-3-8b for 500M tokens, $2.50/GPU-hour", {"dataset_tokens": 5e8, "price_per_gpu_hour": 2.5, "_hardware_unclear": None}),
    ("fine-tune mistral-7b at 3 USD per GPU hour", {"price_per_gpu_hour": 3.0, "dataset_tokens": None, "_hardware_unclear": None}),
    ("fine-tune qwen2.5-7b, 1.8 euros per GPU-hr, on about 2B tokens", {"price_per_gpu_hour": 1.8, "dataset_tokens": 2e9, "_hardware_unclear": None}),
    ("LoRA llama-3-8b with a 4k tokens context", {"dataset_tokens": None, "seq_len": 4096}),
    ("fine-tune gpt2 on 8 A100s", {"dataset_tokens": None, "price_per_gpu_hour": None}),
    ("fine-tune llama-3-8b on 8 H100 with 10B training tokens at €4 per GPU-hour", {"dataset_tokens": 1e10, "price_per_gpu_hour": 4.0}),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), REQUESTS, ids=[r[0][:40] for r in REQUESTS])
def test_request_table_budget_fields(text: str, expected: dict[str, Any]) -> None:
    fields = request_fields(text, MODELS)
    for key, value in expected.items():
        assert fields.get(key) == value, (key, fields)
    # What intake keeps for itself (keys starting with "_") never reaches the brief.
    brief_from_dict(
        {"model": "gpt2", **{k: v for k, v in fields.items() if k != "model" and k[0] != "_"}}
    )


def test_a_bad_price_is_one_line_naming_the_field() -> None:
    with pytest.raises(InputError) as caught:
        brief_from_dict({"model": "gpt2", "price_per_gpu_hour": -1})
    assert "price_per_gpu_hour" in str(caught.value) and "\n" not in str(caught.value)


# ---- the headline: time to train and cost as values ---------------------------------------


def _headline(plan: TrainingPlan) -> str:
    return next(
        line for line in render_markdown(plan).splitlines() if line.startswith("**Verdict:**")
    )


def _number(text: str, pattern: str) -> float:
    match = re.search(pattern, text)
    assert match, (pattern, text)
    return float(match[1].replace(",", ""))


def test_headline_states_hours_gpu_hours_and_cost_as_numbers() -> None:
    plan = _plan("llama-3-8b", "1x8xA100-80GB", dataset_tokens=2e10, price_per_gpu_hour=2.0)
    assert plan.speed is not None and plan.speed.time_to_train_s
    line = _headline(plan)
    hours = plan.speed.time_to_train_s / 3600
    assert _number(line, r"\*\*Time to train:\*\* ([\d,.]+) h") == pytest.approx(hours, abs=0.05)
    assert _number(line, r"([\d,]+) GPU-hours on 8 GPU") == pytest.approx(8 * hours, abs=0.5)
    assert _number(line, r"\*\*Cost:\*\* ([\d,.]+) at 2 per GPU-hour") == pytest.approx(
        16 * hours, abs=0.5
    )
    assert "20B tokens" in line and " / " not in line  # values, not the formula
    budget = plan_budget(plan)
    assert budget is not None and budget.cost == pytest.approx(budget.gpu_hours * 2.0)


def test_the_terminal_summary_states_the_same_budget() -> None:
    plan = _plan("llama-3-8b", "1x8xA100-80GB", dataset_tokens=2e10, price_per_gpu_hour=2.0)
    budget = plan_budget(plan)
    assert budget is not None and budget.cost is not None
    lines = summary_lines(plan.model_dump(mode="json"))
    line = next(line for line in lines if line.startswith("time to train: "))
    assert f"{budget.gpu_hours:,.0f} GPU-hours" in line and f"cost {budget.cost:,.0f} at 2 " in line
    unpriced = _plan("llama-3-8b", "1x8xA100-80GB", dataset_tokens=2e10).model_dump(mode="json")
    assert any(ln.endswith("cost: give price_per_gpu_hour") for ln in summary_lines(unpriced))
    untimed = _plan("llama-3-8b", "1x8xA100-80GB").model_dump(mode="json")
    assert not any(ln.startswith("time to train") for ln in summary_lines(untimed))


def test_headline_names_the_field_that_is_missing() -> None:
    unpriced = _headline(_plan("llama-3-8b", "1x8xA100-80GB", dataset_tokens=1e9))
    assert re.search(r"\*\*Time to train:\*\* [\d.]+ h", unpriced)
    assert "**Cost:** give price_per_gpu_hour." in unpriced
    untimed = _headline(_plan("llama-3-8b", "1x8xA100-80GB", price_per_gpu_hour=2.0))
    assert "**Time to train:** give dataset_tokens" in untimed and "tokens/s" in untimed
    cpu = _headline(_plan("gpt2", "local", seq_len=256, dataset_tokens=1e6))
    assert "**Time to train:** unknown (no GPU speed model for a CPU-only machine)." in cpu


def test_a_priced_request_through_the_graph_has_time_and_cost(
    settings: Settings, tmp_path: Path
) -> None:
    graph = build_graph(checkpointer=InMemorySaver(), settings=settings)
    request = "fine-tune llama-3-8b on 8 A100s on 20B tokens at $2/GPU-hour, no smoke test"
    result = run_plan(graph, {"request": request, "out_dir": str(tmp_path / "p")}, "priced")
    assert result.plan is not None
    report = (tmp_path / "p" / "report.md").read_text()
    assert report.startswith("# Training plan: fine-tune llama-3-8b on 1x8 ")
    hours = result.plan["speed"]["time_to_train_s"] / 3600
    assert _number(report, r"\*\*Time to train:\*\* ([\d,.]+) h") == pytest.approx(hours, abs=0.05)
    assert _number(report, r"\*\*Cost:\*\* ([\d,.]+) at 2 per") == pytest.approx(16 * hours, abs=1)
    assert (
        "<title>Training plan: fine-tune llama-3-8b on 1x8 "
        in (tmp_path / "p" / "report.html").read_text()
    )


# ---- the title follows the request after follow-ups ----------------------------------------


def test_title_follows_the_brief_after_a_follow_up() -> None:
    first = "fine-tune llama-3-8b on 8 A100s"
    # brief_from_request drops the reading's notes ("_hardware_assumed": 40 or 80 GB, issue 28).
    brief = brief_from_request(request_fields(first, MODELS)).model_dump(mode="json")
    before = _plan(**{k: brief[k] for k in ("model", "hardware")}, goal=brief["goal"])
    follow = "what if I only had 4 GPUs?"
    changes = follow_up_fields(follow, brief, MODELS)
    merged = {**brief, **changes, "goal": follow_up_goal(brief["goal"], follow)}
    after = _plan(**{k: merged[k] for k in ("model", "hardware")}, goal=merged["goal"])
    assert plan_title(before).endswith("on 1x8 NVIDIA A100 80GB SXM")
    assert plan_title(after).endswith("on 1x4 NVIDIA A100 80GB SXM")
    md = render_markdown(after)
    assert md.startswith(f"# {plan_title(after)}\n")
    assert f"**Request:** {first}; then: {follow}" in md
    assert f"<title>{plan_title(after)}</title>" in render_html(md, plan_title(after))


def test_follow_up_goal_keeps_the_request_and_the_newest_follow_ups() -> None:
    goal = "fine-tune llama-3-8b on 8 A100s"
    for i in range(100):
        goal = follow_up_goal(goal, f"what if I only had {i} GPUs? " + "x" * 30)
    assert len(goal) <= MAX_GOAL_CHARS
    assert goal.startswith("fine-tune llama-3-8b on 8 A100s; then: ")
    assert goal.endswith("what if I only had 99 GPUs? " + "x" * 30)
    assert "had 0 GPUs" not in goal


def test_chat_follow_up_changes_the_report_title_and_brief(tmp_path: Path) -> None:
    script = "fine-tune llama-3-8b on 8 A100s\nwhat if I only had 4 GPUs?\n/brief\n/quit\n"
    res = subprocess.run(
        [sys.executable, "app.py", "chat", "--no-smoke", "--thread", "report-title"],
        input=script,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    reports = [
        line.split("report: ", 1)[1]
        for line in res.stdout.splitlines()
        if line.startswith("report: ")
    ]
    assert len(reports) == 2, res.stdout
    titles = [Path(r).read_text().splitlines()[0] for r in reports]
    assert titles[0] == "# Training plan: fine-tune llama-3-8b on 1x8 NVIDIA A100 80GB SXM"
    assert titles[1] == "# Training plan: fine-tune llama-3-8b on 1x4 NVIDIA A100 80GB SXM"
    second = Path(reports[1]).read_text()
    assert (
        "**Request:** fine-tune llama-3-8b on 8 A100s; then: what if I only had 4 GPUs?" in second
    )
    # /brief prints the current brief: its goal says the follow-up too.
    assert "goal: 'fine-tune llama-3-8b on 8 A100s; then: what if I only had 4 GPUs?'" in res.stdout


# ---- charts -----------------------------------------------------------------------------------


def _memory_axes(plan: TrainingPlan) -> Any:
    fig = charts.memory_figure(plan)
    return fig.axes[0], fig


def _capacity_x(ax: Any) -> float:
    line = next(line for line in ax.get_lines() if line.get_gid() == "capacity")
    return float(line.get_xdata()[0])


@pytest.mark.parametrize(
    ("model", "hardware"), [("llama-3-70b", "1x8xH100-80GB"), ("mistral-7b", "1x2xRTX3090")]
)
def test_a_wide_span_keeps_the_chosen_bar_and_capacity_in_view(model: str, hardware: str) -> None:
    plan = _plan(model, hardware)
    assert plan.memory is not None and plan.memory.chosen_row is not None
    totals = [s.per_gpu_bytes.total / GB for s in plan.memory.strategies]
    assert max(totals) >= 10 * min(totals)  # the setups span 10x or more
    ax, _ = _memory_axes(plan)
    left, right = ax.get_xlim()
    chosen = plan.memory.chosen_row.per_gpu_bytes.total / GB
    capacity = _capacity_x(ax)
    assert left == 0 and chosen < right and capacity < right
    # At a glance: the capacity line in the right half, the chosen bar wider than 3% of the axis
    # (an axis to the longest bar put an 80 GB line at 5% of 1,554 GB, a 5.9 GB bar at 0.4%).
    assert capacity >= right / 2 and chosen >= 0.03 * right
    cut = [t for t in ax.texts if t.get_gid() == "cut"]
    assert len(cut) == sum(t > right for t in totals) > 0
    assert "axis cut at" in charts.memory_caption(plan) and "axis cut at" in ax.get_xlabel()


def test_a_narrow_span_is_not_cut() -> None:
    plan = _plan("llama-3-8b", "1x8xA100-80GB")
    assert charts.memory_axis_limit(plan) is None
    ax, _ = _memory_axes(plan)
    totals = [s.per_gpu_bytes.total / GB for s in plan.memory.strategies]  # type: ignore[union-attr]
    assert max(totals) < ax.get_xlim()[1]


@pytest.mark.parametrize(
    ("model", "hardware", "seq"),
    [("llama-3-8b", "1x8xA100-80GB", 2048), ("llama-3-70b", "1x8xH100-80GB", 2048), ("gpt2", "local", 512)],
)  # fmt: skip
def test_stacked_segments_sum_to_the_counted_total(model: str, hardware: str, seq: int) -> None:
    plan = _plan(model, hardware, seq_len=seq)
    ax, _ = _memory_axes(plan)
    rows = plan.memory.strategies  # type: ignore[union-attr]
    sums = [0.0] * len(rows)
    assert [c.get_label() for c in ax.containers] == [
        "params", "gradients", "optimizer", "activations above gradients", "buffers"
    ]  # fmt: skip
    for container in ax.containers:
        for i, bar in enumerate(container):
            sums[i] += bar.get_width()
    overlapped = sum(r.per_gpu_bytes.not_concurrent for r in rows)
    assert overlapped > 0  # gradients and activations do overlap in these plans
    for row, total in zip(rows, sums, strict=True):
        assert total == pytest.approx(row.per_gpu_bytes.total / GB, abs=0.01), row.name


def test_a_cpu_plan_labels_its_capacity_ram() -> None:
    plan = _plan("gpt2", "local", seq_len=512)
    ax, _ = _memory_axes(plan)
    capacity = next(line for line in ax.get_lines() if line.get_gid() == "capacity")
    assert capacity.get_label().startswith("RAM per rank")
    assert "GPU" not in capacity.get_label() + ax.get_xlabel() + ax.get_title()
    assert "RAM" in ax.get_xlabel()
    caption = charts.memory_caption(plan)
    assert "RAM per rank" in caption and "GPU" not in caption


def test_host_ram_is_drawn_when_it_binds() -> None:
    plan = _plan("mistral-7b", "1x2xRTX3090")
    assert plan.memory is not None and (plan.memory.binding or "").startswith("host RAM")
    _, fig = _memory_axes(plan)
    assert len(fig.axes) == 2
    host = fig.axes[1]
    widths = [bar.get_width() for bar in host.patches]
    assert widths == pytest.approx([s.cpu_bytes_per_node / GB for s in plan.memory.strategies])
    node_ram = next(line for line in host.get_lines() if line.get_gid() == "node_ram")
    assert float(node_ram.get_xdata()[0]) == 96.0  # 2x the node's 48 GB of GPU memory, assumed
    assert "host RAM" in charts.memory_caption(plan)
    # GPU memory alone binding: one panel.
    assert len(charts.memory_figure(_plan("llama-3-8b", "1x8xA100-80GB")).axes) == 1


def test_captions_describe_what_is_drawn() -> None:
    plan = _plan("llama-3-8b", "1x8xA100-80GB", seq_len=1024)
    captions = [caption for caption, _ in charts.plan_charts(plan)]
    assert captions[0].startswith("Memory per GPU by strategy (* chosen): params, gradients")
    assert "NVIDIA A100 80GB SXM, 80 GB" in captions[0]
    assert "speed model, not measured" in captions[1]
