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


def test_a_chat_goal_word_a_later_follow_up_replaced_is_not_said() -> None:
    """Before, after 'now for 500B tokens' the chat's plan said "a brief file's fields are its
    settings, so '1B tokens' in its goal change nothing": the follow-up line had already said
    dataset_tokens 1e9 -> 5e11, and no brief file was given."""
    data = {
        "goal": "lora llama-3-8b on 8 H100s, 1B tokens; then: now for 500B tokens",
        "model": "llama-3-8b",
        "task": "lora",
        "hardware": "1x8xH100-80GB",
        "dataset_tokens": 5e11,
    }
    assert _goal_lines(data) == []


def test_a_chat_goal_word_no_field_carries_is_said_as_a_chat_word() -> None:
    data = {
        "goal": "lora llama-3-8b on 8 H100s; then: make it 2 nodes in JAX",
        "model": "llama-3-8b",
        "task": "lora",
        "hardware": "2x8xH100-80GB",
    }
    (line,) = _goal_lines(data)
    assert "'JAX'" in line and "brief file" not in line and "follow-up" in line


def test_a_goal_refusal_the_fields_carry_is_not_said() -> None:
    """Before, after the chat follow-up 'no deepspeed' set avoid_frameworks, the plan said
    "'no deepspeed' in the chat's goal change nothing"; a brief file's goal likewise."""
    base = {"model": "llama-3-8b", "task": "lora", "hardware": "1x8xH100-80GB"}
    chat = {**base, "goal": "lora llama-3-8b on 8 H100s; then: no deepspeed"}
    assert _goal_lines({**chat, "avoid_frameworks": ["deepspeed"]}) == []
    again = {**base, "goal": f"{chat['goal']}; then: use deepspeed", "framework": "deepspeed"}
    assert _goal_lines(again) == []
    assert (
        _goal_lines({**base, "goal": "tune it, no deepspeed", "avoid_frameworks": ["deepspeed"]})
        == []
    )
