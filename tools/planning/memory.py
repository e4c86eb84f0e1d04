"""Per-GPU memory estimates for DDP, ZeRO-1/2/3 and ZeRO-Offload, and with tensor/pipeline parallelism.

Data-parallel strategies alone, or under Megatron-style tensor and pipeline parallelism.

Pure arithmetic on a ``ModelSpec`` and a ``HardwareSpec``; nothing here imports torch or
DeepSpeed, so the engineer agent can compare every strategy in microseconds.

Sources, cited again at each term:

- Model states: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", sec. 3.1 and 5 (2Ψ + 2Ψ + KΨ with K = 12 for mixed-precision Adam), and
  DeepSpeed's implementation (``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``),
  whose own estimators ``estimate_zero2_model_states_mem_needs`` and
  ``estimate_zero3_model_states_mem_needs`` the tests compare against.
- Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", eq. 1 (no parallelism), sec. 4.1 (full recomputation), sec. 4.2.2
  (tensor + sequence parallelism divide a layer's activations by t) and sec. 4.2.3 (with the
  1F1B pipeline schedule the first stage holds p micro-batches of its L/p layers).
- Tensor and pipeline parallelism: Narayanan et al. 2021, "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM" (sec. 2.2-2.3: each GPU holds 1/(t*p) of the
  weights; sec. 3: tensor groups stay inside a node).
- Buffers: DeepSpeed's ZeRO config defaults (``deepspeed/runtime/zero/config.py``) and the
  reduce buckets its ZeRO-1/2 optimizer allocates (``stage_1_and_2.py`` setup_buckets).
- Liveness: activations and gradients are not counted at full size together (PyTorch autograd
  frees saved tensors as backward produces gradients).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from tools.core.errors import InputError
from tools.core.schemas import (
    HardwareSpec,
    MemoryBreakdown,
    MemoryPlan,
    ModelSpec,
    StrategyEstimate,
    StrategyName,
    Task,
    TrainingBrief,
)
from tools.core.strategies import OFFLOAD_STRATEGIES, STRATEGY_ORDER, check_strategy

ResolvedPrecision = Literal["bf16", "fp16", "fp32"]

# Vendors quote GPU memory in decimal GB ("80GB"); 80e9 bytes is ~7% under the 80 GiB an
# A100-80GB has, which leaves room for what the driver and ECC reserve.
GB = 1_000_000_000

# PyTorch + CUDA 12 context with cuBLAS/NCCL workspaces: measured 0.5-1 GB; we take the middle.
CUDA_CONTEXT_BYTES = 750_000_000
# Caching-allocator fragmentation: PyTorch rarely returns all freed blocks to a usable pool.
FRAGMENTATION_MARGIN = 0.10

# ZeRO-1/2 bucket size we emit: DeepSpeed's default is 5e8 elements, which with overlap_comm
# costs ~9 GB (HF DeepSpeed guide: 5e8 x 2 bytes x 2 x 4.5); 2e8 is the guide's advice.
ZERO12_BUCKET_ELEMENTS = 200_000_000
# Reduce buffers DeepSpeed's ZeRO-1/2 optimizer allocates with overlap_comm (double buffering).
OVERLAP_BUFFERS = 2
# deepspeed/runtime/engine.py MEMORY_OPT_ALLREDUCE_SIZE: the stage-0 gradient all-reduce bucket.
DDP_ALLREDUCE_BUCKET_ELEMENTS = 500_000_000
# DeepSpeed ZeRO-3 defaults (zero/config.py): sub_group_size and stage3_max_live_parameters.
SUB_GROUP_SIZE = 1_000_000_000
MAX_LIVE_PARAMETERS = 1_000_000_000
# DeepSpeed's estimators' additional_buffer_factor for CPU memory: pinned staging copies
# (e.g. stage_1_and_2.py's param_buffer_of_bit16_for_cpu_offload_groups) and allocator slack.
CPU_BUFFER_FACTOR = 1.5
# Offload must leave this share of the node's RAM to the OS, the page cache, data-loader
# workers and each rank's own process (the same line as the GPU headroom in tools/planning/search.py).
CPU_RAM_HEADROOM = 0.10
# A described cluster ("2x8xH100-80GB") says nothing about host RAM. Assumed: twice the node's
# GPU memory, a common server sizing rule (DGX H100: 2 TB for 640 GB of GPU memory; DGX A100:
# 1-2 TB for 320-640 GB; cloud 8-GPU instances 1.1-2 TB), and at least a 64 GB workstation.
ASSUMED_RAM_PER_GPU_MEMORY = 2.0
MIN_ASSUMED_NODE_RAM_GB = 64.0

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

DEFAULT_LORA_RANK = 16
# Optimizer state bytes per trainable parameter (ZeRO paper sec. 3.1: Adam's momentum and
# variance in fp32; SGD with momentum keeps one fp32 buffer; 8-bit Adam keeps both moments
# block-wise quantized to one byte each, Dettmers et al. 2022, "8-bit Optimizers via Block-wise
# Quantization", whose per-block scales add well under 1%).
# Attention kernels the activation model knows (activation_bytes).
ATTENTION_KERNELS = ("sdpa", "eager")
# Families whose layers are RMSNorm + a gated SiLU/GeLU MLP with no dropout (llama-style).
GATED_MLP_FAMILIES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma", "gemma2", "phi3"}
)
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 4, "adam8bit": 2}

MICRO_BATCH_CANDIDATES = (8, 4, 2, 1)


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


def lora_adapter_params(model: ModelSpec, rank: int = DEFAULT_LORA_RANK) -> int:
    """Trainable LoRA parameters for rank ``rank`` adapters on q, k, v and o projections.

    Hu et al. 2021 ("LoRA", sec. 4): an adapter on a d_in x d_out weight adds r * (d_in + d_out)
    parameters. k and v project to kv_heads * head_dim under grouped-query attention.
    """
    kv_dim = model.hidden * (model.kv_heads or model.heads) // model.heads
    per_layer = rank * (2 * model.hidden + 2 * (model.hidden + kv_dim) + 2 * model.hidden)
    return model.layers * per_layer


def data_parallel_size(
    hardware: HardwareSpec, tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> int:
    """Data-parallel ranks: the world size over the model-parallel degree t x p."""
    return max(1, hardware.world_size // (tensor_parallel * pipeline_parallel))


def check_model_parallel(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    tensor_parallel: int,
    pipeline_parallel: int,
) -> int:
    """Check a tensor x pipeline split of ``model`` on ``hardware``; return the data-parallel size.

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
    if model.layers % p:
        raise InputError("pipeline_parallel", f"{p} must divide the {model.layers} layers")
    if strategy in OFFLOAD_STRATEGIES:
        raise InputError(
            "strategy", f"{strategy} is not combined with tensor/pipeline parallelism here"
        )
    if p > 1 and strategy not in ("ddp", "zero1"):
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


