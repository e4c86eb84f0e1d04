"""vLLM serve.sh: the parallel sizes, context and dtype flags are the plan's, by vLLM's names.

vLLM's CLI flags are its ``EngineArgs`` fields, ``--`` plus the name in kebab case
(vllm/engine/arg_utils.py, vllm-project/vllm commit 99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b:
``tensor_parallel_size``, ``pipeline_parallel_size``, ``max_model_len``, ``dtype`` of type
``ModelDType`` = auto/half/float16/bfloat16/float/float32). vLLM needs a GPU build, so this is a
table test of the flags, not vLLM's parser.
"""

from __future__ import annotations

import pytest

from tools.core.schemas import TrainingBrief
from tools.planning.inference import plan_inference
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model

# The EngineArgs fields serve.sh may set (the others: kv_cache_dtype, max_num_seqs,
# gpu_memory_utilization, quantization are EngineArgs fields at that commit too).
ENGINE_ARGS = {
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_model_len",
    "dtype",
    "kv_cache_dtype",
    "max_num_seqs",
    "gpu_memory_utilization",
    "quantization",
}
MODEL_DTYPES = {"auto", "half", "float16", "bfloat16", "float", "float32"}
CASES = {
    "dense": ("qwen2.5-72b", "1x4xH100-80GB", {}),
    "moe": ("mixtral-8x7b", "1x8xH100-80GB", {"context_len": 8192}),
    "long context": ("llama-3.1-8b", "1x8xH100-80GB", {"context_len": 131072, "concurrency": 2}),
    "pipeline": ("llama-3.1-405b", "2x8xH100-80GB", {"context_len": 4096, "concurrency": 4}),
}


def _flags(command: list[str]) -> dict[str, str]:
    return {a[2:]: command[i + 1] for i, a in enumerate(command) if a.startswith("--")}


@pytest.mark.parametrize("case", list(CASES))
def test_vllm_flags_are_the_plans(case: str) -> None:
    model, hardware, extra = CASES[case]
    brief = TrainingBrief(model=model, task="inference", **extra)  # type: ignore[arg-type]
    plan = plan_inference(lookup_model(model, 2048), parse_hardware(hardware, "ib400"), brief)
    assert plan.command[:3] == ["vllm", "serve", plan.hf_id]
    flags = _flags(plan.command)
    names = {name.replace("-", "_") for name in flags}
    assert names <= ENGINE_ARGS, names - ENGINE_ARGS
    assert int(flags["tensor-parallel-size"]) == plan.tensor_parallel
    assert int(flags.get("pipeline-parallel-size", "1")) == plan.pipeline_parallel
    assert ("pipeline-parallel-size" in flags) == (plan.pipeline_parallel > 1)
    assert int(flags["max-model-len"]) == plan.context_len
    if "context_len" in extra:
        assert plan.context_len == extra["context_len"]
    assert flags["dtype"] in MODEL_DTYPES
    assert flags["dtype"] == ("float16" if plan.weight_dtype == "fp16" else "bfloat16")
    if case == "pipeline":
        assert plan.pipeline_parallel > 1
