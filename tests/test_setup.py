"""The setup type (tools/core/setup.py): one spelling, and plan rows told apart by it."""

from __future__ import annotations

import pytest

from tools.core.setup import Setup
from tools.intake.brief import brief_from_dict
from tools.planning import search_strategy
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model


def test_label_keeps_todays_spellings_and_orders_every_axis() -> None:
    assert Setup("zero1").label() == "zero1"
    assert Setup("zero3", tp=8).label() == "zero3+tp8"
    assert Setup("zero1", tp=8, pp=4).label() == "zero1+tp8+pp4"
    full = Setup("zero1", tp=8, pp=16, vpp=2, cp=2, ep=8, dp=4, micro_batch=2, accumulation=8)
    assert full.label() == "zero1+tp8+pp16+vpp2+cp2+ep8"
    # How a step runs (data parallel, micro-batch, accumulation, recompute) is not the name.
    assert Setup("zero2", dp=8, micro_batch=4, recompute="full").label() == "zero2"
    assert Setup("ddp", cp=2).label() == "ddp+cp2"


def test_setup_arithmetic_and_family() -> None:
    s = Setup("zero1", tp=2, pp=2, vpp=2, cp=2, dp=4, micro_batch=2, accumulation=8)
    assert (s.split, s.world, s.per_rank, s.global_batch) == (8, 32, 16, 64)
    assert s.family() == Setup("zero1", tp=2, pp=2, cp=2)
    assert s.but(tp=4).tp == 4 and s.tp == 2


@pytest.mark.parametrize("bad", [{"tp": 0}, {"dp": -1}, {"micro_batch": True}, {"pp": 1.5}])
def test_setup_refuses_degrees_below_one(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Setup("zero1", **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Setup("zero1", recompute="most")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "hardware", "seq", "batch", "task"),
    [
        ("llama-3-70b", "4x8xH100-80GB", 4096, 512, "pretrain"),
        ("llama-3-8b", "1x8xA100-80GB", 4096, 64, "finetune"),
        ("llama-3-70b", "4x8xH100-80GB", 16384, 256, "pretrain"),
    ],
)
def test_plan_rows_carry_unique_labels(
    model: str, hardware: str, seq: int, batch: int, task: str
) -> None:
    """A program reading the plan by label gets one row; the chosen one is the plan's choice."""
    brief = brief_from_dict(
        {"model": model, "hardware": hardware, "seq_len": seq, "global_batch_size": batch,
         "task": task}
    )  # fmt: skip
    plan = search_strategy(lookup_model(model, seq), parse_hardware(hardware), brief)
    dumped = plan.model_dump(mode="json")
    labels = [row["label"] for row in dumped["strategies"]]
    assert len(labels) == len(set(labels)), labels
    assert all(row["label"] == row["name"] or "+" in row["label"] for row in dumped["strategies"])
    chosen = [row for row in plan.strategies if plan.is_chosen(row)]
    assert len(chosen) == 1 and chosen[0].label == plan.chosen_label
    assert plan.setup is not None and plan.setup.label == plan.chosen_label
    assert chosen[0].setup.family() == plan.chosen_setup.family()
