"""Optimizer, schedule and evaluation words are brief fields with their words, never dropped.

Before, "weight decay 0.1", "clip grad norm 1.0", "betas 0.9, 0.95", "adam eps 1e-8", "10%
warmup" and "eval every 500 steps" were listed as not understood; "no weight decay", "cosine
schedule" and "constant LR" were dropped without a word; "min lr 3e-5" became the peak rate.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tools.core.schemas import TrainingBrief
from tools.intake.account import account_request
from tools.intake.brief import brief_from_request, request_fields
from tools.intake.optim_text import optim_reads
from tools.research.model_catalog import list_models


@pytest.mark.parametrize(
    ("words", "field", "value"),
    [
        ("weight decay 0.1", "weight_decay", 0.1),
        ("wd=0.01", "weight_decay", 0.01),
        ("no weight decay", "weight_decay", 0.0),
        ("clip grad norm 1.0", "max_grad_norm", 1.0),
        ("gradient clipping 0.5", "max_grad_norm", 0.5),
        ("max_grad_norm=0.3", "max_grad_norm", 0.3),
        ("no gradient clipping", "max_grad_norm", 0.0),
        ("adam eps 1e-8", "adam_eps", 1e-8),
        ("epsilon 1e-6", "adam_eps", 1e-6),
        ("cosine schedule", "lr_schedule", "cosine"),
        ("linear decay", "lr_schedule", "linear"),
        ("constant LR", "lr_schedule", "constant"),
        ("linear warmup then cosine decay", "lr_schedule", "cosine"),
        ("min lr 3e-5", "min_lr", 3e-5),
        ("warmup ratio 3%", "warmup_ratio", 0.03),
        ("warmup_ratio=0.03", "warmup_ratio", 0.03),
        ("10% warmup", "warmup_ratio", 0.1),
        ("warmup of 10%", "warmup_ratio", 0.1),
        ("warmup 3%", "warmup_ratio", 0.03),  # was listed as not understood
        ("warmup: 5%", "warmup_ratio", 0.05),
        ("eval every 500 steps", "eval_every", 500),
        ("evaluate every 1k steps", "eval_every", 1000),
        ("on a 1% holdout", "eval_holdout", 0.01),
        ("hold out 2% for validation", "eval_holdout", 0.02),
    ],
)
def test_each_phrase_is_read_with_its_words(words: str, field: str, value: object) -> None:
    text = f"pretrain llama-3-8b on 8 H100, {words}"
    got = {r.field: r for r in optim_reads(text, "pretrain")}
    assert field in got, f"{words!r} not read"
    assert got[field].value == pytest.approx(value)
    assert got[field].quote in words


def test_betas_are_two_fields_from_one_quote() -> None:
    got = {r.field: r for r in optim_reads("betas 0.9, 0.95", "pretrain")}
    assert (got["adam_beta1"].value, got["adam_beta2"].value) == (0.9, 0.95)
    assert got["adam_beta1"].quote == got["adam_beta2"].quote == "betas 0.9, 0.95"
    alone = {r.field: r.value for r in optim_reads("adam_beta2=0.98", "finetune")}
    assert alone == {"adam_beta2": 0.98}  # beta1 stays the task's


def test_a_dpo_beta_and_a_linear_warmup_are_no_adam_words() -> None:
    assert optim_reads("DPO on llama-3-8b with beta 0.1", "finetune") == []
    assert optim_reads("with a linear warmup of 500 steps", "pretrain") == []


def test_serving_requests_read_none_of_them() -> None:
    assert optim_reads("serve llama-3-8b, weight decay 0.1, cosine schedule", "inference") == []


def test_min_lr_is_the_floor_not_the_peak() -> None:
    text = "pretrain llama-3-8b on 8 H100 for 5000 steps, lr 3e-4, min lr 3e-5, 10% warmup"
    fields = request_fields(text, list_models())
    assert (fields["learning_rate"], fields["min_lr"], fields["warmup_ratio"]) == (3e-4, 3e-5, 0.1)
    assert "warmup_steps" not in fields  # "10% warmup" is no 10-step warm-up
    only_floor = request_fields("pretrain llama-3-8b on 8 H100, min lr 3e-5", list_models())
    assert "learning_rate" not in only_floor


def test_the_account_lists_every_field_with_its_words_and_nothing_unread() -> None:
    text = (
        "pretrain llama-3-8b on 16 H100 for 5000 steps, weight decay 0.1, eval every 500 steps "
        "on a 1% holdout, clip grad norm 1.0, betas 0.9, 0.95, adam eps 1e-8, cosine schedule, "
        "min lr 3e-5, 10% warmup"
    )
    fields = request_fields(text, list_models())
    brief = brief_from_request(fields)
    account = account_request(text, fields, brief)
    read = {r.field: r.quote for r in account.read}
    assert read["weight_decay"] == "weight decay 0.1"
    assert read["max_grad_norm"] == "clip grad norm 1.0"
    assert read["adam_beta1"] == read["adam_beta2"] == "betas 0.9, 0.95"
    assert read["adam_eps"] == "adam eps 1e-8"
    assert read["lr_schedule"] == "cosine schedule"
    assert read["min_lr"] == "min lr 3e-5"
    assert read["warmup_ratio"] == "10% warmup"
    assert read["eval_every"] == "eval every 500 steps"
    assert read["eval_holdout"] == "1% holdout"
    assert "learning_rate" not in read
    assert account.not_understood == []


def test_a_brief_refuses_two_warmups_and_a_floor_above_the_peak() -> None:
    with pytest.raises(ValidationError, match="warmup_steps and warmup_ratio"):
        TrainingBrief(model="gpt2", warmup_steps=100, warmup_ratio=0.1)
    with pytest.raises(ValidationError, match="min_lr 0.001 is not below learning_rate"):
        TrainingBrief(model="gpt2", learning_rate=1e-4, min_lr=1e-3)
    with pytest.raises(ValidationError):
        TrainingBrief(model="gpt2", adam_beta2=1.0)
