"""The reviewer's checks: code, not prompts, so text in a brief or a model reply cannot skip them.

Each ``check_*`` looks at one thing and returns its findings; ``check_plan`` runs them all.
The contract checks (the plan against its brief and its files) are in contract.py.
"""

from __future__ import annotations

import json
from typing import Any

from tools.core.schemas import (
    Finding,
    FrameworkChoice,
    HardwareSpec,
    MemoryPlan,
    SmokeResult,
    TrainingBrief,
)
from tools.core.strategies import MIN_HEADROOM, STRATEGY_GAIN, STRATEGY_ORDER
from tools.planning import data_parallel_size
from tools.planning.alternatives import fit_line, option_text
from tools.planning.batch_layout import deepspeed_batch_ranks
from tools.research.framework import DEEPSPEED_FRAMEWORKS, REPLICATING_FRAMEWORKS
from tools.review.config_keys import config_key_findings

# Estimated model FLOPs utilization below which the reviewer warns that the setup is inefficient.
LOW_MFU = 0.15
# Predicted vs measured peak memory of the smoke run: a gap beyond this share is flagged.
MAX_MEMORY_GAP = 0.15
# What to change after a failed smoke run, by its failure_kind (tools/smoke/verdict.py verdicts).
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
    if deepspeed_config is not None:
        findings += check_batch_arithmetic(brief, hardware, memory, deepspeed_config)
        findings += config_key_findings(deepspeed_config)
    findings += check_memory(memory, framework)
    findings += check_efficiency(memory, hardware)
    findings += check_model_parallel(memory)
    findings += check_framework_fit(framework, memory, deepspeed_config)
    findings += check_smoke(smoke, framework, memory)
    return findings


def check_batch_arithmetic(
    brief: TrainingBrief,
    hardware: HardwareSpec,
    memory: MemoryPlan | None,
    config: dict[str, Any],
) -> list[Finding]:
    """Micro x accumulation x data-parallel ranks = train_batch_size = the brief's batch."""
    # DeepSpeed's batch arithmetic counts data-parallel ranks: world / (tensor x pipeline).
    ws = (
        data_parallel_size(
            hardware, memory.tensor_parallel, memory.pipeline_parallel, memory.context_parallel
        )
        if memory is not None
        else hardware.world_size
    )
    micro = _count(config.get("train_micro_batch_size_per_gpu", 0))
    accum = _count(config.get("gradient_accumulation_steps", 0))
    train = _count(config.get("train_batch_size", 0))
    if micro is None or accum is None or train is None:
        return []  # "auto" or another non-number: config_key_findings reports it
    # An unsettled brief (no batch given, none planned yet) has no batch to compare with.
    asked = brief.global_batch_size
    # AutoTP: DeepSpeed counts every rank; the tensor ranks share their sequences.
    ranks = deepspeed_batch_ranks(config, ws)
    if micro * accum * ranks != train or (asked is not None and micro * accum * ws != asked):
        return [
            Finding(
                severity="error",
                check="batch_arithmetic",
                message=f"train_batch_size {train} != micro {micro} x accumulation {accum} x batch ranks {ranks}"
                f" (brief asks {brief.global_batch_size})",
                fix="recompute gradient_accumulation_steps for the target world size",
            )
        ]
    return [
        Finding(
            severity="info",
            check="batch_arithmetic",
            message=f"{micro} x {accum} x {ws} = {micro * accum * ws} sequences per step, as the brief asks",
        )
    ]


