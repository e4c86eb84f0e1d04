"""A request that names a second model says that only the first is planned.

Before, "fine-tune llama-3-8b or mistral-7b on 8 A100" planned llama-3-8b and listed only
"mistral- 7b on" as not understood.
"""

from __future__ import annotations

from typing import Any

import pytest

from tools.intake.account import account_request
from tools.intake.brief import brief_from_dict, request_fields

MODELS = ["llama-3-8b", "mistral-7b", "gpt2", "gpt2-medium", "llama-3-70b", "llama-3.1-8b"]


def _account(text: str) -> Any:
    fields = request_fields(text, MODELS)
    brief = brief_from_dict({k: v for k, v in fields.items() if not k.startswith("_")})
    return account_request(text, fields, brief)


@pytest.mark.parametrize(
    ("text", "other"),
    [
        ("fine-tune llama-3-8b or mistral-7b on 8 A100", "mistral-7b"),
        ("compare llama-3-8b and mistral-7b fine-tuning on 8 A100", "mistral-7b"),
    ],
)
def test_a_second_model_is_a_refused_wish_naming_the_planned_one(text: str, other: str) -> None:
    account = _account(text)
    (wish,) = [w for w in account.wishes if w.wish.startswith("other-model:")]
    assert wish.wish == f"other-model:{other}" and wish.quote == other
    assert wish.honoured is False and "llama-3-8b" in wish.how and other in wish.how
    assert not account.not_understood


@pytest.mark.parametrize(
    "text",
    [
        "fine-tune gpt2 medium on 1 A100",  # one name in two words
        "distill llama-3-70b into llama-3-8b on 8 H100",  # the teacher is the wish's own
        "fine-tune llama-3-8b on 8 A100",
    ],
)
def test_one_model_named_is_no_second_model(text: str) -> None:
    assert not [w for w in _account(text).wishes if w.wish.startswith("other-model:")]


def test_the_planned_model_named_twice_is_read_twice_and_listed_once() -> None:
    # "ppo llama-3-8b with a llama-3-8b reward model" listed "llama- 3-8b reward" as not
    # understood: only the first mention of the planned model was read.
    account = _account("ppo llama-3-8b with a llama-3-8b reward model on 8 H100")
    assert account.not_understood == []
    assert [(f.field, f.quote) for f in account.read if f.field == "model"] == [
        ("model", "llama-3-8b")
    ]
    assert not [w for w in account.wishes if w.wish.startswith(("model", "other-model"))]


@pytest.mark.parametrize(
    ("text", "quote", "unread"),
    [
        ("pretrain gpt2 124M on a single RTX 3090 for 10B tokens", "gpt2 124M", []),
        ("pretrain gpt2 (124M) on a single RTX 3090 for 10B tokens", "gpt2 (124M)", []),
        # not gpt2's size: gpt2-xl is 1.5B; the size stays listed, not read as the name
        ("pretrain gpt2 1.5B on a single RTX 3090 for 10B tokens", "gpt2", ["gpt2 1.5B on"]),
    ],
)
def test_a_size_after_the_name_is_the_names_where_it_is_the_models(
    text: str, quote: str, unread: list[str]
) -> None:
    account = _account(text)
    assert [f.quote for f in account.read if f.field == "model"] == [quote]
    assert account.not_understood == unread
