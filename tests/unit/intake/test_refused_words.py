"""Words intake refuses in one line instead of dropping them (tools/intake/refused_words.py).

Before, "with Adafactor", "SGD with momentum", "Lion" and "Sophia" left no trace: the plan
priced and launched AdamW and said nothing.
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
    ("words", "wish", "quote"),
    [
        ("with Adafactor", "technique:optimizer-adafactor", "Adafactor"),
        ("using SGD with momentum", "technique:optimizer-sgd", "SGD with momentum"),
        ("with the Lion optimizer", "technique:optimizer-lion", "Lion optimizer"),
        ("optimizer: Sophia", "technique:optimizer-sophia", "Sophia"),
    ],
)
def test_an_optimizer_other_than_adamw_is_refused_naming_adamw(
    words: str, wish: str, quote: str
) -> None:
    account = _account(f"fine-tune llama-3-8b on 8 H100 {words}")
    (found,) = [w for w in account.wishes if w.wish == wish]
    assert found.quote == quote and found.honoured is False
    assert "not planned" in found.how and "steps AdamW" in found.how


def test_an_optimizer_the_estimate_prices_says_how() -> None:
    (found,) = _account("fine-tune llama-3-8b on 8 H100 with Adafactor").wishes
    assert "estimate --optimizer adafactor" in found.how


@pytest.mark.parametrize("words", ["no SGD", "a billion tokens", "with AdamW"])
def test_no_optimizer_wish_without_one_named(words: str) -> None:
    account = _account(f"fine-tune llama-3-8b on 8 H100 {words}")
    assert not [w for w in account.wishes if w.wish.startswith("technique:optimizer-")]


@pytest.mark.parametrize(
    ("words", "quote"),
    [
        ("for 3 epochs", "3 epochs"),
        ("epochs=3", "epochs=3"),
        ("num_train_epochs: 2", "num_train_epochs: 2"),
    ],
)
def test_epochs_without_the_data_size_are_refused_in_one_line(words: str, quote: str) -> None:
    account = _account(f"fine-tune llama-3-8b on 8 H100 {words}")
    (found,) = [w for w in account.wishes if w.wish == "technique:epochs"]
    assert found.quote == quote and found.honoured is False and "over 500M tokens" in found.how
    assert not account.not_understood


def test_epochs_given_as_a_setting_multiply_the_tokens() -> None:
    fields = request_fields("fine-tune llama-3-8b on 8 H100, epochs=3 over 500M tokens", MODELS)
    assert fields["dataset_tokens"] == 1.5e9
    account = _account("fine-tune llama-3-8b on 8 H100, epochs=3 over 500M tokens")
    assert not [w for w in account.wishes if w.wish == "technique:epochs"]


@pytest.mark.parametrize("words", ["with a 128k vocabulary", "vocab size 32000"])
def test_a_vocabulary_for_a_named_model_is_refused_in_one_line(words: str) -> None:
    account = _account(f"fine-tune llama-3-8b on 8 H100 {words}")
    (found,) = [w for w in account.wishes if w.wish == "technique:vocabulary"]
    assert found.honoured is False and "by its shape" in found.how
    assert not account.not_understood


def test_a_shape_models_vocabulary_is_read_with_the_shape() -> None:
    text = "pretrain a model with 24 layers, hidden 2048, 16 heads, vocab 32000 on 8 H100"
    account = _account(text)
    assert not [w for w in account.wishes if w.wish == "technique:vocabulary"]


@pytest.mark.parametrize(
    ("words", "quote"),
    [
        ("on spot instances", "spot instances"),
        ("using preemptible VMs", "preemptible VMs"),
        ("with spot pricing", "spot pricing"),
        ("on AWS spot", "spot"),
    ],
)
def test_spot_capacity_is_refused_naming_the_price_used(words: str, quote: str) -> None:
    # Before, "on spot instances" left no trace: the plan priced on-demand GPU-hours silently.
    account = _account(f"pretrain llama-3-8b on 8 H100 {words}")
    (found,) = [w for w in account.wishes if w.wish == "technique:spot"]
    assert found.quote == quote and found.honoured is False
    assert "on-demand" in found.how and "/GPU-hour" in found.how
    assert not [q for q in account.not_understood if "spot" in q or "preempt" in q]


def test_no_spot_wish_without_spot_words() -> None:
    assert not [w for w in _account("pretrain llama-3-8b on 8 H100").wishes if "spot" in w.wish]


@pytest.mark.parametrize(
    ("words", "quote"),
    [
        ("on the pile", "the pile"),
        ("on FineWeb-Edu", "FineWeb-Edu"),
        ("on C4", "C4"),
        ("using the OpenHermes dataset", "OpenHermes"),
        ("on imagenet-1k", "imagenet-1k"),
    ],
)
def test_a_named_public_dataset_is_said_not_fetched(words: str, quote: str) -> None:
    # Before, "train gpt2 on the pile" left no trace: the launch's DATA was unset and unsaid.
    account = _account(f"pretrain llama-3-8b on 8 H100 {words}")
    (found,) = [w for w in account.wishes if w.wish == "data:named"]
    assert found.quote == quote and found.honoured is False
    assert "DATA" in found.how and "tokens" in found.how


def test_a_named_dataset_with_its_size_is_not_asked_for_it() -> None:
    account = _account("pretrain llama-3-8b on 8 H100 on 300B tokens of the pile")
    (found,) = [w for w in account.wishes if w.wish == "data:named"]
    assert "DATA" in found.how and "size" not in found.how


def test_a_cost_wish_on_a_stated_gpu_count_is_said_honoured_by_the_fastest_setup() -> None:
    account = _account("fine-tune llama-3-8b on 2 H100, as cheaply as possible")
    (found,) = [w for w in account.wishes if w.wish == "technique:least-cost"]
    assert found.quote == "as cheaply as possible" and found.honoured is True
    assert "GPU-hours" in found.how
