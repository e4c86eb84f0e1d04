"""The inference plan: weights plus KV cache per GPU, the serving engine's parallelism, its speed.

Pure arithmetic on a ``ModelSpec`` and a ``HardwareSpec``, like ``memory`` and ``speed``: no
torch, no engine. An inference plan has no training config and no training smoke run.

Memory per GPU (decimal GB, as vendors quote device memory):

- weights = params x bytes per parameter (bf16/fp16 2, fp8/int8 1, int4 0.5), split over the
  tensor x pipeline group. Every expert of a mixture of experts is resident.
- KV cache (Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving
  with PagedAttention", sec. 2.2/3: a K and a V vector per layer per token): per token
  2 x layers x kv_heads x head_dim x bytes; grouped-query attention stores kv_heads, not
  heads. Under tensor parallelism each GPU holds kv_heads / TP of them (vLLM replicates a KV
  head when TP exceeds kv_heads, so never fewer than one). Budget = per token x context x
  concurrency.
- activation and workspace allowance: vLLM sizes the KV cache after a profile forward pass of
  ``max_num_batched_tokens`` tokens; modelled as that many tokens x (4 x hidden + 2 x
  intermediate / TP) x 2 bytes, the sampler's fp32 logits (concurrency x vocab x 4) and 1 GB
  of CUDA graphs, NCCL and cuBLAS workspace.
- the engine may use ``gpu_memory_utilization`` of each device: 0.9 is vLLM's default
  (https://docs.vllm.ai/en/latest/serving/engine_args.html, ``--gpu-memory-utilization``);
  the same 10% headroom is kept for TGI and DeepSpeed-Inference.

Parallelism: the smallest tensor-parallel degree inside a node whose weights + KV budget +
allowance fit, among the degrees that divide the node's GPUs and the attention heads (vLLM
requires ``num_attention_heads % tensor_parallel_size == 0``; KV heads divide TP or TP divides
them); pipeline parallelism across nodes only when a whole node's TP does not fit (vLLM's
distributed serving guide: "tensor parallel size = GPUs per node, pipeline parallel size =
nodes", https://docs.vllm.ai/en/latest/serving/distributed_serving.html). GPUs left over run
more replicas of the engine.

Speed (Pope et al. 2022, "Efficiently Scaling Transformer Inference", sec. 2-3: decode is
memory-bandwidth bound at small batch, prefill compute bound):

- decode step = max(memory, compute) + communication, where memory = (weights / TP + batch x
  mean context x KV bytes per token / TP) / (HBM bandwidth x efficiency), compute = 2 x active
  params x batch / (TP x PP x peak x efficiency), and communication = 2 all-reduces of
  batch x hidden x 2 bytes per layer (Shoeybi et al. 2019, fig. 4), ring 2(t-1)/t over the
  GPU link, plus a fixed latency per all-reduce, plus one activation send per pipeline hop.
- time to first token = (2 x active params x P + 2 x layers x hidden x P^2) / (TP x peak x
  efficiency) for a prompt of P tokens (causal attention halves the 4·L·h·P^2 of PaLM,
  Chowdhery et al. 2022 app. B), plus its TP all-reduces.

The speed is computed in tools/planning/serving_speed.py; the engine and its launch command come
from tools/planning/serving_engine.py.
"""

from __future__ import annotations

from math import ceil

from tools.core.inference_types import InferencePlan, ServingEngine, WeightDtype
from tools.core.schemas import FrameworkChoice, FrameworkId, HardwareSpec, ModelSpec, TrainingBrief
from tools.planning.memory import GB
from tools.planning.serve_flags import INT8_CHECKPOINT
from tools.planning.serving_engine import ENGINE_NAMES, engine_for, hf_id_of, serving_command
from tools.planning.serving_speed import serving_speed
from tools.planning.states import head_dim

WEIGHT_BYTES: dict[str, float] = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
KV_BYTES = 2  # bf16/fp16 KV cache (vLLM's kv_cache_dtype "auto" follows the model dtype)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default
DEFAULT_CONTEXT = 8192  # capped by the model's own position limit
DEFAULT_CONCURRENCY = 16
# vLLM's max_num_batched_tokens for online serving with chunked prefill (the profile run).
PROFILE_TOKENS = 8192
FIXED_WORKSPACE_BYTES = 1 * GB

