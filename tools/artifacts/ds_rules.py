"""DeepSpeed 0.19's config rules for the configs the planner writes, checked without DeepSpeed.

Importing DeepSpeed imports torch: 0.7-1.0 s of CPU in a planning process that trains nothing
(bench/suite/plan_cold.py). So the engineer checks the config it emits with
``check_deepspeed_rules``, not with DeepSpeed's own ``DeepSpeedConfig``
(``tools/artifacts/ds_validate.py``, which the smoke run's DeepSpeed and every launch still
parse). The rules are what DeepSpeedConfig and the scheduler's constructor enforce on the blocks
the planner writes:

- the object and world size, no ``"auto"``, no unknown or removed top-level key (the key sets of
  ``tools/review/config_keys.py``);
- the batch sizes: DeepSpeed's completion of a missing one and its identity
  ``train_batch_size == micro x accumulation x world size``, each above 0;
- ``zero_optimization``, its ``offload_*`` blocks, ``bf16``, ``fp16`` and ``tensor_parallel``:
  no key outside their pydantic models (which forbid extras), a ZeRO stage of 0 to 3, an offload
  device of none, cpu or nvme, not fp16 and bf16 both enabled;
- ``scheduler``: one of DeepSpeed's schedulers, no parameter its constructor does not take, the
  ones it requires present, and WarmupCosineLR's positive whole ``warmup_num_steps``.

The key sets below are DeepSpeed 0.19.8's (its models' fields and aliases; each scheduler's
``__init__`` parameters). ``tests/unit/artifacts/test_ds_rules.py`` re-records them from the
installed DeepSpeed, and proves the two checks give the same verdict on every config the emitter
writes over the strategy, precision, tensor-parallel and schedule grid, and on a mutation of
each rule. Values the rules do not cover (a field's type) are the emitter's, which that grid
runs through DeepSpeedConfig.
"""

from __future__ import annotations

from typing import Any

from tools.artifacts.deepspeed_config import ConfigError
from tools.review.config_keys import DEEPSPEED_REMOVED_KEYS, DEEPSPEED_TOP_LEVEL_KEYS, auto_paths

