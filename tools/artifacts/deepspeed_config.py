"""Emit a DeepSpeed config for a memory plan, and validate configs with DeepSpeed itself.

``emit_deepspeed_config`` writes only concrete numbers: DeepSpeed's pydantic configs drop any
``"auto"`` value and fall back to the default (``DeepSpeedConfigModel.__init__``), and plain
DeepSpeed never resolves ``auto`` batch sizes, which only the Hugging Face integration fills.
``validate_deepspeed_config`` (ds_validate.py) runs DeepSpeed's own ``DeepSpeedConfig`` at the
target world size and rejects what DeepSpeed would silently ignore; the planning engineer
checks its config with ``check_deepspeed_rules`` (ds_rules.py), tested to give the same verdict
on every config emitted here, without importing DeepSpeed and torch.

A plan with tensor/pipeline parallelism (``plan.tensor_parallel`` x ``plan.pipeline_parallel``
> 1) runs under Megatron-DeepSpeed, which builds the parallel layers and hands DeepSpeed its
``mpu``; DeepSpeed then sizes batches by the data-parallel group, world / (t x p). So the
config's ``train_batch_size`` is micro x accumulation x data-parallel ranks, and it is validated
at that size (``validate_deepspeed_config(config, data_parallel_size(...))``), the way
DeepSpeedConfig itself reads ``mpu.get_data_parallel_world_size()``.

``hf_trainer_config`` derives the Hugging Face Trainer flavour (``ds_config_hf.json``), where
the values the Trainer fills from ``TrainingArguments`` say ``"auto"``. The strict validator
rejects that flavour on purpose; it is checked instead by resolving each ``"auto"`` back to the
strict config's value (tests/unit/artifacts/test_deepspeed_config.py).
"""

from __future__ import annotations

import copy
import math
from typing import Any

from tools.core.errors import ToolFailure
from tools.core.schemas import HardwareSpec, MemoryPlan, ModelSpec, TrainingBrief
from tools.core.strategies import OFFLOAD_STRATEGIES, ZERO_STAGE, check_strategy
from tools.planning import resolve_precision, zero_settings
from tools.planning.batch import resolve_batch
from tools.planning.batch_layout import BatchLayout
from tools.planning.lr_schedule import (
    DEFAULT_RUN_STEPS,
    LrSchedule,
    brief_schedule,
    warmup_steps,
)

# The optimizer recipe by task, with the request's settings (tools/planning/optimizer_recipe.py);
# task_recipe re-exported for the launchers that import it from here.
from tools.planning.optimizer_recipe import TRAINED_TASKS, brief_recipe
from tools.planning.optimizer_recipe import task_recipe as task_recipe
from tools.research.megatron_arch import architecture
from tools.research.titan_flavors import torchtitan_flavor


class ConfigError(ToolFailure):
    """A DeepSpeed config that DeepSpeed rejects, or would misread; ``key`` names the culprit."""

    def __init__(self, message: str, key: str | None = None) -> None:
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)


def run_schedule(
    brief: TrainingBrief, model: ModelSpec, total_steps: int, layout: BatchLayout | None = None
) -> LrSchedule:
    """The plan's learning-rate schedule for a ``total_steps`` run (lr_schedule.py's rules)."""
    sequences = layout.global_batch if layout is not None else brief.batch
    return brief_schedule(brief, model.params, sequences * brief.seq_len, total_steps)


