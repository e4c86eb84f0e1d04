"""vLLM's precision flags for the weight format an inference plan chose, and the reason none fits.

The plan (tools/planning/inference.py) sizes the weights at its ``weight_dtype`` and the KV cache
at 16 bits (the model's dtype, vLLM's ``--kv-cache-dtype auto``); serve.sh must make vLLM load
exactly that, or the GPUs hold what the plan did not count:

- bf16 / fp16: ``--dtype bfloat16|float16``, no quantization;
- fp8: ``--quantization fp8``, vLLM's dynamic FP8 (docs.vllm.ai, Quantization > FP8 W8A8:
  quantizes a 16-bit checkpoint's weights at load, no calibration);
- int4: ``--quantization bitsandbytes``, in-flight 4-bit (Quantization > BitsAndBytes);
- int8: vLLM has no in-flight INT8 for a 16-bit checkpoint; INT8 W8A8 runs from a checkpoint
  quantized beforehand (llm-compressor, the ``compressed-tensors`` format, Quantization > INT8
  W8A8). ``--quantization compressed-tensors`` makes vLLM refuse a 16-bit checkpoint at load
  instead of serving it at twice the planned bytes; the plan says a quantized checkpoint is
  needed.

The KV cache dtype is stated (``--kv-cache-dtype auto``: the activations' 16-bit dtype) so the
command shows what the plan counted.
"""

from __future__ import annotations

from tools.core.inference_types import InferencePlan

VLLM_QUANTIZATION = {"fp8": "fp8", "int4": "bitsandbytes", "int8": "compressed-tensors"}
INT8_CHECKPOINT = (
    "int8 weights on vLLM need a checkpoint quantized to INT8 W8A8 beforehand (llm-compressor, "
    "compressed-tensors format): vLLM has no in-flight INT8 for a 16-bit checkpoint, and "
    "serve.sh's --quantization compressed-tensors refuses an unquantized one at load"
)


def vllm_precision_flags(plan: InferencePlan) -> list[str]:
    """``--dtype``, ``--kv-cache-dtype`` and ``--quantization`` for the plan's formats."""
    flags = ["--dtype", "float16" if plan.weight_dtype == "fp16" else "bfloat16"]
    flags += ["--kv-cache-dtype", "auto"]
    quantization = VLLM_QUANTIZATION.get(plan.weight_dtype)
    if quantization is not None:
        flags += ["--quantization", quantization]
    return flags


def no_serve_reason(plan: InferencePlan) -> str | None:
    """Why the plan gets no serve.sh (nothing fits), or None when one sequence fits."""
    if plan.max_concurrency >= 1:
        return None
    fixes = "; ".join(plan.alternatives) or "more GPUs, or a smaller weight format"
    return (
        f"no serve.sh: not one sequence of {plan.context_len} tokens fits in {plan.weight_dtype} "
        f"on tensor parallel {plan.tensor_parallel} x pipeline parallel "
        f"{plan.pipeline_parallel} ({plan.used_bytes_per_gpu / 1e9:.1f} GB per GPU needed, "
        f"{plan.budget_bytes_per_gpu / 1e9:.1f} GB budget), so the engine would not start; "
        f"what would fit: {fixes}"
    )