def _count(value: Any) -> int | None:
    """A batch size from the config as an int; None when it is not a number ("auto")."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def check_efficiency(memory: MemoryPlan | None, hardware: HardwareSpec) -> list[Finding]:
    """A warning (never blocking) when the chosen setup's estimated MFU is low or comm-bound.

    Low: MFU under ``LOW_MFU`` (well-tuned dense training reaches 35-55%: Chowdhery et al. 2022,
    PaLM, table 3; Narayanan et al. 2021). Communication-bound: the speed model's collective
    time per step exceeds its compute time, so no overlap can hide it.
    """
    speed = memory.speed if memory is not None else None
    row = memory.chosen_row if memory is not None else None
    if speed is None or speed.mfu is None or row is None or not row.fits:
        return []
    comm = speed.comm_time_s + speed.tp_comm_time_s + speed.pp_comm_time_s
    compute = speed.compute_time_s or 0.0
    comm_bound = comm > compute > 0 or speed.bottleneck == "communication"
    if speed.mfu >= LOW_MFU and not comm_bound:
        return []
    why = []
    if speed.mfu < LOW_MFU:
        why.append(f"estimated MFU {speed.mfu:.0%} is under {LOW_MFU:.0%}")
    if comm_bound:
        why.append(
            f"communication-bound: {comm:.2f} s of collectives per step vs {compute:.2f} s of "
            "compute"
        )
    fixes = ["a larger global batch (more tokens per step to amortize each step's collectives)"]
    if hardware.nodes > 1:
        fixes.append(f"fewer nodes ({hardware.nodes} now: traffic across nodes is the slow link)")
        if memory is not None and memory.tensor_parallel == 1 and hardware.gpus_per_node > 1:
            fixes.append(
                f"tensor parallelism inside a node (TP {hardware.gpus_per_node} over its "
                "fast links) with data parallelism across nodes"
            )
        if memory is not None and memory.chosen.startswith("zero3"):
            fixes.append(
                "ZeRO++ hpZ (zero_hpz_partition_size = GPUs per node: a secondary parameter "
                "shard inside each node, so backward all-gathers stay in the node; Wang et al. "
                "2023, ZeRO++), with qwZ/qgZ quantized collectives"
            )
    if speed.offload_time_s > compute:
        fixes.append("less offload: a higher ZeRO stage or more GPUs instead of CPU offload")
    return [
        Finding(
            severity="warning",
            check="efficiency",
            message="low efficiency: " + "; ".join(why),
            fix="; or ".join(fixes),
        )
    ]


def check_memory(memory: MemoryPlan | None, framework: FrameworkChoice) -> list[Finding]:
    """Does the chosen setup fit, and with how much headroom?"""
    if memory is None:
        return [
            Finding(
                severity="info",
                check="memory_headroom",
                message="nothing is trained: no memory plan needed",
            )
        ]
    chosen = memory.chosen_row
    label = memory.chosen_label
    if chosen is None or not chosen.fits:
        fix, args = memory_fix_and_args(framework, memory)
        message = f"the chosen strategy {label} does not fit in GPU memory"
        if memory.binding:
            # What binds (GPU memory, host RAM for offload, or both) and what would fit.
            message = fit_line(memory.binding, memory.fit_options)
            if args is None:
                fix = (
                    "change the plan to one of the options that fit ("
                    + "; ".join(option_text(o) for o in memory.fit_options if o.fits)
                    + "), or give the node's host RAM if it has more than assumed"
                )
        return [
            Finding(
                severity="error",
                check="memory_headroom",
                message=message,
                fix=fix,
                suggested_args=args,
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


def check_model_parallel(memory: MemoryPlan | None) -> list[Finding]:
    """A tensor/pipeline split needs Megatron-DeepSpeed, not the plain engine."""
    if memory is None or memory.tensor_parallel * memory.pipeline_parallel == 1:
        return []
    return [
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
    ]


def check_framework_fit(
    framework: FrameworkChoice, memory: MemoryPlan | None, config: dict[str, Any] | None
) -> list[Finding]:
    """A replicating framework cannot run a sharded strategy; DeepSpeed needs its config."""
    findings = []
    if memory and framework.primary in REPLICATING_FRAMEWORKS and memory.chosen != "ddp":
        findings.append(
            Finding(
                severity="error",
                check="framework_fit",
                message=f"{framework.primary} replicates model states but the plan needs {memory.chosen_label}",
                fix="use DeepSpeed or FSDP for sharded strategies",
            )
        )
    if framework.primary == "deepspeed" and config is None:
        findings.append(
            Finding(
                severity="error",
                check="framework_fit",
                message="DeepSpeed chosen but no config emitted",
            )
        )
    return findings


def check_smoke(
    smoke: SmokeResult, framework: FrameworkChoice, memory: MemoryPlan | None
) -> list[Finding]:
    """The smoke run's verdict, and its measured memory against the prediction."""
    if smoke.status == "failed":
        kind = smoke.failure_kind or "crash"
        fix, args = (
            memory_fix_and_args(framework, memory)
            if kind == "oom"
            else (SMOKE_FIXES.get(kind, SMOKE_FIXES["crash"]), None)
        )
        return [
            Finding(
                severity="error",
                check="smoke_verdict",
                message=f"smoke run failed: {smoke.reason.splitlines()[0] if smoke.reason else ''}",
                fix=fix,
                suggested_args=args,
                failure_kind=kind,
            )
        ]
    if smoke.status != "passed":
        return [
            Finding(
                severity="info", check="smoke_verdict", message=f"smoke run skipped: {smoke.reason}"
            )
        ]
    first = sum(smoke.losses[:5]) / max(1, len(smoke.losses[:5]))
    last = sum(smoke.losses[-5:]) / max(1, len(smoke.losses[-5:]))
    return [
        Finding(
            severity="info",
            check="smoke_verdict",
            message=f"smoke run passed on {smoke.world_size} {smoke.device} ranks: loss {first:.2f} -> {last:.2f}",
        ),
        *_memory_gap(smoke),
    ]


