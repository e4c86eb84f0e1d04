"""A follow-up the chat cannot apply says what it named and how to ask, not only "nothing I can read".

Before, "what about 3 epochs" and "what would it cost on AWS?" both got "that follow-up changes
nothing I can read", though the chat reads epochs beside a token count and prices from a
per-GPU-hour rate or an instance type (tools/intake/chat_words.py).
"""

from __future__ import annotations

import pytest

from tools.intake.chat_words import nothing_changed
from tools.intake.follow_up import follow_up_fields

BRIEF = {"model": "llama-3-8b", "hardware": "1x8xH100-80GB", "task": "lora", "seq_len": 2048}


@pytest.mark.parametrize(
    ("text", "named", "how"),
    [
        ("what about 3 epochs", "'3 epochs'", "3 epochs over 1B tokens"),
        ("and for 2 epochs?", "'2 epochs'", "2 epochs over 1B tokens"),
        ("what would it cost on AWS?", "'AWS'", "per GPU-hour"),
        ("and on Google Cloud", "'Google Cloud'", "instance type"),
        ("what about azure", "'azure'", "knowledge/gpu_prices.yaml"),
    ],
)
def test_a_follow_up_the_chat_cannot_apply_names_its_words_and_how_to_ask(
    text: str, named: str, how: str
) -> None:
    assert follow_up_fields(text, BRIEF, ["llama-3-8b"]) == {}  # nothing applied: the line says
    line = nothing_changed(text, BRIEF)
    assert named in line and how in line and "changes nothing I can read" not in line


def test_a_follow_up_with_nothing_to_read_still_says_so() -> None:
    assert "changes nothing I can read" in nothing_changed("hmm, interesting", BRIEF)
