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


def test_context_with_a_model_split_off_torchtitan_is_refused_for_what_it_is() -> None:
    # Pinned tp 8 x pp 4 x cp 2 of llama-3-70b (no torchtitan flavor) was refused as a batch
    # that "must be a multiple of the data-parallel degree" (128 on dp 1).
    spec = lookup_model("llama-3-70b", 32768)
    hw = parse_hardware("4x8xH100-80GB")
    brief = TrainingBrief(
        model="llama-3-70b", seq_len=32768, global_batch_size=128, hardware="4x8xH100-80GB",
        pins={"tensor_parallel": 8, "pipeline_parallel": 4, "context_parallel": 2},
    )  # fmt: skip
    plan = search_strategy(spec, hw, brief, SearchOptions())
    note = plan.not_honoured[0]
    assert note.startswith("the pinned choice (tensor parallel 8 + pipeline parallel 4")
    assert "cannot run here: context parallel 2 with tensor x pipeline parallel 8 x 4" in note
    assert "DeepSpeed-Ulysses" in note and "multiple of" not in note
