"""The report's "Inference" section and the terminal line of an inference plan."""

from __future__ import annotations

from typing import Any

from tools.core.inference_types import InferencePlan
from tools.core.units import GB, gb_text
from tools.planning.inference import ENGINE_NAMES


def inference_section(plan: InferencePlan, md_text: Any, one_line: Any) -> list[str]:
    """Markdown lines: weights, KV-cache budget, TP, max concurrency, speed, the command."""
    tp, pp = plan.tensor_parallel, plan.pipeline_parallel
    parallel = f"tensor parallel {tp}" + (f" x pipeline parallel {pp}" if pp > 1 else "")
    lines = [
        "## Inference",
        "",
        f"**Engine:** {ENGINE_NAMES[plan.engine]} ({md_text(plan.engine_reason)}). "
        f"**Parallelism:** {parallel}, {plan.replicas} replica(s) on {plan.gpus_used} GPU(s). "
        f"**Fits:** {'yes' if plan.fits else 'no'}.",
        "",
        "| per GPU | GB |",
        "|---|---:|",
        f"| weights ({plan.weight_dtype}, {plan.weight_bytes_per_param:g} bytes/param; "
        f"{gb_text(plan.weights_bytes)} in all) | {plan.weights_bytes_per_gpu / GB:.2f} |",
        f"| KV cache ({plan.concurrency} x {plan.context_len} tokens x "
        f"{plan.kv_bytes_per_token_per_gpu:,} bytes/token) | {plan.kv_cache_bytes_per_gpu / GB:.2f} |",
        f"| activations and workspace | {plan.activation_bytes_per_gpu / GB:.2f} |",
        f"| total | {plan.used_bytes_per_gpu / GB:.2f} |",
        f"| budget ({plan.gpu_memory_utilization:g} x {plan.gpu_memory_bytes / GB:.0f} GB) | "
        f"{plan.budget_bytes_per_gpu / GB:.2f} |",
        "",
        f"- KV-cache budget: {plan.kv_bytes_per_token:,} bytes per token for the whole model "
        "(2 x layers x kv_heads x head_dim x 2 bytes), "
        f"{gb_text(plan.kv_cache_bytes)} for {plan.concurrency} sequences of {plan.context_len} tokens"
        if plan.decoder
        else "- KV cache: none (an encoder has no autoregressive decode)",
        f"- Max concurrency at {plan.context_len} tokens: {plan.max_concurrency} sequences",
    ]
    if plan.decode_step_s is not None:
        lines += [
            f"- Expected decode: {plan.decode_tokens_per_s_total:,.0f} tokens/s in all "
            f"({plan.tokens_per_s_per_sequence:,.1f} tokens/s per sequence, "
            f"{plan.inter_token_latency_ms:.1f} ms between tokens)",
        ]
    if plan.time_to_first_token_s is not None:
        lines.append(
            f"- Expected time to first token for a {plan.prompt_tokens}-token prompt: "
            f"{plan.time_to_first_token_s * 1e3:,.0f} ms"
        )
    if plan.alternatives:
        lines += ["", "Nothing fits; what would:", ""]
        lines += [f"- {md_text(a)}" for a in plan.alternatives]
    if plan.defaults:
        lines += ["", "Defaults (not in the request):", ""]
        lines += [f"- {md_text(d)}" for d in plan.defaults]
    if plan.why_not:
        lines += ["", f"Why not less parallelism (chosen: {parallel}):", ""]
        lines += [f"- {md_text(k)}: {md_text(v)}" for k, v in plan.why_not.items()]
    command = one_line(" ".join(plan.command)).replace("`", "'")
    lines += ["", "```bash", command, "```", "", "Assumptions:", ""]
    lines += [f"- {md_text(a)}" for a in plan.assumptions]
    lines += ["", "Sources:", ""] + [f"- {md_text(s)}" for s in plan.sources]
    return [*lines, ""]


def inference_line(inference: dict[str, Any]) -> str:
    """One terminal line: engine, parallelism, concurrency, the decode estimate."""
    tp, pp = inference.get("tensor_parallel"), inference.get("pipeline_parallel") or 1
    speed = inference.get("decode_tokens_per_s_total")
    most, asked = inference.get("max_concurrency"), inference.get("concurrency")
    short = (
        f" (not the {asked} asked: their KV cache does not fit)"
        if most and asked and most < asked and inference.get("fits") is False
        else ""
    )
    return (
        f"inference: {inference.get('engine')}, tensor parallel {tp}"
        + (f" x pipeline {pp}" if pp > 1 else "")
        + (
            f", up to {most} sequences{short} of "
            if most
            else ": does not fit, not even one sequence of "
        )
        + f"{inference.get('context_len')} tokens; KV cache "
        f"{(inference.get('kv_cache_bytes') or 0) / GB:.1f} GB"
        + (f"; ~{speed:,.0f} decode tokens/s" if speed else "")
    )
