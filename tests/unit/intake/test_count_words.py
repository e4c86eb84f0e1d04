"""GPU and node counts written out in words of more than one part: "two hundred fifty six H100s".

Before, only the last word was a count: "two hundred fifty six H100s" planned 6 H100 and the
rest of the number was dropped without a word.
"""

from __future__ import annotations

import pytest

from tools.intake.count_words import normalise
from tools.intake.hardware_text import hardware_fields
from tools.intake.spelt_text import spelt_numbers


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("pretrain llama-3.2-1b on two hundred fifty six H100s", "32x8xH100-80GB"),
        ("pretrain on two hundred and fifty-six H100s", "32x8xH100-80GB"),
        ("train on one hundred twenty-eight A100 80GB", "16x8xA100-80GB"),
        ("fine-tune on forty eight H100s", "6x8xH100-80GB"),
        ("fine-tune on twenty-four L40S", "3x8xL40S"),
        ("pretrain on a thousand twenty four H100", "128x8xH100-80GB"),
    ],
)
def test_a_count_in_several_words_is_the_whole_number(text: str, spec: str) -> None:
    assert hardware_fields(text)["hardware"] == spec


@pytest.mark.parametrize(
    ("text", "digits"),
    [
        ("two hundred fifty six H100s", "256 H100s"),
        ("thirty two gpus", "32 gpus"),
        ("eleven nodes", "11 nodes"),
        ("one thousand and twenty-four gpus", "1024 gpus"),
        ("eight H100", "8 H100"),
        ("a single A100", "1 A100"),
        # Not a count of GPUs: left as written.
        ("two hundred thousand examples", "two hundred thousand examples"),
    ],
)
def test_count_words_become_digits(text: str, digits: str) -> None:
    assert normalise(text) == digits


@pytest.mark.parametrize(
    ("text", "spelt"),
    [
        ("twenty billion tokens", "20     billion tokens"),
        ("seq len four thousand ninety six", "seq len 4096                    "),
        ("do five hundred steps of warmup", "do 500          steps of warmup"),
        ("ZeRO stage three", "ZeRO stage 3    "),
        # "one" alone is too often no number ("the one we use"); "zero" is ZeRO's name.
        ("the one we use, zero-3", "the one we use, zero-3"),
    ],
)
def test_number_words_become_digits_in_place(text: str, spelt: str) -> None:
    assert spelt_numbers(text) == spelt and len(spelt_numbers(text)) == len(text)