# Encoders: no autoregressive decode, so no KV cache to keep between steps.
ENCODER_TYPES = frozenset(
    {"bert", "roberta", "distilbert", "albert", "electra", "deberta", "vit", "deit", "convnext"}
)
SOURCES = [
    "vLLM engine arguments: --gpu-memory-utilization (default 0.9), --tensor-parallel-size, "
    "--pipeline-parallel-size, --max-model-len, --max-num-seqs "
    "(https://docs.vllm.ai/en/latest/serving/engine_args.html)",
    "vLLM distributed serving: TP inside a node, PP across nodes "
    "(https://docs.vllm.ai/en/latest/serving/distributed_serving.html)",
    "Kwon et al. 2023, PagedAttention (SOSP), sec. 2.2-3: KV cache per token per layer",
    "Pope et al. 2022, Efficiently Scaling Transformer Inference, sec. 2-3: decode is "
    "memory-bandwidth bound, prefill compute bound",
    "TGI launcher: --num-shard, --max-input-tokens, --max-total-tokens, --quantize "
    "(https://huggingface.co/docs/text-generation-inference/reference/launcher)",
    "DeepSpeed-Inference tutorial: deepspeed.init_inference(tensor_parallel={'tp_size': N}) "
    "(https://www.deepspeed.ai/tutorials/inference-tutorial/)",
]


def is_decoder(model: ModelSpec) -> bool:
    """Whether the model generates token by token (and so keeps a KV cache)."""
    return (model.family or "").lower() not in ENCODER_TYPES


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads one GPU stores under tensor parallel ``tp`` (replicated when tp > kv_heads)."""
    return max(1, (model.kv_heads or model.heads) // tp)


def kv_bytes_per_token(
    model: ModelSpec, tp: int = 1, pp: int = 1, dtype_bytes: int = KV_BYTES
) -> int:
    """KV-cache bytes per token: 2 (K and V) x layers x kv_heads x head_dim x bytes.

    For one GPU of a ``tp`` x ``pp`` group: its kv heads and its layers (``tp=pp=1``: the
    whole model). llama-3-8b: 2 x 32 x 8 x 128 x 2 = 131,072 bytes (128 KiB) per token.
    """
    if not is_decoder(model):
        return 0
    heads = kv_heads_per_gpu(model, tp) if tp > 1 else (model.kv_heads or model.heads)
    return 2 * ceil(model.layers / pp) * heads * head_dim(model) * dtype_bytes


def weights_bytes(model: ModelSpec, dtype: WeightDtype) -> int:
    """All parameters in ``dtype``: params x bytes per parameter."""
    return int(model.params * WEIGHT_BYTES[dtype])


def activation_allowance(model: ModelSpec, tp: int, context: int, concurrency: int) -> int:
    """Activation and workspace bytes per GPU (the profile run, logits, fixed workspace)."""
    tokens = min(PROFILE_TOKENS, context * (1 if is_decoder(model) else concurrency))
    ffn = model.intermediate or 4 * model.hidden
    act = tokens * (4 * model.hidden + 2 * ffn // tp) * 2
    logits = concurrency * model.vocab * 4 if is_decoder(model) else 0
    return int(act + logits + FIXED_WORKSPACE_BYTES)


def weight_dtype_for(brief: TrainingBrief, hardware: HardwareSpec) -> WeightDtype:
    """The brief's weight format; else bf16 where the GPU has bf16, fp16 where it has not."""
    if brief.weight_dtype is not None:
        return brief.weight_dtype
    gpu = hardware.gpu
    return "fp16" if gpu is not None and not gpu.bf16_tflops else "bf16"


def default_context(model: ModelSpec) -> int:
    """``DEFAULT_CONTEXT`` tokens, or the model's own position limit when that is shorter.

    An encoder's sequence is its input (a ViT's patches): the brief's sequence length.
    """
    if not is_decoder(model):
        return model.seq_len
    cfg = model.hf_config or {}
    limit = cfg.get("max_position_embeddings") or cfg.get("n_positions")
    return (
        min(DEFAULT_CONTEXT, int(limit))
        if isinstance(limit, int) and limit > 0
        else DEFAULT_CONTEXT
    )


def _tp_candidates(model: ModelSpec, per_node: int) -> tuple[list[int], dict[str, str]]:
    kv = model.kv_heads or model.heads
    good, why = [], {}
    for t in (d for d in range(1, per_node + 1) if per_node % d == 0):
        if model.heads % t:
            why[f"tp{t}"] = f"{t} does not divide the {model.heads} attention heads"
        elif kv % t and t % kv:
            why[f"tp{t}"] = f"{t} and the {kv} key-value heads do not divide one another"
        else:
            good.append(t)
    return good, why


