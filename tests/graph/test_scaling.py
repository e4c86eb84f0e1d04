"""Time and cost (issue 17 item 5): a cited price table, the brief's price over it, the planner's
chooser at other cluster sizes, and the report's Time and cost table and scaling chart.

Plans come from the real strategy search and the real report and chart code; the CLI test runs
``app.py plan`` in a subprocess. Figures are checked as relations (ordering, arithmetic from
each row's own tokens/s, which row is the smallest that fits), not as today's speed numbers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from inproc import run_main

from tools.artifacts import charts
from tools.artifacts.budget import plan_budget
from tools.artifacts.report import render_markdown, scaling_picks, write_report
from tools.core.schemas import (
    FrameworkChoice,
    HardwareSpec,
    LaunchSpec,
    Review,
    SmokeResult,
    TrainingPlan,
)
from tools.intake.brief import brief_from_dict
from tools.intake.budget_text import budget_fields
from tools.planning import search_strategy
from tools.planning.scale_out import fits_somewhere
from tools.planning.scaling import MAX_SIZES, NO_GPU_NOTE, plan_scaling
from tools.research.hardware import find_gpu, load_gpu_catalog, parse_hardware
from tools.research.model_catalog import lookup_model
from tools.research.prices import list_price, load_price_table, plan_price

ROOT = Path(__file__).resolve().parents[2]


def _plan(model: str, hardware: str | HardwareSpec, **brief: Any) -> TrainingPlan:
    """A plan of the real search with its scaling section, as the reporter assembles it."""
    spec = hardware if isinstance(hardware, str) else "local"
    b = brief_from_dict({"model": model, "hardware": spec, "smoke": False, **brief})
    hw = parse_hardware(b.hardware, b.interconnect) if isinstance(hardware, str) else hardware
    m = lookup_model(b.model, b.seq_len)  # type: ignore[arg-type]
    memory = search_strategy(m, hw, b)
    return TrainingPlan(
        brief=b,
        hardware=hw,
        model=m,
        framework=FrameworkChoice(
            primary="deepspeed", stack=["pytorch", "deepspeed"], rationale=""
        ),
        memory=memory,
        deepspeed_config=None,
        launch=LaunchSpec(command=[]),
        smoke_test=SmokeResult(status="skipped", reason="not run"),
        review=Review(verdict="approved"),
        speed=memory.speed,
        scaling=plan_scaling(m, hw, b, memory, memory.speed),
    )


# ---- the price table ----------------------------------------------------------------------


def test_price_table_loads_and_every_entry_names_its_source_and_month() -> None:
    table = load_price_table()
    catalog = load_gpu_catalog()
    # The parts the issue names with a public list price; the table covers them all.
    for gpu in ("A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200", "L40S", "L4"):
        assert gpu in table, gpu
    for gpu_id, price in table.items():
        assert gpu_id in catalog and price.gpu == gpu_id
        assert 0 < price.usd_per_gpu_hour < 100
        assert price.provider and price.offer and len(price.source) > 20
        assert re.fullmatch(r"[A-Z][a-z]+ 20\d\d", price.listed), price.listed
    # Ordered as the parts are: a B200 hour costs more than an H100's, an H100's more than an L4's.
    assert table["B200"].usd_per_gpu_hour > table["H100-80GB"].usd_per_gpu_hour
    assert table["H100-80GB"].usd_per_gpu_hour > table["L4"].usd_per_gpu_hour
    text = (ROOT / "knowledge" / "gpu_prices.yaml").read_text()
    assert "LIST PRICES THAT CHANGE" in text


def test_a_device_name_finds_its_list_price_and_an_unlisted_gpu_has_none() -> None:
    assert list_price(find_gpu("NVIDIA A100-SXM4-80GB")) == load_price_table()["A100-80GB"]
    assert list_price(find_gpu("V100")) is None  # no list price cited: left out, not invented
    assert list_price(None) is None


def test_the_brief_price_overrides_the_table_and_the_plan_says_where_it_came_from() -> None:
    gpu = find_gpu("A100-80GB")
    listed = plan_price(brief_from_dict({"model": "gpt2"}), gpu)
    assert listed is not None and listed.currency == "USD"
    assert listed.price_per_gpu_hour == load_price_table()["A100-80GB"].usd_per_gpu_hour
    assert "as listed" in listed.source and "list prices change" in listed.source
    # A price in the request's words lands in the brief's field, and wins.
    fields = budget_fields("fine-tune llama-3-8b at $7.25/GPU-hour")
    given = plan_price(brief_from_dict({"model": "gpt2", **fields}), gpu)
    assert given is not None and given.price_per_gpu_hour == 7.25 and given.currency is None
    assert "brief" in given.source
    plan = _plan("llama-3-8b", "1x8xA100-80GB", dataset_tokens=2e10, price_per_gpu_hour=7.25)
    assert plan.scaling.price_per_gpu_hour == 7.25
    budget = plan_budget(plan)
    assert budget is not None and budget.cost == pytest.approx(budget.gpu_hours * 7.25)
    assert "at 7.25 per GPU-hour (the brief's price_per_gpu_hour" in budget.text


def test_without_a_brief_price_the_headline_costs_at_the_list_price_and_cites_it() -> None:
    plan = _plan("llama-3-8b", "1x8xA100-80GB", dataset_tokens=2e10)
    price = load_price_table()["A100-80GB"]
    budget = plan_budget(plan)
    assert budget is not None and budget.cost == pytest.approx(
        budget.gpu_hours * price.usd_per_gpu_hour
    )
    assert f"USD at {price.usd_per_gpu_hour:g} USD per GPU-hour ({price.provider}" in budget.text
    assert f"as listed {price.listed}" in budget.text


# ---- the scaling rows -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def a100_plan() -> TrainingPlan:
    return _plan("llama-3-8b", "1x8xA100-40GB", task="pretrain", dataset_tokens=2e10)


def test_rows_are_ordered_by_gpus_and_bounded(a100_plan: TrainingPlan) -> None:
    rows = a100_plan.scaling.rows
    gpus = [r.gpus for r in rows]
    assert gpus == sorted(set(gpus)) and 3 <= len(rows) <= MAX_SIZES
    assert all(r.gpus == r.nodes * r.gpus_per_node for r in rows)
    # Up to four times the plan's nodes: 2 and 4 nodes of 8.
    assert gpus[-2:] == [16, 32]
    assert [r.chosen for r in rows].count(True) == 1
    assert all(r.global_batch_size % r.gpus == 0 for r in rows)


def test_the_chosen_row_is_the_plan_itself(a100_plan: TrainingPlan) -> None:
    row = next(r for r in a100_plan.scaling.rows if r.chosen)
    assert a100_plan.memory is not None and a100_plan.speed is not None
    assert (row.gpus, row.setup) == (8, a100_plan.memory.chosen_label)
    assert row.tokens_per_s == a100_plan.speed.tokens_per_s
    budget = plan_budget(a100_plan)
    assert budget is not None and row.cost == pytest.approx(budget.cost)


def test_the_smallest_that_fits_is_the_first_fitting_row(a100_plan: TrainingPlan) -> None:
    sc, model = a100_plan.scaling, a100_plan.model
    assert model is not None
    fitting = [r for r in sc.rows if r.fits]
    assert sc.smallest_gpus == fitting[0].gpus
    # Below it, the table shows the first size that does not fit, checked by the memory model.
    first = sc.rows[0]
    assert not first.fits and first.gpus < fitting[0].gpus and first.setup == ""
    hw = a100_plan.hardware.model_copy(update={"nodes": 1, "gpus_per_node": first.gpus})
    brief = a100_plan.brief.model_copy(update={"global_batch_size": first.global_batch_size})
    assert not fits_somewhere(model, hw, brief)
    fastest = max(fitting, key=lambda r: r.tokens_per_s or 0)
    assert sc.fastest_gpus == fastest.gpus


def test_cost_is_gpus_times_hours_times_price_from_each_rows_own_tokens_per_s(
    a100_plan: TrainingPlan,
) -> None:
    price = a100_plan.scaling.price_per_gpu_hour
    assert price == load_price_table()["A100-40GB"].usd_per_gpu_hour
    for r in a100_plan.scaling.rows:
        if not r.fits:
            assert r.tokens_per_s is r.cost is r.hours is None
            continue
        assert r.tokens_per_s and r.mfu is not None and 0 < r.mfu < 1
        hours = 2e10 / r.tokens_per_s / 3600
        assert r.hours == pytest.approx(hours)
        assert r.cost == pytest.approx(r.gpus * hours * price)
        assert r.cost_per_billion_tokens == pytest.approx(
            r.gpus * 1e9 / r.tokens_per_s / 3600 * price
        )


def test_without_dataset_tokens_rows_give_cost_per_billion_tokens_and_no_total() -> None:
    plan = _plan("llama-3-8b", "1x8xA100-80GB", price_per_gpu_hour=2.0)
    fitting = [r for r in plan.scaling.rows if r.fits]
    assert fitting and all(r.hours is None and r.cost is None for r in fitting)
    assert all(r.cost_per_billion_tokens for r in fitting)
    budget = plan_budget(plan)
    assert budget is not None and budget.cost is None
    chosen = next(r for r in fitting if r.chosen)
    assert (
        f"**Cost:** {chosen.cost_per_billion_tokens:,.0f} per billion tokens at 2 " in budget.text
    )


def test_a_cpu_machine_has_no_scaling_and_says_why() -> None:
    cpu = HardwareSpec(source="local", nodes=1, gpus_per_node=0, cpu_cores=2, ram_gb=8)
    plan = _plan("gpt2", cpu, seq_len=128, global_batch_size=8, dataset_tokens=1e6)
    assert plan.scaling.rows == [] and plan.scaling.notes == [NO_GPU_NOTE]
    assert plan.scaling.price_per_gpu_hour is None
    report = render_markdown(plan)
    assert "## Time and cost\n\n- no scaling table: this is a CPU-only machine" in report
    assert charts.scaling_chart(plan) is None
    assert not any("Scaling with" in caption for caption, _ in charts.plan_charts(plan))


def test_an_old_plan_without_a_scaling_section_still_loads() -> None:
    data = json.loads(_plan("llama-3-8b", "1x8xA100-80GB").model_dump_json())
    data.pop("scaling")
    old = TrainingPlan.model_validate(data)
    assert old.scaling.rows == [] and old.scaling.notes == []
    assert "## Time and cost" not in render_markdown(old)


# ---- the report -----------------------------------------------------------------------------


def test_the_report_has_the_time_and_cost_table_and_the_scaling_chart(
    a100_plan: TrainingPlan, tmp_path: Path
) -> None:
    paths = write_report(a100_plan, tmp_path)
    md = Path(paths.markdown or "").read_text()
    head = "| setup | size | GPUs | tokens/s | MFU | time to train | cost (USD) |"
    assert "## Time and cost" in md and head in md
    table = md[md.index(head) :].split("\n\n")[0].splitlines()[2:]
    picks = scaling_picks(a100_plan)
    assert len(table) == len(picks) >= 2
    roles = " ".join(role for role, _ in picks)
    assert "chosen" in roles and "smallest that fits" in roles and "fastest" in roles
    for line, (_, row) in zip(table, picks, strict=True):
        assert line.startswith(f"| {row.setup} |") and f"| {row.gpus} (" in line
        assert f"{row.cost:,.0f}" in line
    assert "Price: 1.48 per GPU-hour (USD), Lambda" in md
    # The chart: the figure's two lines are the fitting rows' tokens/s and costs.
    fig = charts.scaling_figure(a100_plan)
    fitting = [r for r in a100_plan.scaling.rows if r.fits]
    lines = {line.get_gid(): line for ax in fig.axes for line in ax.get_lines()}
    assert list(lines["tokens"].get_xdata()) == [r.gpus for r in fitting]
    assert list(lines["tokens"].get_ydata()) == [r.tokens_per_s for r in fitting]
    assert list(lines["cost"].get_ydata()) == [r.cost for r in fitting]
    assert lines["chosen"].get_xdata()[0] == 8
    html = Path(paths.html or "").read_text()
    caption = charts.scaling_caption(a100_plan)
    assert f"<figcaption>{caption}</figcaption>" in html.replace("&#x27;", "'")
    assert f"does not fit at {a100_plan.scaling.rows[0].gpus} GPUs" in caption
    saved = json.loads(Path(paths.json or "").read_text())["scaling"]
    assert [r["gpus"] for r in saved["rows"]] == [r.gpus for r in a100_plan.scaling.rows]


# ---- the CLI: 8B on 8 A100 with a token budget ---------------------------------------------


def test_plan_8b_on_8_a100_with_dataset_tokens_prints_time_and_cost_with_the_price_source(
    tmp_path: Path,
) -> None:
    brief = tmp_path / "b.yaml"
    brief.write_text(
        "model: llama-3-8b\ntask: finetune\nhardware: 1x8xA100-80GB\nseq_len: 4096\n"
        "global_batch_size: 64\ndataset_tokens: 2.0e10\nsmoke: false\n"
    )
    res = run_main("plan", "--brief", str(brief), "--no-smoke", "--out", "o", "--json", "p.json", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    price = load_price_table()["A100-80GB"]
    sc = plan["scaling"]
    assert sc["price_per_gpu_hour"] == price.usd_per_gpu_hour and sc["rows"]
    chosen = next(r for r in sc["rows"] if r["chosen"])
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("time to train: "))
    hours = chosen["hours"]
    assert hours == pytest.approx(plan["speed"]["time_to_train_s"] / 3600)
    assert f"{8 * hours:,.0f} GPU-hours" in line
    assert f"cost {chosen['cost']:,.0f} USD at {price.usd_per_gpu_hour:g} USD per GPU-hour" in line
    assert f"{price.provider} {price.offer}" in line and f"as listed {price.listed}" in line
    report = (tmp_path / "o" / "report.md").read_text()
    assert "## Time and cost" in report and f"{chosen['cost']:,.0f} USD at" in report


def test_hardware_read_back_from_the_graph_state_scales_like_the_catalogs(
    a100_plan: TrainingPlan,
) -> None:
    # The reporter gets the hardware back from the graph's state as a plain GPUSpec.
    plain = HardwareSpec.model_validate(a100_plan.hardware.model_dump(mode="json"))
    assert type(plain.gpu).__name__ == "GPUSpec"
    assert a100_plan.model is not None and a100_plan.memory is not None
    again = plan_scaling(a100_plan.model, plain, a100_plan.brief, a100_plan.memory, a100_plan.speed)
    assert again.price_source == a100_plan.scaling.price_source != ""
    assert again.rows == a100_plan.scaling.rows
