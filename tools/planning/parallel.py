"""Megatron-style tensor and pipeline parallelism: which splits are valid, and who holds what.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM": each GPU holds 1/(t*p) of the weights (sec. 2.2-2.3); tensor groups stay inside a
node (sec. 3).
"""

from __future__ import annotations

import math

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, ModelSpec
from tools.core.strategies import OFFLOAD_STRATEGIES, STRATEGY_ORDER, StrategyName

# Tensor-parallel degrees to try: powers of two up to one node (Narayanan et al. 2021 sec. 3.3:
# tensor parallelism's all-reduces in every layer need the intra-node links, so t <= GPUs per
# node; Megatron also needs t to divide the attention heads and the key-value heads).
TENSOR_PARALLEL_CANDIDATES = (1, 2, 4, 8)
# ZeRO stages that combine with tensor/pipeline parallelism. DeepSpeed's PipelineEngine refuses
# stages 2 and 3 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
# runtime/pipe/engine.py), so a pipeline uses ZeRO-1, as Megatron-DeepSpeed's recipes do (BLOOM-176B:
# TP 4, PP 12, ZeRO-1); tensor parallelism alone also combines with stages 2 and 3 (DeepSpeed
# takes Megatron's mpu for the data-parallel group).
PIPELINE_STAGES: tuple[StrategyName, ...] = ("zero1",)
TENSOR_ONLY_STAGES: tuple[StrategyName, ...] = ("zero1", "zero2", "zero3")


def data_parallel_size(
    hardware: HardwareSpec,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    context_parallel: int = 1,
) -> int:
    """Data-parallel ranks: the world size over the model-parallel degree t x p x c."""
    return max(1, hardware.world_size // (tensor_parallel * pipeline_parallel * context_parallel))


def check_model_parallel(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    tensor_parallel: int,
    pipeline_parallel: int,
    framework: str = "deepspeed",
) -> int:
    """Check a tensor x pipeline split of ``model`` on ``hardware``; return the data-parallel size.

    ``framework`` relaxes what its own pipeline supports: torchtitan and Megatron split layers
    unevenly (the heaviest stage takes ceil(L/p)), and torchtitan shards a pipeline's stages
    with FSDP2 (any ZeRO stage without offload).

    Megatron-LM's constraints (Narayanan et al. 2021 sec. 3.3 for t within a node): t divides
    the attention heads and the key-value heads, p divides the layers, t x p divides the GPUs.
    Pipelines combine with ZeRO-1 at most (DeepSpeed's PipelineEngine); offload is not combined.
    """
    t, p = tensor_parallel, pipeline_parallel
    if t < 1 or p < 1:
        raise InputError("tensor_parallel", "tensor and pipeline degrees must be at least 1")
    world = hardware.world_size
    if t * p == 1:
        return world
    if hardware.gpu is None:
        raise InputError("tensor_parallel", "tensor/pipeline parallelism needs GPUs")
    if world % (t * p):
        raise InputError(
            "tensor_parallel", f"tensor x pipeline = {t * p} must divide the {world} GPUs"
        )
    if t > max(1, hardware.gpus_per_node):
        raise InputError(
            "tensor_parallel",
            f"tensor-parallel degree {t} exceeds the {hardware.gpus_per_node} GPUs of one node",
        )
    kv_heads = model.kv_heads or model.heads
    if model.heads % t or kv_heads % t:
        raise InputError(
            "tensor_parallel",
            f"{t} must divide the {model.heads} attention heads and {kv_heads} key-value heads",
        )
    uneven = framework in ("torchtitan", "megatron", "nanotron")
    if model.layers % p and not (uneven and p <= model.layers):
        raise InputError("pipeline_parallel", f"{p} must divide the {model.layers} layers")
    if strategy in OFFLOAD_STRATEGIES:
        raise InputError(
            "strategy", f"{strategy} is not combined with tensor/pipeline parallelism here"
        )
    if p > 1 and strategy not in ("ddp", "zero1") and framework != "torchtitan":
        raise InputError(
            "strategy",
            f"{strategy} with a pipeline: DeepSpeed's PipelineEngine takes ZeRO stage 0 or 1 only",
        )
    return world // (t * p)


def model_parallel_params(
    model: ModelSpec, tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> tuple[int, int]:
    """Parameters on the most loaded GPU before ZeRO shards them, and its share of the largest layer.

    Narayanan et al. 2021 sec. 2.2-2.3: each pipeline stage takes L/p layers and tensor
    parallelism splits every weight matrix t ways (the embedding and output layer by vocabulary).
    Megatron puts the input embedding on the first stage and the output layer on the last, so the
    heaviest stage holds (Ψ - V·h)/p + V·h; for a model with untied embeddings this counts the
    second V·h matrix in the body, which overstates a stage by V·h/p. Replicated layer norms are
    left out (a few hidden-sized vectors per layer).
    """
    t, p = tensor_parallel, pipeline_parallel
    stage = model.params
    if p > 1:
        embedding = model.vocab * model.hidden
        stage = math.ceil(max(0, model.params - embedding) / p) + min(embedding, model.params)
    return math.ceil(stage / t), math.ceil(model.largest_layer_params / t)


def model_parallel_setups(
    model: ModelSpec, hardware: HardwareSpec, names: list[StrategyName]
) -> list[tuple[StrategyName, int, int]]:
    """Every valid (strategy, t, p) with t x p > 1 among ``names``, smallest t x p first.

    t from ``TENSOR_PARALLEL_CANDIDATES`` (within a node, dividing heads and key-value heads),
    p dividing the layers, t x p dividing the GPUs; pipelines take ZeRO-1 only.
    """
    world = hardware.world_size
    setups: list[tuple[StrategyName, int, int]] = []
    for tp in TENSOR_PARALLEL_CANDIDATES:
        for pp in range(1, min(model.layers, world) + 1):
            if tp * pp == 1 or world % (tp * pp) or model.layers % pp:
                continue
            for name in PIPELINE_STAGES if pp > 1 else TENSOR_ONLY_STAGES:
                if name not in names:
                    continue
                try:
                    check_model_parallel(model, hardware, name, tp, pp)
                except InputError:
                    continue
                setups.append((name, tp, pp))
    return sorted(setups, key=lambda s: (s[1] * s[2], s[2], STRATEGY_ORDER.index(s[0])))
