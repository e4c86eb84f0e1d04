"""The serving engine: which one serves the plan, and its launch command for one replica.

vLLM by default, else the engine the request names (TGI, DeepSpeed-Inference); the command
carries the plan's degrees, context, concurrency and weight format as the engine's flags.
"""

from __future__ import annotations

from tools.core.inference_types import InferencePlan, ServingEngine
from tools.core.schemas import ModelSpec, TrainingBrief
from tools.planning.serve_flags import vllm_precision_flags

ENGINE_NAMES = {"vllm": "vLLM", "tgi": "TGI", "deepspeed-inference": "DeepSpeed-Inference"}


def engine_for(brief: TrainingBrief) -> tuple[ServingEngine, str]:
    """The serving engine and why: the one the brief names, else vLLM."""
    if brief.engine is not None:
        return brief.engine, f"{ENGINE_NAMES[brief.engine]}: named in the request"
    why = (
        "vLLM by default: paged KV cache and continuous batching, tensor and pipeline "
        "parallel serving, an OpenAI-compatible server"
    )
    if brief.team.existing_stack == "tensorflow":
        why += "; it runs PyTorch checkpoints, so a TensorFlow team serves the Hugging Face weights"
    return "vllm", why


def hf_id_of(brief: TrainingBrief, model: ModelSpec) -> str | None:
    """The Hugging Face repo (catalog) or config folder to serve; None for a size-only model.

    A variant the brief names (``Qwen/Qwen2.5-7B-Instruct``) is served as named, not its catalog
    entry's base weights (tools/research/variant_weights.py).
    """
    from tools.research.model_catalog import catalog_id, load_model_catalog
    from tools.research.variant_weights import variant_weights

    ref = brief.model
    if isinstance(ref, str):
        if (named := variant_weights(ref)) is not None:
            return named
        known = catalog_id(ref)
        if known is not None:
            return str(load_model_catalog()[known].get("hf_repo") or known)
        if ref.lower().endswith(".json"):
            from pathlib import Path

            return str(Path(ref).parent)
        return ref
    return None


_DTYPE_FLAG = {"bf16": "bfloat16", "fp16": "float16"}


def serving_command(plan: InferencePlan) -> list[str]:
    """The engine's launch command for one replica of the plan."""
    model = plan.hf_id or "<path to the model's Hugging Face folder>"
    seqs = str(max(1, min(plan.concurrency, plan.max_concurrency)))
    act_dtype = "float16" if plan.weight_dtype == "fp16" else "bfloat16"
    if plan.engine == "vllm":
        cmd = ["vllm", "serve", model, "--tensor-parallel-size", str(plan.tensor_parallel)]
        if plan.pipeline_parallel > 1:
            cmd += ["--pipeline-parallel-size", str(plan.pipeline_parallel)]
        cmd += [
            "--max-model-len",
            str(plan.context_len),
            "--max-num-seqs",
            seqs,
            "--gpu-memory-utilization",
            f"{plan.gpu_memory_utilization:g}",
        ]
        # The plan's weight and KV formats, quantization included (serve_flags.py).
        return cmd + vllm_precision_flags(plan)
    if plan.engine == "tgi":
        cmd = [
            "text-generation-launcher",
            "--model-id",
            model,
            "--num-shard",
            str(plan.tensor_parallel),
            "--max-input-tokens",
            str(max(1, plan.context_len - 1)),
            "--max-total-tokens",
            str(plan.context_len),
            "--max-batch-prefill-tokens",
            str(plan.context_len),
            "--max-concurrent-requests",
            seqs,
            "--dtype",
            act_dtype,
        ]
        quant = {"fp8": "fp8", "int8": "bitsandbytes", "int4": "bitsandbytes-nf4"}
        if plan.weight_dtype in quant:
            cmd = [*cmd[:-2], "--quantize", quant[plan.weight_dtype]]
        return cmd
    return [
        "deepspeed",
        "--num_gpus",
        str(plan.tensor_parallel),
        "serve_ds.py",
        "--model",
        model,
        "--dtype",
        {"int8": "int8", "fp16": "float16"}.get(plan.weight_dtype, "bfloat16"),
        "--max-tokens",
        str(plan.context_len),
    ]