def scheduler_section(schedule: LrSchedule) -> dict[str, Any]:
    """DeepSpeed's scheduler for the schedule's decay (deepspeed/runtime/lr_schedules.py).

    Cosine: ``WarmupCosineLR``, linear warm-up from ``warmup_min_ratio`` x lr over
    ``warmup_num_steps`` (DeepSpeed raises it to 2 at the least), then cosine to
    ``cos_min_ratio`` x lr at ``total_num_steps``; it peaks at the optimizer's ``lr``. Linear:
    ``WarmupDecayLR``, warm-up from ``warmup_min_lr`` to ``warmup_max_lr``, then linear back
    down to ``warmup_min_lr`` at ``total_num_steps`` (so a floor is also where its warm-up
    starts). Constant: ``WarmupLR``, the warm-up, then ``warmup_max_lr``.
    """
    if schedule.decay == "cosine":
        return {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": schedule.total_steps,
                "warmup_min_ratio": 0.0,
                "warmup_num_steps": schedule.warmup_steps,
                "cos_min_ratio": schedule.min_lr_ratio,
                "warmup_type": "linear",
            },
        }
    params: dict[str, Any] = {
        "warmup_min_lr": schedule.min_lr if schedule.decay == "linear" else 0.0,
        "warmup_max_lr": schedule.peak_lr,
        "warmup_num_steps": schedule.warmup_steps,
        "warmup_type": "linear",
    }
    if schedule.decay == "constant":
        return {"type": "WarmupLR", "params": params}
    return {"type": "WarmupDecayLR", "params": {"total_num_steps": schedule.total_steps, **params}}


def optimizer_sections(
    brief: TrainingBrief,
    model: ModelSpec,
    hardware: HardwareSpec,
    layout: BatchLayout,
    total_steps: int,
) -> dict[str, Any]:
    """ds_config.json's ``optimizer``, ``scheduler`` and ``gradient_clipping`` for the run."""
    recipe = brief_recipe(brief)
    schedule = run_schedule(brief, model, total_steps, layout)
    params: dict[str, Any] = {
        "lr": schedule.peak_lr,
        "betas": recipe.betas,
        "eps": recipe.eps,
        "weight_decay": recipe.weight_decay,
    }
    if hardware.gpu is None:
        # DeepSpeed's FusedAdam is a CUDA kernel; on CPU use torch.optim.AdamW.
        params["torch_adam"] = True
    return {
        "optimizer": {"type": "AdamW", "params": params},
        "scheduler": scheduler_section(schedule),
        # 0: DeepSpeed clips nothing (its engine clips only when gradient_clipping > 0).
        "gradient_clipping": recipe.max_grad_norm,
    }


def with_run_steps(
    config: dict[str, Any], total_steps: int, warmup: int | None = None, constant: bool = False
) -> dict[str, Any]:
    """The config with its schedule resized to a ``total_steps`` run (the launch's steps).

    A schedule emitted for another length keeps its type, peak and floor; its total becomes the
    run's and its warm-up the planner's share of it (``warmup_steps``), or the ``warmup`` steps
    the request names (at most the run's). A WarmupLR without a
    total (never decays) becomes WarmupCosineLR over the run, peaking at its own rate, unless
    the request asks for a ``constant`` rate (then only its warm-up is resized). A config
    with no scheduler, or already sized for the run, is returned as it is.
    """
    section = config.get("scheduler")
    if not isinstance(section, dict) or not isinstance(section.get("params"), dict):
        return config
    params = section["params"]
    warm = min(warmup, total_steps) if warmup else warmup_steps(total_steps)
    if constant and section.get("type") == "WarmupLR":
        if params.get("warmup_num_steps") == warm:
            return config
        updated = copy.deepcopy(config)
        updated["scheduler"]["params"] = dict(params, warmup_num_steps=warm)
        return updated
    sized = params.get("total_num_steps") == total_steps
    if sized and (warmup is None or params.get("warmup_num_steps") == warm):
        return config  # already the run's (a config's own warm-up kept unless one is asked)
    updated = copy.deepcopy(config)
    new = dict(params, total_num_steps=total_steps, warmup_num_steps=warm)
    if section.get("type") == "WarmupLR":
        peak = params.get("warmup_max_lr")
        if isinstance(peak, (int, float)) and "optimizer" in updated:
            updated["optimizer"].setdefault("params", {})["lr"] = peak
        new = {
            "total_num_steps": total_steps,
            "warmup_min_ratio": 0.0,
            "warmup_num_steps": warm,
            "cos_min_ratio": 0.0,
            "warmup_type": "linear",
        }
        updated["scheduler"] = {"type": "WarmupCosineLR", "params": new}
        return updated
    updated["scheduler"]["params"] = new
    return updated


