"""A chat follow-up read in the words people use, changing only what it names.

Before, "what if the sequence length were 16384?" changed nothing ("that follow-up changes
nothing I can read": only "of", "=", ":", "is" and "to" could join the noun and the number);
"what about H100?" re-planned on one H100 (a fresh request's reading of a part without a
count) and "make it H100s" was refused as unclear; "what about 2 nodes of H100?" kept the
brief's A100s.
"""

from __future__ import annotations

import pytest

from tools.intake.brief import request_fields
from tools.intake.follow_up import follow_up_fields

BRIEF = {"model": "llama-3-8b", "hardware": "1x8xA100-80GB", "task": "finetune", "seq_len": 2048}


@pytest.mark.parametrize(
    ("text", "seq"),
    [
        ("what if the sequence length were 16384?", 16384),
        ("and if the context was 8192", 8192),
        ("with the sequence length raised to 8192", 8192),
        ("what if the seq len is set to 4096", 4096),
        ("sequence length cut to 1024", 1024),
    ],
)
def test_a_follow_up_changes_the_sequence_length(text: str, seq: int) -> None:
    assert follow_up_fields(text, BRIEF, ["llama-3-8b"])["seq_len"] == seq


def test_a_count_of_sequences_is_not_a_length() -> None:
    said = request_fields("fine-tune llama-3-8b, sequences at 8 per GPU, on 8 H100", ["llama-3-8b"])
    assert "seq_len" not in said


@pytest.mark.parametrize(
    ("text", "hardware"),
    [
        ("what about H100?", "1x8xH100-80GB"),
        ("make it H100s", "1x8xH100-80GB"),
        ("switch to B200", "1x8xB200"),
        ("what about 2 nodes of H100?", "2x8xH100-80GB"),
        ("what if I only had 4 H100s?", "1x4xH100-80GB"),
        ("what if we had 2 nodes?", "2x8xA100-80GB"),
        ("use 16 H100s", "2x8xH100-80GB"),
    ],
)
def test_a_follow_up_naming_a_gpu_keeps_the_counts_it_does_not_change(
    text: str, hardware: str
) -> None:
    assert follow_up_fields(text, BRIEF, ["llama-3-8b"])["hardware"] == hardware


@pytest.mark.parametrize(
    ("brief", "text", "changes"),
    [
        (BRIEF, "what if the batch were 128", {"global_batch_size": 128}),
        (BRIEF, "with the batch size set to 512", {"global_batch_size": 512}),
        (BRIEF, "with gradient checkpointing", {"recipe": {"checkpointing": "full"}}),
        (BRIEF, "without activation checkpointing", {"recipe": {"checkpointing": "none"}}),
        (
            {**BRIEF, "task": "lora", "recipe": {"lora_rank": 16}},
            "what about rank 64?",
            {"recipe": {"lora_rank": 64}},
        ),
        (BRIEF, "what if weight decay 0.05?", {"weight_decay": 0.05}),
        (
            BRIEF,
            "with a cosine schedule and min lr 1e-6",
            {"lr_schedule": "cosine", "min_lr": 1e-6},
        ),
        (
            {**BRIEF, "warmup_steps": 100},
            "what about 10% warmup",
            {"warmup_ratio": 0.1, "warmup_steps": None},
        ),
    ],
)
def test_a_follow_up_changes_the_batch_and_the_recipe_it_names(
    brief: dict[str, object], text: str, changes: dict[str, object]
) -> None:
    """Recipe words are read for the brief's task (a follow-up rarely restates it)."""
    assert follow_up_fields(text, brief, ["llama-3-8b"]) == changes


def test_a_wish_a_follow_up_cannot_apply_is_named() -> None:
    """fp8, 8-bit Adam, a deadline or a budget are wishes of a whole request: the chat names
    them (and how to ask) instead of only saying the follow-up changed nothing."""
    from tools.intake.follow_up import wish_words

    assert follow_up_fields("switch to fp8", BRIEF, ["llama-3-8b"]) == {}
    assert wish_words("switch to fp8") == ["fp8"]
    assert wish_words("with 8-bit adam, finish within 3 days") == ["8-bit adam", "within 3 days"]
    assert wish_words("with a budget of $5000") == ["$5000"]
    assert wish_words("double the batch size") == []


@pytest.mark.parametrize(
    ("text", "dropped"),
    [
        # Before, a follow-up that changed a field dropped its wishes without a word: "make it
        # 2 A100 in JAX by Friday with 8-bit adam" re-planned on 2 A100s and said nothing else.
        ("make it 2 A100 in JAX by Friday with 8-bit adam", ["JAX", "by Friday", "8-bit adam"]),
        ("use 16 H100s and fp8", ["fp8"]),
        # What the follow-up's fields carry is not named: checkpointing is the recipe's.
        ("make it 2 A100 with gradient checkpointing", []),
        ("make it 2 A100", []),
    ],
)
def test_the_wishes_a_changing_follow_up_cannot_carry_are_named(
    text: str, dropped: list[str]
) -> None:
    from tools.intake.follow_up import dropped_wish_words

    changes = follow_up_fields(text, BRIEF, ["llama-3-8b"])
    assert changes and dropped_wish_words(text, changes) == dropped
