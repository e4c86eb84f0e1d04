"""Evaluation during training: ``--eval-every N`` steps and at the end, on ``--eval-holdout``.

With ``--data`` the holdout is the last ``--eval-holdout`` of the data's sequences, never
trained on (job_data.py splits it off, holdout.py says how); without it, synthetic sequences
of the training patterns drawn with another seed. An evaluation puts the model in eval mode
(the DeepSpeed engine's ``eval()``), runs up to ``--eval-batches`` micro-batches per rank
without gradients and back in train mode, and averages the loss over every held-out target
token of every rank (one all_reduce). Rank 0 prints ``eval step N/T loss L perplexity P`` and
appends an ``eval_loss`` row to ``metrics.jsonl``; each rank's ``rank{R}.json`` lists them.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch
from holdout import HeldOut, eval_batches, rank_rows
from job_data import PatternData
from job_ranks import get_rank, get_world_size

# The synthetic holdout's draws: PatternData's "rank" this far past any real rank, so its seed
# is no training rank's.
_SYNTHETIC_DRAWS = 1_000_000


def evaluating(args: argparse.Namespace) -> bool:
    """Whether the run evaluates (``--eval-every`` or ``--eval-holdout`` given)."""
    return bool(args.eval_every or args.eval_holdout)


def synthetic_holdout(vocab_size: int, args: argparse.Namespace, data_ranks: int) -> HeldOut:
    """Enough synthetic sequences for one evaluation, from the training patterns, another draw."""
    count = data_ranks * args.micro_batch * args.eval_batches
    draws = PatternData(vocab_size, args.seq_len, count, args.seed, _SYNTHETIC_DRAWS)
    return HeldOut.of_rows(
        draws.next(), f"{count} synthetic sequences drawn with another seed (no --data)"
    )


def board_tag(key: str) -> str:
    """A metrics row's key as a TensorBoard tag: ``eval/loss`` for ``eval_loss``, else ``train/``."""
    return "eval/" + key.removeprefix("eval_") if key.startswith("eval_") else f"train/{key}"


def open_evaluator(
    args: argparse.Namespace, job: Any, data: Any, data_rank: int, tensor_parallel: int
) -> Evaluator | None:
    """The run's evaluator (None without ``--eval-every``/``--eval-holdout``); rank 0 says its plan.

    ``data`` is what the run trains on: the user's with its held-out share split off, or the
    synthetic patterns (then the holdout is drawn here).
    """
    if not evaluating(args):
        return None
    data_ranks = max(1, get_world_size() // tensor_parallel)
    held = getattr(data, "held_out", None)
    default = "" if args.eval_holdout_given else " (the default: no --eval-holdout given)"
    if held is None:
        vocab_size = int(getattr(job.model, "config").vocab_size)  # noqa: B009 - any HF model
        held, default = synthetic_holdout(vocab_size, args, data_ranks), ""
    evaluator = Evaluator(args, held, data_rank, data_ranks, tensor_parallel)
    evaluator.say_plan(default)
    return evaluator


class Evaluator:
    """The run's evaluations: when they are due, running one, and logging it."""

    def __init__(
        self,
        args: argparse.Namespace,
        held: HeldOut,
        data_rank: int,
        data_ranks: int,
        tensor_parallel: int,
    ) -> None:
        self.args, self.held = args, held
        self.data_rank, self.data_ranks = data_rank, data_ranks
        self.tensor_parallel = tensor_parallel
        self.batches = eval_batches(held.count, data_ranks, args.micro_batch, args.eval_batches)
        self.rows: list[dict[str, Any]] = []  # this rank's metrics file lists them

    def say_plan(self, default: str) -> None:
        """Rank 0's line: what is held out, how much each evaluation reads, and when."""
        if get_rank() != 0:
            return
        args = self.args
        when = f"every {args.eval_every} steps and at the end" if args.eval_every else "at the end"
        read = min(self.held.count, self.batches * self.data_ranks * args.micro_batch)
        print(
            f"eval: held out {self.held.text}{default}; each evaluation reads {read} of them "
            f"({self.batches} micro-batch(es) per rank, --eval-batches {args.eval_batches}), "
            f"{when}",
            flush=True,
        )

    def due(self, step: int) -> bool:
        """Whether step ``step`` ends with an evaluation (every N steps, and the last)."""
        every = self.args.eval_every
        return step == self.args.steps or bool(every and step % every == 0)

    def run(self, job: Any, step: int, log: Any) -> float:
        """Evaluate after ``step``, log it (rank 0), and return the seconds it took."""
        start = time.perf_counter()
        loss, rows, tokens = self.mean_loss(job)
        elapsed = time.perf_counter() - start
        perplexity = math.exp(loss) if loss < 700 else math.inf
        row = {
            "step": step,
            "eval_loss": loss,
            "eval_perplexity": perplexity,
            "eval_sequences": rows,
            "eval_tokens": tokens,
            "eval_time_s": elapsed,
            "time": time.time(),
        }
        self.rows.append(row)
        text = (
            f"eval step {step}/{self.args.steps} loss {loss:.4f} perplexity {perplexity:.2f} "
            f"({rows} held-out sequences, {tokens:,} tokens, {elapsed:.2f}s)"
        )
        log.record(row, text)
        return elapsed

    def mean_loss(self, job: Any) -> tuple[float, int, int]:
        """The loss per held-out target token over every rank, the sequences and tokens read."""
        sums = torch.zeros(3, dtype=torch.float64, device=job.device)
        places = rank_rows(
            self.held.count, self.data_rank, self.data_ranks, self.args.micro_batch, self.batches
        )
        job.set_training(False)
        try:
            with torch.no_grad():
                for ids in places:
                    rows, labels, real = self.held.batch(ids)
                    loss = job.eval_loss(rows.to(job.device), labels.to(job.device))
                    if real:  # a batch of padding rows alone has no loss (0/0)
                        targets = real * (rows.shape[1] - 1)
                        sums += torch.tensor(
                            [float(loss.float()) * targets, targets, real],
                            dtype=torch.float64,
                            device=job.device,
                        )
        finally:
            job.set_training(True)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums)
            sums /= self.tensor_parallel  # a tensor-parallel group's ranks read the same rows
        loss = float(sums[0] / sums[1]) if sums[1] > 0 else math.nan
        return loss, int(sums[2]), int(sums[1])
