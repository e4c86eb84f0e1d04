"""A brief file's goal is its title: words there the fields do not carry are said, not dropped.

Before, a goal reading "in JAX ... seq 8192" beside fields that said neither was planned on
the fields alone without a word (tools/intake/goal_text.py).
"""

from __future__ import annotations

from typing import Any

from tools.intake.account import account_brief
from tools.intake.brief import brief_from_dict


def _goal_lines(data: dict[str, Any]) -> list[str]:
    brief = brief_from_dict(data)
    return [a.why for a in account_brief(data, brief).assumed if a.field == "goal"]


def test_goal_words_the_fields_do_not_carry_are_said() -> None:
    data = {
        "goal": "pretrain in JAX with seq 8192 on ZeRO-3",
        "model": "llama-3-8b",
        "task": "pretrain",
        "hardware": "1x8xH100-80GB",
    }
    (line,) = _goal_lines(data)
    assert "'JAX'" in line and "'seq 8192'" in line and "'ZeRO-3'" in line
    assert "change nothing" in line


def test_goal_words_the_fields_carry_are_not_said() -> None:
    data = {
        "goal": "Fine-tune Llama-3-8B with seq 4096 on DeepSpeed (or FSDP)",
        "model": "llama-3-8b",
        "task": "finetune",
        "seq_len": 4096,
        "framework": "deepspeed",
        "hardware": "1x8xA100-80GB",
    }
    assert _goal_lines(data) == []
