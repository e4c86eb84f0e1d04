"""The reviewer's checks: code, not prompts, so text in a brief or a model reply cannot skip them."""

from __future__ import annotations

from typing import Any, Literal

from tools.memory import data_parallel_size, setup_label
from tools.schemas import (
    Finding,
    FrameworkChoice,
    HardwareSpec,
    MemoryPlan,
    Review,
    SmokeResult,
    TrainingBrief,
)

# Below this share of free GPU memory the plan is one allocator spike away from an OOM.
MIN_HEADROOM = 0.10
# Predicted vs measured peak memory of the smoke run: a gap beyond this share is flagged.
MAX_MEMORY_GAP = 0.15
# What to change after a failed smoke run, by the reason's kind (tools/smoke.py verdicts).
SMOKE_FIXES = {
    "oom": "raise the ZeRO stage, enable activation checkpointing, halve the micro-batch "
    "(doubling gradient accumulation), or offload the optimizer to CPU",
    "nan": "use bf16 instead of fp16, lower the learning rate, or check the data for bad values",
    "diverged": "lower the learning rate or add warm-up; check that the labels match the inputs",
    "timeout": "look for a hung rank (the log's last step); check the interconnect and ports",
    "crash": "read the failing rank's error in the log tail; fix the config or environment",
    "launcher_error": "check the launcher command, the hostfile and that the GPUs are visible",
}


def check_plan(
    brief: TrainingBrief,
    hardware: HardwareSpec,
    framework: FrameworkChoice,
    memory: MemoryPlan | None,
    deepspeed_config: dict[str, Any] | None,
    smoke: SmokeResult,
) -> list[Finding]:
    """Run every check and return the findings (errors block approval)."""
    findings: list[Finding] = []
    # DeepSpeed's batch arithmetic counts data-parallel ranks: world / (tensor x pipeline).
    ws = (
        data_parallel_size(hardware, memory.tensor_parallel, memory.pipeline_parallel)
        if memory is not None
        else hardware.world_size
    )
    if deepspeed_config is not None:
        micro = int(deepspeed_config.get("train_micro_batch_size_per_gpu", 0))
        accum = int(deepspeed_config.get("gradient_accumulation_steps", 0))
        train = int(deepspeed_config.get("train_batch_size", 0))
        if micro * accum * ws != train or train != brief.global_batch_size:
            findings.append(
                Finding(
                    severity="error",
                    check="batch_arithmetic",
                    message=f"train_batch_size {train} != micro {micro} x accumulation {accum} x data-parallel {ws}"
                    f" (brief asks {brief.global_batch_size})",
                    fix="recompute gradient_accumulation_steps for the target world size",
                )
            )
        else:
            findings.append(
                Finding(
                    severity="info",
                    check="batch_arithmetic",
                    message=f"{micro} x {accum} x {ws} = {train} sequences per step, as the brief asks",
                )
            )
    findings.extend(_memory_findings(memory))
    if memory is not None and memory.tensor_parallel * memory.pipeline_parallel > 1:
        findings.append(
            Finding(
                severity="warning",
                check="model_parallel",
                message=f"the plan needs tensor parallel {memory.tensor_parallel} x pipeline "
                f"parallel {memory.pipeline_parallel}: run it with Megatron-DeepSpeed (or "
                "Megatron-LM/NeMo); the plain DeepSpeed engine and the generated train.py "
                "parallelise data only",
                fix="launch Megatron-DeepSpeed's pretrain_gpt.py with the plan's parallel "
                "degrees and ds_config.json (MEGATRON.md)",
            )
        )
    if (
        memory
        and framework.primary in {"pytorch", "pytorch_ddp", "tensorflow", "horovod"}
        and memory.chosen != "ddp"
    ):
        findings.append(
            Finding(
                severity="error",
                check="framework_fit",
                message=f"{framework.primary} replicates model states but the plan needs {memory.chosen}",
                fix="use DeepSpeed or FSDP for sharded strategies",
            )
        )
    if framework.primary == "deepspeed" and deepspeed_config is None:
        findings.append(
            Finding(
                severity="error",
                check="framework_fit",
                message="DeepSpeed chosen but no config emitted",
            )
        )
    if smoke.status == "failed":
        kind = smoke.reason.split(":", 1)[0].strip()
        findings.append(
            Finding(
                severity="error",
                check="smoke_verdict",
                message=f"smoke run failed: {smoke.reason.splitlines()[0] if smoke.reason else ''}",
                fix=SMOKE_FIXES.get(kind, SMOKE_FIXES["crash"]),
            )
        )
    elif smoke.status == "passed":
        first = sum(smoke.losses[:5]) / max(1, len(smoke.losses[:5]))
        last = sum(smoke.losses[-5:]) / max(1, len(smoke.losses[-5:]))
        findings.append(
            Finding(
                severity="info",
                check="smoke_verdict",
                message=f"smoke run passed on {smoke.world_size} {smoke.device} ranks: loss {first:.2f} -> {last:.2f}",
            )
        )
        findings.extend(_memory_gap(smoke))
    else:
        findings.append(
            Finding(
                severity="info", check="smoke_verdict", message=f"smoke run skipped: {smoke.reason}"
            )
        )
    return findings


