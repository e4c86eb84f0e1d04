"""The plan's contract checks: the plan is about the brief, and its files say what it says.

``check_contract`` runs them all; errors block approval. launch.sh is read as the shell reads
it (launch_script.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tools.core.errors import TrainwrightError, shown
from tools.core.schemas import (
    Finding,
    HardwareSpec,
    LaunchSpec,
    MemoryPlan,
    ModelSpec,
    SmokeResult,
    TrainingBrief,
)
from tools.core.strategies import ZERO_STAGE
from tools.review.launch_script import runs_command


def check_contract(
    brief: TrainingBrief,
    hardware: HardwareSpec,
    model: ModelSpec | None,
    memory: MemoryPlan | None,
    deepspeed_config: dict[str, Any] | None,
    launch: LaunchSpec | None,
    smoke: SmokeResult,
) -> list[Finding]:
    """The plan is about the brief, and its files say what the plan says (errors block approval)."""
    return [
        *check_brief(brief, hardware, model),
        *check_launch(hardware, memory, deepspeed_config, launch),
        *check_smoke_setup(smoke, memory),
    ]


def _error(check: str, message: str, fix: str) -> Finding:
    return Finding(severity="error", check=check, message=message, fix=fix)


def check_brief(
    brief: TrainingBrief, hardware: HardwareSpec, model: ModelSpec | None
) -> list[Finding]:
    """The plan's hardware and model are the brief's: resolved again here, not taken on trust."""
    from tools.research.hardware import hardware_for_brief
    from tools.research.model_catalog import brief_model

    fix = "plan the brief's model and hardware; a tool call cannot change them"
    findings = []
    expected_hw = hardware_for_brief(brief)

    def key(hw: HardwareSpec) -> tuple[Any, ...]:
        return (hw.nodes, hw.gpus_per_node, hw.gpu.name if hw.gpu else None, hw.interconnect)

    if key(hardware) != key(expected_hw):
        findings.append(
            _error(
                "brief_contract",
                f"the plan targets {hardware.nodes}x{hardware.gpus_per_node} "
                f"{shown(hardware.gpu.name if hardware.gpu else 'CPU')}, not the brief's "
                f"hardware {shown(brief.hardware)}",
                fix,
            )
        )
    if brief.model is None:
        if model is not None:
            findings.append(
                _error("brief_contract", "the brief trains no model but the plan has one", fix)
            )
        return findings
    try:
        expected = brief_model(brief)
    except TrainwrightError as exc:
        return [*findings, _error("brief_contract", f"the brief's model: {exc}", fix)]
    sizes = ("name", "params", "layers", "hidden", "heads", "vocab", "seq_len")
    if model is None or any(getattr(model, k) != getattr(expected, k) for k in sizes):
        got = f"{shown(model.name)} ({model.params:,} parameters)" if model else "no model"
        findings.append(
            _error(
                "brief_contract",
                f"the plan is for {got}, not the brief's {shown(expected.name)} "
                f"({expected.params:,} parameters at seq_len {brief.seq_len})",
                fix,
            )
        )
    if not findings:
        findings.append(
            Finding(
                severity="info",
                check="brief_contract",
                message=f"the plan is for the brief's model {shown(expected.name)} and hardware "
                f"{shown(brief.hardware)}",
            )
        )
    return findings


# Flags that give a launcher's node count and ranks per node (horovodrun gives the total).
_NODES_FLAGS = ("--num_nodes", "--nnodes")
_PER_NODE_FLAGS = ("--num_gpus", "--nproc_per_node")


def _flag(command: list[str], names: tuple[str, ...]) -> int | None:
    for i, arg in enumerate(command[:-1]):
        if arg in names:
            try:
                return int(command[i + 1])
            except ValueError:
                return None
    return None


def _launch_world(command: list[str]) -> int | None:
    """The ranks a launch command starts, as its flags say; None when it does not say."""
    total = _flag(command, ("-np",))
    if total is not None:
        return total
    per_node = _flag(command, _PER_NODE_FLAGS)
    if per_node is None:
        return None
    return (_flag(command, _NODES_FLAGS) or 1) * per_node


def check_launch(
    hardware: HardwareSpec,
    memory: MemoryPlan | None,
    config: dict[str, Any] | None,
    launch: LaunchSpec | None,
) -> list[Finding]:
    """launch.sh, ds_config.json and the plan agree: launcher, ZeRO stage, world size, config.

    Reads the files as written, so a launch emitted for an earlier plan (or edited since) shows.
    """
    if memory is None:
        return []  # nothing is trained: no launch to check
    fix = "emit the launch files again after the last plan_parallelism and emit_deepspeed_config"
    if launch is None or not launch.command:
        return [_error("launch_agrees", "no launch files were emitted for the plan", fix)]
    problems = []
    command = launch.command
    # Megatron-DeepSpeed under torchrun: a model-parallel plan, or one that asked for Megatron.
    model_parallel = memory.tensor_parallel * memory.pipeline_parallel > 1 or (
        any(arg.rstrip('"').endswith("pretrain_gpt.py") for arg in command)
    )
    if config is not None and not model_parallel and command[0] != "deepspeed":
        problems.append(f"the plan runs DeepSpeed but the launch starts {shown(command[0])}")
    if config is None and command[0] == "deepspeed":
        problems.append("the launch starts DeepSpeed but the plan has no DeepSpeed config")
    if config is not None:
        stage = int((config.get("zero_optimization") or {}).get("stage", 0) or 0)
        if stage != ZERO_STAGE[memory.chosen]:
            problems.append(
                f"ds_config has ZeRO stage {stage} but the plan's {memory.chosen} is stage "
                f"{ZERO_STAGE[memory.chosen]}"
            )
    world = _launch_world(command)
    expected = hardware.nodes * max(1, hardware.gpus_per_node)
    if world is not None and world != expected:
        problems.append(f"the launch starts {world} ranks, the plan's hardware has {expected}")
    written = launch.files.get("ds_config.json")
    if config is not None and written is None:
        problems.append("the plan has a DeepSpeed config but no ds_config.json was written")
    elif config is None and written is not None:
        problems.append("a ds_config.json was written but the plan has no DeepSpeed config")
    elif written is not None and _read_json(written) != config:
        problems.append("ds_config.json on disk is not the plan's DeepSpeed config")
    script = launch.files.get("launch.sh")
    if script is None:
        problems.append("no launch.sh was written")
    elif not runs_command(_read_text(script), command):
        problems.append("launch.sh does not run the plan's launch command")
    if problems:
        return [_error("launch_agrees", "; ".join(problems), fix)]
    return [
        Finding(
            severity="info",
            check="launch_agrees",
            message=f"launch.sh starts {command[0]} with {world or expected} rank(s)"
            + (
                f", ds_config.json is the plan's ZeRO stage {ZERO_STAGE[memory.chosen]}"
                if config
                else ""
            )
            + ", as the plan says",
        )
    ]


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _read_json(path: str) -> Any:
    try:
        return json.loads(_read_text(path))
    except ValueError:
        return None


def check_smoke_setup(smoke: SmokeResult, memory: MemoryPlan | None) -> list[Finding]:
    """A smoke run made before the plan changed tested another setup: it cannot pass this one."""
    if smoke.status == "skipped" or memory is None or not smoke.strategy:
        return []
    tensorflow = smoke.run_mode is not None and smoke.run_mode.launcher == "tensorflow"
    if smoke.strategy == memory.chosen or tensorflow:
        return []  # TensorFlow's workers replicate: the memory plan's rows are PyTorch's
    return [
        _error(
            "smoke_verdict",
            f"smoke run tested {shown(smoke.strategy)} but the plan chose {memory.chosen}",
            "run the smoke test after the last plan_parallelism",
        )
    ]
