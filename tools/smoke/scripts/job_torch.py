"""The FSDP2 (``--fsdp``) and plain DDP modes, under torchrun: AdamW, a schedule, DCP checkpoints.

FSDP2 (``fully_shard``) wraps every decoder layer and then the model; the model is built on the
meta device, sharded, and filled from rank 0, which alone loads the weights (or draws the random
init) on CPU and broadcasts each shard (``set_model_state_dict(..., broadcast_from_rank0=True)``,
as Accelerate's ``cpu_ram_efficient_loading`` does). ``--bf16`` computes in bf16 over fp32
shards. DDP wraps the whole model (``--bf16``/``--fp16`` autocast); run as a single process
without torchrun's environment, it trains without DDP. The schedule is ``--lr-schedule
constant|linear|cosine`` with ``--warmup-steps``; checkpoints are ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from harness import UsageError, dist_env_present, write_json_atomic
from job_loop import Job, preflight, train_loop
from job_model import (
    add_lora,
    build_model,
    decoder_layers,
    enable_checkpointing,
    has_experts,
    load_model,
    model_config_dict,
)
from job_probes import cpu_baseline_bytes, sample
from job_ranks import get_local_rank, get_rank, get_world_size

# What a DCP checkpoint folder holds beside the shards: the step, data position, schedule.
TRAINER_STATE = "trainer_state.json"


class TorchJob(Job):
    """FSDP2 or DDP (or one process): AdamW, clipping, a LambdaLR schedule, DCP checkpoints."""

    def __init__(
        self,
        args: argparse.Namespace,
        model: torch.nn.Module,
        train_model: torch.nn.Module,
        device: torch.device,
        amp_dtype: torch.dtype | None,
    ) -> None:
        super().__init__(model, device, args.grad_accum)
        self.args = args
        self.train_model = train_model  # DDP's wrapper, or the (FSDP-sharded) model itself
        self.amp_dtype = amp_dtype if not args.fsdp else None  # FSDP casts in its own policy
        self.params = [p for p in model.parameters() if p.requires_grad]
        # train.py's parse_args gives --lr its FSDP/DDP default.
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=args.lr,
            betas=tuple(args.adam_betas),
            eps=args.adam_eps,
            weight_decay=args.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: schedule_factor(args, step)
        )
        self.scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None

    def micro_step(self, batch: torch.Tensor, last: bool) -> torch.Tensor:
        """Forward and backward (the loss divided over the accumulation); reduce on the last."""
        with self._sync(last), self._autocast():
            loss = self.train_model(input_ids=batch, labels=batch).loss
        sample()
        scaled = loss / self.grad_accum
        with self._sync(last):
            if self.scaler is not None:
                self.scaler.scale(scaled).backward()
            else:
                scaled.backward()
        sample()
        return loss

    def eval_loss(self, batch: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """A held-out micro-batch's loss: the model inside DDP (no gradient hooks), autocast."""
        with self._autocast():
            return self.model(input_ids=batch, labels=labels).loss

    def set_training(self, on: bool) -> None:
        """Train or eval mode, of the wrapper the loop runs (DDP's, or the FSDP model)."""
        self.train_model.train(on)

    def optimizer_step(self) -> None:
        """Unscale (fp16), clip, step, advance the schedule, clear the gradients."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.args.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        sample()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return float(self.scheduler.get_last_lr()[0])

    def _sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Reduce gradients only on an optimizer step's last micro-batch."""
        if last or self.grad_accum == 1:
            return contextlib.nullcontext()
        if isinstance(self.train_model, torch.nn.parallel.DistributedDataParallel):
            return self.train_model.no_sync()
        if hasattr(self.train_model, "set_requires_gradient_sync"):  # FSDP2
            return _GradientSync(self.train_model)
        return contextlib.nullcontext()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _options(self) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # LoRA: the frozen base comes from --model-path again; only the adapters are saved.
        lora = bool(self.args.lora_rank)
        return StateDictOptions(ignore_frozen_params=lora, strict=not lora)

    def save(self, root: Path, tag: str, state: dict[str, Any]) -> None:
        """torch.distributed.checkpoint of the (sharded) model and optimizer, plus a JSON state."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(
            self.model, self.optimizer, options=self._options()
        )
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(root / tag))
        extra = {
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }
        if get_rank() == 0:
            write_json_atomic(root / tag / TRAINER_STATE, {**state, **extra})

    def load(self, root: Path, tag: str) -> dict[str, Any]:
        """Load the DCP checkpoint in place; returns the JSON state."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optim_state = get_state_dict(
            self.model, self.optimizer, options=self._options()
        )
        loaded: dict[str, Any] = {"model": model_state, "optim": optim_state}
        dcp.load(loaded, checkpoint_id=str(root / tag))
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=loaded["model"],
            optim_state_dict=loaded["optim"],
            options=self._options(),
        )
        state = json.loads((root / tag / TRAINER_STATE).read_text())
        self.scheduler.load_state_dict(state.pop("scheduler"))
        scaler = state.pop("scaler", None)
        if self.scaler is not None and scaler:
            self.scaler.load_state_dict(scaler)
        return dict(state)


