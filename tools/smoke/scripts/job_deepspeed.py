"""The DeepSpeed mode (``--deepspeed_config``): the engine ``deepspeed.initialize`` builds.

Start it with the DeepSpeed launcher: ``deepspeed --num_gpus 8 train.py --deepspeed_config
ds_config.json ...``. The optimizer, precision, ZeRO stage, learning-rate schedule, gradient
clipping and accumulation come from the config. Under ZeRO-3 the model is built or loaded
already partitioned (``deepspeed.zero.Init`` through transformers' DeepSpeed integration), so
no rank ever holds the whole model. DeepSpeed is imported here only, so the FSDP and DDP modes
run where it is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from harness import UsageError
from job_loop import Job, preflight, train_loop
from job_model import add_lora, enable_checkpointing, load_model, model_config_dict
from job_probes import cpu_baseline_bytes, sample
from job_ranks import get_local_rank


class DeepSpeedJob(Job):
    """The engine ``deepspeed.initialize`` builds: it accumulates, clips and schedules itself."""

    def __init__(self, engine: Any, model: torch.nn.Module, lora: bool) -> None:
        device = (
            engine.device
            if isinstance(engine.device, torch.device)
            else torch.device(engine.device)
        )
        super().__init__(model, device, int(engine.gradient_accumulation_steps()))
        self.engine = engine
        self.lora = lora

    def micro_step(self, batch: torch.Tensor, last: bool) -> torch.Tensor:
        """Forward, backward, and the engine's step (a no-op before the boundary)."""
        loss = self.engine(input_ids=batch, labels=batch).loss
        sample()
        self.engine.backward(loss)
        sample()
        # The engine steps the optimizer only at the accumulation boundary it counts itself.
        self.engine.step()
        return loss

    def eval_loss(self, batch: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """A held-out micro-batch's loss through the engine (ZeRO-3 gathers the weights)."""
        return self.engine(input_ids=batch, labels=labels).loss

    def set_training(self, on: bool) -> None:
        """The engine's ``train()`` or ``eval()``."""
        if on:
            self.engine.train()
        else:
            self.engine.eval()

    def optimizer_step(self) -> None:
        """Nothing left to do: the engine stepped at the boundary."""
        sample()

    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return float(self.engine.optimizer.param_groups[0]["lr"])

    def save(self, root: Path, tag: str, state: dict[str, Any]) -> None:
        """DeepSpeed's own checkpoint format (``latest`` is ours: written once it is complete)."""
        # LoRA: the frozen base comes from --model-path again; only the adapters are saved.
        self.engine.save_checkpoint(
            str(root),
            tag=tag,
            client_state=state,
            save_latest=False,
            exclude_frozen_parameters=self.lora,
        )

    def load(self, root: Path, tag: str) -> dict[str, Any]:
        """DeepSpeed's load_checkpoint; returns the client state."""
        path, state = self.engine.load_checkpoint(
            str(root), tag=tag, load_module_strict=not self.lora
        )
        if path is None:
            raise UsageError(f"--checkpoint-dir {root}: DeepSpeed could not load {tag}")
        return dict(state or {})


# DeepSpeed's warm-up schedulers (deepspeed/runtime/lr_schedules.py): built at iteration -1
# with the rate 0, and at iteration 0 the linear warm-up's ratio is 0 too.
_WARMUP_SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")


def start_schedule(scheduler: Any) -> None:
    """Move a fresh DeepSpeed warm-up schedule to iteration 1, the rate of the first step.

    The engine steps the scheduler after each optimizer step, so as built the first two steps
    run at the rate 0 (iteration -1, then 0) and the warm-up reaches its peak two steps late.
    From iteration 1, step N runs at N/warmup of the peak, as train.py's own schedule does
    (``schedule_factor``). A resumed job loads the scheduler's state over this.
    """
    if type(scheduler).__name__ in _WARMUP_SCHEDULERS and scheduler.last_batch_iteration < 0:
        scheduler.step(1)


def run_deepspeed(args: argparse.Namespace) -> int:
    """DeepSpeed mode: the engine that ``deepspeed.initialize`` builds from the config."""
    # Imported here so the FSDP and DDP modes run where DeepSpeed is not installed.
    import deepspeed

    on_cuda = torch.cuda.is_available()
    local_rank = get_local_rank(args)
    if on_cuda:
        torch.cuda.set_device(local_rank)

    model_config = model_config_dict(args)
    ds_config = adapt_precision(json.loads(args.deepspeed_config.read_text()), on_cuda)
    if args.lr is not None and isinstance(ds_config.get("optimizer"), dict):
        ds_config["optimizer"].setdefault("params", {})["lr"] = args.lr

    skip_shm_comm_build()
    # The process group first, so that its buffers are in the CPU baseline, not the model's.
    deepspeed.init_distributed()
    tensor_parallel = int((ds_config.get("tensor_parallel") or {}).get("autotp_size") or 1)
    data = preflight(args, tensor_parallel)

    # Same seed on every rank: the replicas must start identical for data parallelism.
    torch.manual_seed(args.seed)
    # On CPU the peak is anonymous RSS; what the run itself adds is the peak minus what the
    # interpreter, torch, DeepSpeed and the model's code already hold.
    baseline_bytes = 0 if on_cuda else cpu_baseline_bytes(model_config)
    zero3 = int((ds_config.get("zero_optimization") or {}).get("stage", 0)) == 3
    # The config's dtype from the start (fp32 on CPU, where adapt_precision drops half
    # precision); DeepSpeed keeps the fp32 master copy in its optimizer.
    dtype = torch.float32
    if (ds_config.get("bf16") or {}).get("enabled"):
        dtype = torch.bfloat16
    elif (ds_config.get("fp16") or {}).get("enabled"):
        dtype = torch.float16
    keep_alive = zero3_context(ds_config) if zero3 else None
    # ZeRO-3: transformers builds or loads inside deepspeed.zero.Init (each parameter is
    # partitioned as it is created, on the device the config names). Otherwise on this rank's
    # device: a billion-parameter init on CPU takes long.
    where = None if zero3 else torch.device(f"cuda:{local_rank}" if on_cuda else "cpu")
    model: torch.nn.Module = add_lora(args, load_model(args, model_config, dtype, where))
    if "activation_checkpointing" in ds_config or args.gradient_checkpointing:
        enable_checkpointing(args, model)

    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config,
    )
    del keep_alive  # transformers' integration holds its own reference while it matters
    start_schedule(engine.lr_scheduler)
    engine.train()
    code = train_loop(
        args,
        DeepSpeedJob(engine, model, bool(args.lora_rank)),
        data,
        baseline_bytes=baseline_bytes,
        extra={
            "mode": "deepspeed",
            "deepspeed": deepspeed.__version__,
            "construction": "zero.Init" if zero3 else "full",
            "zero_stage": int((ds_config.get("zero_optimization") or {}).get("stage", 0)),
        },
        tensor_parallel=tensor_parallel,
    )
    if code == 0 and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return code


