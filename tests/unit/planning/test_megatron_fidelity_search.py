"""The search keeps a model off Megatron-only splits its launch would not build, out loud.

tools/research/megatron_arch.py decides what Megatron-DeepSpeed cannot build; here: the plan
says which splits were not searched and why, a pinned degree is the request's layout and keeps
Megatron, and when nothing else fits the plan runs on Megatron with one "Not as asked" line.
"""

from __future__ import annotations

from tools.core.schemas import TrainingBrief
from tools.planning import SearchOptions, search_strategy
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model
from tools.research.splits import setup_framework


def _search(model: str, hardware: str, seq: int = 2048, **brief: object):
    spec = lookup_model(model, seq, from_scratch=True)
    hw = parse_hardware(hardware)
    if "host_ram_gb" in brief:
        hw = hw.model_copy(update={"ram_gb": brief["host_ram_gb"]})
    request = TrainingBrief(model=model, task="pretrain", seq_len=seq, hardware=hardware, **brief)
    return spec, search_strategy(spec, hw, request, SearchOptions())


def test_deepseek_is_planned_on_the_hugging_face_model_and_the_plan_says_why() -> None:
    model, plan = _search("deepseek-v2-lite", "2x8xH100-80GB")
    assert setup_framework(model, plan) is None and plan.chosen_setup.ep == 1
    line = next(a for a in plan.assumptions if a.startswith("not searched:"))
    assert "cannot build deepseek-v2-lite's architecture" in line
    assert "multi-head latent attention" in line and "name Megatron" in line
    assert plan.not_honoured == []


def test_a_pinned_expert_degree_keeps_megatron() -> None:
    model, plan = _search("deepseek-v2-lite", "2x8xH100-80GB", pins={"expert_parallel": 8})
    assert plan.chosen_setup.ep == 8 and setup_framework(model, plan) == "megatron"
    assert not any(a.startswith("not searched:") for a in plan.assumptions)


def test_when_only_megatron_fits_the_plan_runs_there_and_says_so() -> None:
    # Gemma 2 27B on 16 A100 40GB with 64 GB of host RAM: ZeRO-3 needs more than 36 GB per GPU
    # and offload more RAM than the nodes have; only Megatron's tensor split fits.
    model, plan = _search("gemma-2-27b", "2x8xA100-40GB", host_ram_gb=64)
    assert plan.chosen_row is not None and plan.chosen_row.fits
    assert setup_framework(model, plan) == "megatron"
    note = plan.not_honoured[0]
    assert note.startswith("no setup whose launch builds gemma-2-27b as it is fits")
    assert note in plan.assumptions and "Megatron-DeepSpeed" in note