def memory_comparison(smoke: SmokeResult) -> str | None:
    """The smoke run's measured peak against the planner's prediction for the same shape.

    One sentence, quoted alike by the review, the report and the CLI; None when either number
    is missing.
    """
    measured = smoke.measured_memory_bytes
    predicted = smoke.predicted_peak_memory_bytes
    if not measured or not predicted:
        return None
    what = (
        "peak anonymous RSS above the pre-model baseline"
        if smoke.device == "cpu"
        else "peak allocated GPU memory"
    )
    return (
        f"measured {what} {measured / 2**20:,.0f} MiB vs predicted {predicted / 2**20:,.0f} MiB "
        f"for the same shape ({measured / predicted - 1:+.0%})"
    )


def _memory_gap(smoke: SmokeResult) -> list[Finding]:
    """Flag a measured peak more than ``MAX_MEMORY_GAP`` away from the prediction."""
    message = memory_comparison(smoke)
    if message is None or not smoke.predicted_peak_memory_bytes:
        return []
    gap = (smoke.measured_memory_bytes or 0) / smoke.predicted_peak_memory_bytes - 1
    if abs(gap) <= MAX_MEMORY_GAP:
        return [Finding(severity="info", check="predicted_vs_measured", message=message)]
    if smoke.run_mode is not None and smoke.run_mode.launcher == "layout":
        # The torch-native stand-in is not the planned framework (its own model, and every
        # rank draws the whole model before keeping its share): its gap says nothing of the plan.
        stand_in = f"{message} (torch-native stand-in, not the planned framework's footprint)"
        return [Finding(severity="info", check="predicted_vs_measured", message=stand_in)]
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


def suggest(args: dict[str, Any]) -> str:
    """A plan_parallelism call as a fix names it: the tool and its JSON arguments."""
    return f"plan_parallelism {json.dumps(args)}"


def memory_options(
    framework: FrameworkChoice, memory: MemoryPlan
) -> list[tuple[str, dict[str, Any]]]:
    """The plan_parallelism changes that lower memory per GPU, cheapest first: (how, arguments)."""
    options: list[tuple[str, dict[str, Any]]] = []
    order = list(STRATEGY_ORDER)
    # Only a framework that runs the plan's ZeRO stage can raise it.
    if framework.primary in DEEPSPEED_FRAMEWORKS and memory.chosen in order[:-1]:
        up = order[order.index(memory.chosen) + 1]
        how = "offload to CPU" if "offload" in up else "raise the ZeRO stage"
        options.append((f"{how}: {{call}} ({STRATEGY_GAIN[up]})", {"min_strategy": up}))
    if not memory.activation_checkpointing:
        options.append(
            ("turn activation checkpointing on: {call}", {"activation_checkpointing": True})
        )
    if memory.micro_batch_size > 1:
        options.append(
            (
                "halve the micro-batch, doubling gradient accumulation: {call}",
                {"micro_batch_size": memory.micro_batch_size // 2},
            )
        )
    return options


def memory_fix_and_args(
    framework: FrameworkChoice, memory: MemoryPlan | None
) -> tuple[str, dict[str, Any] | None]:
    """After an OOM: the fix in words, and the cheapest option's plan_parallelism arguments."""
    if memory is None:
        return SMOKE_FIXES["oom"], None
    options = memory_options(framework, memory)
    if not options:
        return (
            f"{memory.chosen} with activation checkpointing and micro-batch 1 is as lean as this "
            "plan gets: use more GPUs, GPUs with more memory, or a shorter sequence"
        ), None
    text = "; or ".join(how.format(call=suggest(args)) for how, args in options)
    return (
        "re-plan with less memory per GPU, then emit the config and rerun the smoke test; "
        "cheapest first: " + text
    ), options[0][1]


def memory_fix(framework: FrameworkChoice, memory: MemoryPlan | None) -> str:
    """After an OOM: the plan_parallelism changes that lower memory per GPU, cheapest first."""
    return memory_fix_and_args(framework, memory)[0]
