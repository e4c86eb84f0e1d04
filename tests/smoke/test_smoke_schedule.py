"""The smoke run executes the plan's own learning-rate schedule, scaled to its steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from specs import GPT2_TINY, tiny_spec
from test_smoke import plan_ds_config

from tools.core.settings import Settings
from tools.smoke import DeepSpeedRun, SmokeSpec, TorchrunRun, run_smoke_test
from tools.smoke.ds_adapt import adapt_ds_config
from tools.smoke.schedule import plan_torchrun_schedule, scale_ds_scheduler, scaled_warmup

STEPS = 30


def _lrs(run_dir: str | None) -> list[float]:
    rows = (Path(run_dir or "") / "metrics" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(row)["lr"] for row in rows]


@pytest.mark.parametrize(
    ("warmup", "total", "expected"),
    [
        # No total (an older plan's WarmupLR): the planner's 3% of the run.
        (2000, None, 1),
        (100, 1000, 3),
        (500, 10_000, 2),
        (0, 1000, 0),
        (1, 10**6, 1),
        (5000, 1000, 29),
    ],
)
def test_warmup_keeps_its_share_of_the_run(warmup: int, total: int | None, expected: int) -> None:
    assert scaled_warmup(warmup, total, STEPS) == expected


def test_deepspeed_scheduler_is_rescaled_not_replaced() -> None:
    plan = {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": 0.0,
            "warmup_max_lr": 3e-4,
            "warmup_num_steps": 500,
            "total_num_steps": 10_000,
            "warmup_type": "linear",
        },
    }
    section, note = scale_ds_scheduler(plan, STEPS, 3e-3)
    assert section == {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": 0.0,
            "warmup_max_lr": 3e-3,
            "warmup_num_steps": 2,
            "total_num_steps": STEPS,
            "warmup_type": "linear",
        },
    }
    assert plan["params"]["warmup_num_steps"] == 500  # the plan's own section is untouched
    assert note == (
        "plan's scheduler WarmupDecayLR: warmup 500 -> 2 steps, decay over 10000 -> 30 steps, "
        "peak lr 0.0003 -> 0.003"
    )


def test_adapted_config_keeps_the_scheduler_only_when_told_the_steps() -> None:
    with_steps, notes = adapt_ds_config(
        plan_ds_config(2), device="cpu", ranks=2, micro_batch_size=1, steps=STEPS
    )
    assert with_steps["scheduler"]["params"]["warmup_num_steps"] == 1
    assert "plan's scheduler WarmupLR: warmup 100 -> 1 steps, peak lr default -> 0.003" in notes
    without, notes = adapt_ds_config(plan_ds_config(2), device="cpu", ranks=2, micro_batch_size=1)
    assert "scheduler" not in without
    assert any(note.endswith("(dropped scheduler)") for note in notes)


def test_torchrun_schedule_comes_from_the_plan_command() -> None:
    command = ["torchrun", "--nproc_per_node", "8", "train.py", "--steps", "1000"]
    command += ["--lr-schedule", "cosine", "--warmup-steps", "100", "--fsdp"]
    assert plan_torchrun_schedule(command, STEPS) == (
        ["--lr-schedule", "cosine", "--warmup-steps", "3"],
        "plan's schedule cosine: warmup 100 -> 3 steps, decay over 1000 -> 30 steps",
    )
    floored = plan_torchrun_schedule([*command, "--min-lr-ratio", "0.1"], STEPS)
    assert floored is not None and floored[0][-2:] == ["--min-lr-ratio", "0.1"]
    assert floored[1].endswith("down to 0.1 x the peak")
    assert plan_torchrun_schedule(["torchrun", "train.py", "--steps", "10"], STEPS) is None


def _warmup_then_decay(lrs: list[float], warmup: int, peak: float) -> None:
    assert len(lrs) == STEPS
    assert lrs[:warmup] == sorted(lrs[:warmup]) and lrs[0] < peak
    assert max(lrs) == pytest.approx(peak, rel=1e-6)
    assert lrs[warmup:] == sorted(lrs[warmup:], reverse=True)
    assert lrs[-1] < 0.2 * peak


@pytest.mark.slow
def test_deepspeed_smoke_runs_the_plans_warmup_decay(settings: Settings) -> None:
    config: dict[str, Any] = plan_ds_config(2)
    config["scheduler"] = {
        "type": "WarmupDecayLR",
        "params": {"warmup_max_lr": 2e-5, "warmup_num_steps": 500, "total_num_steps": 5000},
    }
    spec = SmokeSpec(mode=DeepSpeedRun(config), steps=STEPS)
    result = run_smoke_test(tiny_spec(GPT2_TINY), spec, settings)
    assert result.status == "passed", result.reason
    assert "plan's scheduler WarmupDecayLR: warmup 500 -> 3 steps" in result.reason
    ran = json.loads((Path(result.run_dir or "") / "ds_config.json").read_text())
    assert ran["scheduler"]["params"]["total_num_steps"] == STEPS
    lr = ran["scheduler"]["params"]["warmup_max_lr"]
    _warmup_then_decay(_lrs(result.run_dir), 3, lr)


@pytest.mark.slow
def test_a_broken_scheduler_section_fails_the_smoke_run(settings: Settings) -> None:
    config = plan_ds_config(2)
    config["scheduler"] = {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}
    # WarmupDecayLR needs total_num_steps: DeepSpeed refuses it when the engine starts.
    spec = SmokeSpec(mode=DeepSpeedRun(config), steps=STEPS)
    result = run_smoke_test(tiny_spec(GPT2_TINY), spec, settings)
    assert result.status == "failed" and result.failure_kind == "crash"
    assert result.reason.startswith("crash"), result.reason
    assert "total_num_steps" in result.reason, result.reason


@pytest.mark.slow
def test_torchrun_smoke_runs_the_plans_cosine_schedule(settings: Settings) -> None:
    command = ["torchrun", "train.py", "--steps", "2000", "--lr-schedule", "cosine"]
    command += ["--warmup-steps", "200"]
    spec = SmokeSpec(mode=TorchrunRun(plan_command=tuple(command)), steps=STEPS)
    result = run_smoke_test(tiny_spec(GPT2_TINY), spec, settings)
    assert result.status == "passed", result.reason
    assert "plan's schedule cosine: warmup 200 -> 3 steps" in result.reason
    lrs = _lrs(result.run_dir)
    _warmup_then_decay(lrs, 3, max(lrs))
