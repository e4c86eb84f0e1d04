"""A dataset given as examples x their average length is its tokens, not a sequence length."""

from __future__ import annotations

import pytest

from tools.intake.numbers_text import number_reads


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        # Before, these were listed as not understood ("2M instruction", "averaging 600 tokens")
        # and the plan ran its default number of steps.
        ("sft llama on 4 MI250X, 2M instruction pairs averaging 600 tokens, seq 2048", 1.2e9),
        ("lora qwen2.5-7b, 20k examples avg 800 tokens", 16e6),
        ("100k conversations with an average of 1.5k tokens", 100e3 * 1536),
        ("50k samples of about 700 tokens on average", 35e6),
        ("We have like 30k convos, ~1200 tokens each. Budget is tight", 36e6),
        ("about 8k support tickets of roughly 900 tokens each", 7.2e6),
    ],
)
def test_examples_of_an_average_length_are_the_datasets_tokens(text: str, tokens: float) -> None:
    reads, notes = number_reads(text, 2048)
    by = {r.field: r.value for r in reads}
    assert by["dataset_tokens"] == pytest.approx(tokens)
    assert by.get("seq_len") in (None, 2048)  # an average is no sequence length
    assert any("average" in n for n in notes)


def test_examples_of_a_length_keep_their_sequence_length() -> None:
    reads, _ = number_reads("50k samples of 1k tokens", 2048)
    by = {r.field: r.value for r in reads}
    assert by["seq_len"] == 1024 and by["dataset_tokens"] == 50e3 * 1024