def _fit(
    model: ModelSpec,
    dtype: WeightDtype,
    tp: int,
    pp: int,
    context: int,
    concurrency: int,
    budget: int,
) -> tuple[int, int, int, int, int]:
    """Per GPU: weights, KV bytes per token, allowance, bytes used, and sequences that fit."""
    w = int(weights_bytes(model, dtype) / (tp * pp))
    kv_tok = kv_bytes_per_token(model, tp, pp)
    act = activation_allowance(model, tp, context, concurrency)
    used = w + kv_tok * context * concurrency + act
    room = budget - w - act
    if not is_decoder(model):
        max_conc = 10**6 if room >= 0 else 0
    else:
        max_conc = max(0, room // (kv_tok * context)) if room > 0 else 0
    return w, kv_tok, act, used, int(min(max_conc, 10**6))


def _serving_request(
    model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief, engine: ServingEngine
) -> tuple[WeightDtype, int, int, list[str], list[str]]:
    """The weight format, context and concurrency served, with the defaults taken and the notes."""
    dtype = weight_dtype_for(brief, hardware)
    defaults: list[str] = []
    assumptions: list[str] = []
    context = brief.context_len
    if context is None:
        context = default_context(model)
        defaults.append(f"context {context} tokens (default; give 'context 32k' to change it)")
    concurrency = brief.concurrency
    if concurrency is None:
        concurrency = DEFAULT_CONCURRENCY
        defaults.append(
            f"{concurrency} concurrent sequences (default; give 'for 64 concurrent users' to change it)"
        )
    if brief.weight_dtype is None:
        defaults.append(f"{dtype} weights (default; fp8, int8 or int4 when asked)")
    if engine == "deepspeed-inference" and dtype in ("fp8", "int4"):
        assumptions.append(
            f"DeepSpeed-Inference's init_inference takes fp16/bf16/int8 weights, not {dtype}: "
            "bf16 planned instead"
        )
        dtype = "bf16"
    return dtype, context, concurrency, defaults, assumptions


def _degrees(
    model: ModelSpec,
    hardware: HardwareSpec,
    engine: ServingEngine,
    served: tuple[WeightDtype, int, int],
    budget: int,
    assumptions: list[str],
) -> tuple[int, int, dict[str, str]]:
    """The smallest tensor x pipeline degrees that hold the load, and why each smaller one fails.

    ``served`` is the weight format, the context and the concurrency. When none holds it, the
    most memory there is (the largest degrees), with a note where the engine cannot span nodes.
    """
    dtype, context, concurrency = served
    gpu = hardware.gpu
    per_node = max(1, hardware.gpus_per_node)
    tps, why_not = _tp_candidates(model, per_node) if gpu else ([1], {})
    tps = tps or [1]
    pps = list(range(1, hardware.nodes + 1)) if engine == "vllm" and gpu else [1]
    pps = [p for p in pps if p <= model.layers]
    chosen: tuple[int, int] | None = None
    for pp in pps:
        for tp in tps:
            w, kv_tok, act, used, max_conc = _fit(
                model, dtype, tp, pp, context, concurrency, budget
            )
            if used <= budget:
                chosen = (tp, pp)
                break
            why_not[f"tp{tp}" + (f"+pp{pp}" if pp > 1 else "")] = (
                f"{w / GB:.1f} GB weights + {kv_tok * context * concurrency / GB:.1f} GB KV cache "
                f"+ {act / GB:.1f} GB activations per GPU = {used / GB:.1f} GB > the "
                f"{budget / GB:.1f} GB budget"
            )
        if chosen:
            break
    if chosen is None:
        # Nothing holds the stated concurrency: the most memory there is, with what fits there.
        chosen = (tps[-1], pps[-1])
        if engine != "vllm" and hardware.nodes > 1:
            assumptions.append(
                f"{ENGINE_NAMES[engine]} shards inside one node only; vLLM adds pipeline "
                "parallelism across nodes"
            )
    tp, pp = chosen
    why_not.pop(f"tp{tp}" + (f"+pp{pp}" if pp > 1 else ""), None)
    return tp, pp, why_not


def plan_inference(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> InferencePlan:
    """The inference plan for serving ``model`` on ``hardware`` as ``brief`` asks (module docstring)."""
    engine, engine_reason = engine_for(brief)
    dtype, context, concurrency, defaults, assumptions = _serving_request(
        model, hardware, brief, engine
    )
    gpu = hardware.gpu
    capacity = int(gpu.memory_gb * GB) if gpu else int((hardware.ram_gb or 0) * GB)
    budget = int(capacity * GPU_MEMORY_UTILIZATION)
    tp, pp, why_not = _degrees(
        model, hardware, engine, (dtype, context, concurrency), budget, assumptions
    )
    w, kv_tok, act, used, max_conc = _fit(model, dtype, tp, pp, context, concurrency, budget)
    fits = max_conc >= concurrency
    group = tp * pp
    replicas = hardware.world_size // group if gpu else 1
    batch = max(1, min(concurrency, max_conc))
    plan = InferencePlan(
        engine=engine,
        engine_reason=engine_reason,
        hf_id=hf_id_of(brief, model),
        decoder=is_decoder(model),
        weight_dtype=dtype,
        weight_bytes_per_param=WEIGHT_BYTES[dtype],
        kv_dtype="fp16" if dtype == "fp16" else "bf16",
        context_len=context,
        concurrency=concurrency,
        defaults=defaults,
        weights_bytes=weights_bytes(model, dtype),
        weights_bytes_per_gpu=w,
        kv_bytes_per_token=kv_bytes_per_token(model),
        kv_bytes_per_token_per_gpu=kv_tok,
        kv_cache_bytes=kv_bytes_per_token(model) * context * concurrency,
        kv_cache_bytes_per_gpu=kv_tok * context * concurrency,
        activation_bytes_per_gpu=act,
        gpu_memory_bytes=capacity,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        budget_bytes_per_gpu=budget,
        used_bytes_per_gpu=used,
        fits=fits,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        replicas=replicas,
        gpus_used=group * replicas,
        max_concurrency=max_conc if is_decoder(model) else concurrency if max_conc else 0,
        why_not=why_not,
        assumptions=assumptions,
        sources=list(SOURCES),
    )
    if not plan.decoder:
        plan.assumptions.append(
            f"{model.family} is an encoder: no KV cache and no token-by-token decode; vLLM and "
            "TGI serve generative and embedding models, an image or text classifier is often "
            "served by TorchServe, Triton or TF Serving: the memory and latency figures hold"
        )
    if max_conc < 1:
        plan.alternatives = _alternatives(model, hardware, brief, plan)
        plan.assumptions.append("nothing fits: no throughput or latency estimate")
    elif gpu is not None and gpu.memory_bandwidth_gbs:
        serving_speed(plan, model, hardware, batch)
    else:
        plan.assumptions.append("no GPU datasheet figures: no throughput or latency estimate")
    if engine == "vllm" and dtype == "int8":
        plan.assumptions.append(INT8_CHECKPOINT)
    plan.command = serving_command(plan)
    return plan


def _alternatives(
    model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief, plan: InferencePlan
) -> list[str]:
    """What would hold one sequence of the context: a smaller weight format, or more GPUs."""
    out = []
    tp, pp, ctx = plan.tensor_parallel, plan.pipeline_parallel, plan.context_len
    budget = plan.budget_bytes_per_gpu
    smaller = [d for d in ("fp8", "int4") if WEIGHT_BYTES[d] < plan.weight_bytes_per_param]
    for dtype in smaller:
        w, kv_tok, act, _, conc = _fit(model, dtype, tp, pp, ctx, plan.concurrency, budget)  # type: ignore[arg-type]
        if conc >= 1:
            out.append(
                f"{dtype} weights: {w / GB:.1f} GB per GPU, up to {conc} sequences of {ctx} tokens"
            )
            break
    if budget > 0 and hardware.gpu is not None:
        need = plan.weights_bytes + plan.kv_bytes_per_token * ctx * plan.concurrency
        per_gpu_room = budget - plan.activation_bytes_per_gpu
        gpus = ceil(need / per_gpu_room) if per_gpu_room > 0 else 0
        if gpus > hardware.world_size:
            out.append(
                f"about {gpus} {hardware.gpu.name} GPUs for {plan.concurrency} sequences of {ctx} "
                f"tokens in {plan.weight_dtype} ({need / GB:.0f} GB of weights and KV cache)"
            )
    out.append(f"a shorter context than {ctx} tokens" if plan.decoder else "a smaller model")
    return out


def serving_framework(brief: TrainingBrief) -> FrameworkChoice:
    """The framework line of an inference plan: the engine's own stack, not a training framework."""
    engine, why = engine_for(brief)
    primary: FrameworkId = "deepspeed" if engine == "deepspeed-inference" else "pytorch"
    others = ", ".join(ENGINE_NAMES[e] for e in ENGINE_NAMES if e != engine)
    return FrameworkChoice(
        primary=primary,
        stack=[primary],
        rationale=f"Serving with {why}. {ENGINE_NAMES[engine]} runs on {primary}; "
        f"{others} are the alternatives (name one in the request to use it). Nothing is "
        "trained: no training config, no training smoke run.",
    )
