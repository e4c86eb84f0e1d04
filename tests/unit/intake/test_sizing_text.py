"""A sizing question in words: what asks it, and the deadline, budget and limits it states."""

from __future__ import annotations

import pytest

from tools.intake.sizing_text import budget_dollars, deadline_seconds, sizing_question

DAY = 86_400.0


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("how many A100 40GB do I need to fully fine-tune llama-2-13b", "how many"),
        ("which GPUs should I use to fine-tune llama-3-8b", "which GPUs"),
        ("what do I need to pretrain a 1B llama", "what do I need"),
        ("cheapest way to pretrain a 1B llama on 1T tokens", "cheapest"),
        # Before, these asked nothing and were dropped without a word.
        ("pretrain a 1.3B gpt on 40B tokens as cheap as possible", "as cheap as possible"),
        ("fine-tune llama-3-8b on 2B tokens, minimize cost", "minimize cost"),
        ("pretrain a 1B llama on 1T tokens at the lowest possible cost", "lowest possible cost"),
        ("我需要多少张H100来微调llama-2-70b", "需要多少"),
        ("pretrain a 1B llama on 1T tokens within 30 days", "within 30 days"),
    ],
)
def test_asking_words_make_a_sizing_question(text: str, words: str) -> None:
    ask = sizing_question(text, count_given=False)
    assert ask is not None and ask.words == words


def test_a_plan_for_hardware_one_has_is_not_a_sizing_question() -> None:
    assert sizing_question("fine-tune llama-3-8b on 8 A100", count_given=True) is None
    # A deadline on stated hardware is a wish about that plan, not a sizing question ...
    assert sizing_question("fine-tune llama-3-8b on 8 A100 in 2 weeks", count_given=True) is None
    # ... but asking words still ask, whatever the text says about hardware.
    assert sizing_question("fine-tune llama-3-8b: how many A100", count_given=True) is not None
    assert sizing_question("fine-tune llama-3-8b", count_given=False) is None


def test_deadlines_read_as_seconds() -> None:
    assert deadline_seconds("within 30 days") == 30 * DAY
    assert deadline_seconds("in 2 weeks") == 14 * DAY
    assert deadline_seconds("in 6 hours") == 6 * 3600
    assert deadline_seconds("in 3 months") == 90 * DAY
    assert deadline_seconds("三十天内") == 30 * DAY
    assert deadline_seconds("3天内训完") == 3 * DAY
    assert deadline_seconds("soon") is None


def test_budgets_read_in_us_dollars_only() -> None:
    assert budget_dollars("$5,000") == 5000
    assert budget_dollars("$50k") == 50_000
    assert budget_dollars("$1.5 million") == 1_500_000
    assert budget_dollars("20000 USD") == 20_000
    assert budget_dollars("5000 EUR") is None
    ask = sizing_question("which GPUs for llama-3-8b, budget 5000 EUR", count_given=False)
    assert ask is not None and ask.budget_usd is None
    assert any("5000 EUR" in n and "not in US dollars" in n for n in ask.notes)


def test_limits_in_the_words() -> None:
    text = "fine-tune llama-3-8b on one node, at most 4 GPUs, how many H100 within 10 days for $2k"
    ask = sizing_question(text, count_given=False)
    assert ask is not None
    assert ask.one_node and ask.max_gpus == 4
    assert ask.deadline_s == 10 * DAY and ask.budget_usd == 2000
    assert {r.value for r in ask.reads} >= {"one node", "at most 4 GPUs"}


def test_a_deadline_by_day_alone_asks_no_sizing_question() -> None:
    # "by Friday" names no duration: the sizing could not use it, so the request keeps its
    # hardware reading (this machine) and the deadline stays a wish the plan says it could not check.
    from tools.intake.sizing_text import sizing_question

    assert sizing_question("fine-tune llama-3-8b by Friday", count_given=False) is None
    assert sizing_question("fine-tune llama-3-8b within 3 days", count_given=False) is not None


@pytest.mark.parametrize(
    ("text", "quote", "seconds"),
    [
        # Before, "a week" was no number: the deadline was dropped without a word.
        ("continued pretraining on 16 L4, finish in under a week", "in under a week", 7 * DAY),
        ("fine-tune llama-3-8b on 8 A100 within a day", "within a day", DAY),
        ("pretrain gpt2 on 4 A100, done in a month", "in a month", 30 * DAY),
        ("pretrain gpt2 on 4 A100 in less than an hour", "in less than an hour", 3600.0),
    ],
)
def test_a_deadline_of_one_unit_in_words_is_read(text: str, quote: str, seconds: float) -> None:
    from tools.intake.numbers_text import deadline_reading

    read = deadline_reading(text)
    assert read is not None and read.quote == quote
    assert deadline_seconds(read.quote) == seconds


def test_a_cost_wish_on_a_stated_gpu_count_keeps_the_count() -> None:
    # "as cheaply as possible" beside "2 H100" planned the sizing's pick (8 H100): another job.
    text = "fine-tune gemma-2-9b on 2 H100, as cheaply as possible"
    assert sizing_question(text, count_given=True) is None
    assert sizing_question("fine-tune gemma-2-9b as cheap as possible", count_given=False)
