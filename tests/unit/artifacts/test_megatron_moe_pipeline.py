"""A mixture of experts in Megatron-DeepSpeed's pipeline with tensor parallelism turns off
DeepSpeed's pipe/grad partitioning, which its pipeline engine cannot do for MoE.

Megatron-DeepSpeed's GPTModelPipe passes the hidden states and the aggregated MoE loss between
stages, both requiring grads; DeepSpeed's PipelineEngine partitions only one such tensor
(deepspeed/runtime/pipe/engine.py asserts the rest need no grad), and partitions whenever the
stage is model-parallel unless ds_config.json's ``pipeline`` section says
``pipe_partitioned``/``grad_partitioned`` false (its defaults are true,
deepspeed/runtime/config.py ``get_pipeline_config``). megatron/model/gpt_model.py checks the
config for exactly this, but reads a missing key as false: the run fails at the first forward.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deepspeed.runtime.config import get_pipeline_config

from tools.artifacts.deepspeed_config import emit_deepspeed_config
from tools.artifacts.launch import emit_launch
from tools.core.estimate_types import MemoryPlan, SetupCandidate
from tools.core.schemas import FrameworkChoice, GPUSpec, HardwareSpec, TrainingBrief
from tools.research.model_catalog import lookup_model

H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989)
MEGATRON = FrameworkChoice(primary="megatron", stack=["pytorch"], rationale="x")


def _ds_config(tmp_path: Path, name: str, tp: int, pp: int) -> dict:  # type: ignore[type-arg]
    hardware = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=H100)
    model = lookup_model(name, 2048)
    dp = 8 // (tp * pp)
    brief = TrainingBrief(goal="x", model=name, seq_len=2048, global_batch_size=4 * dp)
    setup = SetupCandidate(
        strategy="zero1", tensor_parallel=tp, pipeline_parallel=pp, data_parallel=dp,
        micro_batch_size=1, gradient_accumulation_steps=4, checkpointing="full",
        per_gpu_bytes={"total": 1}, fits=True,
    )  # fmt: skip
    memory = MemoryPlan(
        strategies=[], chosen="zero1", micro_batch_size=1, gradient_accumulation_steps=4,
        activation_checkpointing=True, tensor_parallel=tp, pipeline_parallel=pp, setup=setup,
    )  # fmt: skip
    config = emit_deepspeed_config(memory, model, hardware, brief)
    emit_launch(tmp_path, brief, hardware, model, MEGATRON, config, memory=memory, steps=10)
    return json.loads((tmp_path / "ds_config.json").read_text())


def test_moe_pipeline_with_tensor_parallelism_turns_partitioning_off(tmp_path: Path) -> None:
    pipeline = get_pipeline_config(_ds_config(tmp_path, "mixtral-8x7b", 2, 2))
    assert pipeline["pipe_partitioned"] is False and pipeline["grad_partitioned"] is False


@pytest.mark.parametrize(("name", "tp", "pp"), [("llama-3-8b", 2, 2), ("mixtral-8x7b", 1, 2)])
def test_other_plans_keep_deepspeeds_pipeline_defaults(
    tmp_path: Path, name: str, tp: int, pp: int
) -> None:
    # Dense layers pass one tensor that needs grad; without tensor parallelism the engine
    # does not partition at all.
    assert "pipeline" not in _ds_config(tmp_path, name, tp, pp)