class _GradientSync:
    """FSDP2: keep the gradients unsharded and unreduced until the step's last micro-batch."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.model.set_requires_gradient_sync(False)

    def __exit__(self, *exc: object) -> None:
        self.model.set_requires_gradient_sync(True)


def schedule_factor(args: argparse.Namespace, step: int) -> float:
    """The learning-rate multiplier after ``step`` optimizer steps: warm-up, then the decay."""
    if step < args.warmup_steps:
        return (step + 1) / args.warmup_steps
    if args.lr_schedule == "constant":
        return 1.0
    span = max(1, args.steps - args.warmup_steps)
    done = min(1.0, (step - args.warmup_steps) / span)
    # The decay ends at min_lr_ratio x the peak (DeepSpeed WarmupCosineLR's cos_min_ratio).
    floor = args.min_lr_ratio
    if args.lr_schedule == "linear":
        return floor + (1.0 - floor) * max(0.0, 1.0 - done)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * done))


def _amp_dtype(args: argparse.Namespace, on_cuda: bool) -> torch.dtype | None:
    """The compute dtype of ``--bf16``/``--fp16`` on CUDA; CPU runs stay fp32."""
    if on_cuda and args.bf16:
        # Pre-Ampere GPUs have no bf16 math; fp16 with loss scaling is the usual fallback.
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if on_cuda and args.fp16:
        return torch.float16
    return None


def _precision_name(amp_dtype: torch.dtype | None) -> str:
    names: dict[torch.dtype | None, str] = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    return names.get(amp_dtype, "fp32")


def run_ddp(args: argparse.Namespace) -> int:
    """Plain PyTorch mode: DistributedDataParallel over torchrun's ranks, AdamW, optional autocast."""
    on_cuda = torch.cuda.is_available()
    local_rank = get_local_rank(args)
    device = torch.device("cuda", local_rank) if on_cuda else torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(device)
    distributed = dist_env_present()
    if distributed:
        # env:// reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun sets them.
        torch.distributed.init_process_group(backend="nccl" if on_cuda else "gloo")
    try:
        data = preflight(args)
        model_config = model_config_dict(args)
        # Same seed on every rank: the replicas must start identical (DDP also broadcasts
        # rank 0's weights when it wraps the model).
        torch.manual_seed(args.seed)
        baseline_bytes = 0 if on_cuda else cpu_baseline_bytes(model_config)
        amp_dtype = _amp_dtype(args, on_cuda)
        # fp32 weights (autocast computes in half precision); QLoRA's base is 4-bit.
        model = add_lora(args, load_model(args, model_config, torch.float32, device))
        if args.gradient_checkpointing:
            enable_checkpointing(args, model)
        train_model: torch.nn.Module = model
        if distributed:
            train_model = torch.nn.parallel.DistributedDataParallel(
                model,
                device_ids=[device.index] if on_cuda else None,
                # Routed experts that get no token in a step have no gradient; DDP must be told.
                find_unused_parameters=has_experts(model),
            )
        train_model.train()
        code = train_loop(
            args,
            TorchJob(args, model, train_model, device, amp_dtype),
            data,
            baseline_bytes=baseline_bytes,
            extra={
                "mode": "ddp",
                "deepspeed": None,
                "precision": _precision_name(amp_dtype),
                "construction": "full",
            },
        )
        if code == 0 and distributed:
            torch.distributed.barrier()
        return code
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def run_fsdp(args: argparse.Namespace) -> int:
    """FSDP2 mode: meta-device model, one fully_shard unit per layer, weights from rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist_env_present():
        raise UsageError(
            "--fsdp runs under torchrun (torchrun --nproc_per_node N train.py --fsdp ...)"
        )
    on_cuda = torch.cuda.is_available()
    local_rank = get_local_rank(args)
    device = torch.device("cuda", local_rank) if on_cuda else torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(device)
    torch.distributed.init_process_group(backend="nccl" if on_cuda else "gloo")
    try:
        data = preflight(args)
        if args.qlora:
            raise UsageError(
                "--qlora runs in the DDP mode (bitsandbytes' 4-bit layers); drop --fsdp"
            )
        model_config = model_config_dict(args)
        torch.manual_seed(args.seed)
        baseline_bytes = 0 if on_cuda else cpu_baseline_bytes(model_config)
        amp_dtype = _amp_dtype(args, on_cuda)
        with torch.device("meta"):
            model = add_lora(args, build_model(model_config, args.attn_implementation))
        if args.gradient_checkpointing:
            enable_checkpointing(args, model)
        policy = (
            MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32)
            if amp_dtype is not None
            else MixedPrecisionPolicy()
        )
        shard_args = fsdp_arguments(args, device, policy)
        for layer in decoder_layers(model):
            fully_shard(layer, **shard_args)
        fully_shard(model, **shard_args)
        model.to_empty(device=device)
        fill_from_rank0(args, model, model_config, set_model_state_dict, StateDictOptions)
        model.train()
        code = train_loop(
            args,
            TorchJob(args, model, model, device, amp_dtype),
            data,
            baseline_bytes=baseline_bytes,
            extra={
                "mode": "fsdp",
                "deepspeed": None,
                "precision": _precision_name(amp_dtype),
                "construction": "meta+broadcast",
            },
        )
        if code == 0:
            torch.distributed.barrier()
        return code
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def fsdp_arguments(args: argparse.Namespace, device: torch.device, policy: Any) -> dict[str, Any]:
    """``fully_shard``'s keywords for ``--fsdp-sharding`` and ``--fsdp-offload``."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    kwargs: dict[str, Any] = {
        "mp_policy": policy,
        "reshard_after_forward": args.fsdp_sharding != "grad-op",
        "offload_policy": CPUOffloadPolicy() if args.fsdp_offload else OffloadPolicy(),
    }
    if args.fsdp_sharding == "hybrid":
        from torch.distributed.device_mesh import init_device_mesh

        # Shard over a node's ranks, replicate across nodes (HSDP).
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", get_world_size()))
        kwargs["mesh"] = init_device_mesh(
            device.type,
            (get_world_size() // per_node, per_node),
            mesh_dim_names=("replicate", "shard"),
        )
    return kwargs


def fill_from_rank0(
    args: argparse.Namespace,
    model: torch.nn.Module,
    model_config: dict[str, Any],
    set_model_state_dict: Any,
    options: Any,
) -> None:
    """Rank 0 loads (or draws) the full weights on CPU; every rank receives its shards.

    Buffers left out of the state dict (rotary frequencies) are broadcast too: ``to_empty``
    left them uninitialised.
    """
    full: dict[str, torch.Tensor] = {}
    source: torch.nn.Module | None = None
    if get_rank() == 0:
        source = add_lora(args, load_model(args, model_config, torch.float32, torch.device("cpu")))
        full = source.state_dict()
    set_model_state_dict(
        model, full, options=options(full_state_dict=True, broadcast_from_rank0=True)
    )
    persistent = set(model.state_dict())
    source_buffers = dict(source.named_buffers()) if source is not None else {}
    for name, buffer in model.named_buffers():
        if name in persistent:
            continue
        if source is not None:
            buffer.copy_(source_buffers[name])
        torch.distributed.broadcast(buffer, src=0)
    del source, full
