"""Numbers written in words are read like digits, and quoted as written.

Before, "pretrain llama-3.2-1b from scratch, twenty billion tokens, sixteen H100s, seq len four
thousand ninety six" read the GPUs only: the 20B tokens and the sequence length were dropped
without a word (the not-understood list looks at digits alone), and the plan ran 1000 steps
at 2048.
"""

from __future__ import annotations

from tools.intake.account import account_request
from tools.intake.brief import brief_from_dict, request_fields

TEXT = (
    "pretrain llama-3.2-1b from scratch, twenty billion tokens, sixteen H100s, seq len four "
    "thousand ninety six, five hundred warmup steps"
)


def test_number_words_are_read_and_quoted_as_written() -> None:
    fields = request_fields(TEXT, ["llama-3.2-1b"])
    assert fields["dataset_tokens"] == 20e9 and fields["seq_len"] == 4096
    assert fields["warmup_steps"] == 500
    assert fields["goal"] == TEXT
    brief = brief_from_dict({k: v for k, v in fields.items() if not k.startswith("_")})
    account = account_request(TEXT, fields, brief)
    quotes = {f.field: f.quote for f in account.read}
    assert quotes["dataset_tokens"] == "twenty billion tokens"
    assert quotes["seq_len"] == "seq len four thousand ninety six"
    assert account.not_understood == []


def test_number_words_no_reader_binds_are_listed_as_written() -> None:
    text = "fine-tune llama-3.2-1b on 8 H100 with a patience of three hundred"
    fields = request_fields(text, ["llama-3.2-1b"])
    brief = brief_from_dict({k: v for k, v in fields.items() if not k.startswith("_")})
    assert account_request(text, fields, brief).not_understood == ["of three hundred"]


def test_the_letter_k_said_aloud_is_a_thousand_and_quoted_as_said() -> None:
    """ "a context of four kay tokens" was read as a sequence length of 4."""
    text = "fine-tune llama-3.2-1b on 8 H100 with a context of four kay tokens"
    fields = request_fields(text, ["llama-3.2-1b"])
    assert fields["seq_len"] == 4096
    brief = brief_from_dict({k: v for k, v in fields.items() if not k.startswith("_")})
    quotes = {f.field: f.quote for f in account_request(text, fields, brief).read}
    assert quotes["seq_len"] == "context of four kay"
    assert (
        request_fields("fine-tune llama-3.2-1b on 8 H100, 2 kay context", ["llama-3.2-1b"])[
            "seq_len"
        ]
        == 2048
    )
