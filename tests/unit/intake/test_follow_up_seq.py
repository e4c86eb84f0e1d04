"""A chat follow-up's sequence length in the words people use ("what if it were 16384?").

Before, "what if the sequence length were 16384?" changed nothing ("that follow-up changes
nothing I can read"): only "of", "=", ":", "is" and "to" could join the noun and the number.
"""

from __future__ import annotations

import pytest

from tools.intake.brief import follow_up_fields, request_fields

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