# deepspeed/runtime/zero/config.py DeepSpeedZeroConfig: fields and aliases (extra="forbid").
ZERO_KEYS = frozenset(
    {
        "allgather_bucket_size", "allgather_partitions", "allgather_sequential",
        "compute_grad_norm", "contiguous_gradients", "cpu_offload", "cpu_offload_param",
        "cpu_offload_use_pin_memory", "elastic_checkpoint", "enable_sanity_checks",
        "gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module",
        "legacy_stage1", "load_from_fp32_weights", "log_trace_cache_warnings",
        "max_live_parameters", "max_reuse_distance", "memory_efficient_linear",
        "model_persistence_threshold", "module_granularity_threshold", "offload_optimizer",
        "offload_param", "overlap_comm", "override_module_apply", "param_persistence_threshold",
        "parameter_alignment", "pipeline_loading_checkpoint", "prefetch_bucket_size",
        "reduce_bucket_size", "reduce_scatter", "round_robin_gradients",
        "save_muon_momentum_buffer_in_memory", "stage", "stage3_allgather_sequential",
        "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
        "stage3_max_live_parameters", "stage3_max_reuse_distance",
        "stage3_model_persistence_threshold", "stage3_module_granularity_threshold",
        "stage3_param_persistence_threshold", "stage3_prefetch_bucket_size",
        "stage3_use_all_reduce_for_fetch_params", "sub_group_size",
        "use_all_reduce_for_fetch_params", "use_multi_rank_bucket_allreduce", "zenflow",
        "zero_hpz_partition_size", "zero_quantized_gradients",
        "zero_quantized_nontrainable_weights", "zero_quantized_weights",
    }
)  # fmt: skip
# deepspeed/runtime/zero/offload_config.py: the two offload blocks' models.
OFFLOAD_KEYS = {
    "offload_param": frozenset(
        {"buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"}
    ),
    "offload_optimizer": frozenset(
        {
            "buffer_count",
            "cpuadam_cores_perc",
            "device",
            "fast_init",
            "nvme_path",
            "pin_memory",
            "pipeline_read",
            "pipeline_write",
            "ratio",
            "super_offload",
        }
    ),  # fmt: skip
}
OFFLOAD_DEVICES = frozenset({"none", "cpu", "nvme"})  # OffloadDeviceEnum
ZERO_STAGES = (0, 1, 2, 3)  # ZeroStageEnum
# deepspeed/runtime/precision_config.py and runtime/tensor_parallel/config.py (extra="forbid").
BLOCK_KEYS = {
    "bf16": frozenset(
        {
            "bf16_master_weights_and_grads", "bf16_optimizer_states", "check_grad_overflow",
            "enabled", "immediate_grad_update",
        }
    ),
    "fp16": frozenset(
        {
            "auto_cast", "consecutive_hysteresis", "enabled", "fp16_master_weights_and_grads",
            "hysteresis", "initial_scale_power", "loss_scale", "loss_scale_window",
            "min_loss_scale",
        }
    ),
    "tensor_parallel": frozenset(
        {
            "autotp_size", "dtype", "injection_policy_tuple", "keep_module_on_host",
            "kernel_inject", "partition_config", "preset_model", "replace_with_kernel_inject",
            "tensor_parallel", "tp", "tp_overlap_comm", "vocab_parallel_ce_backend",
            "vocab_parallel_lm_head",
        }
    ),
}  # fmt: skip
# deepspeed/runtime/lr_schedules.py: each scheduler's keyword parameters (after the optimizer)
# and which of them have no default.
SCHEDULER_PARAMS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "LRRangeTest": (
        frozenset(
            {
                "lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
                "lr_range_test_staircase", "last_batch_iteration",
            }
        ),
        frozenset(),
    ),
    "OneCycle": (
        frozenset(
            {
                "cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
                "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
                "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom",
                "decay_mom_rate", "last_batch_iteration",
            }
        ),
        frozenset({"cycle_min_lr", "cycle_max_lr"}),
    ),
    "WarmupLR": (
        frozenset(
            {
                "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                "last_batch_iteration",
            }
        ),
        frozenset(),
    ),
    "WarmupDecayLR": (
        frozenset(
            {
                "total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                "warmup_type", "last_batch_iteration",
            }
        ),
        frozenset({"total_num_steps"}),
    ),
    "WarmupCosineLR": (
        frozenset(
            {
                "total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
                "warmup_type", "last_batch_iteration",
            }
        ),
        frozenset({"total_num_steps"}),
    ),
}  # fmt: skip
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _rejects(message: str, key: str | None = None) -> ConfigError:
    return ConfigError(f"DeepSpeed rejects the config: {message}", key=key)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_top_level(config: dict[str, Any]) -> None:
    removed = sorted(str(key) for key in config if key in DEEPSPEED_REMOVED_KEYS)
    if removed:
        raise _rejects(f"{removed[0]!r} is a feature DeepSpeed 0.19 removed", key=removed[0])
    unknown = sorted(str(key) for key in config if key not in DEEPSPEED_TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(
            f"DeepSpeed does not read {', '.join(unknown)} and would ignore it", key=unknown[0]
        )


def _check_batch(config: dict[str, Any], world_size: int) -> None:
    """DeepSpeedConfig's _set_batch_related_parameters, then its _batch_assertion."""
    train, micro, accum = (config.get(key) for key in BATCH_KEYS)
    for key, value in zip(BATCH_KEYS, (train, micro, accum), strict=True):
        if value is not None and not _is_count(value):
            raise _rejects(f"{key} is {value!r}, not a whole number", key=key)
    if train is not None and micro is not None and accum is None:
        accum = train // micro // world_size
    elif train is not None and accum is not None and micro is None:
        micro = train // world_size // accum
    elif micro is not None and accum is not None and train is None:
        train = micro * accum * world_size
    elif train is not None and micro is None and accum is None:
        accum, micro = 1, train // world_size
    elif micro is not None and train is None and accum is None:
        train, accum = micro * world_size, 1
    if train is None or micro is None or accum is None:
        raise _rejects("either train_batch_size or train_micro_batch_size_per_gpu is needed")
    for key, value in zip(BATCH_KEYS, (train, micro, accum), strict=True):
        if value <= 0:
            raise _rejects(f"{key} {value} has to be greater than 0", key=key)
    if train != micro * accum * world_size:
        raise _rejects(
            "Check batch related parameters. train_batch_size is not equal to "
            "micro_batch_per_gpu * gradient_acc_step * world_size "
            f"{train} != {micro} * {accum} * {world_size}",
            key="train_batch_size",
        )


def _check_block(name: str, block: Any, allowed: frozenset[str]) -> None:
    if not isinstance(block, dict):
        raise _rejects(f"{name} is {type(block).__name__}, not an object", key=name)
    extra = sorted(str(key) for key in block if key not in allowed)
    if extra:
        raise _rejects(
            f"{name}.{extra[0]}: extra inputs are not permitted", key=f"{name}.{extra[0]}"
        )


def _check_zero(zero: Any) -> None:
    if isinstance(zero, bool):  # the legacy form: true is stage 1
        return
    _check_block("zero_optimization", zero, ZERO_KEYS)
    stage = zero.get("stage", 0)
    if not _is_count(stage) or stage not in ZERO_STAGES:
        raise _rejects(f"ZeRO stage {stage!r} is not 0, 1, 2 or 3", key="zero_optimization.stage")
    for name, allowed in OFFLOAD_KEYS.items():
        if zero.get(name) is None:
            continue
        _check_block(f"zero_optimization.{name}", zero[name], allowed)
        device = zero[name].get("device", "none")
        if device not in OFFLOAD_DEVICES:
            raise _rejects(
                f"offload device {device!r} is not none, cpu or nvme",
                key=f"zero_optimization.{name}.device",
            )


def _check_scheduler(scheduler: Any) -> None:
    name = scheduler.get("type") if isinstance(scheduler, dict) else None
    if not isinstance(name, str) or name not in SCHEDULER_PARAMS:
        raise ConfigError(
            f"{name!r} is not a DeepSpeed scheduler ({', '.join(SCHEDULER_PARAMS)})",
            key="scheduler.type",
        )
    params = scheduler.get("params", {})
    accepted, required = SCHEDULER_PARAMS[name]
    if not isinstance(params, dict):
        raise ConfigError(f"the {name} parameters are not an object", key="scheduler.params")
    unknown = sorted(str(k) for k in params if k not in accepted)
    if unknown:
        raise ConfigError(
            f"DeepSpeed rejects the scheduler: {name} takes no parameter {unknown[0]!r}",
            key=f"scheduler.params.{unknown[0]}",
        )
    missing = sorted(required - set(params))
    if missing:
        raise ConfigError(
            f"DeepSpeed rejects the scheduler: {name} needs {missing[0]!r}",
            key=f"scheduler.params.{missing[0]}",
        )
    warmup = params.get("warmup_num_steps", 1000)
    if name == "WarmupCosineLR" and (not _is_count(warmup) or warmup <= 0):
        raise ConfigError(
            f"DeepSpeed rejects the scheduler: warmup_num_steps must be a positive integer, "
            f"got {warmup!r}",
            key="scheduler.params.warmup_num_steps",
        )


def check_written_form(config: Any, world_size: int) -> None:
    """What both checks refuse before any rule: not an object, no ranks, an ``"auto"`` value."""
    if not isinstance(config, dict):
        raise ConfigError(f"expected a JSON object, got {type(config).__name__}")
    if world_size < 1:
        raise ConfigError(f"world size must be at least 1, got {world_size}", key="world_size")
    autos = auto_paths(config)
    if autos:
        raise ConfigError(
            '"auto" is only resolved by the Hugging Face integration; DeepSpeed drops it and '
            "uses its default. Write a number.",
            key=autos[0],
        )


def check_deepspeed_rules(config: dict[str, Any], world_size: int) -> None:
    """Check ``config`` against DeepSpeed 0.19's rules at ``world_size`` data-parallel ranks.

    Args:
        config: The ds_config.json contents.
        world_size: Data-parallel ranks the config will run on.

    Raises:
        ConfigError: a rule of the module docstring fails; the message names it, as
            ``validate_deepspeed_config`` would.
    """
    check_written_form(config, world_size)
    _check_top_level(config)
    _check_batch(config, world_size)
    if config.get("zero_optimization") is not None:
        _check_zero(config["zero_optimization"])
    for name in ("bf16", "fp16", "tensor_parallel"):
        if config.get(name) is not None:
            _check_block(name, config[name], BLOCK_KEYS[name])
    if all(isinstance(config.get(p), dict) and config[p].get("enabled") for p in ("bf16", "fp16")):
        raise _rejects("bfloat16 and fp16 modes cannot be simultaneously enabled", key="bf16")
    if config.get("scheduler") is not None:
        _check_scheduler(config["scheduler"])
