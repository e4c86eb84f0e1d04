"""The training loop every mode drives: steps, logging, checkpoints, resume, preemption.

A step is one optimizer step (the config's gradient accumulation, or ``--grad-accum``, of
``--micro-batch`` sequences per rank each). Rank 0 prints loss, learning rate, tokens/s and
memory every ``--log-every`` steps (the held-out loss: job_eval.py) and appends the same to
``metrics-dir/metrics.jsonl`` (and to TensorBoard with ``--tensorboard DIR``, W&B with
``--wandb PROJECT``); each rank writes ``metrics-dir/rank{R}.json`` (losses, step times,
tokens, peak memory). With a checkpoint
directory, SIGTERM (SLURM's preemption signal) ends the run after the current step with a final
checkpoint and exit code 0 (within the launcher's grace period: 30 s).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from harness import EXIT_NAN, UsageError, record_stop, write_json_atomic
from job_checkpoints import resume, save_checkpoint
from job_data import PatternData, ShardData, TokenData, load_data
from job_eval import board_tag, open_evaluator
from job_lock import JobLock
from job_model import local_param_bytes, total_params, trainable_params
from job_probes import FaultInjector, is_oom, peak_memory_bytes, process_gpu_memory_bytes
from job_ranks import StopRequest, agree, get_rank, get_world_size

# Every this many steps each rank rewrites its metrics file (a stopped run still reports).
_METRICS_EVERY = 5


class Job:
    """What the training loop drives: micro-steps, optimizer steps, checkpoints.

    ``model`` is the module whose config and embeddings the loop reads (inside any wrapper).
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, grad_accum: int) -> None:
        self.model = model
        self.device = device
        self.grad_accum = grad_accum

    def micro_step(self, batch: torch.Tensor, last: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch; ``last`` ends the optimizer step."""
        raise NotImplementedError

    def eval_loss(self, batch: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of one held-out micro-batch (in eval mode, without gradients: job_eval.py)."""
        return self.model(input_ids=batch, labels=labels).loss

    def set_training(self, on: bool) -> None:
        """Train mode, or eval mode (no dropout) for an evaluation."""
        self.model.train(on)

    def optimizer_step(self) -> None:
        """Apply the accumulated gradients (clipped), step the schedule, clear the gradients."""
        raise NotImplementedError

    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        raise NotImplementedError

    def save(self, root: Path, tag: str, state: dict[str, Any]) -> None:
        """Save a checkpoint ``root/tag`` with ``state`` (step, data position); every rank calls it."""
        raise NotImplementedError

    def load(self, root: Path, tag: str) -> dict[str, Any]:
        """Load checkpoint ``root/tag`` into the model and optimizer; returns its ``state``."""
        raise NotImplementedError


def preflight(args: argparse.Namespace, tensor_parallel: int = 1) -> TokenData | ShardData | None:
    """Before any model is built: take the checkpoint folder (rank 0), read the data (every rank).

    A problem on any rank stops all of them with one line (exit 2), so that no rank waits for
    the others in a collective and no rank of a refused job (another node's included) trains.
    Returns this rank's data (None without ``--data``).
    """
    if args.checkpoint_dir is None and args.data is None:
        return None
    rank, world = get_rank(), get_world_size()
    problem = None
    if rank == 0 and args.checkpoint_dir is not None:
        try:
            JobLock.take(args.checkpoint_dir)
        except UsageError as exc:
            problem = str(exc)
    agree(problem)
    if args.data is None:
        return None
    data = None
    try:
        data = load_data(args, rank // tensor_parallel, max(1, world // tensor_parallel))
    except UsageError as exc:
        problem = str(exc)
    agree(problem)
    return data


class MetricLog:
    """Rank 0's interval log: stdout, ``metrics.jsonl``, TensorBoard and W&B when enabled."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.active = rank == 0
        self.path = args.metrics_dir / "metrics.jsonl"
        self.writer: Any = None
        self.wandb: Any = None
        if not self.active:
            return
        args.metrics_dir.mkdir(parents=True, exist_ok=True)
        if args.tensorboard is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise UsageError(
                    "--tensorboard needs tensorboard: pip install tensorboard"
                ) from exc
            self.writer = SummaryWriter(str(args.tensorboard))
        if args.wandb:
            try:
                import wandb
            except ImportError as exc:
                raise UsageError("--wandb needs wandb: pip install wandb") from exc
            self.wandb = wandb.init(project=args.wandb, config=_plain(vars(args)), resume="allow")

    def record(self, row: dict[str, Any], text: str) -> None:
        """Print ``text`` and append ``row`` (with a step) to every enabled sink."""
        if not self.active:
            return
        print(text, flush=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        step = int(row["step"])
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and self.writer is not None:
                self.writer.add_scalar(board_tag(key), value, step)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self) -> None:
        """Flush and close TensorBoard and W&B."""
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}


class RankMetrics:
    """This rank's ``metrics-dir/rank{R}.json``: its losses, step times, tokens and memory."""

    def __init__(
        self,
        args: argparse.Namespace,
        job: Job,
        *,
        start_step: int,
        resumed_from: str | None,
        baseline_bytes: int,
        memory_marks: dict[str, int],
        data_info: dict[str, Any],
        extra: dict[str, Any],
    ) -> None:
        self.args, self.job = args, job
        self.rank, self.world_size = get_rank(), get_world_size()
        self.path = args.metrics_dir / f"rank{self.rank}.json"
        self.start_step, self.resumed_from = start_step, resumed_from
        self.baseline_bytes = baseline_bytes
        self.memory_marks = memory_marks  # the loop adds the GPU's after the first step
        self.data_info, self.extra = data_info, extra
        self.losses: list[float] = []
        self.step_times_s: list[float] = []
        self.tokens_per_step = args.micro_batch * args.seq_len * job.grad_accum

    def write(self, status: str) -> None:
        """Write the file with ``status`` (running, ok, nan, oom, preempted)."""
        write_json_atomic(self.path, self.fields(status))

    def fields(self, status: str) -> dict[str, Any]:
        """The file's contents."""
        args, model, device = self.args, self.job.model, self.job.device
        on_cuda = device.type == "cuda"
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "device": str(device.type),
            "device_name": torch.cuda.get_device_name(device) if on_cuda else "cpu",
            "status": status,
            "steps": len(self.losses),
            "first_step": self.start_step + 1,
            "resumed_from": self.resumed_from,
            "losses": self.losses,
            "step_times_s": self.step_times_s,
            "tokens_per_step": self.tokens_per_step,
            "tokens_processed": self.tokens_per_step * len(self.losses),
            "peak_memory_bytes": peak_memory_bytes(device),
            "process_gpu_memory_bytes": process_gpu_memory_bytes(device),
            "baseline_memory_bytes": self.baseline_bytes,
            "seq_len": args.seq_len,
            "micro_batch": args.micro_batch,
            "grad_accum": self.job.grad_accum,
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            **self.memory_marks,
            "params": total_params(model),
            "trainable_params": trainable_params(model),
            "init": args.init,
            "lora_rank": args.lora_rank,
            "qlora": args.qlora,
            **self.data_info,
            "torch": torch.__version__,
            **self.extra,
        }


def train_loop(
    args: argparse.Namespace,
    job: Job,
    token_data: TokenData | ShardData | None,
    *,
    baseline_bytes: int,
    extra: dict[str, Any],
    tensor_parallel: int = 1,
) -> int:
    """Run up to ``args.steps`` optimizer steps, log them, checkpoint, and write this rank's metrics.

    The ranks of one tensor-parallel group (``tensor_parallel`` consecutive ranks, as DeepSpeed
    AutoTP groups them) draw the same batches: they hold shards of one replica. Returns 0 after
    all steps (or a SIGTERM's final checkpoint), 3 at the first non-finite loss.
    """
    rank, world_size = get_rank(), get_world_size()
    data_ranks = max(1, world_size // tensor_parallel)
    memory_marks = _memory_marks(job)
    data, data_info = _open_data(args, job, token_data, rank // tensor_parallel)
    tag, start_step = _resume(args, job, data)
    log = MetricLog(args, rank)
    record = RankMetrics(
        args,
        job,
        start_step=start_step,
        resumed_from=tag,
        baseline_bytes=baseline_bytes,
        memory_marks=memory_marks,
        data_info=data_info,
        extra=extra,
    )
    injector = FaultInjector(args.inject, args.inject_step, rank, world_size)
    evaluator = open_evaluator(args, job, data, rank // tensor_parallel, tensor_parallel)
    if evaluator is not None:
        record.extra["evals"] = evaluator.rows
    interval_start, interval_steps = time.perf_counter(), 0
    for step in range(start_step + 1, args.steps + 1):
        step_lr = job.lr()
        step_loss, elapsed_s = _one_step(job, data, injector, step, record)
        # One small all-reduce per step: the mean loss over the ranks, and whether any rank was
        # asked to stop (all must save the same step).
        mean_loss, stop = _agree_on_step(job.device, step_loss)
        record.losses.append(step_loss if math.isfinite(step_loss) else float("nan"))
        record.step_times_s.append(elapsed_s)
        interval_steps += 1
        if step % args.log_every == 0 or step == args.steps or stop:
            span = time.perf_counter() - interval_start
            rate = record.tokens_per_step * data_ranks * interval_steps / span if span > 0 else 0.0
            memory = peak_memory_bytes(job.device) - baseline_bytes
            _log_step(log, args, step, mean_loss, step_lr, rate, elapsed_s, memory)
            interval_start, interval_steps = time.perf_counter(), 0
        if step % _METRICS_EVERY == 0:
            # Partial metrics let a run that is stopped (timeout, Ctrl-C) still report progress.
            record.write("running")
        if not (math.isfinite(step_loss) and math.isfinite(mean_loss)):
            # Nothing after a NaN loss tells us more; stop early so the verdict comes fast. The
            # all-reduced mean is NaN on every rank when any rank's loss is, so all stop here.
            record.write("nan")
            log.close()
            return EXIT_NAN
        if evaluator is not None and evaluator.due(step) and not stop:
            interval_start += evaluator.run(job, step, log)  # not training time: out of tokens/s
        due = args.save_every and step % args.save_every == 0
        if args.checkpoint_dir is not None and (due or stop or step == args.steps):
            save_checkpoint(job, args.checkpoint_dir, step, data.position, args.keep_checkpoints)
        if stop:
            record.write("preempted")
            log.close()
            if rank == 0:
                print(
                    f"stopped at step {step} on SIGTERM; rerun the same command to resume",
                    flush=True,
                )
                if (
                    args.checkpoint_dir is not None
                ):  # the run saved: the launcher's exit 1 is not a failure
                    record_stop(step, args.checkpoint_dir / f"step{step}")
            return 0
    record.write("ok")
    log.close()
    return 0


def _memory_marks(job: Job) -> dict[str, int]:
    """What the model holds before the first step: on a GPU its allocation, and this rank's share.

    On a GPU the loop adds the allocation after the first step (when the optimizer has created
    its states), to split the peak into states and activations.
    """
    marks: dict[str, int] = {}
    if job.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(job.device)
        marks["allocated_at_start_bytes"] = int(torch.cuda.memory_allocated(job.device))
    # What this rank holds of the model once it is built and sharded, before any step.
    marks["local_param_bytes"] = local_param_bytes(job.model)
    return marks


def _open_data(
    args: argparse.Namespace, job: Job, token_data: TokenData | ShardData | None, data_rank: int
) -> tuple[TokenData | ShardData | PatternData, dict[str, Any]]:
    """The batches this rank draws, and what the metrics say about them; rank 0 says which."""
    vocab_size = int(getattr(job.model, "config").vocab_size)  # noqa: B009 - any HF model, peft's too
    if token_data is None:
        if get_rank() == 0:
            print("data: synthetic repeated-pattern sequences (no --data given)", flush=True)
        data = PatternData(vocab_size, args.seq_len, args.micro_batch, args.seed, data_rank)
        return data, {"data": "synthetic"}
    if isinstance(token_data, ShardData):
        return token_data, _shard_info(token_data, vocab_size, args.seq_len)
    # Read and checked by preflight, before the model was built.
    tokens = int(token_data.blocks.numel())
    if get_rank() == 0:
        print(
            f"data: {tokens:,} tokens in {token_data.blocks.shape[0]:,} blocks of {args.seq_len}; "
            f"{token_data.batches_per_epoch()} micro-batches per rank per epoch",
            flush=True,
        )
    return token_data, {"data": str(args.data), "data_tokens": tokens}


def _shard_info(data: ShardData, vocab_size: int, seq_len: int) -> dict[str, Any]:
    """Rank 0 says what the shards hold; ids the model's embedding cannot hold stop the run."""
    if int(data.index["vocab_size"]) > vocab_size:
        raise UsageError(
            f"--data {data.info['data']}: tokenized with {data.index['tokenizer']} "
            f"({data.index['vocab_size']:,} ids), more than the model's vocabulary ({vocab_size:,})"
        )
    if get_rank() == 0:
        print(
            f"data: {data.stream.tokens:,} tokens in {len(data.stream.shards)} shard(s) of "
            f"{data.info['data']} ({data.index['tokenizer']}): {data.samples:,} samples of "
            f"{seq_len + 1} tokens, {data.batches_per_epoch()} micro-batches per rank per epoch",
            flush=True,
        )
    return data.info


def _resume(
    args: argparse.Namespace, job: Job, data: TokenData | ShardData | PatternData
) -> tuple[str | None, int]:
    """The checkpoint the run continues from (None: none) and its step; SIGTERM caught from now."""
    if args.checkpoint_dir is None:
        return None, 0
    start_step = 0
    tag, state = resume(job, args.checkpoint_dir)
    if tag is not None:
        start_step = int(state.get("step", 0))
        data.skip(int(state.get("data_position", start_step * job.grad_accum)))
        if get_rank() == 0:
            print(f"resumed from {args.checkpoint_dir / tag} at step {start_step}", flush=True)
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    StopRequest.install()
    return tag, start_step


def _one_step(
    job: Job,
    data: TokenData | ShardData | PatternData,
    injector: FaultInjector,
    step: int,
    record: RankMetrics,
) -> tuple[float, float]:
    """One optimizer step: the mean loss of its micro-batches on this rank, and its time."""
    device = job.device
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step_loss = 0.0
    try:
        injector.before_step(step, job.model, device)
        for micro in range(job.grad_accum):
            batch = injector.batch(step, data.next()).to(device)
            loss = job.micro_step(batch, last=micro == job.grad_accum - 1)
            step_loss += float(loss.detach().float().item()) / job.grad_accum
        job.optimizer_step()
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
        injector.release()
        if is_oom(exc):
            record.write("oom")
        raise
    injector.release()
    if on_cuda:
        torch.cuda.synchronize(device)
        if step == record.start_step + 1:
            record.memory_marks["allocated_after_step1_bytes"] = int(
                torch.cuda.memory_allocated(device)
            )
    return step_loss, time.perf_counter() - start


def _agree_on_step(device: torch.device, step_loss: float) -> tuple[float, bool]:
    """The mean loss over the ranks, and whether any rank was asked to stop (SIGTERM)."""
    mean_loss, stop = step_loss, StopRequest.requested
    if torch.distributed.is_initialized():
        flags = torch.tensor([step_loss, float(stop)], device=device, dtype=torch.float64)
        torch.distributed.all_reduce(flags)
        mean_loss, stop = float(flags[0]) / get_world_size(), bool(flags[1] > 0)
    return mean_loss, stop


def _log_step(
    log: MetricLog,
    args: argparse.Namespace,
    step: int,
    loss: float,
    lr: float,
    rate: float,
    elapsed_s: float,
    memory: int,
) -> None:
    """Rank 0's line and row for ``step``: loss, learning rate, tokens/s, time, peak memory."""
    row = {
        "step": step,
        "loss": loss,
        "lr": lr,
        "tokens_per_s": rate,
        "step_time_s": elapsed_s,
        "peak_memory_bytes": memory,
        "time": time.time(),
    }
    text = (
        f"step {step}/{args.steps} loss {loss:.4f} lr {lr:.3g} "
        f"{rate:,.0f} tokens/s {elapsed_s:.2f}s/step peak memory {memory / 2**30:.2f} GiB"
    )
    log.record(row, text)