# The keys the Hugging Face Trainer resolves when they say "auto" (Transformers docs: DeepSpeed
# integration, 'auto' values; HfTrainerDeepSpeedConfig.trainer_config_process and
# trainer_config_finalize in transformers/integrations/deepspeed.py). Batch sizes, clipping,
# optimizer and precision come from TrainingArguments; total_num_steps and warmup_num_steps
# from the computed step count; the three ZeRO sizes from the model's hidden size.
HF_AUTO_KEYS: tuple[str, ...] = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "optimizer.params.lr",
    "optimizer.params.betas",
    "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
    "bf16.enabled",
    "fp16.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)
# Filled from the hidden size. The docs set them to "auto" for ZeRO-3 only, and only there do
# our values equal the integration's (tools/planning/memory.py zero_settings), so ZeRO-1/2 keep numbers.
_HF_ZERO3_KEYS = frozenset(key for key in HF_AUTO_KEYS if key.startswith("zero_optimization."))


def zero_section(plan: MemoryPlan, model: ModelSpec) -> dict[str, Any]:
    """The ``zero_optimization`` section of the plan's chosen strategy for ``model``."""
    stage = ZERO_STAGE[plan.chosen]
    if stage == 0:
        return {"stage": 0}
    sizes = zero_settings(model, plan.chosen)
    section: dict[str, Any] = {
        "stage": stage,
        # Overlap reduction with backward; tools/planning/memory.py budgets its extra buffers.
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": sizes.reduce_bucket_size,
    }
    if stage < 3:
        section.update(
            {
                "allgather_partitions": True,
                "allgather_bucket_size": sizes.allgather_bucket_size,
                "reduce_scatter": True,
            }
        )
    else:
        section.update(
            {
                "stage3_prefetch_bucket_size": sizes.prefetch_bucket_size,
                "stage3_param_persistence_threshold": sizes.param_persistence_threshold,
                "stage3_max_live_parameters": sizes.max_live_parameters,
                "stage3_max_reuse_distance": sizes.max_reuse_distance,
                "sub_group_size": sizes.sub_group_size,
                # Without it, a ZeRO-3 save holds only this rank's shard of the weights.
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
    if plan.chosen in OFFLOAD_STRATEGIES:
        section["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.chosen == "zero3_offload_all":
        section["offload_param"] = {"device": "cpu", "pin_memory": True}
    return section


def planned_total_steps(brief: TrainingBrief) -> int | None:
    """Optimizer steps to train on ``brief.dataset_tokens``: ceil(tokens / (batch x seq_len))."""
    if brief.dataset_tokens is None:
        return None
    return max(1, math.ceil(brief.dataset_tokens / (brief.batch * brief.seq_len)))


def emit_deepspeed_config(
    plan: MemoryPlan,
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    *,
    total_steps: int | None = None,
    autotp: bool = False,
) -> dict[str, Any]:
    """Write the ds_config.json contents for the plan's chosen strategy and batch split.

    Args:
        plan: The memory plan; its chosen strategy, micro batch, accumulation and checkpointing.
        model: The architecture (hidden size sets the ZeRO-3 bucket sizes).
        hardware: The target; its data-parallel size (the world size over the plan's tensor x
            pipeline degree) fixes train_batch_size.
        brief: The brief (task picks the optimizer recipe, precision the 16-bit section).
        total_steps: Planned optimizer steps, which the schedule (WarmupCosineLR: warm-up,
            then cosine decay, ``run_schedule``) spans. Defaults to the brief's
            ``dataset_tokens`` over the tokens per step (``planned_total_steps``), else the
            launch files' default run (``DEFAULT_RUN_STEPS``); the launch resizes it to the
            steps it runs (``with_run_steps``).
        autotp: The plan's tensor parallelism runs on DeepSpeed AutoTP (the plan's framework is
            deepspeed, tools/research/framework.py ``setup_framework``): the config gets
            ``"tensor_parallel": {"autotp_size": t}``. Otherwise Megatron builds the split and
            hands DeepSpeed its process groups, and the config has no such section.
    """
    brief = resolve_batch(brief, model, hardware)[0]  # the default the search planned with
    layout = BatchLayout.of_plan(plan, hardware)
    _check_batch(plan, layout, brief)
    _check_parallelism(plan, autotp, ring=torchtitan_flavor(model) is not None)
    if total_steps is None:
        total_steps = planned_total_steps(brief) or DEFAULT_RUN_STEPS
    tp = plan.tensor_parallel
    config: dict[str, Any] = {
        # AutoTP: DeepSpeed counts every rank in train_batch_size (deepspeed_batch_ranks).
        **layout.deepspeed_fields(tp if autotp and tp > 1 else 1),
        "steps_per_print": 10,
        "wall_clock_breakdown": False,
    }
    config.update(_precision_section(brief, hardware))
    config["zero_optimization"] = zero_section(plan, model)
    if autotp and tp > 1:
        # DeepSpeed's AutoTP training section (deepspeed/runtime/tensor_parallel/config.py
        # TPTrainingConfig.autotp_size): deepspeed.initialize shards the model's linear layers
        # over groups of ``tp`` consecutive ranks; each group reads the same sequences.
        config["tensor_parallel"] = {"autotp_size": tp}
    if not autotp and tp > 1 and plan.pipeline_parallel > 1 and architecture(model).experts > 1:
        # Megatron-DeepSpeed's MoE pipeline passes the experts' loss beside the hidden states,
        # both needing grads; DeepSpeed's PipelineEngine partitions one such tensor only (its
        # pipe/engine.py asserts) and partitions by default (config.py get_pipeline_config):
        # megatron/model/gpt_model.py requires both switches off (a missing key reads as off).
        config["pipeline"] = {"pipe_partitioned": False, "grad_partitioned": False}
    if brief.task in TRAINED_TASKS:
        config |= optimizer_sections(brief, model, hardware, layout, total_steps)
    if plan.activation_checkpointing:
        config["activation_checkpointing"] = _checkpointing_section(plan, autotp)
    return config


def _check_batch(plan: MemoryPlan, layout: BatchLayout, brief: TrainingBrief) -> None:
    """Refuse a split whose sequences per step (micro x accumulation x data parallel) miss the brief's."""
    if layout.global_batch != brief.batch:
        raise ConfigError(
            f"plan gives {plan.micro_batch_size} x {plan.gradient_accumulation_steps} x "
            f"{layout.data_parallel} = {layout.global_batch} sequences per step, the brief asks "
            f"{brief.batch}",
            key="train_batch_size",
        )


def _check_parallelism(plan: MemoryPlan, autotp: bool, ring: bool = True) -> None:
    """Refuse the splits DeepSpeed cannot run: ring context parallel, ZeRO-2/3 with pipeline, AutoTP's.

    Context parallelism runs on Megatron-DeepSpeed as DeepSpeed-Ulysses, with this config
    (tools/artifacts/megatron.py); ``ring``: the plan's is torchtitan's ring attention instead.
    """
    if plan.context_parallel > 1 and (ring or autotp):
        raise ConfigError(
            f"context parallel {plan.context_parallel}: DeepSpeed has no ring attention over "
            "context-parallel ranks; the plan runs on torchtitan (torchtitan.toml)",
            key="context_parallel",
        )
    if plan.pipeline_parallel > 1 and ZERO_STAGE[plan.chosen] > 1:
        raise ConfigError(
            f"{plan.chosen} with pipeline parallelism: DeepSpeed's PipelineEngine takes ZeRO "
            "stage 0 or 1 only",
            key="zero_optimization.stage",
        )
    tp = plan.tensor_parallel
    if autotp and tp > 1 and (plan.pipeline_parallel > 1 or ZERO_STAGE[plan.chosen] > 2):
        raise ConfigError(
            f"{plan.chosen_label} on DeepSpeed AutoTP: AutoTP training takes tensor parallelism "
            "alone with ZeRO stage 0, 1 or 2 (deepspeed.ai/tutorials/autotp-training)",
            key="tensor_parallel.autotp_size",
        )


def _precision_section(brief: TrainingBrief, hardware: HardwareSpec) -> dict[str, Any]:
    """The 16-bit section (``bf16`` or ``fp16``) for the precision training runs in; {} for fp32."""
    precision = resolve_precision(brief.precision, hardware)
    if precision == "bf16":
        return {"bf16": {"enabled": True}}
    if precision == "fp16":
        # Dynamic loss scaling (loss_scale 0) from 2^16, DeepSpeed's documented defaults.
        return {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,
                "initial_scale_power": 16,
                "loss_scale_window": 1000,
                "hysteresis": 2,
                "min_loss_scale": 1,
            }
        }
    return {}


def _checkpointing_section(plan: MemoryPlan, autotp: bool) -> dict[str, Any]:
    """deepspeed.checkpointing's settings, for models that call it.

    Hugging Face models turn recomputation on with model.gradient_checkpointing_enable()
    instead.
    """
    return {
        # Megatron-DeepSpeed: split each checkpointed layer input over the tensor-parallel
        # ranks, as tools/planning/memory.py counts it (2*s*b*h/t per layer).
        "partition_activations": plan.tensor_parallel > 1 and not autotp,
        "cpu_checkpointing": False,
        "contiguous_memory_optimization": False,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }


def smoke_ds_config(
    model: ModelSpec,
    strategy: str,
    *,
    world_size: int,
    nodes: int = 1,
    micro_batch_size: int = 1,
    gpu: Any = None,
    activation_checkpointing: bool = False,
) -> dict[str, Any] | None:
    """The DeepSpeed config the planner emits for ``strategy`` on ``world_size`` ranks.

    For a smoke run without a plan (``app.py smoke``, the GPU check): the config as a plan with
    that strategy would carry it, before the runner adapts it to the local world. ``gpu`` (a
    GPUSpec) picks the precision as the planner would (bf16 where the GPU has it); without one
    the config is fp32. ``ddp`` gives None: a plain PyTorch DDP run with torchrun.
    """
    check_strategy(strategy)
    if strategy == "ddp":
        return None
    nodes = nodes if world_size % nodes == 0 else 1
    hardware = HardwareSpec(source="local", nodes=nodes, gpus_per_node=world_size // nodes, gpu=gpu)
    brief = TrainingBrief(
        model=model.name,
        task="pretrain",
        seq_len=model.seq_len,
        global_batch_size=micro_batch_size * world_size,
        hardware="local",
        precision="auto",
    )
    plan = MemoryPlan(
        strategies=[],
        chosen=strategy,  # type: ignore[arg-type]
        micro_batch_size=micro_batch_size,
        activation_checkpointing=activation_checkpointing,
    )
    return emit_deepspeed_config(plan, model, hardware, brief)


def hf_trainer_config(config: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of a strict DeepSpeed config with the Hugging Face Trainer's values "auto".

    Every key in ``HF_AUTO_KEYS`` that ``config`` has becomes ``"auto"`` (the ZeRO sizes only
    at stage 3); everything else (stage, offload, overlap_comm, contiguous_gradients,
    activation checkpointing, the fp16 loss scaling) is kept. The Trainer then fills the autos
    from ``TrainingArguments``, so the run matches the strict config only when those arguments
    carry the same values (learning_rate, adam_beta1/2, adam_epsilon, weight_decay,
    max_grad_norm, per_device_train_batch_size, gradient_accumulation_steps, warmup_steps,
    bf16/fp16). ``validate_deepspeed_config`` rejects the result: plain DeepSpeed drops "auto".

    Args:
        config: A ds_config.json as ``emit_deepspeed_config`` writes it (concrete numbers).
    """
    flavour = copy.deepcopy(config)
    zero = flavour.get("zero_optimization")
    stage = zero.get("stage") if isinstance(zero, dict) else None
    for key in HF_AUTO_KEYS:
        if key in _HF_ZERO3_KEYS and stage != 3:
            continue
        *parents, leaf = key.split(".")
        node: Any = flavour
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node[leaf] = "auto"
    return flavour
