"""The reviewer's checks: code, not prompts, so text in a brief or a model reply cannot skip them."""

from __future__ import annotations

import difflib
import json
from typing import Any, Literal

from tools.core.schemas import (
    Finding,
    FrameworkChoice,
    HardwareSpec,
    MemoryPlan,
    Review,
    SmokeResult,
    TrainingBrief,
)
from tools.core.strategies import MIN_HEADROOM, STRATEGY_GAIN, STRATEGY_ORDER, setup_label
from tools.planning.memory import data_parallel_size

# Predicted vs measured peak memory of the smoke run: a gap beyond this share is flagged.
MAX_MEMORY_GAP = 0.15
# What to change after a failed smoke run, by the reason's kind (tools/smoke/verdict.py verdicts).
SMOKE_FIXES = {
    "oom": "raise the ZeRO stage, enable activation checkpointing, halve the micro-batch "
    "(doubling gradient accumulation), or offload the optimizer to CPU",
    "nan": "use bf16 instead of fp16, lower the learning rate, or check the data for bad values",
    "diverged": "lower the learning rate or add warm-up; check that the labels match the inputs",
    "timeout": "look for a hung rank (the log's last step); check the interconnect and ports",
    "crash": "read the failing rank's error in the log tail; fix the config or environment",
    "launcher_error": "check the launcher command, the hostfile and that the GPUs are visible",
}
# Frameworks that run a plan's ZeRO stage (and so can raise it after an OOM).
ZERO_FRAMEWORKS = frozenset({"deepspeed", "megatron"})
# The top-level keys DeepSpeed 0.19's DeepSpeedConfig reads: DeepSpeedConfig.__init__ and
# _initialize_params in deepspeed/runtime/config.py, through the get_* helpers over the names in
# deepspeed/runtime/constants.py and the config classes they build. Recorded by parsing a config
# with a dict that logs every lookup (as tools/artifacts/deepspeed_config.py validates); "bfloat16" is the
# legacy alias read when "bf16" is absent, "sequence_parallel_size" is read only without an mpu.
# DeepSpeed silently ignores any other top-level key: "zero_optimisation" trains without ZeRO.
# tests/test_review_loop.py re-records the set from the installed DeepSpeed.
DEEPSPEED_TOP_LEVEL_KEYS = frozenset(
    {
        "activation_checkpointing",
        "aio",
        "autotuning",
        "bf16",
        "bfloat16",
        "checkpoint",
        "comet",
        "comms_logger",
        "communication_data_type",
        "compile",
        "csv_monitor",
        "data_efficiency",
        "data_types",
        "dataloader_drop_last",
        "datastates_ckpt",
        "disable_allgather",
        "disable_python_gc",
        "dump_state",
        "expert_parallel",
        "flops_profiler",
        "fp16",
        "gradient_accumulation_steps",
        "gradient_allreduce_op",
        "gradient_clipping",
        "gradient_predivide_factor",
        "hybrid_engine",
        "log_level",
        "managed_gradient_accumulation",
        "memory_breakdown",
        "optimizer",
        "pipeline",
        "prescale_gradients",
        "scheduler",
        "seq_parallel_communication_data_type",
        "sequence_parallel_size",
        "steps_per_print",
        "tensor_parallel",
        "tensorboard",
        "timers",
        "torch_autocast",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "use_data_before_expert_parallelism",
        "vocabulary_size",
        "wall_clock_breakdown",
        "wandb",
        "weight_quantization",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "zero_optimization",
    }
)
# Blocks of features DeepSpeed 0.19 removed: it refuses a config that still has one
# (deepspeed/runtime/config.py _REMOVED_TOP_LEVEL_CONFIG_KEYS).
DEEPSPEED_REMOVED_KEYS = frozenset(
    {
        "amp",
        "compression_training",
        "curriculum_learning",
        "eigenvalue",
        "elasticity",
        "graph_harvesting",
        "nebula",
        "progressive_layer_drop",
        "quantize_training",
        "sparse_attention",
        "sparse_gradients",
    }
)
# DeepSpeed's own default for data_types.keep_in_fp32_modules is the string "auto"
# (runtime/constants.py KEEP_IN_FP32_MODULES_DEFAULT): the one "auto" a strict config may hold.
AUTO_ALLOWED = frozenset({"data_types.keep_in_fp32_modules"})


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
        micro = _count(deepspeed_config.get("train_micro_batch_size_per_gpu", 0))
        accum = _count(deepspeed_config.get("gradient_accumulation_steps", 0))
        train = _count(deepspeed_config.get("train_batch_size", 0))
        if micro is None or accum is None or train is None:
            pass  # "auto" or another non-number: config_key_findings reports it
        elif micro * accum * ws != train or train != brief.global_batch_size:
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
        findings.extend(config_key_findings(deepspeed_config))
    findings.extend(_memory_findings(memory, framework))
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
                fix=memory_fix(framework, memory)
                if kind == "oom"
                else SMOKE_FIXES.get(kind, SMOKE_FIXES["crash"]),
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


