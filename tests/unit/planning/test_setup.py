"""The setup type (tools/core/setup.py): one spelling, and plan rows told apart by it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.core.schemas import MemoryPlan, TrainingBrief
from tools.core.setup import Setup
from tools.intake.brief import brief_from_dict, load_brief
from tools.planning import SearchOptions, search_strategy
from tools.planning.estimate import EstimateRequest, estimate
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


# Briefs whose plans hold several rows of one ZeRO family (a zero1 row at TP 1 and another at
# TP 2): dense and MoE models, long context (context parallel), offload on small GPUs, a
# replicating framework, and the example briefs the README plans.
BRIEFS = [
    {"model": "llama-3-70b", "hardware": "4x8xH100-80GB", "seq_len": 4096,
     "global_batch_size": 512, "task": "pretrain"},
    {"model": "llama-3-8b", "hardware": "1x8xA100-80GB", "seq_len": 4096,
     "global_batch_size": 64, "task": "finetune"},
    {"model": "llama-3-70b", "hardware": "4x8xH100-80GB", "seq_len": 16384,
     "global_batch_size": 256, "task": "pretrain"},
    {"model": "mixtral-8x7b", "hardware": "2x8xH100-80GB", "seq_len": 4096,
     "global_batch_size": 256, "task": "pretrain"},
    {"model": "mistral-7b", "hardware": "1x2xRTX3090", "global_batch_size": 32,
     "task": "finetune"},
    {"model": "llama-3-8b", "hardware": "1x8xA100-80GB", "global_batch_size": 64,
     "task": "lora"},
]  # fmt: skip
EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples" / "briefs").glob("*.yaml"))


def _check_labels(plan: MemoryPlan) -> None:
    """A program reading the plan by label gets one row; the chosen one is the plan's choice."""
    dumped = plan.model_dump(mode="json")
    labels = [row["label"] for row in dumped["strategies"]]
    assert len(labels) == len(set(labels)), labels
    assert all(row["label"] == row["name"] or "+" in row["label"] for row in dumped["strategies"])
    chosen = [row for row in plan.strategies if plan.is_chosen(row)]
    assert len(chosen) == 1 and chosen[0].label == plan.chosen_label
    assert plan.setup is not None and plan.setup.label == plan.chosen_label
    assert chosen[0].setup.family() == plan.chosen_setup.family()


def _search(brief: TrainingBrief, options: SearchOptions | None = None) -> MemoryPlan:
    assert brief.model is not None and brief.hardware is not None
    model = lookup_model(brief.model, brief.seq_len)
    return search_strategy(model, parse_hardware(brief.hardware), brief, options or SearchOptions())


@pytest.mark.parametrize("fields", BRIEFS, ids=lambda f: f"{f['model']}-{f['hardware']}")
def test_plan_rows_carry_unique_labels(fields: dict[str, object]) -> None:
    _check_labels(_search(brief_from_dict(fields)))


def test_the_labels_tell_apart_rows_the_names_do_not() -> None:
    """The case the label exists for: two rows of one ZeRO family at different splits."""
    names = [row.name for row in _search(brief_from_dict(BRIEFS[0])).strategies]
    assert len(names) > len(set(names))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_plans_carry_unique_labels(path: Path) -> None:
    brief = load_brief(path)
    if brief.hardware == "local":
        brief = brief.model_copy(update={"hardware": "1x2xA100-80GB"})
    _check_labels(_search(brief))
    # A replicating framework (PyTorch DDP, Horovod) searched with the same brief.
    _check_labels(_search(brief, SearchOptions(replicating="pytorch_ddp")))


@pytest.mark.parametrize("framework", ["fsdp", "megatron", "torchtitan"])
def test_estimate_rows_carry_unique_labels(framework: str) -> None:
    request = EstimateRequest(
        model="llama-3-70b", hardware="2x8xH100-80GB", seq_len=8192, framework=framework
    )
    _check_labels(estimate(request).memory)
