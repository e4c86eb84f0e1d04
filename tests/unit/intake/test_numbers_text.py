"""Batches given in tokens become sequences as practitioners count them."""

from __future__ import annotations

import pytest

from tools.intake.numbers_text import batch_reading
from tools.intake.optim_text import lr_reading


@pytest.mark.parametrize(
    ("text", "seq_len", "sequences"),
    [
        # Binary multiples, as published batch sizes are counted: 4M = 4 x 2^20 tokens.
        ("a batch of 4M tokens", 32768, 128),
        ("a 4M-token batch", 4096, 1024),
        ("batch of 512k tokens", 2048, 256),
        ("global batch of 1.5M tokens", 4096, 384),
        # Neither reading is whole sequences: the decimal count, rounded.
        ("batch of 2M tokens", 3000, 667),
        # A plain number of tokens is taken as written.
        ("batch of 1000000 tokens", 2048, 488),
    ],
)
def test_a_token_batch_becomes_whole_sequences_and_says_how(
    text: str, seq_len: int, sequences: int
) -> None:
    read, how = batch_reading(text, seq_len)
    assert read is not None and read.value == sequences
    assert how is not None and f"= {sequences} sequences of {seq_len}" in how


def test_a_refused_zero_stage_is_read_with_its_words() -> None:
    from tools.intake.wishes import pin_fields, pin_reads

    text = "fine-tune phi-4 on 4 RTX 4090, do not use ZeRO-3, zero 2 is fine, never ZeRO-1"
    (read,) = [r for r in pin_reads(text) if r.field == "pins.avoid_zero_stages"]
    assert (read.value, read.quote) == ([1, 3], "not use ZeRO-3")
    assert pin_fields(text) == {"zero_stage": 2, "avoid_zero_stages": [1, 3]}


def test_a_refusal_at_the_start_of_the_request_keeps_its_words() -> None:
    from tools.intake.wishes import pin_reads

    (read,) = pin_reads("no ZeRO-3 please, fine-tune llama-3-8b on 8 A100")
    assert (read.field, read.value, read.quote) == ("pins.avoid_zero_stages", [3], "no ZeRO-3")


@pytest.mark.parametrize(
    ("text", "rate", "quote"),
    [
        ("fine-tune llama-3.1-8b with a 3e-5 learning rate", 3e-5, "3e-5 learning rate"),
        ("pretrain with a 0.0003 peak learning rate", 3e-4, "0.0003 peak learning rate"),
        ("batch 512 lr 6e-4", 6e-4, "lr 6e-4"),  # the rate after its name still wins
    ],
)
def test_a_rate_before_its_name_is_the_learning_rate(text: str, rate: float, quote: str) -> None:
    read = lr_reading(text)
    assert read is not None and read.value == rate and read.quote == quote


def test_a_count_before_lr_is_no_rate() -> None:
    assert lr_reading("compare 2 learning rates on batch 512 lr") is None


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        # A thousands separator is part of the number: once "context of 8,192" planned seq 8.
        ("llama-3-8b on 8 H100, context of 8,192", "seq_len", 8192),
        ("max seq len 16,384 on 8 A100", "seq_len", 16384),
        ("a 32,768-token context", "seq_len", 32768),
        ("on 8 A100, global batch 1,024, seq 2048", "global_batch_size", 1024),
        ("global batch of 2,097,152 tokens, seq 2048", "global_batch_size", 1024),
        ("pretrain on 1,500 billion tokens", "dataset_tokens", 1.5e12),
        # A list stays a list: "4096,8192" has no thousands group.
        ("seq 4096, batch 64", "seq_len", 4096),
    ],
)
def test_a_number_with_thousands_separators_is_read_whole(
    text: str, field: str, value: float
) -> None:
    from tools.intake.numbers_text import number_reads

    reads, _ = number_reads(text, 2048)
    assert [r.value for r in reads if r.field == field] == [value]


@pytest.mark.parametrize(
    ("text", "quote"),
    [
        ("fine-tune llama-3-8b on 8 A100 by Friday", "by Friday"),
        ("we need it before next Monday, 8 H100", "before next Monday"),
        ("pretrain gpt2 on 4 A100, due by end of the week", "by end of the week"),
        ("fine-tune llama-3-8b on 8 A100 by tomorrow", "by tomorrow"),
        # Before, a day after "deadline" or "due on" left no trace ("deadline friday").
        ("finetuen llama 3 8b on eight h100s, deadline friday", "deadline friday"),
        ("pretrain gpt2 on 4 A100, deadline: next Monday", "deadline: next Monday"),
        ("fine-tune mistral-7b, due on Thursday, 8 H100", "due on Thursday"),
        ("sft qwen on 2 A100, the deadline is end of the month", "deadline is end of the month"),
    ],
)
def test_a_deadline_named_by_a_day_is_a_deadline_wish(text: str, quote: str) -> None:
    # Before, "by Friday" left no trace in the plan; a day is no duration, so the plan says
    # it was not checked rather than dropping it.
    from tools.intake.numbers_text import deadline_reading
    from tools.intake.sizing_text import deadline_seconds

    read = deadline_reading(text)
    assert read is not None and read.quote == quote
    assert deadline_seconds(read.quote) is None


