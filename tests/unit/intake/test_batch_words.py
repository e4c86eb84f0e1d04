"""A bare batch size ("bs=32", "bsz 64") is the global batch, and "I assumed" says so.

Before, "bs=32" and "bsz 64" were listed as not understood (tools/intake/batch_words.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tools.intake.account import account_request
from tools.intake.brief import brief_from_dict, request_fields

MODELS = ["llama-3-8b"]


def _account(text: str) -> Any:
    fields = request_fields(text, MODELS)
    brief = brief_from_dict({k: v for k, v in fields.items() if not k.startswith("_")})
    return brief, account_request(text, fields, brief)


@pytest.mark.parametrize(("words", "batch"), [("bs=32", 32), ("bsz 64", 64), ("batch size 32", 32)])
def test_a_bare_batch_size_is_the_global_batch_said_as_assumed(words: str, batch: int) -> None:
    brief, account = _account(f"fine-tune llama-3-8b on 8 H100, {words}")
    assert brief.global_batch_size == batch
    (assumed,) = [a for a in account.assumed if a.field == "global_batch_size"]
    assert assumed.value == batch and "global batch" in assumed.why and "per GPU" in assumed.why
    assert not account.not_understood


@pytest.mark.parametrize("words", ["global batch 512", "batch 4 per GPU", "mbs=4"])
def test_a_batch_that_says_which_is_not_assumed(words: str) -> None:
    _, account = _account(f"fine-tune llama-3-8b on 8 H100, {words}")
    assert not [a for a in account.assumed if a.field == "global_batch_size" and "read as" in a.why]


@pytest.mark.parametrize("words", ["bs 4 per GPU", "bsz=4 per device"])
def test_bs_per_gpu_is_the_micro_batch(words: str) -> None:
    brief, account = _account(f"fine-tune llama-3-8b on 8 H100, {words}")
    assert brief.pins.micro_batch == 4
    assert not [a for a in account.assumed if "read as the global batch" in a.why]
