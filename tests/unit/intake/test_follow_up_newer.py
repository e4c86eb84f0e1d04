"""A chat follow-up's newer word wins over the brief's older one, and keeps what it does not name.

Before, "use fsdp" after "no fsdp" (and "no deepspeed" on a brief that chose DeepSpeed) failed
with "framework pytorch_fsdp is also in avoid_frameworks", and "use zero3 instead" after "make it
data parallel only" replaced every pin, so the data-parallel-only pins went without the user
asking (tools/intake/follow_up.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tools.intake.brief import brief_from_dict
from tools.intake.follow_up import follow_up_fields

BRIEF = {"model": "llama-3-8b", "hardware": "1x8xH100-80GB", "task": "lora", "seq_len": 2048}


def _after(extra: dict[str, Any], text: str) -> dict[str, Any]:
    brief = {**BRIEF, **extra}
    merged = {**brief, **follow_up_fields(text, brief, ["llama-3-8b"])}
    brief_from_dict(merged)  # the chat checks the merged brief the same way
    return merged


def test_naming_a_framework_the_brief_avoids_takes_it_off_the_avoid_list() -> None:
    merged = _after({"avoid_frameworks": ["pytorch_fsdp", "megatron"]}, "use fsdp")
    assert merged["framework"] == "pytorch_fsdp"
    assert merged["avoid_frameworks"] == ["megatron"]


def test_refusing_the_brief_framework_unpins_it() -> None:
    merged = _after({"framework": "deepspeed"}, "no deepspeed")
    assert merged["avoid_frameworks"] == ["deepspeed"] and merged.get("framework") is None


@pytest.mark.parametrize(
    ("pins", "text", "expect"),
    [
        (
            {"tensor_parallel": 1, "pipeline_parallel": 1, "context_parallel": 1},
            "use zero3 instead",
            {"tensor_parallel": 1, "pipeline_parallel": 1, "zero_stage": 3},
        ),
        ({"zero_stage": 3, "tensor_parallel": 2}, "no zero3", {"tensor_parallel": 2}),
        ({"avoid_zero_stages": [3], "tensor_parallel": 2}, "use zero3", {"zero_stage": 3}),
    ],
)
def test_a_pin_follow_up_keeps_the_pins_it_does_not_name(
    pins: dict[str, Any], text: str, expect: dict[str, Any]
) -> None:
    merged = _after({"pins": pins}, text)["pins"]
    assert {k: merged.get(k) for k in expect} == expect
    if text == "no zero3":
        assert merged.get("zero_stage") is None and 3 in merged["avoid_zero_stages"]
    if text == "use zero3":
        assert 3 not in (merged.get("avoid_zero_stages") or [])
        assert merged["tensor_parallel"] == 2
