"""A run's length given as a bare step count: "20 steps", "run 500 iterations", "2k steps"."""

from __future__ import annotations

import pytest

from tools.intake.numbers_text import steps_reading


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        # Before, only "for 20 steps" was read: "20 steps" was listed as not understood and the
        # plan ran its default 1000 steps.
        ("pretrain a tiny llama on 1 GPU, 20 steps", 20),
        ("train gpt2 on 8 a100s, run 500 iterations", 500),
        ("GRPO qwen2.5-7b with 8 H100, 500 steps", 500),
        ("2k steps at seq 4096", 2000),
        ("do 1,500 iters on 4 A100", 1500),
        ("fine-tune mistral-7b, 30 steps, fp16", 30),
    ],
)
def test_a_bare_step_count_is_the_run_length(text: str, steps: int) -> None:
    read = steps_reading(text)
    assert read is not None and read.value == steps


@pytest.mark.parametrize(
    "text",
    [
        "save every 500 steps",
        "eval every 200 iterations",
        "warmup of 2000 steps",
        "warmup 100 steps",
        "2000 steps of warmup",
        "linear warm-up over the first 300 steps",
        "accumulate gradients over 4 steps",
        "8 gradient accumulation steps",
        "log every 10 steps",
    ],
)
def test_a_step_count_that_belongs_to_something_else_is_no_run_length(text: str) -> None:
    assert steps_reading(text) is None
