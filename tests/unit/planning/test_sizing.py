"""The sizing search: counts asked about, time and cost arithmetic, the pick, Pareto set and binding."""

from __future__ import annotations

import pytest

from tools.core.errors import InputError
from tools.core.schemas import SizingPlan, SizingRow
from tools.intake.brief import brief_from_dict
from tools.planning.sizing import SizingLimits, counts_for, size_count, size_training, sizing_gpu
from tools.research.hardware import find_gpu
from tools.research.model_catalog import lookup_model
from tools.research.prices import load_price_table

DAY = 86_400.0


def _size(model: str, task: str, **limits: object) -> SizingPlan:
    brief = brief_from_dict({"model": model, "task": task})
    return size_training(lookup_model(model, brief.seq_len), brief, SizingLimits(**limits))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def a100_13b() -> SizingPlan:
    """How many A100 40GB to fully fine-tune Llama 2 13B on 1B tokens (and the priced table)."""
    return _size("llama-2-13b", "finetune", tokens=1e9, asked=("A100-40GB",))


@pytest.fixture(scope="module")
def free_1b() -> SizingPlan:
    """Pretraining a 1B Llama on 100B tokens on up to 16 GPUs, unconstrained."""
    return _size("llama-3.2-1b", "pretrain", tokens=1e11, max_gpus=16)


def _fitting(plan: SizingPlan) -> list[SizingRow]:
    return [r for r in plan.rows if r.fit != "does not fit"]


def test_counts_are_powers_of_two_to_a_node_then_whole_nodes() -> None:
    assert counts_for(8, 1024, False) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert counts_for(8, 1024, True) == [1, 2, 4, 8]
    assert counts_for(8, 24, False) == [1, 2, 4, 8, 16, 24]  # the cap, as whole nodes
    assert counts_for(8, 6, False) == [1, 2, 4, 6]
    assert counts_for(4, 20, False) == [1, 2, 4, 8, 16, 20]


def test_each_row_time_is_tokens_over_speed_and_cost_is_time_count_price(
    a100_13b: SizingPlan,
) -> None:
    rows = _fitting(a100_13b)
    assert len(rows) >= 10
    for row in rows:
        assert row.tokens_per_s and row.time_s and row.cost_usd and row.price_per_gpu_hour
        assert row.time_s == pytest.approx(1e9 / row.tokens_per_s, rel=1e-12)
        assert row.cost_usd == pytest.approx(
            row.time_s / 3600 * row.count * row.price_per_gpu_hour, rel=1e-12
        )
        assert row.count == row.nodes * row.gpus_per_node
        assert row.setup and row.fit in ("fits", "tight")
    for row in a100_13b.rows:
        if row.fit == "does not fit":
            assert row.tokens_per_s is None and row.cost_usd is None and not row.setup


def test_a100_40gb_answer_has_a_least_count_and_a_row_per_priced_type(a100_13b: SizingPlan) -> None:
    answer = next(a for a in a100_13b.answers if a.gpu == "A100-40GB")
    assert answer.asked and answer.min_count and answer.min_setup
    # 13B fully fine-tuned holds 16 bytes per parameter of states: more than one 40 GB GPU.
    assert answer.min_count > 1
    assert answer.min_free_share is not None and answer.min_free_share >= 0.10
    smaller = [r for r in a100_13b.rows if r.gpu == "A100-40GB" and r.count < answer.min_count]
    assert smaller and all(r.fit == "does not fit" for r in smaller)
    assert {r.gpu for r in a100_13b.rows} >= set(load_price_table())
    assert a100_13b.pick is not None and a100_13b.pick.gpu == "A100-40GB"
    assert answer.cost_optimal_count == a100_13b.pick.count
    # The cost optimum: the cheapest A100 40GB row.
    mine = [r for r in _fitting(a100_13b) if r.gpu == "A100-40GB"]
    assert a100_13b.pick.cost_usd == min(r.cost_usd or 0 for r in mine)


def test_pareto_rows_are_not_dominated(a100_13b: SizingPlan) -> None:
    front = a100_13b.pareto
    assert front
    for row in front:
        assert row.time_s is not None and row.cost_usd is not None
        for other in _fitting(a100_13b):
            assert other.time_s is not None and other.cost_usd is not None
            assert not (other.time_s < row.time_s and other.cost_usd < row.cost_usd)
    times = [r.time_s or 0 for r in front]
    assert times == sorted(times)