def node_ram_bytes(hardware: HardwareSpec) -> tuple[int, str | None]:
    """Host RAM per node, and the assumption behind it when the hardware spec does not say."""
    if hardware.ram_gb is not None:
        return int(hardware.ram_gb * GB), None
    gpu_gb = (hardware.gpu.memory_gb if hardware.gpu else 0.0) * max(1, hardware.gpus_per_node)
    ram_gb = max(MIN_ASSUMED_NODE_RAM_GB, ASSUMED_RAM_PER_GPU_MEMORY * gpu_gb)
    return int(ram_gb * GB), (
        f"node RAM not given: assumed {ram_gb:g} GB ({ASSUMED_RAM_PER_GPU_MEMORY:g}x the node's "
        f"{gpu_gb:g} GB of GPU memory, a common server sizing, at least "
        f"{MIN_ASSUMED_NODE_RAM_GB:g} GB); offload must leave {CPU_RAM_HEADROOM:.0%} of it free"
    )


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


def layer_coefficient(model: ModelSpec) -> float:
    """Bytes per s*b*h one transformer layer keeps for backward at 16-bit, without the scores.

    34 for GPT-style layers (Korthikanti et al. 2022, eq. 1); 22 + 8*i/h for llama-style
    layers (see ``activation_bytes``).
    """
    config = model.hf_config or {}
    family = str(config.get("model_type", ""))
    if family in GATED_MLP_FAMILIES and model.intermediate:
        return 22 + 8 * model.intermediate / model.hidden
    if config.get("activation_function") == "gelu_new" or family == "gpt2":
        # Hugging Face's NewGELUActivation is composed of elementwise ops, which save the tanh
        # output, the half input and the (1 + tanh) factor besides its input: 3 more 4h-wide
        # 16-bit tensors (+24); the attention kernel also keeps its output (+2).
        return 60.0
    return 34.0


