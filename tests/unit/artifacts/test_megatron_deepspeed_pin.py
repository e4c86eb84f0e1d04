"""Megatron-DeepSpeed launches check the DeepSpeed they run under before torchrun starts.

Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed 4efb479d, its newest) imports
``deepspeed.compression.compress`` in megatron/training.py, which pretrain_gpt.py and the
checkpoint converter import; DeepSpeed removed that library in 0.19.7 (0.19.6's sdist has
compression/compress.py, 0.19.7's and 0.19.8's do not), so with a current DeepSpeed every rank
stopped at import ('No module named deepspeed.compression.compress';
bench/results/2026-12-06-launch-parsers.md).
"""

from __future__ import annotations

from pathlib import Path

from tools.artifacts.deepspeed_config import emit_deepspeed_config
from tools.artifacts.launch import emit_launch
from tools.artifacts.megatron_env import DEEPSPEED_FOR_MEGATRON, deepspeed_check
from tools.core.schemas import (
    FrameworkChoice,
    GPUSpec,
    HardwareSpec,
    MemoryPlan,
    SetupCandidate,
    TrainingBrief,
)
from tools.research.model_catalog import lookup_model

H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989)


def _megatron_plan(out: Path, task: str) -> None:
    model = lookup_model("llama-2-7b", 4096)  # a Llama the converter maps
    hardware = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=H100)
    setup = SetupCandidate(
        strategy="zero1",
        tensor_parallel=2,
        pipeline_parallel=2,
        context_parallel=1,
        data_parallel=2,
        micro_batch_size=1,
        gradient_accumulation_steps=8,
        checkpointing="full",
        per_gpu_bytes={"total": 1},
        fits=True,
    )
    memory = MemoryPlan(
        strategies=[],
        chosen="zero1",
        micro_batch_size=1,
        gradient_accumulation_steps=8,
        activation_checkpointing=True,
        tensor_parallel=2,
        pipeline_parallel=2,
        setup=setup,
    )
    brief = TrainingBrief(
        goal="x",
        model=model.name,
        task=task,  # type: ignore[arg-type]
        seq_len=4096,
        global_batch_size=16,
        precision="bf16",
    )
    framework = FrameworkChoice(primary="megatron", stack=["pytorch"], rationale="x")
    config = emit_deepspeed_config(memory, model, hardware, brief, autotp=False)
    emit_launch(out, brief, hardware, model, framework, config, memory=memory, steps=10)


def test_the_check_imports_what_megatron_deepspeed_imports() -> None:
    text = "\n".join(deepspeed_check())
    assert "import deepspeed.compression.compress" in text
    assert f"deepspeed=={DEEPSPEED_FOR_MEGATRON}" in text
    assert "exit 2" in text


def test_every_megatron_script_checks_before_torchrun(tmp_path: Path) -> None:
    _megatron_plan(tmp_path, "finetune")
    scripts = ["launch.sh", "train.sbatch", "convert_checkpoint.sh"]
    for name in scripts:
        text = (tmp_path / name).read_text()
        assert "import deepspeed.compression.compress" in text, name
        assert text.index("deepspeed.compression.compress") < text.index("torchrun "), name
    assert f"deepspeed=={DEEPSPEED_FOR_MEGATRON}" in (tmp_path / "MEGATRON.md").read_text()
