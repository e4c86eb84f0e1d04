"""A training stack trainwright writes no launch files for is refused out loud, never dropped.

Before, "in JAX", "with PyTorch Lightning", "with Ray Train" and "with ColossalAI" left no
trace: the plan ran on DeepSpeed or FSDP and the request's accounting said nothing.
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
    return account_request(text, fields, brief)


@pytest.mark.parametrize(
    ("text", "wish", "quote"),
    [
        ("fine-tune llama-3-8b on 8 A100 in JAX", "unoffered:jax", "JAX"),
        ("fine-tune llama-3-8b on 8 A100 with Flax", "unoffered:jax", "Flax"),
        (
            "fine-tune llama-3-8b on 8 A100 with PyTorch Lightning",
            "unoffered:lightning",
            "PyTorch Lightning",
        ),
        ("fine-tune llama-3-8b on 8 A100 with Ray Train", "unoffered:ray-train", "Ray Train"),
        ("fine-tune llama-3-8b on 8 A100 with ColossalAI", "unoffered:colossalai", "ColossalAI"),
    ],
)
def test_an_unoffered_stack_is_a_refused_wish_with_its_words(
    text: str, wish: str, quote: str
) -> None:
    account = _account(text)
    (found,) = [w for w in account.wishes if w.wish == wish]
    assert found.quote == quote and found.honoured is False
    assert found.how.startswith("not offered:") and "DeepSpeed" in found.how


def test_a_refused_unoffered_stack_is_kept() -> None:
    account = _account("fine-tune llama-3-8b on 8 A100, no JAX")
    (found,) = [w for w in account.wishes if w.wish == "avoid:jax"]
    assert found.honoured is True


def test_a_word_that_only_contains_the_name_is_no_wish() -> None:
    account = _account("fine-tune llama-3-8b on 8 A100 with an x-ray dataset, lightning fast")
    assert not [w for w in account.wishes if w.wish.startswith(("unoffered:", "avoid:"))]
