"""A one-node DeepSpeed launch.sh listens on $MASTER_PORT when it is set.

With port 29500 taken (a second job on the machine), `bash launch.sh` of "fine-tune gpt2 on
this machine with deepspeed zero2" stopped every rank with `torch.distributed.DistNetworkError:
... port: 29500 ... EADDRINUSE`, and launch.sh's arguments go to train.py, so no port could be
given without editing it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tools.artifacts.launch import emit_launch
from tools.core.schemas import FrameworkChoice, HardwareSpec, TrainingBrief
from tools.research.model_catalog import lookup_model

DEEPSPEED = FrameworkChoice(primary="deepspeed", stack=["pytorch", "deepspeed"], rationale="x")
DDP = FrameworkChoice(primary="pytorch_ddp", stack=["pytorch", "pytorch_ddp"], rationale="x")
ZERO2 = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2},
}
PORT = ["${MASTER_PORT:+--master_port}", '${MASTER_PORT:+"$MASTER_PORT"}']


def _launch_line(out: Path, framework: FrameworkChoice, nodes: int) -> tuple[list[str], list[str]]:
    spec = lookup_model("gpt2", 1024)
    brief = TrainingBrief(goal="g", model="gpt2", task="finetune", seq_len=1024)  # type: ignore[arg-type]
    hardware = HardwareSpec(source="described", nodes=nodes, gpus_per_node=2)
    config = dict(ZERO2, train_batch_size=16 * nodes) if framework is DEEPSPEED else None
    launch = emit_launch(out, brief, hardware, spec, framework, config, steps=10)
    line = (out / "launch.sh").read_text().splitlines()[-1]
    return line.split(" "), launch.command


def test_one_node_deepspeed_takes_the_port_from_the_environment(tmp_path: Path) -> None:
    words, command = _launch_line(tmp_path, DEEPSPEED, 1)
    assert words[:4] == ["deepspeed", *PORT, "--num_gpus"]
    # The plan's command (plan.json, the report, the smoke run) stays the launcher's own.
    assert command[:2] == ["deepspeed", "--num_gpus"]
    # Unset, bash drops both words: the launcher's default port, as before.
    assert all(w.startswith("${MASTER_PORT:+") for w in shlex.split(" ".join(words[1:3])))
    sbatch = (tmp_path / "train.sbatch").read_text()
    assert " ".join(["deepspeed", *PORT, "--num_gpus"]) in sbatch


@pytest.mark.parametrize(("framework", "nodes"), [(DEEPSPEED, 2), (DDP, 1), (DDP, 2)])
def test_other_launches_keep_their_command(
    framework: FrameworkChoice, nodes: int, tmp_path: Path
) -> None:
    words, _ = _launch_line(tmp_path, framework, nodes)
    assert not set(PORT) & set(words)
