"""The reviewer's checks of an inference plan: it fits, its parallelism is valid, its files agree."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from tools.core.inference_types import InferencePlan
from tools.core.schemas import Finding, HardwareSpec, LaunchSpec, ModelSpec, SmokeResult
from tools.planning.memory import GB
from tools.planning.serve_flags import no_serve_reason, vllm_precision_flags
from tools.smoke.policy import INFERENCE_SMOKE

# The flag each engine's command gives its tensor-parallel degree by.
TP_FLAGS = {
    "vllm": "--tensor-parallel-size",
    "tgi": "--num-shard",
    "deepspeed-inference": "--num_gpus",
}
FIT_FIX = (
    "use more GPUs or GPUs with more memory, fp8 or int4 weights, a shorter context, or fewer "
    "concurrent sequences"
)


def _error(check: str, message: str, fix: str = "") -> Finding:
    return Finding(severity="error", check=check, message=message, fix=fix)


def _flag(command: list[str], name: str) -> str | None:
    for i, arg in enumerate(command[:-1]):
        if arg == name:
            return command[i + 1]
    return None


def check_inference(
    plan: InferencePlan | None,
    launch: LaunchSpec | None,
    smoke: SmokeResult | None,
    model: ModelSpec | None = None,
    hardware: HardwareSpec | None = None,
    deepspeed_config: dict[str, Any] | None = None,
) -> list[Finding]:
    """Fits with headroom, TP divides the heads, concurrency >= 1, serve.sh runs the plan."""
    if plan is None:
        return [_error("inference_plan", "no inference plan was made", "plan the inference again")]
    findings = [*_check_fit(plan), *_check_parallel(plan, model, hardware)]
    findings += _check_files(plan, launch, deepspeed_config)
    if smoke is not None and smoke.status != "skipped":
        findings.append(
            _error(
                "smoke_verdict",
                f"a training smoke run ({smoke.status}) was made for an inference plan",
                "an inference plan gets no training smoke run",
            )
        )
    else:
        findings.append(Finding(severity="info", check="smoke_verdict", message=INFERENCE_SMOKE))
    return findings


def _check_fit(plan: InferencePlan) -> list[Finding]:
    budget = plan.budget_bytes_per_gpu
    where = (
        f"{plan.weights_bytes_per_gpu / GB:.1f} GB weights + "
        f"{plan.kv_cache_bytes_per_gpu / GB:.1f} GB KV cache + "
        f"{plan.activation_bytes_per_gpu / GB:.1f} GB activations per GPU = "
        f"{plan.used_bytes_per_gpu / GB:.1f} GB of the {budget / GB:.1f} GB budget "
        f"({plan.gpu_memory_utilization:g} x {plan.gpu_memory_bytes / GB:.1f} GB)"
    )
    if plan.max_concurrency < 1:
        fix = "; or ".join(plan.alternatives) if plan.alternatives else FIT_FIX
        return [
            _error(
                "inference_memory",
                f"not even one sequence of {plan.context_len} tokens fits: {where}",
                fix,
            )
        ]
    if not plan.fits or plan.used_bytes_per_gpu > budget:
        return [
            Finding(
                severity="warning",
                check="inference_memory",
                message=f"{plan.concurrency} concurrent sequences of {plan.context_len} tokens do "
                f"not fit ({where}); at most {plan.max_concurrency} run at once, the rest queue",
                fix=FIT_FIX,
            )
        ]
    headroom = 1 - plan.used_bytes_per_gpu / plan.gpu_memory_bytes
    return [
        Finding(
            severity="info",
            check="inference_memory",
            message=f"{where}: fits, {headroom:.0%} of the device free; up to "
            f"{plan.max_concurrency} sequences of {plan.context_len} tokens fit",
        )
    ]


def _check_parallel(
    plan: InferencePlan, model: ModelSpec | None, hardware: HardwareSpec | None
) -> list[Finding]:
    problems = []
    tp = plan.tensor_parallel
    if model is not None:
        kv = model.kv_heads or model.heads
        if model.heads % tp:
            problems.append(
                f"tensor parallel {tp} does not divide the {model.heads} attention heads"
            )
        elif kv % tp and tp % kv:
            problems.append(f"tensor parallel {tp} and the {kv} key-value heads do not divide")
    if hardware is not None and hardware.gpu is not None:
        if tp > max(1, hardware.gpus_per_node):
            problems.append(
                f"tensor parallel {tp} spans more than a node's {hardware.gpus_per_node} GPUs"
            )
        if tp * plan.pipeline_parallel > hardware.world_size:
            problems.append(
                f"tensor x pipeline parallel {tp * plan.pipeline_parallel} exceeds the "
                f"{hardware.world_size} GPUs"
            )
    if plan.concurrency < 1:
        problems.append(f"concurrency {plan.concurrency} is below 1")
    if problems:
        return [_error("inference_parallel", "; ".join(problems), "plan the inference again")]
    return [
        Finding(
            severity="info",
            check="inference_parallel",
            message=f"tensor parallel {tp}"
            + (
                f" x pipeline parallel {plan.pipeline_parallel}"
                if plan.pipeline_parallel > 1
                else ""
            )
            + f" divides the model's heads; {plan.replicas} replica(s)",
        )
    ]


def _check_files(
    plan: InferencePlan, launch: LaunchSpec | None, deepspeed_config: dict[str, Any] | None
) -> list[Finding]:
    fix = "emit the serving launch files again for this plan"
    problems = []
    if deepspeed_config is not None:
        problems.append("an inference plan has a training DeepSpeed config")
    why = no_serve_reason(plan)
    if why is not None:
        # Nothing fits (_check_fit says it): no serve.sh is right, one would be wrong.
        if launch is not None and (launch.command or "serve.sh" in launch.files):
            problems.append("serve.sh was written for a plan in which nothing fits")
            return [_error("launch_agrees", "; ".join(problems), fix)]
        return [Finding(severity="info", check="launch_agrees", message=why)]
    if launch is None or not launch.command:
        return [_error("launch_agrees", "no serving command was emitted", fix)]
    if launch.command != plan.command:
        problems.append("the launch command is not the inference plan's")
    tp = _flag(launch.command, TP_FLAGS[plan.engine])
    if tp != str(plan.tensor_parallel):
        problems.append(
            f"the command's {TP_FLAGS[plan.engine]} is {tp}, the plan's TP is {plan.tensor_parallel}"
        )
    if plan.engine == "vllm":
        problems += _precision_problems(plan, launch.command)
    seqs = _flag(launch.command, "--max-num-seqs") or _flag(
        launch.command, "--max-concurrent-requests"
    )
    if seqs is not None and (not seqs.isdigit() or int(seqs) < 1):
        problems.append(f"the command serves {seqs} concurrent sequences")
    script = launch.files.get("serve.sh")
    try:
        text = Path(script).read_text(encoding="utf-8") if script else ""
    except (OSError, UnicodeDecodeError):
        text = ""
    if shlex.join(plan.command) not in text:
        problems.append("serve.sh does not run the plan's command")
    if problems:
        return [_error("launch_agrees", "; ".join(problems), fix)]
    return [
        Finding(
            severity="info",
            check="launch_agrees",
            message=f"serve.sh starts {plan.command[0]} with {TP_FLAGS[plan.engine]} "
            f"{plan.tensor_parallel}, as the plan says",
        )
    ]


def _precision_problems(plan: InferencePlan, command: list[str]) -> list[str]:
    """The command's vLLM --dtype, --kv-cache-dtype and --quantization against the plan's formats."""
    problems = []
    want = vllm_precision_flags(plan)
    for name in ("--dtype", "--kv-cache-dtype", "--quantization"):
        expected = _flag(want, name) if name in want else None
        if _flag(command, name) != expected:
            problems.append(
                f"the command's {name} is {_flag(command, name)}, the plan's "
                f"{plan.weight_dtype} weights need {expected}"
            )
    return problems