def activation_bytes(
    model: ModelSpec,
    *,
    seq_len: int,
    micro_batch_size: int,
    precision: ResolvedPrecision,
    activation_checkpointing: bool,
    task: Task = "finetune",
    selective_recompute: bool = False,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    micro_batches: int | None = None,
    attention: str = "sdpa",
) -> int:
    """Activation bytes per GPU for one micro batch (Korthikanti et al. 2022, eq. 1).

    ``attention`` is the kernel: ``sdpa`` (PyTorch's scaled_dot_product_attention, the
    Hugging Face default since transformers 4.36, or FlashAttention) keeps no s x s tensors
    (Dao et al. 2022: memory linear in s), so the 5*a*s/h part below is left out; ``eager``
    keeps the scores, at 6 bytes each in 16-bit training (see the code). Measured on an H200 (bench/gpu_check.json, a 1.1B llama at s=2048, b=4): eager
    peaks at 3.2x the sdpa run's memory.

    The per-layer coefficient 34 is Korthikanti's for a GPT layer (LayerNorm, 4h GeLU MLP,
    dropout). Llama-style layers (``GATED_MLP_FAMILIES``: RMSNorm, a gated SiLU MLP of width i,
    no dropout) keep, per s*b*h at 16-bit, as the Hugging Face modeling code saves them for
    backward: 12 for the two RMSNorms (each keeps its fp32 input, 4 bytes, and its 16-bit
    normalised output, 2, which the next projections share), 10 for attention (q, k and v
    repeated to all heads and the output, saved by the attention kernel, 8, plus the output
    projection's input, 2) and 8*i/h for the MLP (gate, SiLU, up and product outputs, i wide):
    22 + 8*i/h, which is 44 for i = 2.75h against 47 measured on the H200. GPT-2 (composite
    tanh GeLU, ``layer_coefficient``) keeps 60 against 66 measured.

    Per transformer layer without recomputation: s*b*h*(34 + 5*a*s/h) bytes at 16-bit (the
    5*a*s/h part is the attention score/softmax/dropout tensors, which FlashAttention-style
    kernels do not store, so this is an upper bound with them). With full activation
    checkpointing (sec. 4.1) each layer keeps only its 16-bit input, 2*s*b*h bytes, plus one
    layer's full activations while it is recomputed. fp32 doubles the 16-bit tensors. The
    logits add s*b*V at the working precision plus the fp32 copy cross-entropy takes
    (Hugging Face ``ForCausalLMLoss`` upcasts logits with ``.float()``).
    Inference keeps a KV cache (2 * layers * s * b * kv_dim) instead of training activations.
    Selective recomputation (sec. 5, Table 2) recomputes only the attention core, so a layer
    keeps 34*s*b*h bytes; memory-efficient attention kernels store about the same.

    Tensor parallelism of degree t is modelled with Megatron's sequence parallelism (sec. 4.2.2):
    every per-layer term, the checkpointed layer inputs and the vocabulary-parallel logits are
    divided by t. Pipeline parallelism of degree p (sec. 4.2.3, 1F1B schedule of Narayanan et
    al. 2021 sec. 2.2.1): a stage runs L/p layers; the first stage holds min(p, m) micro-batches
    in flight (m = ``micro_batches`` per optimizer step, p when not given), the last stage one,
    plus the logits. The larger of the two is the per-GPU peak.
    """
    if attention not in ATTENTION_KERNELS:
        raise InputError("attention", f"must be one of {', '.join(ATTENTION_KERNELS)}")
    s, b, h, a = seq_len, micro_batch_size, model.hidden, model.heads
    t, p = tensor_parallel, pipeline_parallel
    scale = 2 if precision == "fp32" else 1
    act_bytes = 4 if precision == "fp32" else 2
    keeps_scores = attention == "eager" and not selective_recompute
    # Eager attention keeps the softmax output in fp32 (Hugging Face computes it with
    # dtype=torch.float32) and, at 16-bit, its cast that the scores-times-values matmul saves:
    # 6 bytes per score (Korthikanti's 5 assume a 16-bit softmax plus dropout), 4 in fp32.
    score_bytes = (4 if precision == "fp32" else 6) * a * s * s * b if keeps_scores else 0
    one_layer = -(-(int(s * b * layer_coefficient(model) * h) * scale + score_bytes) // t)
    layers = -(-model.layers // p)
    if task in ("inference", "agent-app"):
        kv_dim = h * (model.kv_heads or a) // a
        kv_cache = -(-2 * layers * s * b * kv_dim * act_bytes // t)
        # Generation computes logits for the last position only (transformers logits_to_keep).
        return kv_cache + one_layer + b * model.vocab * 4
    # Per layer and micro-batch: the layer's input under full checkpointing (plus one layer's
    # activations while it is recomputed), else all of them.
    stored = -(-2 * s * b * h * scale // t) if activation_checkpointing else one_layer
    working = one_layer if activation_checkpointing else 0
    # Logits at the working precision (kept in the model output), the fp32 copy Hugging Face's
    # ForCausalLMLoss makes with .float() (none when training in fp32) and the fp32
    # log-softmax that cross-entropy saves for backward, all live during the loss.
    logits = -(-s * b * model.vocab * (act_bytes + (4 if act_bytes < 4 else 0) + 4) // t)
    if p == 1:
        return model.layers * stored + working + logits
    in_flight = min(p, micro_batches or p)
    first_stage = layers * stored * in_flight + working
    last_stage = layers * stored + working + logits
    return max(first_stage, last_stage)


def _buffer_bytes(
    model: ModelSpec,
    strategy: StrategyName,
    *,
    world_size: int,
    precision: ResolvedPrecision,
    on_gpu: bool,
    training: bool,
) -> tuple[int, list[str]]:
    """Communication buckets and the CUDA context, before the fragmentation margin."""
    grad_bytes = 4 if precision == "fp32" else 2
    settings = zero_settings(model, strategy)
    notes: list[str] = []
    total = 0
    if strategy == "ddp":
        if world_size > 1 and training:
            bucket = min(DDP_ALLREDUCE_BUCKET_ELEMENTS, model.params) * grad_bytes
            total += bucket
            notes.append(
                f"all-reduce bucket {bucket / GB:.2f} GB "
                "(DeepSpeed stage 0 buckets of 5e8 elements)"
            )
    elif strategy.startswith("zero3"):
        # Double-buffered reduce bucket with overlap_comm, plus the prefetch bucket.
        reduce = 2 * settings.reduce_bucket_size * grad_bytes if training else 0
        prefetch = settings.prefetch_bucket_size * grad_bytes
        total += reduce + prefetch
        notes.append(
            f"reduce bucket {settings.reduce_bucket_size:,} elements x2 (overlap_comm) and "
            f"prefetch bucket {settings.prefetch_bucket_size:,} elements: "
            f"{(reduce + prefetch) / GB:.2f} GB"
        )
    elif training:
        # DeepSpeed stage_1_and_2.py setup_buckets: a reduce bucket of reduce_bucket_size
        # elements, doubled with overlap_comm, in the gradient-reduction dtype: the fp32
        # accumulator at stage 1, the gradients' 16-bit dtype at stage 2. The all-gather of
        # updated parameters writes into the flat parameter buffer in place (runtime/utils.py
        # all_gather_dp_groups), so allgather_bucket_size adds no memory. (The Hugging Face
        # guide's "4.5x the bucket sizes" for overlap_comm is a rule of thumb; this is the code.)
        reduce_bytes = 4 if strategy.startswith("zero1") else grad_bytes
        bucket = OVERLAP_BUFFERS * settings.reduce_bucket_size * reduce_bytes
        total += bucket
        notes.append(
            f"reduce bucket {settings.reduce_bucket_size:,} elements x{OVERLAP_BUFFERS} "
            f"(overlap_comm) at {reduce_bytes} bytes: {bucket / GB:.2f} GB"
        )
    if on_gpu:
        total += CUDA_CONTEXT_BYTES
        notes.append(f"CUDA context and library workspaces {CUDA_CONTEXT_BYTES / GB:.2f} GB")
    return total, notes


def capacity_bytes(hardware: HardwareSpec) -> int | None:
    """Bytes one rank may use: the GPU's memory, or a CPU rank's share of the node's RAM."""
    if hardware.gpu is not None:
        return int(hardware.gpu.memory_gb * GB)
    if hardware.ram_gb is None:
        return None
    # CPU-only: every rank shares the node's RAM.
    return int(hardware.ram_gb * GB / hardware.world_size)


def estimate_strategy(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    *,
    task: Task = "finetune",
    precision: str = "bf16",
    micro_batch_size: int = 1,
    activation_checkpointing: bool = False,
    optimizer: str = "adamw",
    seq_len: int | None = None,
    lora_rank: int = DEFAULT_LORA_RANK,
    selective_recompute: bool = False,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    gradient_accumulation_steps: int | None = None,
    attention: str = "sdpa",
) -> StrategyEstimate:
    """Estimate per-GPU memory (and CPU memory per node) of one strategy for one micro batch.

    Args:
        model: The architecture, with exact sizes.
        hardware: The target machine or cluster; its world size is the data-parallel degree.
        strategy: ddp, zero1, zero2, zero3, zero2_offload_optimizer, zero3_offload_optimizer or
            zero3_offload_all.
        task: pretrain, finetune, lora (frozen base, rank-``lora_rank`` adapters on q/k/v/o),
            inference or agent-app (both forward only).
        precision: bf16, fp16, fp32 or auto (resolved with the GPU; CPU-only means fp32).
        micro_batch_size: Sequences per GPU per forward pass.
        activation_checkpointing: Whether every transformer layer is recomputed in backward.
        optimizer: adamw, adam, adam8bit or sgd (with momentum).
        seq_len: Tokens per sequence; defaults to ``model.seq_len``.
        lora_rank: Adapter rank for the lora task.
        selective_recompute: Recompute only the attention core (Korthikanti et al. sec. 5).
        attention: The attention kernel, ``sdpa`` (default, also FlashAttention) or ``eager``.
        tensor_parallel: Megatron tensor-parallel degree t (with sequence parallelism).
        pipeline_parallel: Pipeline-parallel degree p (1F1B schedule); ZeRO then shards over
            the world / (t x p) data-parallel ranks.
        gradient_accumulation_steps: Micro-batches per optimizer step, which bounds the
            micro-batches a pipeline's first stage holds in flight (p when not given).
    """
    strategy = check_strategy(strategy)
    if micro_batch_size < 1:
        raise InputError("micro_batch_size", "must be at least 1")
    on_gpu = hardware.gpu is not None
    if not on_gpu and strategy in OFFLOAD_STRATEGIES:
        raise InputError("strategy", f"{strategy} offloads GPU memory to CPU and needs a GPU")
    resolved = resolve_precision(precision, hardware)
    tp, pp = tensor_parallel, pipeline_parallel
    world = check_model_parallel(model, hardware, strategy, tp, pp)  # the data-parallel size
    seq = seq_len or model.seq_len
    training = task in ("pretrain", "finetune", "lora")

    notes: list[str] = []
    # What one GPU holds of the model before ZeRO shards it over the data-parallel ranks.
    params_here, largest_here = model_parallel_params(model, tp, pp)
    share = params_here / model.params if model.params else 1.0
    if tp * pp > 1:
        notes.append(
            f"tensor parallel {tp} x pipeline {pp} x data parallel {world} "
            f"(Megatron-LM, Narayanan et al. 2021): {params_here:,} parameters on the heaviest "
            "stage's GPUs before ZeRO; activations with sequence parallelism"
            + (f" and {pp} micro-batches in flight on the first stage (1F1B)" if pp > 1 else "")
        )
    if task == "lora":
        adapters = lora_adapter_params(model, lora_rank)
        adapters_here = math.ceil(adapters * share)
        total_params, trainable = params_here + adapters_here, adapters_here
        layer_trainable = adapters // model.layers // tp
        notes.append(f"LoRA rank {lora_rank} on q/k/v/o: {adapters:,} trainable parameters")
    elif training:
        total_params, trainable, layer_trainable = params_here, params_here, None
    else:
        total_params, trainable, layer_trainable = params_here, 0, 0
    states = model_state_bytes(
        total_params,
        trainable,
        largest_here,
        world,
        strategy,
        precision=resolved,
        optimizer=optimizer,
        largest_layer_trainable_params=layer_trainable,
    )
    gpu = states.gpu
    params = gpu.get("params", 0) + gpu.get("gathered_params", 0)
    gradients = gpu.get("grads", 0) + gpu.get("gathered_grads", 0) + gpu.get("grads_fp32", 0)
    optimizer_bytes = gpu.get("master_params", 0) + gpu.get("optimizer_moments", 0)
    activations = activation_bytes(
        model,
        seq_len=seq,
        micro_batch_size=micro_batch_size,
        precision=resolved,
        activation_checkpointing=activation_checkpointing,
        task=task,
        selective_recompute=selective_recompute,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        micro_batches=gradient_accumulation_steps,
        attention=attention,
    )
    # Buckets scale with what this GPU's data-parallel group reduces: its model-parallel share.
    # Pipeline send/receive buffers (2 x s*b*h/t 16-bit values) are left to the margin.
    bucket_model = model if tp * pp == 1 else model.model_copy(update={"params": params_here})
    buffers, buffer_notes = _buffer_bytes(
        bucket_model,
        strategy,
        world_size=world,
        precision=resolved,
        on_gpu=on_gpu,
        training=training,
    )
    # Activations and gradients do not peak together: autograd frees each saved tensor once
    # its node's backward has run, while the gradients it produces appear (PyTorch autograd
    # mechanics, "saved tensors"). The forward ends with every activation and no gradient, the
    # backward with every gradient and no activation; the peak holds the larger of the two.
    subtotal = params + optimizer_bytes + max(activations, gradients) + buffers
    if gradients and activations:
        notes.append(
            f"activations ({activations / GB:.2f} GB) and gradients ({gradients / GB:.2f} GB) "
            "are not live together: the peak counts the larger"
        )
    margin = int(FRAGMENTATION_MARGIN * subtotal)
    buffers += margin
    total = subtotal + margin
    notes.extend(buffer_notes)
    notes.append(f"fragmentation margin {margin / GB:.2f} GB (10% of the rest), in buffers")

    cpu_per_node = 0
    if states.cpu_per_rank:
        # DeepSpeed's estimate_zero3_model_states_mem_needs / estimate_zero2_model_states_mem_
        # needs CPU figure: the offloaded states of every rank on the node, x1.5.
        ranks_per_node = max(1, hardware.gpus_per_node)
        cpu_per_node = int(sum(states.cpu_per_rank.values()) * ranks_per_node * CPU_BUFFER_FACTOR)
        notes.append(
            f"CPU per node {cpu_per_node / GB:.1f} GB: offloaded states of {ranks_per_node} ranks "
            "x1.5 (DeepSpeed's additional_buffer_factor for pinned buffers)"
        )

    capacity = capacity_bytes(hardware)
    fits = capacity is None or total <= capacity
    if capacity is None:
        notes.append("memory capacity unknown: fit not checked")
    if cpu_per_node:
        ram, assumed = node_ram_bytes(hardware)
        usable = (1 - CPU_RAM_HEADROOM) * ram
        if assumed:
            notes.append(assumed)
        if cpu_per_node > usable:
            fits = False
            notes.append(
                f"does not fit in CPU RAM: offload needs {cpu_per_node / GB:.0f} GB per node, "
                f"more than {1 - CPU_RAM_HEADROOM:.0%} of the node's {ram / GB:g} GB"
                + (" (assumed)" if assumed else "")
            )
    if strategy != "ddp" and world == 1:
        notes.append("world size 1: ZeRO has nothing to partition across")
    return StrategyEstimate(
        name=strategy,
        per_gpu_bytes=MemoryBreakdown(
            params=params,
            gradients=gradients,
            optimizer=optimizer_bytes,
            activations=activations,
            buffers=buffers,
            total=total,
            not_concurrent=min(activations, gradients),
            margin=margin,
        ),
        cpu_bytes_per_node=cpu_per_node,
        fits=fits,
        micro_batch_size=micro_batch_size,
        notes=notes,
        tensor_parallel=tp,
        pipeline_parallel=pp,
    )


def _micro_batch_candidates(per_rank_batch: int, requested: int | None) -> list[int]:
    if requested is not None:
        if requested < 1 or per_rank_batch % requested:
            raise InputError(
                "micro_batch_size",
                f"{requested} must divide the per-GPU batch of {per_rank_batch} sequences",
            )
        return [requested]
    return [m for m in MICRO_BATCH_CANDIDATES if per_rank_batch % m == 0]


def plan_memory(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    *,
    micro_batch_size: int | None = None,
    activation_checkpointing: bool | None = None,
    strategies: list[str] | None = None,
) -> MemoryPlan:
    """Estimate every strategy and choose the simplest that fits, with micro batch and accumulation.

    Args:
        model: The architecture, with exact sizes.
        hardware: The target machine or cluster.
        brief: The training brief (task, seq_len, global_batch_size, precision).
        micro_batch_size: Force this micro batch instead of searching 8, 4, 2, 1.
        activation_checkpointing: Force checkpointing on or off instead of trying off first.
        strategies: Only consider these strategies (names as in ``STRATEGY_ORDER``).
    """
    world = hardware.world_size
    global_batch = brief.global_batch_size
    if global_batch % world:
        lower = max(world, global_batch // world * world)
        raise InputError(
            "global_batch_size",
            f"{global_batch} sequences per step must be a multiple of the data-parallel world "
            f"size {world} (nodes x GPUs per node); try {lower} or {lower + world}",
        )
    per_rank = global_batch // world
    micro_candidates = _micro_batch_candidates(per_rank, micro_batch_size)
    precision = resolve_precision(brief.precision, hardware)

    names = [check_strategy(s) for s in strategies] if strategies else list(STRATEGY_ORDER)
    names = sorted(set(names), key=STRATEGY_ORDER.index)
    assumptions: list[str] = []
    if hardware.gpu is None:
        skipped = [s for s in names if s in OFFLOAD_STRATEGIES]
        names = [s for s in names if s not in OFFLOAD_STRATEGIES]
        if skipped:
            assumptions.append("CPU-only machine: offload strategies do not apply")
        if not names:
            raise InputError("strategies", "offload strategies need a GPU; this machine has none")

    def estimate(name: StrategyName, micro: int, ckpt: bool) -> StrategyEstimate:
        return estimate_strategy(
            model,
            hardware,
            name,
            task=brief.task,
            precision=precision,
            micro_batch_size=micro,
            activation_checkpointing=ckpt,
            seq_len=brief.seq_len,
        )

    def best_micro(name: StrategyName, ckpt: bool) -> StrategyEstimate:
        for micro in micro_candidates:
            est = estimate(name, micro, ckpt)
            if est.fits:
                return est
        return est  # the smallest micro batch, which does not fit either

    # Checkpointing costs ~1/3 more compute (Korthikanti et al. sec. 4.1), so it is the last
    # resort; among strategies the simplest wins, then the largest micro batch it allows.
    ckpt_options = (
        [activation_checkpointing] if activation_checkpointing is not None else [False, True]
    )
    chosen: StrategyEstimate | None = None
    ckpt = ckpt_options[-1]
    for option in ckpt_options:
        for name in names:
            est = best_micro(name, option)
            if est.fits:
                chosen, ckpt = est, option
                break
        if chosen is not None:
            break

    estimates = [best_micro(name, ckpt) for name in names]
    if chosen is None:
        chosen = min(estimates, key=lambda e: e.per_gpu_bytes.total)
        assumptions.append(
            f"nothing fits: {chosen.name} has the smallest footprint "
            f"({chosen.per_gpu_bytes.total / GB:.1f} GB per device); it does not fit either"
        )
    else:
        chosen = next(e for e in estimates if e.name == chosen.name)

    capacity = capacity_bytes(hardware)
    device = (
        f"{hardware.gpu.name} {hardware.gpu.memory_gb:g} GB (decimal GB, as vendors quote)"
        if hardware.gpu is not None
        else f"CPU RAM {hardware.ram_gb} GB shared by {world} rank(s)"
    )
    how_precision = (
        f"precision {precision}"
        + (" (auto)" if brief.precision == "auto" else "")
        + (
            f" (asked {brief.precision}; CPU-only runs fp32)"
            if precision != brief.precision and brief.precision != "auto"
            else ""
        )
    )
    assumptions.extend(
        [
            f"capacity per device: {device}",
            how_precision,
            f"data-parallel world size {world}; seq_len {brief.seq_len}; global batch "
            f"{global_batch} = micro {chosen.micro_batch_size} x accumulation "
            f"{per_rank // chosen.micro_batch_size} x {world}",
            "model states: ZeRO paper (2+2+12 bytes/param for mixed-precision Adam) plus the "
            "fp32 gradient copy DeepSpeed steps on (4 bytes/param, partitioned like the optimizer)",
            "activations: Korthikanti et al. 2022 eq. 1 with the SDPA/FlashAttention kernel "
            "(no s x s scores; llama-style layers 22 + 8·i/h per s·b·h instead of 34), full "
            "checkpointing keeps 2·s·b·h per layer; activations and gradients are not live "
            "together, so the peak counts the larger",
            "logits: 16-bit logits, the fp32 copy and the fp32 log-softmax cross-entropy saves (s·b·V·(2+4+4) bytes)",
            f"buffers: ZeRO-1/2 reduce bucket {ZERO12_BUCKET_ELEMENTS:.0e} elements x2 with "
            "overlap_comm; ZeRO-3 buckets from hidden size as the HF integration sets them; "
            f"CUDA context {CUDA_CONTEXT_BYTES / GB:.2f} GB; "
            f"fragmentation margin {FRAGMENTATION_MARGIN:.0%} of the total",
            "ZeRO-3 assumes the model is built under deepspeed.zero.Init "
            "(Hugging Face does this for stage 3)",
        ]
    )
    if hardware.gpu is not None and any(n in OFFLOAD_STRATEGIES for n in names):
        ram, assumed = node_ram_bytes(hardware)
        assumptions.append(
            assumed
            or f"offload: CPU states per node (DeepSpeed's estimator figure, x1.5) must fit in "
            f"{1 - CPU_RAM_HEADROOM:.0%} of the node's {ram / GB:g} GB RAM"
        )
    if brief.seq_len > model.seq_len:
        assumptions.append(f"seq_len {brief.seq_len} exceeds the model's {model.seq_len} positions")
    if ckpt and chosen.fits and activation_checkpointing is None:
        assumptions.append("activation checkpointing is needed: nothing fits without it")

    return MemoryPlan(
        strategies=estimates,
        chosen=chosen.name,
        micro_batch_size=chosen.micro_batch_size,
        gradient_accumulation_steps=per_rank // chosen.micro_batch_size,
        activation_checkpointing=ckpt,
        capacity_bytes=capacity,
        assumptions=assumptions,
    )
