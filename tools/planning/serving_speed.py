"""The serving speed: decode step, tokens/s and time to first token of an inference plan.

Pope et al. 2022, "Efficiently Scaling Transformer Inference", sec. 2-3: decode is memory-bandwidth
bound at small batch, prefill compute bound. The formulas are tools/planning/inference.py's
module docstring; the achieved share of peak comes from the GPU's class (``EFFICIENCY_BY_CLASS``).
"""

from __future__ import annotations

import re

from tools.core.inference_types import InferencePlan
from tools.core.schemas import GPUSpec, HardwareSpec, ModelSpec
from tools.core.units import GB
from tools.planning.comm import (
    DEFAULT_GPU_TO_GPU_GBS,
    INTERCONNECT_GBS,
    LINK_EFFICIENCY,
    catalog_gpu,
)

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


# Achieved share of HBM bandwidth in decode (paged-attention and GEMV kernels): an assumption.
HBM_EFFICIENCY = 0.8
ALL_REDUCE_LATENCY_S = 8e-6  # one small NCCL/custom all-reduce inside an NVLink node
PIPELINE_HOP_LATENCY_S = 30e-6  # one activation send between nodes


def serving_speed(
    plan: InferencePlan, model: ModelSpec, hardware: HardwareSpec, batch: int
) -> None:
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
