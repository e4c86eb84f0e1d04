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
"""

from __future__ import annotations

import re
from math import ceil

from tools.core.inference_types import InferencePlan, ServingEngine, WeightDtype
from tools.core.schemas import (
    FrameworkChoice,
    FrameworkId,
    GPUSpec,
    HardwareSpec,
    ModelSpec,
    TrainingBrief,
)
from tools.planning.comm import (
    DEFAULT_GPU_TO_GPU_GBS,
    INTERCONNECT_GBS,
    LINK_EFFICIENCY,
    catalog_gpu,
)
from tools.planning.memory import GB
from tools.planning.serve_flags import INT8_CHECKPOINT, vllm_precision_flags

# Achieved fraction of dense peak for compute-bound prefill, by GPU class: (efficiency, why),
# typical LLM MFU figures (the training speed model works per kernel instead:
# tools/planning/kernels.py). The first
# pattern found in the GPU's normalized name picks the class; order matters ("a100" before
# "a10"). These are typical achieved MFU figures, not ceilings.
EFFICIENCY_BY_CLASS: dict[str, tuple[float, str]] = {
    "hopper": (
        0.40,
        "Hopper (H100/H200): Llama 3 reports 38-43% BF16 MFU on H100 (Dubey et al. 2024, "
        "Table 4); well-tuned DeepSpeed/FSDP fine-tunes land near 40%",
    ),
    "blackwell": (
        0.35,
        "Blackwell (B200): higher peak than Hopper with less mature kernels; assumed below "
        "Hopper until published training MFU says otherwise",
    ),
    "ampere_datacenter": (
        0.45,
        "datacenter Ampere (A100/A800/A30): Megatron-LM reaches 52% of peak on A100 "
        "(Narayanan et al. 2021); 45% is common for DeepSpeed/FSDP LLM training",
    ),
    "volta": (
        0.30,
        "Volta (V100): Megatron-LM sustained ~30% of fp16 peak (Shoeybi et al. 2019, "
        "39 TFLOP/s per GPU of 125)",
    ),
    "amd_instinct": (
        0.30,
        "AMD Instinct (MI250X/MI300X): ~32% of peak reported for 1T-parameter training on "
        "Frontier's MI250X (Dash et al. 2023); ROCm kernels trail CUDA's",
    ),
    "workstation": (
        0.30,
        "consumer/workstation and inference parts (RTX 3090/4090, L4, L40S, A10G): power and "
        "clock limits under sustained load, smaller caches and lower memory bandwidth per FLOP",
    ),
    "turing": (
        0.20,
        "T4: a 70 W part that throttles well below its boost-clock peak in training",
    ),
    "unknown": (0.30, "unknown GPU class: a conservative 30% of peak"),
}
_CLASS_PATTERNS: tuple[tuple[str, str], ...] = (
    ("h100", "hopper"),
    ("h200", "hopper"),
    ("h800", "hopper"),
    ("gh200", "hopper"),
    ("b200", "blackwell"),
    ("b100", "blackwell"),
    ("a100", "ampere_datacenter"),
    ("a800", "ampere_datacenter"),
    ("a30", "ampere_datacenter"),
    ("v100", "volta"),
    ("mi2", "amd_instinct"),
    ("mi3", "amd_instinct"),
    ("rtx", "workstation"),
    ("l40", "workstation"),
    ("l4", "workstation"),
    ("a10", "workstation"),
    ("t4", "turing"),
)


def gpu_class(gpu: GPUSpec) -> str:
    """The ``EFFICIENCY_BY_CLASS`` key for ``gpu``, matched on its normalized name."""
    key = re.sub(r"[^a-z0-9]+", "", f"{getattr(gpu, 'id', '')} {gpu.name}".lower())
    for pattern, name in _CLASS_PATTERNS:
        if pattern in key:
            return name
    return "unknown"


WEIGHT_BYTES: dict[str, float] = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
KV_BYTES = 2  # bf16/fp16 KV cache (vLLM's kv_cache_dtype "auto" follows the model dtype)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default
DEFAULT_CONTEXT = 8192  # capped by the model's own position limit
DEFAULT_CONCURRENCY = 16
# vLLM's max_num_batched_tokens for online serving with chunked prefill (the profile run).
PROFILE_TOKENS = 8192
FIXED_WORKSPACE_BYTES = 1 * GB
# Achieved share of HBM bandwidth in decode (paged-attention and GEMV kernels): an assumption.
HBM_EFFICIENCY = 0.8
ALL_REDUCE_LATENCY_S = 8e-6  # one small NCCL/custom all-reduce inside an NVLink node
PIPELINE_HOP_LATENCY_S = 30e-6  # one activation send between nodes
ENGINE_NAMES = {"vllm": "vLLM", "tgi": "TGI", "deepspeed-inference": "DeepSpeed-Inference"}
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


def head_dim(model: ModelSpec) -> int:
    """Per-head width: the config's ``head_dim`` (or T5's ``d_kv``), else hidden / heads."""
    cfg = model.hf_config or {}
    return int(cfg.get("head_dim") or cfg.get("d_kv") or model.hidden // model.heads)


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


def plan_inference(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> InferencePlan:
    """The inference plan for serving ``model`` on ``hardware`` as ``brief`` asks (module docstring)."""
    engine, engine_reason = engine_for(brief)
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
    gpu = hardware.gpu
    capacity = int(gpu.memory_gb * GB) if gpu else int((hardware.ram_gb or 0) * GB)
    budget = int(capacity * GPU_MEMORY_UTILIZATION)
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
        _speed(plan, model, hardware, batch)
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


def _speed(plan: InferencePlan, model: ModelSpec, hardware: HardwareSpec, batch: int) -> None:
    """Decode step, tokens/s and time to first token (module docstring), into ``plan``."""
    gpu = hardware.gpu
    assert gpu is not None and gpu.memory_bandwidth_gbs
    tp, pp, ctx = plan.tensor_parallel, plan.pipeline_parallel, plan.context_len
    active = model.active_params or model.params
    bw = gpu.memory_bandwidth_gbs * 1e9 * HBM_EFFICIENCY
    cls = gpu_class(gpu)
    eff, eff_why = EFFICIENCY_BY_CLASS[cls]
    peak = (gpu.bf16_tflops or gpu.fp16_tflops or gpu.fp32_tflops or 0) * 1e12
    catalog = catalog_gpu(gpu)
    link = catalog.link if catalog else "pcie"
    g2g = catalog.gpu_to_gpu_gbs if catalog and catalog.gpu_to_gpu_gbs else DEFAULT_GPU_TO_GPU_GBS
    intra = g2g / 2 * LINK_EFFICIENCY[link] * 1e9
    mean_ctx = ctx // 2
    kv_read = batch * mean_ctx * plan.kv_bytes_per_token_per_gpu * pp  # every stage, in turn
    memory_s = (plan.weights_bytes / tp + kv_read) / bw
    compute_s = 2 * active * batch / (tp * peak * eff) if peak else 0.0

    def all_reduces(tokens: int) -> float:
        if tp == 1:
            return 0.0
        nbytes = tokens * model.hidden * 2
        return 2 * model.layers * (ALL_REDUCE_LATENCY_S + 2 * (tp - 1) / tp * nbytes / intra)

    net = (hardware.interconnect or "roce100").lower()
    inter = INTERCONNECT_GBS.get(net, INTERCONNECT_GBS["roce100"]) * LINK_EFFICIENCY.get(net, 0.8)
    hops = (pp - 1) * (PIPELINE_HOP_LATENCY_S + batch * model.hidden * 2 / (inter * 1e9))
    if plan.decoder:
        step = max(memory_s, compute_s) + all_reduces(batch) + hops
        plan.decode_step_s = step
        plan.inter_token_latency_ms = step * 1e3
        plan.tokens_per_s_per_sequence = 1 / step
        plan.decode_tokens_per_s = batch / step
        plan.decode_tokens_per_s_total = batch / step * plan.replicas
    prompt = mean_ctx if plan.decoder else ctx
    flops = 2 * active * prompt + 2 * model.layers * model.hidden * prompt**2
    plan.prompt_tokens = prompt
    plan.time_to_first_token_s = (
        (flops / (tp * peak * eff) if peak else 0.0) + all_reduces(prompt) + hops + memory_s
    )
    plan.assumptions += [
        f"decode at batch {batch} (the planned concurrency that fits), each sequence at a mean "
        f"context of {mean_ctx} tokens (half of {ctx}): reads {plan.weights_bytes / tp / GB:.1f} GB "
        f"of weights + {kv_read / GB:.2f} GB of KV cache per GPU per step at {HBM_EFFICIENCY:.0%} of "
        f"{gpu.memory_bandwidth_gbs:g} GB/s HBM: {memory_s * 1e3:.2f} ms; compute "
        f"{compute_s * 1e3:.2f} ms; the step is {'memory' if memory_s >= compute_s else 'compute'} bound",
        f"prefill of a {prompt}-token prompt at {eff:.0%} of {peak / 1e12:g} TFLOP/s ({eff_why})",
        f"tensor parallel {tp}: 2 all-reduces of batch x hidden x 2 bytes per layer over {link}, "
        f"{ALL_REDUCE_LATENCY_S * 1e6:g} µs latency each"
        if tp > 1
        else "one GPU per replica: no tensor-parallel communication",
    ]
    if pp > 1:
        plan.assumptions.append(
            f"pipeline parallel {pp} across nodes over {net}: one activation send per hop; "
            "vLLM needs a Ray cluster spanning the nodes (distributed serving guide); "
            "pipelining several batches would raise throughput above this estimate"
        )
    if plan.replicas > 1:
        plan.assumptions.append(
            f"{plan.replicas} replicas of the {tp * pp}-GPU engine serve the {hardware.world_size} "
            "GPUs behind a load balancer (one launch per replica, CUDA_VISIBLE_DEVICES per group)"
        )
    if model.active_params and model.active_params != model.params:
        plan.assumptions.append(
            "mixture of experts: every expert stays resident; decode reads all of them per step "
            "(at batch > 1 most experts are hit), compute counts the active ones"
        )


def hf_id_of(brief: TrainingBrief, model: ModelSpec) -> str | None:
    """The Hugging Face repo (catalog) or config folder to serve; None for a size-only model."""
    from tools.research.model_catalog import catalog_id, load_model_catalog

    ref = brief.model
    if isinstance(ref, str):
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
