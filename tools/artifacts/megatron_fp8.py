"""Whether Megatron-DeepSpeed's fp8 path builds the plan's model, and why not when it does not.

Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed, megatron/model/transformer.py) runs fp8
linears only inside Transformer Engine's layers: ``--transformer-impl transformer_engine``
makes ``ParallelTransformer.build_layer`` create ``transformer_engine.pytorch.TransformerLayer``
in place of its own layer, and ``--fp8-hybrid`` wraps them in ``fp8_autocast``. Three limits
follow from that code:

- Only the plain model uses them. The pipeline model (``GPTModelPipe``, megatron/model/
  gpt_model.py, built under ``--deepspeed`` unless ``--no-pipeline-parallel``: every plan with
  pipeline stages, and a fine-tune that loads the converter's checkpoint) is made of
  ``ParallelTransformerLayerPipe``, Megatron's own layer: the fp8 flags change nothing there.
- ``build_layer`` asserts ``num_attention_heads == num_key_value_heads`` ("Transformer_engine
  does not support GQA") and passes no ``normalization``, ``activation`` or ``bias``, so the
  layer has Transformer Engine's defaults: LayerNorm, a GeLU MLP and biased linears
  (transformer_engine/pytorch/transformer.py ``TransformerLayer``). A model with RMSNorm,
  SwiGLU or bias-free linears (``--normalization rmsnorm``, ``--swiglu``,
  ``--disable-bias-linear``) would be another model.
- It gets no ``num_experts`` (a mixture of experts would train dense layers) and none of
  DeepSpeed-Ulysses' sequence-parallel attention (``--ds-sequence-parallel-size``), which wraps
  Megatron's own attention only.

So fp8 applies on Megatron-DeepSpeed to a GPT-3-style model (LayerNorm, GeLU, biases, full
multi-head attention) trained as the plain model; otherwise the launch trains bf16 and says why.
"""

from __future__ import annotations

from tools.artifacts.headline import FP8_NOT_APPLIED
from tools.artifacts.megatron_model import architecture_flags
from tools.core.schemas import ModelSpec

# The pretrain_gpt.py flags whose model Transformer Engine's layer, as Megatron-DeepSpeed
# builds it, is not; each with how the model differs.
_TE_DIFFERS = {
    "--num-key-value-heads": "grouped-query attention (build_layer asserts 'Transformer_engine "
    "does not support GQA')",
    "--swiglu": "a SwiGLU MLP (the layer's is GeLU)",
    "--normalization": "RMSNorm (the layer's is LayerNorm)",
    "--disable-bias-linear": "bias-free linears (the layer's have biases)",
    "--num-experts": "a mixture of experts (the layer is dense)",
}


def te_gaps(
    model: ModelSpec,
    tensor_parallel: int = 1,
    *,
    pipeline_model: bool,
    context_parallel: int = 1,
    expert_parallel: int = 1,
) -> list[str]:
    """What this plan has that Megatron-DeepSpeed's Transformer Engine layers do not build.

    ``pipeline_model``: the launch builds Megatron-DeepSpeed's pipeline model (no
    ``--no-pipeline-parallel``). Empty: its fp8 applies.
    """
    flags = architecture_flags(model, tensor_parallel, expert_parallel)
    found = [why for flag, why in _TE_DIFFERS.items() if flag in flags]
    if flag_value(flags, "--normalization") not in (None, "rmsnorm"):
        found.remove(_TE_DIFFERS["--normalization"])
    if context_parallel > 1:
        found.append("DeepSpeed-Ulysses context parallelism (it wraps Megatron's own attention)")
    if pipeline_model:
        found.insert(
            0,
            "the pipeline model (GPTModelPipe: pipeline stages, or a fine-tune's converted "
            "checkpoint), whose layers are Megatron's own, never Transformer Engine's",
        )
    return found


def fp8_refusal(
    model: ModelSpec,
    tensor_parallel: int,
    *,
    pipeline_model: bool,
    context_parallel: int = 1,
    expert_parallel: int = 1,
    priced_bf16: bool = False,
) -> str | None:
    """Why the Megatron-DeepSpeed launch cannot apply fp8 to this plan (None: it can).

    ``te_gaps``' arguments; ``priced_bf16``: the plan is priced as bf16 for it (the planner's
    line), else the fp8 estimate stands (the launch's). The line starts as every unapplied-fp8
    note does, for the report's headline.
    """
    found = te_gaps(
        model,
        tensor_parallel,
        pipeline_model=pipeline_model,
        context_parallel=context_parallel,
        expert_parallel=expert_parallel,
    )
    if not found:
        return None
    return (
        f"{FP8_NOT_APPLIED}: Megatron-DeepSpeed runs fp8 only in Transformer Engine's layers, "
        "which it builds with LayerNorm, GeLU, biases and full multi-head attention, in its "
        f"plain model (megatron/model/transformer.py); this plan has {'; '.join(found)}. So "
        "the launch passes no fp8 flags and trains bf16 mixed precision, "
        + ("and the plan is priced as bf16" if priced_bf16 else "slower than the fp8 estimate")
    )


def flag_value(flags: list[str], name: str) -> str | None:
    """The value after ``name`` in an argument list (None: absent)."""
    return flags[flags.index(name) + 1] if name in flags else None