def zero3_context(ds_config: dict[str, Any]) -> Any:
    """Transformers' DeepSpeed integration, told the config: models build under zero.Init."""
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(ds_config)


def adapt_precision(ds_config: dict[str, Any], on_cuda: bool) -> dict[str, Any]:
    """Drop half precision where the device cannot train in it (fp32 on CPU)."""
    cfg = dict(ds_config)
    if not on_cuda:
        for key in ("bf16", "fp16"):
            cfg.pop(key, None)
    elif cfg.get("bf16", {}).get("enabled") and not torch.cuda.is_bf16_supported():
        # Pre-Ampere GPUs have no bf16 math; fp16 with loss scaling is the usual fallback.
        cfg.pop("bf16")
        cfg["fp16"] = {"enabled": True}
    return cfg


def skip_shm_comm_build() -> bool:
    """Stop DeepSpeed JIT-building its CPU shared-memory all-reduce op (training never uses it)."""
    # On the CPU accelerator, deepspeed.comm's TorchBackend builds the "deepspeed_shm_comm" op
    # (gcc + ninja, ~30-60 s the first time, cached under TORCH_EXTENSIONS_DIR) whenever the
    # process group starts. Its only caller is inference_all_reduce (tensor-parallel inference,
    # deepspeed/comm/torch.py); training collectives go through torch.distributed/gloo.
    # build_shm_op() returns None when deepspeed.ops.__compatible_ops__ marks the op
    # incompatible; that dict is probed once per process and, as deepspeed/ops/__init__.py
    # notes, edits to it persist. If a later DeepSpeed drops the dict, nothing breaks: the op
    # is built (and cached) as before. SMOKE_BUILD_SHM_COMM=1 restores the build.
    if torch.cuda.is_available() or os.environ.get("SMOKE_BUILD_SHM_COMM") == "1":
        return False
    try:
        import deepspeed
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    except (ImportError, AttributeError, TypeError):
        return False
    return True