def _memory_findings(memory: MemoryPlan | None) -> list[Finding]:
    """Does the chosen strategy fit, and with how much headroom?"""
    if memory is None:
        return [
            Finding(
                severity="info",
                check="memory_headroom",
                message="nothing is trained: no memory plan needed",
            )
        ]
    # Rows with the same name differ by their tensor/pipeline degrees.
    chosen = next(
        (
            s
            for s in memory.strategies
            if s.name == memory.chosen
            and s.tensor_parallel == memory.tensor_parallel
            and s.pipeline_parallel == memory.pipeline_parallel
        ),
        None,
    )
    label = setup_label(memory.chosen, memory.tensor_parallel, memory.pipeline_parallel)
    if chosen is None or not chosen.fits:
        return [
            Finding(
                severity="error",
                check="memory_headroom",
                message=f"the chosen strategy {label} does not fit in GPU memory",
                fix="a higher ZeRO stage, offload, activation checkpointing or more GPUs",
            )
        ]
    if not memory.capacity_bytes:
        return []
    headroom = 1 - chosen.per_gpu_bytes.total / memory.capacity_bytes
    ok = headroom >= MIN_HEADROOM
    return [
        Finding(
            severity="info" if ok else "warning",
            check="memory_headroom",
            message=f"{label} uses {chosen.per_gpu_bytes.total / 1e9:.1f} GB of "
            f"{memory.capacity_bytes / 1e9:.1f} GB per device ({headroom:.0%} headroom)",
            fix="" if ok else "lower the micro-batch or enable activation checkpointing",
        )
    ]


def decide(findings: list[Finding], round_no: int, max_rounds: int) -> Review:
    """Approve when no error is left; otherwise ask for changes until the rounds run out."""
    errors = [f for f in findings if f.severity == "error"]
    if not errors:
        verdict: Literal["approved", "changes_requested", "rejected"] = "approved"
    elif round_no < max_rounds:
        verdict = "changes_requested"
    else:
        verdict = "rejected"
    return Review(verdict=verdict, rounds=round_no, findings=findings)


def _memory_gap(smoke: SmokeResult) -> list[Finding]:
    """Compare the smoke run's measured peak with the planner's prediction for the same shape."""
    measured = smoke.measured_memory_bytes
    predicted = smoke.predicted_peak_memory_bytes
    if not measured or not predicted:
        return []
    gap = measured / predicted - 1
    what = (
        "peak anonymous RSS above the pre-model baseline"
        if smoke.device == "cpu"
        else "peak allocated GPU memory"
    )
    message = (
        f"measured {what} {measured / 2**20:,.0f} MiB vs predicted {predicted / 2**20:,.0f} MiB "
        f"for the same shape ({gap:+.0%})"
    )
    if abs(gap) <= MAX_MEMORY_GAP:
        return [Finding(severity="info", check="predicted_vs_measured", message=message)]
    direction = "above" if gap > 0 else "below"
    return [
        Finding(
            severity="warning",
            check="predicted_vs_measured",
            message=f"{message}: more than {MAX_MEMORY_GAP:.0%} {direction} the prediction",
            fix="keep more headroom than the plan shows"
            if gap > 0
            else "the plan may be more conservative than needed (a larger micro-batch may fit)",
        )
    ]
