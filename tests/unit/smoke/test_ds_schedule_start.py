"""train.py's DeepSpeed mode warms up from the first step, as its torch modes do.

DeepSpeed's warm-up schedulers are built at iteration -1 (rate 0) and the engine steps them
after each optimizer step, so a plan's launch.sh under DeepSpeed ran its first two steps at
learning rate 0 (`step 1/4 loss 4.8341 lr 0`, `step 2/4 ... lr 0`, `step 3/4 ... lr 6.67e-07`
where the DDP plan's step 1 logs 6.67e-07) and reached the peak two steps after the plan says.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import torch
from job_deepspeed import start_schedule
from job_torch import schedule_factor

PEAK = 2e-5
STEPS = 100
WARMUP = 10
# As tools/artifacts/deepspeed_config.py writes them: WarmupCosineLR for fine-tuning and
# pretraining, WarmupLR and WarmupDecayLR from older plans and the smoke run's configs.
SCHEDULERS: dict[str, dict[str, Any]] = {
    "WarmupCosineLR": {
        "total_num_steps": STEPS,
        "warmup_min_ratio": 0.0,
        "warmup_num_steps": WARMUP,
        "cos_min_ratio": 0.0,
        "warmup_type": "linear",
    },
    "WarmupDecayLR": {
        "total_num_steps": STEPS,
        "warmup_min_lr": 0.0,
        "warmup_max_lr": PEAK,
        "warmup_num_steps": WARMUP,
        "warmup_type": "linear",
    },
    "WarmupLR": {
        "warmup_min_lr": 0.0,
        "warmup_max_lr": PEAK,
        "warmup_num_steps": WARMUP,
        "warmup_type": "linear",
    },
}


def _scheduler(kind: str) -> tuple[Any, torch.optim.Optimizer]:
    from deepspeed.runtime import lr_schedules

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    return getattr(lr_schedules, kind)(optimizer, **SCHEDULERS[kind]), optimizer


def _rates(scheduler: Any, optimizer: torch.optim.Optimizer, steps: int) -> list[float]:
    """The rate of each optimizer step, the scheduler stepped after each as the engine does."""
    rates = []
    for _ in range(steps):
        rates.append(float(optimizer.param_groups[0]["lr"]))
        scheduler.step()
    return rates


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_the_first_step_trains_at_the_warm_ups_first_rate(kind: str) -> None:
    scheduler, optimizer = _scheduler(kind)
    assert _rates(scheduler, optimizer, 2) == [0.0, 0.0]  # DeepSpeed as built: two idle steps

    scheduler, optimizer = _scheduler(kind)
    start_schedule(scheduler)
    rates = _rates(scheduler, optimizer, WARMUP)
    torch_args = argparse.Namespace(warmup_steps=WARMUP, steps=STEPS, lr_schedule="cosine")
    torch_args.min_lr_ratio = 0.0
    expected = [PEAK * schedule_factor(torch_args, s) for s in range(WARMUP)]
    # The warm-up's steps as train.py's; at step WARMUP DeepSpeed's cosine has begun (one step
    # of STEPS - WARMUP in, 0.03% below the peak) where train.py is at the peak.
    assert rates[:-1] == pytest.approx(expected[:-1], rel=1e-9)
    assert rates[0] > 0 and rates[-1] == pytest.approx(PEAK, rel=1e-3)


def test_a_resumed_schedule_is_left_where_the_checkpoint_put_it() -> None:
    scheduler, optimizer = _scheduler("WarmupCosineLR")
    scheduler.step(5)  # as load_checkpoint restores it
    start_schedule(scheduler)
    assert scheduler.last_batch_iteration == 5
    assert optimizer.param_groups[0]["lr"] == pytest.approx(PEAK * 5 / WARMUP)
