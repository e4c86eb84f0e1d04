"""Adapt a planned DeepSpeed config to the local smoke world: its ranks, device and model.

What the local world cannot honour or does not need changes (half precision and CUDA-only
kernels on CPU, nvme offload, sections that log or tune, batch and bucket sizes, the learning
rate); the ZeRO stage and the offloads stay, since they are what the smoke run proves.
"""

from __future__ import annotations

import copy
from typing import Any

from tools.core.schemas import ModelSpec
from tools.smoke.schedule import scale_ds_scheduler

# The plan's learning rate is sized for the full model over a long run (often 1e-5); a
# random-init tiny model needs a larger peak rate to show learning within ~30 steps. The plan's
# schedule runs, its lengths scaled to the smoke steps (schedule.py).
SMOKE_LR = 3e-3
# Above this width the rate shrinks as 1/width: Adam's per-weight step must shrink as fan-in
# grows for the update to stay the same size (Yang et al. 2021, "Tensor Programs V", muP).
SMOKE_LR_WIDTH = 256
# Sections that need the network (wandb, comet), write outside the run dir, or change the
# batch sizes we set (elasticity, autotuning); none of them bears on whether training works.
_DROPPED_SECTIONS = (
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "flops_profiler",
    "comms_logger",
    "autotuning",
    "elasticity",
    "checkpoint",
    "nebula",
    "data_efficiency",
    "curriculum_learning",
    "compression_training",
    "dump_state",
    # AutoTP's tensor-parallel degree (the plan's framework is DeepSpeed AutoTP): the smoke
    # world's few ranks run the ZeRO part data-parallel; the degree is the launch files'.
    "tensor_parallel",
)


def smoke_lr(hidden: int) -> float:
    """The smoke run's constant learning rate for a model of width ``hidden``."""
    return SMOKE_LR * min(1.0, SMOKE_LR_WIDTH / max(1, hidden))


def adapt_ds_config(
    ds_config: dict[str, Any],
    *,
    device: str,
    ranks: int,
    micro_batch_size: int,
    scaled: ModelSpec | None = None,
    lr: float = SMOKE_LR,
    steps: int | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Adapt a DeepSpeed config to the local smoke world; return it and notes on what changed.

    With ``scaled`` (the model the run builds), the ZeRO bucket sizes become the ones the
    planner gives that model (tools/planning/memory.py ``zero_settings``): the planned sizes are sized
    for the full model and would make the scaled run's buffers, and so its memory, unlike
    both the target's and the prediction's. With ``steps``, the plan's ``scheduler`` runs with
    its lengths scaled to them (schedule.py); without, it is dropped and the rate is constant.
    """
    cfg = _drop_auto(copy.deepcopy(ds_config))
    notes: list[str] = []
    for key in _DROPPED_SECTIONS:
        if cfg.pop(key, None) is not None:
            notes.append(f"dropped {key}")
    cfg["train_micro_batch_size_per_gpu"] = micro_batch_size
    cfg["gradient_accumulation_steps"] = 1
    cfg["train_batch_size"] = micro_batch_size * ranks
    cfg["steps_per_print"] = 10**9
    cfg["wall_clock_breakdown"] = False

    on_cpu = device != "cuda"
    if on_cpu:
        for key in ("bf16", "fp16", "amp", "torch_autocast"):
            section = cfg.pop(key, None)
            if isinstance(section, dict) and section.get("enabled"):
                notes.append(f"{key} -> fp32 (CPU)")
        # Half-precision communication and quantized ZeRO collectives have no CPU kernels.
        cfg.pop("communication_data_type", None)

    zero = cfg.get("zero_optimization")
    offload_optimizer = False
    if isinstance(zero, dict):
        if on_cpu:
            for key in (
                "zero_quantized_weights",
                "zero_quantized_gradients",
                "zero_hpz_partition_size",
            ):
                if zero.pop(key, None):
                    notes.append(f"dropped zero_optimization.{key} (CUDA kernels)")
        for key in ("offload_optimizer", "offload_param"):
            section = zero.get(key)
            if not isinstance(section, dict):
                continue
            where = section.get("device", "none")
            if where == "nvme":
                # The target's nvme_path does not exist here, and async_io needs libaio.
                zero[key] = {"device": "cpu", "pin_memory": bool(section.get("pin_memory"))}
                notes.append(f"{key} nvme -> cpu")
            if key == "offload_optimizer" and zero[key].get("device", "none") != "none":
                offload_optimizer = True
        if scaled is not None and zero.get("stage"):
            _rescale_buckets(zero, scaled, notes)

    optimizer = cfg.get("optimizer")
    if not isinstance(optimizer, dict) or not optimizer.get("type"):
        optimizer = {"type": "AdamW", "params": {}}
        notes.append("added AdamW")
    params = dict(optimizer.get("params") or {})
    if on_cpu and str(optimizer["type"]).lower() not in ("adam", "adamw"):
        # Other config-built optimizers (Lamb, Lion, 1-bit Adam) have no CPU kernel without offload.
        notes.append(f"optimizer {optimizer['type']} -> AdamW (CPU)")
        optimizer = {"type": "AdamW"}
        params = {k: v for k, v in params.items() if k in ("betas", "eps", "weight_decay")}
    params["lr"] = lr
    if not offload_optimizer and str(optimizer["type"]).lower() in ("adam", "adamw"):
        # Same Adam(W) update (torch.optim.AdamW) without JIT-building DeepSpeed's fused_adam
        # op (gcc on CPU, nvcc on GPU: a minute or more the first time, and a CUDA toolkit that
        # must match torch's). The optimizer states, and so the memory, are the same.
        params["torch_adam"] = True
    optimizer["params"] = params
    cfg["optimizer"] = optimizer
    scheduler = cfg.pop("scheduler", None)
    if isinstance(scheduler, dict) and steps is not None:
        cfg["scheduler"], note = scale_ds_scheduler(scheduler, steps, lr)
        notes.append(note)
    else:
        notes.append(f"constant lr {lr:g}" + (" (dropped scheduler)" if scheduler else ""))
    return cfg, notes


def _rescale_buckets(zero: dict[str, Any], scaled: ModelSpec, notes: list[str]) -> None:
    from tools.planning.states import zero_settings

    stage = int(zero["stage"])
    sizes = zero_settings(scaled, "zero3" if stage == 3 else "zero2")  # type: ignore[arg-type]
    wanted = {
        "reduce_bucket_size": sizes.reduce_bucket_size,
        "allgather_bucket_size": sizes.allgather_bucket_size,
        "stage3_prefetch_bucket_size": sizes.prefetch_bucket_size,
        "stage3_param_persistence_threshold": sizes.param_persistence_threshold,
    }
    changed = False
    for key, value in wanted.items():
        if key in zero and zero[key] != value:
            zero[key] = value
            changed = True
    if changed:
        notes.append("ZeRO bucket sizes scaled to the smoke model")


def _drop_auto(value: Any) -> Any:
    # "auto" values are filled in by the HF Trainer integration only; DeepSpeed rejects them,
    # and its own defaults are what a plain deepspeed.initialize would use.
    if isinstance(value, dict):
        return {k: _drop_auto(v) for k, v in value.items() if v != "auto"}
    if isinstance(value, list):
        return [_drop_auto(v) for v in value]
    return value
