"""A run's length given in optimizer steps becomes the tokens it trains, said; never both."""

from __future__ import annotations

import pytest

from tools.core.errors import InputError
from tools.intake.brief import brief_from_dict
from tools.planning.batch import resolve_steps


def test_steps_become_the_runs_tokens_with_the_line() -> None:
    brief = brief_from_dict(
        {"model": "llama-3.1-8b", "train_steps": 5000, "global_batch_size": 32, "seq_len": 4096}
    )
    settled, note = resolve_steps(brief)
    assert settled.dataset_tokens == 5000 * 32 * 4096 and settled.train_steps is None
    assert (
        note
        == "dataset_tokens 655,360,000: the request's 5000 optimizer steps x 32 sequences x 4096 tokens"
    )
    assert resolve_steps(settled) == (settled, None)  # settled once


def test_a_brief_without_steps_is_left_as_it_is() -> None:
    brief = brief_from_dict({"model": "llama-3.1-8b", "global_batch_size": 32})
    assert resolve_steps(brief) == (brief, None)


def test_steps_and_tokens_together_are_one_line() -> None:
    with pytest.raises(InputError) as err:
        brief_from_dict({"model": "llama-3.1-8b", "train_steps": 10, "dataset_tokens": 1e9})
    assert "train_steps and dataset_tokens both set the run's length" in str(err.value)
    assert "\n" not in str(err.value)
