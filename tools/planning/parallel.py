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


def pipeline_split(layers: int, pipeline_parallel: int) -> tuple[int, ...]:
    """Transformer layers on each of ``pipeline_parallel`` stages, first to last; () if equal.

    Where p does not divide the L layers, the first L mod p stages take one layer more: what
    DeepSpeed's ``PipelineModule`` does under Megatron-DeepSpeed (``partition_method=
    'type:transformer'``: ``partition_balanced`` over one unit per transformer layer,
    deepspeed/runtime/utils.py) and what torchtitan builds from the module names the plan
    writes for each stage (``module_fqns_per_model_part``). Llama 3.1 405B's 126 layers over 16
    stages: 14 of 8 and 2 of 7.
    """
    p = pipeline_parallel
    if p <= 1 or layers % p == 0:
        return ()
    base, extra = divmod(layers, p)
    return tuple(base + 1 if stage < extra else base for stage in range(p))


def heaviest_stage_layers(layers: int, pipeline_parallel: int) -> int:
    """Transformer layers on the most loaded pipeline stage: ceil(L/p).

    The pipeline runs at the pace of its slowest stage and the memory check is for the fullest
    GPU, so both price this stage (with the first stage's embedding, see
    ``model_parallel_params``).
    """
    return -(-layers // max(1, pipeline_parallel))


# The Hugging Face config keys that count a mixture of experts' routed experts.
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def routed_experts(model: ModelSpec) -> int:
    """Routed experts per MoE layer (1: a dense model)."""
    cfg = model.hf_config or {}
    return max([1, *(int(cfg[k]) for k in EXPERT_KEYS if isinstance(cfg.get(k), int))])


def expert_params(model: ModelSpec) -> int:
    """Parameters of the routed experts' MLPs: L x E x (3 if gated else 2) x h x i (0: dense).

    Mixtral 8x7B: 32 x 8 x 3 x 4096 x 14336 = 45.1 B of its 46.7 B. The width is the
    experts' (``moe_intermediate_size`` where the config has one, else the MLP's).
    """
    experts = routed_experts(model)
    if experts <= 1:
        return 0
    cfg = model.hf_config or {}
    width = int(cfg.get("moe_intermediate_size") or model.intermediate or 4 * model.hidden)
    gated = 3 if str(cfg.get("hidden_act", "silu")) in ("silu", "swiglu") else 2
    return min(model.params, model.layers * experts * gated * model.hidden * width)


def stage_expert_params(
    model: ModelSpec, tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> int:
    """The routed experts' parameters on the busiest GPU under t x p, before expert parallelism.

    ``expert_params`` counts every layer's experts; a pipeline stage holds ceil(L/p) of the L
    layers' (Narayanan et al. 2021 sec. 2.2, as ``model_parallel_params``) and tensor
    parallelism splits each expert's matrices t ways. Without the stage share, a stage's
    parameters less the whole model's experts went negative under pipelining (issue 30).
    """
    experts = expert_params(model)
    if not experts:
        return 0
    layers = max(1, model.layers)
    stage = -(-experts * heaviest_stage_layers(layers, pipeline_parallel) // layers)
    return math.ceil(stage / tensor_parallel)


def params_per_rank(
    model: ModelSpec, tensor_parallel: int = 1, pipeline_parallel: int = 1, expert_parallel: int = 1
) -> int:
    """Parameters one GPU holds and reduces over data parallelism.

    Its stage and shard, with only 1/e of its stage's experts under e-way expert parallelism
    (DeepSpeed-MoE, Rajbhandari et al. 2022 sec. 4: each rank keeps E/e of every MoE layer's
    experts).
    """
    here = model_parallel_params(model, tensor_parallel, pipeline_parallel)[0]
    if expert_parallel <= 1:
        return here
    experts = min(here, stage_expert_params(model, tensor_parallel, pipeline_parallel))
    return here - experts + experts // expert_parallel


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

    ``framework`` relaxes what its own pipeline supports: torchtitan shards a pipeline's stages
    with FSDP2 (any ZeRO stage without offload).

    Megatron-LM's constraints (Narayanan et al. 2021 sec. 3.3 for t within a node): t divides
    the attention heads and the key-value heads, t x p divides the GPUs. p need not divide the
    layers: every pipeline a plan runs (Megatron-DeepSpeed's DeepSpeed ``PipelineModule``,
    torchtitan) splits them unevenly (``pipeline_split``; the heaviest stage takes ceil(L/p)),
    but every stage needs a layer. Pipelines combine with ZeRO-1 at most (DeepSpeed's
    PipelineEngine); offload is not combined.
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
    if p > model.layers:
        raise InputError(
            "pipeline_parallel", f"{p} stages exceed the {model.layers} layers of the model"
        )
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
    Megatron puts the input embedding on the first stage and the output layer on the last
    (megatron/core/models/gpt/gpt_model.py at core_v0.6.0: ``self.embedding`` only when
    ``pre_process``, ``self.output_layer`` only when ``post_process``), so the heaviest stage
    holds (Ψ - e·V·h)·ceil(L/p)/L + V·h, e the embedding matrices Ψ counts: 2 for a model with
    untied embeddings (``tie_word_embeddings`` false in its config: the output layer is not in
    the body the stages share), else 1 (the first stage is one of the longer ones where p does
    not divide L, ``pipeline_split``). Counting the untied output layer in the body overstated
    the first stage by V·h/p (Llama 3 8B at p = 2: 0.26 B parameters, 2.2 GiB with Megatron's
    6 + 12/d bytes each; issue 30). Replicated layer norms are left out (a few hidden-sized
    vectors per layer).
    """
    t, p = tensor_parallel, pipeline_parallel
    stage = model.params
    if p > 1:
        embedding = model.vocab * model.hidden
        untied = (model.hf_config or {}).get("tie_word_embeddings") is False
        body = max(0, model.params - embedding * (2 if untied else 1))
        layers = max(1, model.layers)
        heaviest = min(layers, heaviest_stage_layers(layers, p))
        stage = -(-body * heaviest // layers) + min(embedding, model.params)
    return math.ceil(stage / t), math.ceil(model.largest_layer_params / t)


def model_parallel_setups(
    model: ModelSpec, hardware: HardwareSpec, names: list[StrategyName]
) -> list[tuple[StrategyName, int, int]]:
    """Every valid (strategy, t, p) with t x p > 1 among ``names``, smallest t x p first.

    t from ``TENSOR_PARALLEL_CANDIDATES`` (within a node, dividing heads and key-value heads),
    p up to the layers (uneven stages, ``pipeline_split``), t x p dividing the GPUs; pipelines
    take ZeRO-1 only.
    """
    world = hardware.world_size
    setups: list[tuple[StrategyName, int, int]] = []
    for tp in TENSOR_PARALLEL_CANDIDATES:
        for pp in range(1, min(model.layers, world) + 1):
            if tp * pp == 1 or world % (tp * pp):
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
