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
from tools.core.schemas import HardwareSpec, MemoryPlan, ModelSpec, TrainingBrief
from tools.planning.batch_layout import BatchLayout
from tools.planning.lr_schedule import DEFAULT_RUN_STEPS, LrSchedule


@dataclass(frozen=True)
class RunShape:
    """The launched run: optimizer steps, batch layout, schedule, and what the plan notes."""

    steps: int
    layout: BatchLayout
    schedule: LrSchedule
    notes: tuple[str, ...]


def run_steps(brief: TrainingBrief, steps: int | None) -> tuple[int, str]:
    """The run's optimizer steps and where they come from."""
    if steps is not None:
        return steps, f"{steps} optimizer steps, as the launch was asked for"
    planned = planned_total_steps(brief)
    if planned is not None:
        return planned, (
            f"{planned} optimizer steps: the request's {brief.dataset_tokens:.3g} tokens over "
            f"{brief.batch} x {brief.seq_len} tokens per step"
        )
    return DEFAULT_RUN_STEPS, (
        f"{DEFAULT_RUN_STEPS} optimizer steps: the default run, as the request gives no dataset "
        "size (dataset_tokens); pass --steps to launch.sh and re-plan with the real length, "
        "since the schedule is sized for these steps"
    )


def layout_of(
    memory: MemoryPlan | None,
    hardware: HardwareSpec,
    config: dict[str, Any] | None,
    brief: TrainingBrief,
) -> BatchLayout:
    """The plan's batch layout: the memory plan's split, else the config's, else DDP's.

    Without either, every rank runs one sequence per micro-step and accumulates to the brief's
    batch when the world divides it.
    """
    if memory is not None:
        return BatchLayout.of_plan(memory, hardware)
    if config is not None:
        return BatchLayout.of_deepspeed(config)
    world = max(1, hardware.world_size)
    accumulation = brief.batch // world if brief.batch % world == 0 else 1
    return BatchLayout(1, max(1, accumulation), world)


def shape_run(
    brief: TrainingBrief,
    model: ModelSpec,
    hardware: HardwareSpec,
    memory: MemoryPlan | None,
    config: dict[str, Any] | None,
    steps: int | None,
) -> tuple[RunShape, dict[str, Any] | None]:
    """The run, and the DeepSpeed config with its schedule sized for it."""
    total, why = run_steps(brief, steps)
    layout = layout_of(memory, hardware, config, brief)
    schedule = run_schedule(brief, model, total, layout)
    notes = [why, f"batch: {layout.describe()}"]
    if brief.task in ("pretrain", "finetune", "lora"):
        notes.append(schedule.note())
    if config is not None:
        config = with_run_steps(config, brief, model, total)
    return RunShape(total, layout, schedule, tuple(notes)), config