def test_a_deadline_picks_the_cheapest_row_that_meets_it(free_1b: SizingPlan) -> None:
    times = sorted(r.time_s for r in _fitting(free_1b) if r.time_s)
    deadline = times[len(times) // 3]  # met by a third of the rows
    plan = _size("llama-3.2-1b", "pretrain", tokens=1e11, deadline_s=deadline, max_gpus=16)
    assert plan.objective == "cheapest" and plan.binding is None and plan.pick is not None
    assert plan.pick.time_s is not None and plan.pick.time_s <= deadline
    ok = [r for r in _fitting(plan) if r.time_s and r.time_s <= deadline and r.cost_usd]
    assert plan.pick.cost_usd == min(r.cost_usd or 0 for r in ok)
    assert all(r.meets_deadline == (r.time_s <= deadline) for r in ok)


def test_a_budget_alone_picks_the_fastest_row_within_it(free_1b: SizingPlan) -> None:
    costs = sorted(r.cost_usd for r in _fitting(free_1b) if r.cost_usd)
    budget = costs[len(costs) // 2]
    plan = _size("llama-3.2-1b", "pretrain", tokens=1e11, budget_usd=budget, max_gpus=16)
    assert plan.objective == "fastest" and plan.pick is not None
    assert plan.pick.cost_usd is not None and plan.pick.cost_usd <= budget
    ok = [r for r in _fitting(plan) if r.cost_usd is not None and r.cost_usd <= budget]
    assert plan.pick.time_s == min(r.time_s or 0 for r in ok)


def test_an_unmeetable_deadline_binds_by_the_fastest_rows_lateness() -> None:
    plan = _size("llama-3.2-1b", "pretrain", tokens=1e12, deadline_s=60.0, max_gpus=16)
    assert plan.pick is None and plan.binding is not None
    assert plan.binding.constraint == "deadline" and plan.binding.limit == 60.0
    fastest = min(r.time_s for r in _fitting(plan) if r.time_s)
    assert plan.binding.best == pytest.approx(fastest)
    assert plan.binding.by == pytest.approx(fastest - 60.0)
    assert "deadline" in plan.binding.text and "over" in plan.binding.text


def test_an_unmeetable_budget_binds_by_the_cheapest_rows_overrun() -> None:
    plan = _size("llama-3.2-1b", "pretrain", tokens=1e12, budget_usd=10.0, max_gpus=16)
    assert plan.pick is None and plan.binding is not None
    assert plan.binding.constraint == "budget"
    cheapest = min(r.cost_usd for r in _fitting(plan) if r.cost_usd)
    assert plan.binding.by == pytest.approx(cheapest - 10.0)


def test_one_node_binds_and_says_the_least_count_that_fits() -> None:
    plan = _size("llama-2-70b", "finetune", asked=("A100-40GB",), one_node=True)
    assert all(r.count <= 8 for r in plan.rows)
    assert plan.pick is None and plan.binding is not None
    assert plan.binding.constraint == "one_node"
    assert plan.binding.best is not None and plan.binding.best > 8
    assert plan.binding.by == plan.binding.best - 8


def test_max_gpus_caps_every_type() -> None:
    plan = _size("llama-3.2-1b", "finetune", max_gpus=4)
    assert plan.rows and max(r.count for r in plan.rows) == 4


def test_refused_types_are_not_sized_and_the_users_price_wins() -> None:
    plan = _size("llama-3.2-1b", "finetune", tokens=1e8, refused=("L4",), prices={"H100-80GB": 1.0})
    assert "L4" not in {r.gpu for r in plan.rows}
    assert any("refused" in n and "L4" in n for n in plan.notes)
    h100 = next(a for a in plan.answers if a.gpu == "H100-80GB")
    assert h100.price_per_gpu_hour == 1.0 and h100.price_source == "the request's price"
    with pytest.raises(InputError, match="both asked for and refused"):
        _size("llama-3.2-1b", "finetune", asked=("L4",), refused=("L4",))


def test_an_unpriced_asked_type_is_sized_without_cost() -> None:
    plan = _size("llama-3.2-1b", "finetune", tokens=1e8, asked=("V100-32GB",), only_asked=True)
    assert {r.gpu for r in plan.rows} == {"V100-32GB"}
    fitting = _fitting(plan)
    assert fitting and all(r.cost_usd is None and r.time_s for r in fitting)
    assert any("no price for V100-32GB" in n for n in plan.notes)


def test_offload_rows_say_they_depend_on_host_ram() -> None:
    brief = brief_from_dict({"model": "llama-2-13b", "task": "finetune"})
    model = lookup_model("llama-2-13b", brief.seq_len)
    row = size_count(model, brief, find_gpu("L40S"), 4)
    assert "offload" in row.setup and row.offload and "host RAM" in row.offload


def test_training_only_and_a_gpu_of_another_memory() -> None:
    with pytest.raises(InputError, match="sizing is for training"):
        _size("llama-3.2-1b", "inference")
    big = sizing_gpu("H100-80GB", 96.0)
    assert big.memory_gb == 96.0 and find_gpu("H100-80GB").memory_gb == 80


def test_a_request_price_without_a_gpu_type_is_said_not_applied() -> None:
    brief = brief_from_dict(
        {"model": "llama-3.2-1b", "task": "finetune", "price_per_gpu_hour": 0.5}
    )
    model = lookup_model("llama-3.2-1b", brief.seq_len)
    plan = size_training(model, brief, SizingLimits(max_gpus=2))
    assert any("names no GPU type, so it is not applied" in n for n in plan.notes)
    assert all(a.price_source != "the request's price" for a in plan.answers)
    asked = size_training(model, brief, SizingLimits(max_gpus=2, asked=("L4",)))
    l4 = next(a for a in asked.answers if a.gpu == "L4")
    assert l4.price_per_gpu_hour == 0.5 and l4.price_source == "the request's price"


def test_a_batch_the_count_does_not_divide_is_rounded_up_out_loud() -> None:
    brief = brief_from_dict({"model": "llama-3.2-1b", "task": "pretrain", "global_batch_size": 100})
    limits = SizingLimits(max_gpus=16, asked=("H100-80GB",))  # type: ignore[arg-type]
    plan = size_training(lookup_model("llama-3.2-1b", brief.seq_len), brief, limits)
    odd = [r for r in plan.rows if 100 % r.count]
    assert odd and all(r.global_batch_size % r.count == 0 for r in odd)
    assert all(r.global_batch_size > 100 for r in odd)
    assert any(
        n.startswith("global batch 100 does not divide over every count") for n in plan.notes
    )
    default = _size("llama-3.2-1b", "pretrain", max_gpus=8)
    assert any(n.startswith("global batch not given: ") for n in default.notes)
