"""The run every launcher writes: its steps, batch layout and learning-rate schedule, and notes.

``emit_launch`` (tools/artifacts/launch.py) sizes one run and hands it to the launcher rows: the
steps (the engineer's, else the brief's dataset tokens over the tokens per step, else the
default run, said in the notes), the batch layout (tools/planning/batch_layout.py) and the
schedule over those steps (tools/planning/lr_schedule.py). A DeepSpeed config emitted for
another length gets its schedule resized to the run (``with_run_steps``), so ds_config.json,
Megatron's flags, torchtitan.toml and train.py's arguments all describe the same run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.artifacts.deepspeed_config import planned_total_steps, run_schedule, with_run_steps
from tools.core.schemas import TRAINING_TASKS, HardwareSpec, MemoryPlan, ModelSpec, TrainingBrief
from tools.planning.batch_layout import BatchLayout
from tools.planning.lr_schedule import DEFAULT_RUN_STEPS, LrSchedule, asked_warmup


@dataclass(frozen=True)
class RunShape:
    """The launched run: optimizer steps, batch layout, schedule, and what the plan notes."""

    steps: int
    layout: BatchLayout
    schedule: LrSchedule
    notes: tuple[str, ...]


def run_steps(
    brief: TrainingBrief, steps: int | None, config: dict[str, Any] | None = None
) -> tuple[int, str]:
    """The run's optimizer steps and where they come from.

    The engineer's ``steps``, else the length the DeepSpeed config's schedule was emitted for,
    else the brief's dataset tokens over the tokens per step, else the default run.
    """
    if steps is not None:
        return steps, f"{steps} optimizer steps, as the launch was asked for"
    emitted = ((config or {}).get("scheduler") or {}).get("params", {}).get("total_num_steps")
    if isinstance(emitted, int) and emitted > 0:
        return emitted, f"{emitted} optimizer steps, the length ds_config.json's schedule spans"
    planned = planned_total_steps(brief)
    if planned is not None:
        return planned, (
            f"{planned} optimizer steps: the request's {brief.dataset_tokens:.3g} tokens over "
            f"{brief.batch} x {brief.seq_len} tokens per step"
        )
    return DEFAULT_RUN_STEPS, (
        f"{DEFAULT_RUN_STEPS} optimizer steps: the default run, as the request gives no dataset "
        "size (dataset_tokens); the schedule is sized for these steps, so re-plan with the real "
        "length rather than only passing --steps to launch.sh"
    )


def layout_of(
    memory: MemoryPlan | None, hardware: HardwareSpec, config: dict[str, Any] | None
) -> tuple[BatchLayout, str | None]:
    """The plan's batch layout: the memory plan's split, else the config's, else one per rank.

    Without either (a launch written with no memory plan), every rank runs one sequence per
    step, and the note says so.
    """
    if memory is not None:
        return BatchLayout.of_plan(memory, hardware), None
    if config is not None:
        return BatchLayout.of_deepspeed(config), None
    layout = BatchLayout(1, 1, max(1, hardware.world_size))
    return layout, (
        "no memory plan: one sequence per rank and step, no accumulation; plan the strategy "
        "for the request's batch split"
    )


def config_schedule_note(config: dict[str, Any], schedule: LrSchedule) -> str:
    """What ds_config.json's schedule is: the plan's rule, or the config's own."""
    section = config.get("scheduler")
    peak = ((config.get("optimizer") or {}).get("params") or {}).get("lr")
    if not isinstance(section, dict):
        return "ds_config.json has no scheduler: DeepSpeed keeps the optimizer's rate constant"
    params = section.get("params") or {}
    if peak == schedule.peak_lr and params.get("warmup_num_steps") == schedule.warmup_steps:
        return schedule.note()
    return (
        f"learning rate: ds_config.json's {section.get('type')} (peak {peak}, warm-up "
        f"{params.get('warmup_num_steps')} of {params.get('total_num_steps')} steps), as given"
    )


def sized_config(config: dict[str, Any], brief: TrainingBrief, total: int) -> dict[str, Any]:
    """The DeepSpeed config with its schedule sized for a ``total``-step run of ``brief``.

    The warm-up the request names (its steps, or its ratio of the run) is kept; so is a
    constant rate it asks for (deepspeed_config.py ``with_run_steps``).
    """
    warmup = asked_warmup(brief, total)
    return with_run_steps(config, total, warmup, constant=brief.lr_schedule == "constant")


def shape_run(
    brief: TrainingBrief,
    model: ModelSpec,
    hardware: HardwareSpec,
    memory: MemoryPlan | None,
    config: dict[str, Any] | None,
    steps: int | None,
) -> tuple[RunShape, dict[str, Any] | None]:
    """The run, and the DeepSpeed config with its schedule sized for it."""
    total, why = run_steps(brief, steps, config)
    layout, assumed = layout_of(memory, hardware, config)
    schedule = run_schedule(brief, model, total, layout)
    notes = [why, f"batch: {layout.describe()}" + (f" ({assumed})" if assumed else "")]
    if config is not None:
        config = sized_config(config, brief, total)
        notes.append(config_schedule_note(config, schedule))
    elif brief.task in TRAINING_TASKS:
        notes.append(schedule.note())
    return RunShape(total, layout, schedule, tuple(notes)), config