def _count(value: Any) -> int | None:
    """A batch size from the config as an int; None when it is not a number ("auto")."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _memory_findings(memory: MemoryPlan | None, framework: FrameworkChoice) -> list[Finding]:
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
    chosen = memory.chosen_row
    label = memory.chosen_label
    if chosen is None or not chosen.fits:
        return [
            Finding(
                severity="error",
                check="memory_headroom",
                message=f"the chosen strategy {label} does not fit in GPU memory",
                fix=memory_fix(framework, memory),
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
        findings = [
            *findings,
            Finding(
                severity="error",
                check="verdict",
                message=f"rejected after {round_no} of at most {max_rounds} review round(s); "
                f"still failing: {', '.join(dict.fromkeys(failure_label(f) for f in errors))}",
                fix="the engineer's changes did not resolve it within max_review_rounds: apply the "
                "fixes above by hand, change the brief (more or larger GPUs, a smaller model or "
                "sequence), or allow more rounds",
            ),
        ]
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


def config_key_findings(config: dict[str, Any]) -> list[Finding]:
    """Flag what DeepSpeed would ignore or refuse: unknown or removed top-level keys, "auto"."""
    findings: list[Finding] = []
    for key in sorted(str(k) for k in config):
        if key in DEEPSPEED_REMOVED_KEYS:
            findings.append(
                Finding(
                    severity="error",
                    check="config_keys",
                    message=f"top-level key {key!r} is a feature DeepSpeed 0.19 removed; "
                    "DeepSpeedConfig refuses the config",
                    fix=f"delete {key!r}"
                    + ("; use bf16 or fp16 for mixed precision" if key == "amp" else ""),
                )
            )
        elif key not in DEEPSPEED_TOP_LEVEL_KEYS:
            near = difflib.get_close_matches(key, sorted(DEEPSPEED_TOP_LEVEL_KEYS), n=1)
            findings.append(
                Finding(
                    severity="error",
                    check="config_keys",
                    message=f"DeepSpeed never reads top-level key {key!r}: it would be silently "
                    "ignored",
                    fix=f"rename it to {near[0]!r}" if near else f"delete {key!r}",
                )
            )
    for path in _auto_paths(config):
        findings.append(
            Finding(
                severity="error",
                check="config_keys",
                message=f'{path} is "auto": only the Hugging Face Trainer integration resolves '
                '"auto"; launched with deepspeed the value is not a number',
                fix="write the number (emit_deepspeed_config's strict config has it)",
            )
        )
    if not findings:
        findings.append(
            Finding(
                severity="info",
                check="config_keys",
                message=f"all {len(config)} top-level keys are ones DeepSpeed reads; "
                'no "auto" values',
            )
        )
    return findings


def _auto_paths(value: Any, path: str = "") -> list[str]:
    """Dotted paths of the "auto" strings in a config (lists indexed by position)."""
    if isinstance(value, str):
        auto = value.strip().lower() == "auto" and path not in AUTO_ALLOWED
        return [path] if auto else []
    if isinstance(value, dict):
        items: list[tuple[str, Any]] = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return []
    return [p for k, v in items for p in _auto_paths(v, f"{path}.{k}" if path else k)]


def suggest(args: dict[str, Any]) -> str:
    """A plan_parallelism call as a fix names it: the tool and its JSON arguments."""
    return f"plan_parallelism {json.dumps(args)}"


def memory_fix(framework: FrameworkChoice, memory: MemoryPlan | None) -> str:
    """After an OOM: the plan_parallelism changes that lower memory per GPU, cheapest first."""
    if memory is None:
        return SMOKE_FIXES["oom"]
    options: list[str] = []
    order = list(STRATEGY_ORDER)
    if framework.primary in ZERO_FRAMEWORKS and memory.chosen in order[:-1]:
        up = order[order.index(memory.chosen) + 1]
        how = "offload to CPU" if "offload" in up else "raise the ZeRO stage"
        options.append(f"{how}: {suggest({'min_strategy': up})} ({STRATEGY_GAIN[up]})")
    if not memory.activation_checkpointing:
        options.append(
            f"turn activation checkpointing on: {suggest({'activation_checkpointing': True})}"
        )
    if memory.micro_batch_size > 1:
        options.append(
            "halve the micro-batch, doubling gradient accumulation: "
            + suggest({"micro_batch_size": memory.micro_batch_size // 2})
        )
    if not options:
        return (
            f"{memory.chosen} with activation checkpointing and micro-batch 1 is as lean as this "
            "plan gets: use more GPUs, GPUs with more memory, or a shorter sequence"
        )
    return (
        "re-plan with less memory per GPU, then emit the config and rerun the smoke test; "
        "cheapest first: " + "; or ".join(options)
    )


def failure_label(finding: Finding) -> str:
    """A short name for an error finding: its check, and for a failed smoke run its kind."""
    if finding.check == "smoke_verdict":
        kind = finding.message.removeprefix("smoke run failed:").split(":", 1)[0].strip()
        return f"smoke {kind}" if kind else "smoke run"
    return finding.check or finding.message


def setup_of(memory: MemoryPlan | None, config: dict[str, Any] | None) -> dict[str, str]:
    """The choices a review round judged, as short strings (compared between rounds)."""
    if memory is None:
        return {}
    setup = {
        "strategy": setup_label(memory.chosen, memory.tensor_parallel, memory.pipeline_parallel)
    }
    if config is not None:
        setup["zero_stage"] = str((config.get("zero_optimization") or {}).get("stage", 0))
    setup["micro_batch"] = str(memory.micro_batch_size)
    setup["accumulation"] = str(memory.gradient_accumulation_steps)
    setup["activation_checkpointing"] = "on" if memory.activation_checkpointing else "off"
    return setup


_SETUP_PREFIX = "reviewed "


def round_findings(
    memory: MemoryPlan | None,
    config: dict[str, Any] | None,
    prior: Review | None,
    round_no: int,
) -> list[Finding]:
    """The review's record of the rounds: what earlier rounds failed on and what changed since.

    Each round records the setup it reviewed (check ``setup``, ``key=value`` pairs). The next
    round reads it from the review it follows, compares, and adds one ``review_history`` line,
    e.g. ``round 1: smoke oom -> round 2: strategy zero2 (was zero1), zero_stage 2 (was 1)``;
    lines of earlier rounds are carried forward, so the final review holds the whole story.
    """
    setup = setup_of(memory, config)
    findings: list[Finding] = []
    if prior is not None and prior.verdict == "changes_requested" and prior.rounds == round_no - 1:
        findings += [f for f in prior.findings if f.check == "review_history"]
        before: dict[str, str] = {}
        for f in prior.findings:
            if f.check == "setup" and f.message.startswith(_SETUP_PREFIX):
                before = dict(
                    item.split("=", 1)
                    for item in f.message.removeprefix(_SETUP_PREFIX).split()
                    if "=" in item
                )
        failed = [failure_label(f) for f in prior.findings if f.severity == "error"]
        changes = [f"{k} {v} (was {before[k]})" for k, v in setup.items() if before.get(k, v) != v]
        findings.append(
            Finding(
                severity="info",
                check="review_history",
                message=f"round {prior.rounds}: {', '.join(dict.fromkeys(failed)) or 'changes requested'}"
                f" -> round {round_no}: {', '.join(changes) or 'no change to the setup'}",
            )
        )
    if setup:
        findings.append(
            Finding(
                severity="info",
                check="setup",
                message=_SETUP_PREFIX + " ".join(f"{k}={v}" for k, v in setup.items()),
            )
        )
    return findings
