"""The job's data reaches every node's ranks, however a multi-node DeepSpeed plan is started.

launch.sh makes the request's data path (or the shards prepare_data.py wrote) the default
``DATA``. The same default holds in launch_node{R}.sh (the launch without ssh, one script a
node) and in train.sbatch, whose multi-node DeepSpeed step runs the launcher in ``bash -c``:
a child shell sees only exported variables, so ``DATA`` is exported there (as ``MODEL_PATH``
is), or the ranks would train on train.py's synthetic data.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from specs import LLAMA3_8B

from tools.artifacts.deepspeed_config import emit_deepspeed_config
from tools.artifacts.launch import emit_launch
from tools.core.schemas import (
    FrameworkChoice,
    GPUSpec,
    HardwareSpec,
    MemoryPlan,
    SetupCandidate,
    TrainingBrief,
)

H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989)
HARDWARE = HardwareSpec(source="described", nodes=2, gpus_per_node=8, gpu=H100)
DEEPSPEED = FrameworkChoice(primary="deepspeed", stack=["pytorch", "deepspeed"], rationale="x")
SCRIPTS = ("launch.sh", "launch_node0.sh", "launch_node1.sh", "train.sbatch")


def _emit(out: Path, task: str, data_path: str | None, model: str = LLAMA3_8B.name) -> None:
    setup = SetupCandidate(
        strategy="zero3",
        data_parallel=16,
        micro_batch_size=1,
        gradient_accumulation_steps=2,
        checkpointing="full",
        per_gpu_bytes={"total": 1},
        fits=True,
    )
    memory = MemoryPlan(
        strategies=[],
        chosen="zero3",
        micro_batch_size=1,
        gradient_accumulation_steps=2,
        activation_checkpointing=True,
        setup=setup,
    )
    brief = TrainingBrief(
        goal="x",
        model=model,
        task=task,  # type: ignore[arg-type]
        seq_len=2048,
        global_batch_size=32,
        precision="bf16",
        data_path=data_path,
    )
    config = emit_deepspeed_config(memory, LLAMA3_8B, HARDWARE, brief)
    emit_launch(out, brief, HARDWARE, LLAMA3_8B, DEEPSPEED, config, memory=memory, steps=100)


@pytest.mark.parametrize(
    ("task", "data_path", "default"),
    [
        ("finetune", "/data/chat.jsonl", "DATA=/data/chat.jsonl"),
        ("pretrain", None, "DATA=data/tokens"),
    ],
)
def test_every_nodes_script_defaults_data_as_launch_sh_does(
    tmp_path: Path, task: str, data_path: str | None, default: str
) -> None:
    _emit(tmp_path, task, data_path)
    for script in SCRIPTS:
        lines = (tmp_path / script).read_text().splitlines()
        job = next(i for i, line in enumerate(lines) if "trainer/train.py" in line)
        setting = [line for line in lines[:job] if line.endswith(default)]
        assert setting, f"{script} runs the job without the plan's default {default}"


def test_the_sbatch_child_shell_sees_the_data_default(tmp_path: Path) -> None:
    _emit(tmp_path, "finetune", "/data/chat.jsonl")
    lines = (tmp_path / "train.sbatch").read_text().splitlines()
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    assert "bash -c '" in lines[srun]  # the step's launcher runs in a child shell
    assert any(re.search(r"\bexport DATA\b", line) for line in lines[:srun]), (
        "DATA is set in train.sbatch but not exported: the srun step's bash -c does not see it"
    )


def test_every_nodes_script_passes_its_arguments_on_as_launch_sh_does(tmp_path: Path) -> None:
    # "./launch.sh --steps 50" reached train.py; "./launch_node1.sh --steps 50" did not, so the
    # nodes of one job could run different step counts.
    _emit(tmp_path, "finetune", "/data/chat.jsonl")
    for script in ("launch.sh", "launch_node0.sh", "launch_node1.sh"):
        job = next(
            line
            for line in (tmp_path / script).read_text().splitlines()
            if "trainer/train.py" in line and not line.startswith("#")
        )
        assert job.endswith('"$@"'), f"{script}: {job[-80:]}"


@pytest.mark.parametrize(
    ("named", "weights"),
    [
        ("llama-3-8b", "meta-llama/Meta-Llama-3-8B"),
        ("Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct"),
        ("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct"),
    ],
)
def test_every_nodes_script_loads_the_weights_the_brief_names(
    tmp_path: Path, named: str, weights: str
) -> None:
    # The instruct model is the base model's shape, so the catalog prices it as llama-3-8b; its
    # launch loaded the base weights, a fine-tune of another model than the one asked for.
    _emit(tmp_path, "finetune", "/data/chat.jsonl", model=named)
    for script in SCRIPTS:
        text = (tmp_path / script).read_text()
        assert f"MODEL_PATH={weights}\n" in text, f"{script} does not load {weights}"
