"""The plan's learning-rate schedule, scaled to the smoke run's few steps.

A plan's schedule is sized for its whole run (warm-up over thousands of steps, decay over the
run); the smoke run keeps its kind and its shape and rescales its lengths to the smoke steps
(the warm-up keeps its share of the run, at least one step), so the emitted ``scheduler``
section, or the launch command's ``--lr-schedule``, is what the smoke run executes: a broken one
fails it. The peak rate stays the smoke rate (ds_adapt.py ``smoke_lr``): the plan's is sized for
the full model and would show no learning on the scaled one within the smoke steps.
"""

from __future__ import annotations

import copy
from typing import Any

from tools.planning.lr_schedule import WARMUP_SHARE

# Warm-up share of a run whose total length the plan does not give (an older plan's WarmupLR):
# the planner's own rule for the job (tools/planning/lr_schedule.py, 3% of the run).
_UNKNOWN_TOTAL_WARMUP_SHARE = WARMUP_SHARE
# DeepSpeed scheduler parameters that are a number of steps (deepspeed/runtime/lr_schedules.py).
_STEP_KEYS = ("warmup_num_steps", "total_num_steps", "cycle_first_step_size", "decay_step_size")
# The parameter that is each scheduler's peak rate (DeepSpeed's default where it is left out:
# 0.001 for the warm-up schedules); WarmupCosineLR peaks at the optimizer's rate.
_PEAK_KEY = {
    "WarmupLR": "warmup_max_lr",
    "WarmupDecayLR": "warmup_max_lr",
    "OneCycle": "cycle_max_lr",
}


def scaled_warmup(warmup: int, total: int | None, steps: int) -> int:
    """The warm-up of a ``steps``-step run with the plan's ``warmup`` of ``total`` steps.

    The share of the run is kept (``total`` unknown: a tenth of the run); at least one step
    when the plan warms up at all, and never the whole run.
    """
    if warmup <= 0:
        return 0
    share = warmup / total if total else _UNKNOWN_TOTAL_WARMUP_SHARE
    return max(1, min(steps - 1, round(min(1.0, share) * steps)))


def scale_ds_scheduler(
    scheduler: dict[str, Any], steps: int, lr: float
) -> tuple[dict[str, Any], str]:
    """The plan's DeepSpeed ``scheduler`` section for a ``steps``-step smoke run, and a note.

    Its type and other parameters are kept as emitted (DeepSpeed validates them when the run
    starts); the step counts are rescaled and the peak rate becomes ``lr``.
    """
    section = copy.deepcopy(scheduler)
    params = section.get("params")
    kind = str(section.get("type", "?"))
    if not isinstance(params, dict):
        return section, f"plan's scheduler {kind} (no params)"
    total = params.get("total_num_steps")
    total = int(total) if isinstance(total, (int, float)) and total > 0 else None
    changes: list[str] = []
    warmup = params.get("warmup_num_steps")
    if isinstance(warmup, (int, float)):
        new = scaled_warmup(int(warmup), total, steps)
        params["warmup_num_steps"] = new
        changes.append(f"warmup {int(warmup)} -> {new} steps")
    if total is not None:
        params["total_num_steps"] = steps
        changes.append(f"decay over {total} -> {steps} steps")
    for key in _STEP_KEYS[2:]:
        value = params.get(key)
        if isinstance(value, (int, float)) and value > 0 and total:
            params[key] = max(1, round(value * steps / total))
            changes.append(f"{key} {value:g} -> {params[key]}")
    peak = _PEAK_KEY.get(kind)
    if peak is not None:
        changes.append(f"peak lr {params.get(peak, 'default')} -> {lr:g}")
        params[peak] = lr
    elif kind == "WarmupCosineLR":
        # It peaks at the optimizer's rate, which the smoke run sets to ``lr`` (ds_adapt.py).
        changes.append(f"peak lr (the optimizer's) -> {lr:g}")
    return section, f"plan's scheduler {kind}: " + ", ".join(changes or ["as emitted"])


def plan_torchrun_schedule(command: list[str], steps: int) -> tuple[list[str], str] | None:
    """train.py's schedule arguments in the plan's launch ``command``, scaled to ``steps``.

    None when the command sets no ``--lr-schedule`` (then the smoke run's rate is constant).
    """
    values = _flag_values(command, ("--lr-schedule", "--warmup-steps", "--steps", "--min-lr-ratio"))
    kind = values.get("--lr-schedule")
    # The decay's floor is a share of the peak: the same at any length.
    floor = ["--min-lr-ratio", values["--min-lr-ratio"]] if "--min-lr-ratio" in values else []
    if kind is None:
        return None
    try:
        warmup = int(values.get("--warmup-steps", "0"))
        total = int(values["--steps"]) if "--steps" in values else None
    except ValueError:
        # The plan's flags as they are: train.py rejects them and the smoke run fails.
        as_emitted = ["--lr-schedule", kind, "--warmup-steps", values.get("--warmup-steps", "0")]
        return [*as_emitted, *floor], f"plan's schedule {kind} as emitted"
    new = scaled_warmup(warmup, total, steps)
    note = f"plan's schedule {kind}: warmup {warmup} -> {new} steps"
    if total is not None:
        note += f", decay over {total} -> {steps} steps"
    if floor:
        note += f", down to {floor[1]} x the peak"
    return ["--lr-schedule", kind, "--warmup-steps", str(new), *floor], note


# train.py's AdamW flags (tools/artifacts/recipe_launch.py recipe_args) and their value counts.
_RECIPE_FLAGS = {"--weight-decay": 1, "--max-grad-norm": 1, "--adam-eps": 1, "--adam-betas": 2}


def plan_recipe_flags(command: list[str]) -> list[str]:
    """The plan's AdamW flags in its launch ``command``, as given: the smoke run steps the same.

    Weight decay, clipping, betas and eps mean the same at any length, so they are not scaled;
    a value train.py refuses fails the smoke run, as it would the job.
    """
    flags: list[str] = []
    for i, word in enumerate(command):
        if count := _RECIPE_FLAGS.get(word):
            flags += command[i : i + 1 + count]
    return flags


def _flag_values(command: list[str], flags: tuple[str, ...]) -> dict[str, str]:
    """The last value each of ``flags`` has in ``command`` (``--flag value`` or ``--flag=value``)."""
    found: dict[str, str] = {}
    for i, word in enumerate(command):
        name, eq, value = word.partition("=")
        if name in flags:
            if eq:
                found[name] = value
            elif i + 1 < len(command):
                found[name] = command[i + 1]
    return found
