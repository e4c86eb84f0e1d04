"""Model states per GPU: parameters, gradients and optimizer states under DDP, ZeRO-1/2/3, offload.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", sec. 3.1 and 5 (2Ψ + 2Ψ + KΨ with K = 12 for mixed-precision Adam), and DeepSpeed's
implementation (``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``), whose own
estimators ``estimate_zero2_model_states_mem_needs`` and ``estimate_zero3_model_states_mem_needs``
the tests compare against. The ZeRO bucket sizes live here too: the estimate and the emitted
DeepSpeed config must use the same ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, ModelSpec, ResolvedPrecision
from tools.core.strategies import OFFLOAD_STRATEGIES, StrategyName, check_strategy
from tools.research.architectures import GATED_MLP_FAMILIES as GATED_MLP_FAMILIES

# ZeRO-1/2 bucket size we emit: DeepSpeed's default is 5e8 elements, which with overlap_comm
# costs ~9 GB (HF DeepSpeed guide: 5e8 x 2 bytes x 2 x 4.5); 2e8 is the guide's advice.
ZERO12_BUCKET_ELEMENTS = 200_000_000
# DeepSpeed ZeRO-3 defaults (zero/config.py): sub_group_size, stage3_max_live_parameters and
# stage3_max_reuse_distance.
SUB_GROUP_SIZE = 1_000_000_000
MAX_LIVE_PARAMETERS = 1_000_000_000
MAX_REUSE_DISTANCE = 1_000_000_000

DEFAULT_LORA_RANK = 16
# The linear projections of one transformer layer an adapter can sit on (PEFT target names).
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
DEFAULT_LORA_TARGETS = LORA_TARGETS
# Families whose attention projects q, k and v with one linear layer (GPT-2's c_attn, Phi-3's
# qkv_proj, Falcon's and GPT-NeoX's query_key_value), and whose gate and up are one layer
# (Phi-3's gate_up_proj): an adapter there is one r x (d_in + d_out) pair (peft's all-linear).
FUSED_QKV_FAMILIES = frozenset({"gpt2", "phi3", "falcon", "gpt_neox", "bloom"})
FUSED_GATE_UP_FAMILIES = frozenset({"phi3"})
# Optimizer state bytes per trainable parameter (ZeRO paper sec. 3.1: Adam's momentum and
# variance in fp32; SGD with momentum keeps one fp32 buffer; 8-bit Adam keeps both moments
# block-wise quantized to one byte each, Dettmers et al. 2022, "8-bit Optimizers via Block-wise
# Quantization", whose per-block scales add well under 1%).
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 4, "adam8bit": 2}


@dataclass(frozen=True)
class ModelStates:
    """Model-state bytes by sub-term: resident on each GPU, and held in CPU memory per rank.

    Keys: ``params`` (working weights, or their ZeRO-3 partition), ``gathered_params`` (ZeRO-3:
    the largest layer gathered for compute), ``grads`` (gradients at the training precision),
    ``gathered_grads`` (ZeRO-3: the largest layer's full gradients before reduce-scatter),
    ``grads_fp32`` (the fp32 gradient copy DeepSpeed's mixed-precision optimizers step on),
    ``master_params`` (fp32 master weights), ``optimizer_moments`` (Adam m and v).
    """

    gpu: dict[str, int] = field(default_factory=dict)
    cpu_per_rank: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ZeroSettings:
    """The ZeRO bucket and threshold sizes (elements) shared by the estimate and the config."""

    reduce_bucket_size: int
    allgather_bucket_size: int
    prefetch_bucket_size: int
    param_persistence_threshold: int
    max_live_parameters: int
    sub_group_size: int
    max_reuse_distance: int = 0


def zero_settings(model: ModelSpec, strategy: StrategyName) -> ZeroSettings:
    """ZeRO bucket sizes for ``model``: what we estimate with and what the DeepSpeed config says."""
    hidden_sq = model.hidden * model.hidden
    if strategy.startswith("zero3"):
        # The Hugging Face integration's "auto" values (transformers/integrations/deepspeed.py):
        # reduce bucket hidden^2, prefetch 0.9 * hidden^2, persistence threshold 10 * hidden.
        return ZeroSettings(
            reduce_bucket_size=hidden_sq,
            allgather_bucket_size=hidden_sq,
            prefetch_bucket_size=int(0.9 * hidden_sq),
            param_persistence_threshold=10 * model.hidden,
            max_live_parameters=MAX_LIVE_PARAMETERS,
            sub_group_size=SUB_GROUP_SIZE,
            max_reuse_distance=MAX_REUSE_DISTANCE,
        )
    # A bucket larger than the model only wastes memory.
    bucket = max(1, min(ZERO12_BUCKET_ELEMENTS, model.params))
    return ZeroSettings(
        reduce_bucket_size=bucket,
        allgather_bucket_size=bucket,
        prefetch_bucket_size=0,
        param_persistence_threshold=0,
        max_live_parameters=0,
        sub_group_size=SUB_GROUP_SIZE,
    )


def zero3_kept_gathered(params: int, reuse_distance: int) -> int:
    """Parameters (elements) ZeRO-3 keeps gathered where forward turns into backward.

    DeepSpeed's partitioned_param_coordinator.py ``__params_to_release`` (v0.11.1 lines 489-498,
    the same in 0.16): after a module runs, its parameters stay gathered if the module recurs
    within the next ``stage3_max_reuse_distance`` elements of the recorded trace. The trace
    runs forward and back again, so a module near the end of forward recurs in backward after
    twice the parameters that follow it: at the turn, when the activations peak, the last R/2
    parameters are still gathered (all of them in a model under R/2). Simulating that rule
    over Llama 2 7B's modules with R = 1e9 keeps 502M. ``stage3_max_live_parameters`` only
    caps prefetching (``fetch_sub_module``), not this.
    """
    return min(params, reuse_distance // 2)


def resolve_precision(precision: str, hardware: HardwareSpec) -> ResolvedPrecision:
    """Resolve ``auto`` (and CPU-only machines) to the precision training will really use."""
    if hardware.gpu is None:
        # CPU training runs fp32 here: mixed precision on CPU saves little and DeepSpeed's CPU
        # accelerator support for 16-bit optimizers is partial.
        return "fp32"
    if precision == "auto":
        # bf16 where the GPU has bf16 tensor cores (A100/H100-class); V100/T4 only fp16.
        return "bf16" if hardware.gpu.bf16_tflops else "fp16"
    if precision not in ("bf16", "fp16", "fp32"):
        raise InputError(
            "precision", f"unknown precision {precision!r}; use bf16, fp16, fp32 or auto"
        )
    return precision  # type: ignore[return-value]


def head_dim(model: ModelSpec) -> int:
    """Per-head width: the config's ``head_dim`` (or T5's ``d_kv``), else hidden / heads.

    Some models give their heads an explicit width, so the attention's width (heads x
    head_dim) is not the hidden size: Gemma 2 2B runs 8 x 256 = 2048 against a hidden size of
    2304, openai/gpt-oss-120b 64 x 64 = 4096 against 2880 (each model's config.json).
    """
    config = model.hf_config or {}
    for key in ("head_dim", "d_kv"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return model.hidden // model.heads


def lora_adapter_params(
    model: ModelSpec,
    rank: int = DEFAULT_LORA_RANK,
    targets: tuple[str, ...] = DEFAULT_LORA_TARGETS,
) -> int:
    """Trainable LoRA parameters for rank ``rank`` adapters on the ``targets`` projections.

    Hu et al. 2021 ("LoRA", sec. 4): an adapter on a d_in x d_out weight adds r * (d_in + d_out)
    parameters. k and v project to kv_heads * head_dim under grouped-query attention. The MLP
    projections are gate/up (h -> i) and down (i -> h) in llama-style gated layers; a GPT-style
    MLP has up and down only (``gate`` adds nothing there). A mixture of experts adapts every
    expert's MLP. The default is every linear projection of a layer, as the QLoRA paper
    (Dettmers et al. 2023, sec. 4) found necessary to match full fine-tuning.
    """
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if unknown:
        raise InputError("lora_targets", f"unknown projections {unknown}; use {LORA_TARGETS}")
    h = model.hidden
    config = model.hf_config or {}
    q_dim = model.heads * head_dim(model)
    kv_dim = (model.kv_heads or model.heads) * head_dim(model)
    inter = model.intermediate or 4 * h
    gated = str(config.get("model_type", "")) in GATED_MLP_FAMILIES and bool(model.intermediate)
    experts = 1
    for key in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        if isinstance(config.get(key), int) and config[key] > 1:
            experts = config[key]
            break
    sides = {
        "q": h + q_dim,
        "k": h + kv_dim,
        "v": h + kv_dim,
        "o": q_dim + h,
        "gate": (h + inter) * experts if gated else 0,
        "up": (h + inter) * experts,
        "down": (inter + h) * experts,
    }
    chosen = dict.fromkeys(targets)
    total = sum(sides[t] for t in chosen)
    family = str(config.get("model_type", ""))
    if family in FUSED_QKV_FAMILIES and {"q", "k", "v"} & set(chosen):
        # One linear layer projects q, k and v, and one adapter covers it: r * (h + h + 2 kv).
        total += h + q_dim + 2 * kv_dim - sum(sides[t] for t in ("q", "k", "v") if t in chosen)
    if family in FUSED_GATE_UP_FAMILIES and {"gate", "up"} & set(chosen):
        # gate and up as one h -> 2i layer: r * (h + 2i), not 2 r (h + i).
        total += (h + 2 * inter) * experts - sum(sides[t] for t in ("gate", "up") if t in chosen)
    return model.layers * rank * total


def model_state_bytes(
    total_params: int,
    trainable_params: int,
    largest_layer_params: int,
    world_size: int,
    strategy: StrategyName,
    *,
    precision: ResolvedPrecision = "bf16",
    optimizer: str = "adamw",
    sub_group_size: int | None = SUB_GROUP_SIZE,
    largest_layer_trainable_params: int | None = None,
) -> ModelStates:
    """Bytes of parameters, gradients and optimizer state per GPU (and per rank on CPU).

    Args:
        total_params: All parameters (Ψ), frozen ones included.
        trainable_params: Parameters that get gradients and optimizer state (Ψ, or the LoRA
            adapters; 0 for inference).
        largest_layer_params: Parameters of the largest single module (ZeRO-3 gathers it whole).
        world_size: Data-parallel ranks (N_d in the ZeRO paper).
        strategy: One of ``STRATEGY_ORDER``.
        precision: ``bf16``/``fp16`` (mixed precision with fp32 master weights) or ``fp32``.
        optimizer: ``adamw``/``adam`` (8 bytes of state per parameter) or ``sgd`` (4).
        sub_group_size: ZeRO-3 converts gradients to fp32 one sub-group of this many elements
            at a time; ``None`` counts the whole partition at once, as DeepSpeed's estimator does.
        largest_layer_trainable_params: Trainable parameters of that largest layer (defaults to
            all of it when training everything, none otherwise).
    """
    strategy = check_strategy(strategy)
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise InputError(
            "optimizer",
            f"unknown optimizer {optimizer!r}; choose from {sorted(OPTIMIZER_STATE_BYTES)}",
        )
    n = max(1, world_size)
    mixed = precision in ("bf16", "fp16")
    weight_bytes = 2 if mixed else 4
    shard_params = strategy.startswith("zero3")
    shard_grads = strategy.startswith(("zero2", "zero3"))
    shard_optimizer = strategy != "ddp"
    offload_optimizer = strategy in OFFLOAD_STRATEGIES
    offload_params = strategy == "zero3_offload_all"
    trainable = trainable_params
    if largest_layer_trainable_params is None:
        largest_layer_trainable_params = largest_layer_params if trainable >= total_params else 0

    def part(count: int, sharded: bool) -> int:
        # ZeRO pads partitions to equal size, so each rank holds ceil(count / N).
        return math.ceil(count / n) if sharded else count

    gpu: dict[str, int] = {}
    cpu: dict[str, int] = {}
    # ZeRO paper sec. 3.1: 2Ψ for 16-bit weights (4Ψ in fp32); sec. 5.3: stage 3 keeps 1/N_d.
    (cpu if offload_params else gpu)["params"] = weight_bytes * part(total_params, shard_params)
    if shard_params:
        # stage3.py gathers each module's full weights before its forward/backward; the
        # largest one bounds this (DeepSpeed's estimator: 4 * largest_layer_params for 16-bit
        # params plus grads).
        gpu["gathered_params"] = weight_bytes * largest_layer_params
    if trainable:
        # ZeRO paper sec. 3.1: 2Ψ for 16-bit gradients; sec. 5.2: stage 2 keeps 1/N_d.
        grads = weight_bytes * part(trainable, shard_grads)
        if strategy == "zero2_offload_optimizer":
            # stage_1_and_2.py (cpu_offload): reduced buckets are copied straight into the
            # pinned fp32 gradient partition on CPU; no 16-bit partition stays on the GPU.
            grads = 0
        if grads:
            # stage3.py grad_partitions_flat_buffer lives on self.device: CPU when offloading.
            (cpu if strategy.startswith("zero3") and offload_optimizer else gpu)["grads"] = grads
        if shard_params:
            gpu["gathered_grads"] = weight_bytes * largest_layer_trainable_params
        if mixed:
            # DeepSpeed's 16-bit optimizers step on an fp32 copy of the gradients (FP16_/
            # BF16_Optimizer; stage_1_and_2.py single_partition_of_fp32_groups[i].grad;
            # stage3.py _prepare_fp32_grad_for_sub_group, one sub-group at a time). The
            # ZeRO paper's K=12 leaves this out; DeepSpeed's estimators count it (18 = 2+4+12).
            fp32_grads = part(trainable, shard_optimizer)
            if strategy == "zero3" and sub_group_size is not None:
                fp32_grads = min(fp32_grads, sub_group_size)
            (cpu if offload_optimizer else gpu)["grads_fp32"] = 4 * fp32_grads
        # ZeRO paper sec. 3.1, K=12 for mixed-precision Adam: fp32 master weights (4) + momentum
        # and variance (8); sec. 5.1: stage 1 partitions them. In fp32, DDP steps the weights
        # in place, but ZeRO still clones an fp32 partition (stage_1_and_2.py weights_partition,
        # stage3.py fp32_partitioned_groups_flat).
        if mixed or shard_optimizer:
            (cpu if offload_optimizer else gpu)["master_params"] = 4 * part(
                trainable, shard_optimizer
            )
        (cpu if offload_optimizer else gpu)["optimizer_moments"] = OPTIMIZER_STATE_BYTES[
            optimizer
        ] * part(trainable, shard_optimizer)
    return ModelStates(gpu=gpu, cpu_per_rank=cpu)
