"""A smoke run shorter than the sequence asked says so (tools/smoke/runner.py).

Before, a run scaled to 64 tokens said nothing of the 2,048 asked.
"""

from __future__ import annotations

from tools.research.model_catalog import lookup_model
from tools.smoke.runner import scaled_sequence_note
from tools.smoke.spec import SmokeSpec


def test_a_run_shorter_than_asked_says_so() -> None:
    model = lookup_model("gpt2", 1024)
    assert scaled_sequence_note(SmokeSpec(seq_len=1024), model, {"seq_len": 1024}) == []
    (line,) = scaled_sequence_note(SmokeSpec(seq_len=1024), model, {"seq_len": 64})
    assert line.startswith("sequence length 64, not the 1,024 asked")
