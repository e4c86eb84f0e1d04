"""What DeepSpeed would ignore or refuse in a config: unknown or removed top-level keys, "auto"."""

from __future__ import annotations

import difflib
from typing import Any

from tools.core.schemas import Finding

# The top-level keys DeepSpeed 0.19's DeepSpeedConfig reads: DeepSpeedConfig.__init__ and
# _initialize_params in deepspeed/runtime/config.py, through the get_* helpers over the names in
# deepspeed/runtime/constants.py and the config classes they build. Recorded by parsing a config
# with a dict that logs every lookup (as tools/artifacts/deepspeed_config.py validates); "bfloat16" is the
# legacy alias read when "bf16" is absent, "sequence_parallel_size" is read only without an mpu.
# DeepSpeed silently ignores any other top-level key: "zero_optimisation" trains without ZeRO.
# tests/graph/test_review_loop.py re-records the set from the installed DeepSpeed.
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
    for path in auto_paths(config):
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


def auto_paths(value: Any, path: str = "") -> list[str]:
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
    return [p for k, v in items for p in auto_paths(v, f"{path}.{k}" if path else k)]
