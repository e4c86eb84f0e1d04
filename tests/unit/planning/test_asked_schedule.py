"""The schedule a request names (decay shape, floor, warm-up share) replaces the rule's, said."""

from __future__ import annotations

import pytest

from tools.core.schemas import TrainingBrief
from tools.planning.lr_schedule import brief_schedule
from tools.planning.optimizer_recipe import brief_recipe


def _schedule(**fields: object):  # type: ignore[no-untyped-def]
    brief = TrainingBrief(model="gpt2", task="pretrain", **fields)  # type: ignore[arg-type]
    return brief_schedule(brief, 1e8, 1e6, 1000)


def test_the_rule_is_unchanged_without_the_words() -> None:
    schedule = _schedule()
    assert (schedule.decay, schedule.warmup_steps, schedule.min_lr_ratio) == ("cosine", 30, 0.1)
    assert schedule.note().endswith("(10% of the peak, Llama 2)")


def test_linear_decay_ends_at_the_asked_floor() -> None:
    schedule = _schedule(lr_schedule="linear", min_lr=1e-5, warmup_ratio=0.1)
    assert schedule.warmup_steps == 100 and schedule.min_lr == 1e-5
    assert schedule.lr_at(100) == pytest.approx(schedule.peak_lr)
    assert schedule.lr_at(550) == pytest.approx((schedule.peak_lr + 1e-5) / 2)
    assert schedule.lr_at(1000) == pytest.approx(1e-5)
    assert "the request's 10% of the run; the rule gives 30" in schedule.note()
    assert "linear decay to 1e-05" in schedule.note()


def test_a_constant_rate_says_why_a_floor_is_not_applied() -> None:
    schedule = _schedule(lr_schedule="constant", min_lr=1e-5)
    assert schedule.lr_at(999) == schedule.peak_lr and schedule.min_lr_ratio == 0
    assert "min lr 1e-05 not applied: a constant rate does not decay" in schedule.note()
    above = _schedule(min_lr=0.5)  # above the rule's peak: nothing to decay
    assert above.decay == "constant" and "is not below the peak" in above.note()


def test_the_recipe_takes_the_asked_values_over_the_task() -> None:
    asked = TrainingBrief(model="gpt2", task="finetune", adam_beta2=0.95, max_grad_norm=0.0)
    recipe = brief_recipe(asked)
    assert recipe.betas == [0.9, 0.95] and recipe.max_grad_norm == 0.0
    assert recipe.weight_decay == 0.0 and recipe.eps == 1e-8  # the task's
    assert set(recipe.asked) == {"adam_beta2", "max_grad_norm"}