@pytest.mark.parametrize(
    ("text", "seq_len", "tokens"),
    [
        # Before, each was listed as not understood and the plan had no token budget.
        ("continued pretraining on 300B toks", None, 300e9),
        ("train for 2 epochs on 10M examples of 512 tokens", 512, 2 * 10e6 * 512),
        ("train 3 epochs over 50k samples at 2048 tokens", 2048, 3 * 50e3 * 2048),
        ("SFT on 120k conversations of 4k tokens each", 4096, 120e3 * 4096),
    ],
)
def test_a_token_budget_in_examples_or_abbreviated_is_read(
    text: str, seq_len: int | None, tokens: float
) -> None:
    from tools.intake.account import not_understood
    from tools.intake.numbers_text import number_reads

    reads, _ = number_reads(text, 2048)
    assert [r.value for r in reads if r.field == "seq_len"] == ([seq_len] if seq_len else [])
    assert max(r.value for r in reads if r.field == "dataset_tokens") == tokens
    assert not not_understood(text, [(r.start, r.end) for r in reads])


@pytest.mark.parametrize(
    "text",
    ["a global batch of 512 sequences of 2048 tokens", "512 sequences of 2048 tokens per step"],
)
def test_a_batch_of_sequences_of_a_length_is_no_dataset(text: str) -> None:
    from tools.intake.numbers_text import number_reads

    reads, _ = number_reads(text, 2048)
    assert not [r for r in reads if r.field == "dataset_tokens"]


@pytest.mark.parametrize(
    ("text", "micro", "batch"),
    [
        # Hugging Face's argument names: before, "per_device_train_batch_size: 4" was the
        # global batch 4, silently.
        (
            "max_seq_length: 4096, per_device_train_batch_size: 4, gradient_accumulation_steps: 8",
            4,
            None,
        ),
        ("per_device_train_batch_size=2", 2, None),
        # Megatron's abbreviations: global and micro batch size.
        ("gbs 1024, mbs 2", 2, 1024),
        ("--global-batch-size 512 --micro-batch-size 1", 1, 512),
    ],
)
def test_per_device_and_abbreviated_batches_are_read_as_what_they_are(
    text: str, micro: int, batch: int | None
) -> None:
    from tools.intake.numbers_text import number_reads

    reads, _ = number_reads(text, 2048)
    assert [r.value for r in reads if r.field == "micro-batch"] == [micro]
    assert [r.value for r in reads if r.field == "global_batch_size"] == ([batch] if batch else [])


def test_token_batches_in_the_plural_are_a_batch_and_leave_the_steps_read() -> None:
    # Before, "1M token batches" was a 1M-token budget and "for 10000 steps" not understood.
    from tools.intake.numbers_text import number_reads

    reads, _ = number_reads("pretrain on 8 H100 for 10000 steps with 1M token batches", 4096)
    by = {r.field: r.value for r in reads}
    assert by["global_batch_size"] == 256 and by["train_steps"] == 10000
    assert "dataset_tokens" not in by


@pytest.mark.parametrize(
    ("text", "steps"),
    [("with 1,000 warmup steps", 1000), ("warmup of 2,000 steps", 2000), ("warmup_steps=500", 500)],
)
def test_warmup_steps_with_thousands_separators_are_read_whole(text: str, steps: int) -> None:
    # Before, "1,000 warmup steps" was listed not understood and the default warm-up planned.
    from tools.intake.optim_text import warmup_reading

    read = warmup_reading(text)
    assert read is not None and read.value == steps


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        # the 4 is per_device_train_batch_size's: before, the accumulation read 4, not 8
        ("per_device_train_batch_size=4 gradient_accumulation_steps=8", 8),
        ("per_device_train_batch_size: 4 gradient_accumulation_steps: 8", 8),
        ("micro batch 2 and 8 gradient accumulation steps", 8),
        ("gradient accumulation 16", 16),
    ],
)
def test_gradient_accumulation_is_the_number_its_own_key_gives(text: str, steps: int) -> None:
    from tools.intake.numbers_text import accumulation_reading

    read = accumulation_reading(text)
    assert read is not None and read.value == steps, read


@pytest.mark.parametrize(
    ("text", "seq_len"),
    [
        # was listed as not understood and the plan ran at 2048
        ("Can we full fine-tune llama-3-8b at 4k? If not, what's the cheapest way?", 4096),
        ("fine-tune llama-3-8b on 8 H100 at 8k tokens", 8192),
        ("fine-tune llama-3-8b on 8 H100 at 4k steps", None),
        ("fine-tune llama-3-8b on 8 H100 at $4k", None),
        ("fine-tune llama-3-8b on 8 H100 at 4k tokens/s", None),
    ],
)
def test_a_length_in_k_at_the_end_of_a_clause_is_the_sequence_length(
    text: str, seq_len: int | None
) -> None:
    from tools.intake.numbers_text import seq_reading

    read = seq_reading(text)
    assert (read.value if read else None) == seq_len, read
