"""Strategy search: fastest setup that fits with headroom, no needless offload, reasons for the rest."""

from __future__ import annotations

import pytest

from tools.brief import brief_from_dict
from tools.hardware import parse_hardware
from tools.memory import OFFLOAD_STRATEGIES, capacity_bytes
from tools.models import lookup_model
from tools.strategy import MIN_HEADROOM, search_strategy


def _search(model: str, hardware: str, seq_len: int, batch: int, task: str = "finetune"):
    brief = brief_from_dict(
        {
            "model": model,
            "hardware": hardware,
            "seq_len": seq_len,
            "global_batch_size": batch,
            "task": task,
        }
    )
    hw = parse_hardware(hardware)
    return search_strategy(lookup_model(model, seq_len), hw, brief), hw


def test_llama_8b_on_8_a100_picks_the_fastest_fitting_non_offload_setup() -> None:
    plan, hw = _search("llama-3-8b", "1x8xA100-80GB", 4096, 64)
    rows = {s.name: s for s in plan.strategies}
    chosen = rows[plan.chosen]
    assert plan.chosen not in OFFLOAD_STRATEGIES
    cap = capacity_bytes(hw)
    assert chosen.per_gpu_bytes.total <= (1 - MIN_HEADROOM) * cap
    fitting_plain = [
        s
        for s in plan.strategies
        if s.name not in OFFLOAD_STRATEGIES and s.per_gpu_bytes.total <= (1 - MIN_HEADROOM) * cap
    ]
    assert chosen.tokens_per_s == max(s.tokens_per_s or 0 for s in fitting_plain)
    assert set(plan.why_not) == set(rows) - {plan.chosen}
    assert "offload not needed" in plan.why_not["zero3_offload_all"]
    assert "does not fit" in plan.why_not["ddp"]
    assert plan.micro_batch_size * plan.gradient_accumulation_steps * 8 == 64


def test_offload_only_when_nothing_else_fits() -> None:
    plan, hw = _search("llama-3-8b", "1x1xRTX4090", 2048, 16, task="lora")
    cap = capacity_bytes(hw)
    if plan.chosen in OFFLOAD_STRATEGIES:
        assert all(
            s.per_gpu_bytes.total > (1 - MIN_HEADROOM) * cap
            for s in plan.strategies
            if s.name not in OFFLOAD_STRATEGIES
        )


def test_nothing_fits_says_why() -> None:
    plan, _ = _search("llama-3.1-405b", "8x8xH100-80GB", 8192, 512, task="pretrain")
    assert plan.assumptions[0].startswith("nothing fits")
    assert all("over 90%" in why for why in plan.why_not.values())


def test_forced_choices_are_respected() -> None:
    plan, _ = _search("llama-3-8b", "1x8xA100-80GB", 4096, 64)
    brief = brief_from_dict(
        {
            "model": "llama-3-8b",
            "hardware": "1x8xA100-80GB",
            "seq_len": 4096,
            "global_batch_size": 64,
        }
    )
    forced = search_strategy(
        lookup_model("llama-3-8b", 4096),
        parse_hardware("1x8xA100-80GB"),
        brief,
        micro_batch_size=1,
        activation_checkpointing=True,
        strategies=["zero3", "zero3_offload_all"],
    )
    assert (
        forced.chosen == "zero3"
        and forced.micro_batch_size == 1
        and forced.activation_checkpointing
    )


def test_cpu_only_target_keeps_the_memory_choice() -> None:
    plan, _ = _search("gpt2", "local", 256, 8, task="pretrain")
    assert plan.why_not == {} and plan.chosen in {"ddp", "zero1", "zero2", "zero3"}


@pytest.mark.parametrize(
    ("model", "hardware", "seq", "batch", "task"),
    [
        ("gpt2", "1x1xT4", 1024, 32, "pretrain"),
        ("llama-3-8b", "1x8xA100-80GB", 4096, 64, "finetune"),
        ("llama-3-8b", "1x1xRTX4090", 2048, 16, "lora"),
        ("llama-2-13b", "1x1xA100-40GB", 4096, 32, "finetune"),
        ("llama-3-70b", "2x8xH100-80GB", 8192, 512, "pretrain"),
        ("llama-3.1-405b", "8x8xH100-80GB", 8192, 512, "pretrain"),
    ],
)
def test_six_reference_cases_give_a_complete_answer(model, hardware, seq, batch, task) -> None:
    plan, _ = _search(model, hardware, seq, batch, task)
    assert plan.chosen in {s.name for s in plan.strategies}
    assert plan.assumptions
