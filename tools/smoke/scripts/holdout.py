"""The held-out share of the data: how much, which sequences, and how the ranks deal them.

``--eval-holdout FRACTION`` holds out the last FRACTION of the data's sequences (the packed
blocks of a text dataset, the samples of a token-shard folder): the end of the token stream,
which no rank trains on. ``split_holdout`` says how many, or stops the run in one line when too
few are left to train on. An evaluation deals the held-out sequences round-robin to the
data-parallel ranks, ``micro`` at a time, as training deals its batches; every rank runs the
same number of micro-batches (FSDP's and ZeRO-3's forward passes are collectives), a rank's
last ones padded with rows that count for nothing (``None`` ids) where the holdout runs out.

Standard library; torch once a batch is read (train.py imports this module before torch, so
``--help`` needs none).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness import UsageError

if TYPE_CHECKING:
    import torch

# The share held out when ``--eval-every`` is given without ``--eval-holdout`` (Megatron-style
# 1%: tools/artifacts/recipe_launch.py passes the same).
DEFAULT_HOLDOUT = 0.01
# Micro-batches per rank per evaluation at most (Megatron-DeepSpeed's --eval-iters is 100
# global batches; a job's evaluation should cost a few steps, not an epoch of the holdout).
DEFAULT_EVAL_BATCHES = 20


def holdout_size(total: int, fraction: float) -> int:
    """Sequences held out of ``total``: ``fraction`` of them rounded up, at least one.

    Rounded to 9 digits first: 0.07 x 100 is 7.000000000000001 in floating point, 7 not 8.
    """
    if total <= 0:
        return 0
    return min(total, max(1, math.ceil(round(total * fraction, 9))))


def split_holdout(total: int, fraction: float, needed: int, unit: str) -> int:
    """How many of ``total`` sequences (the last ones) are held out.

    A UsageError (one line) when fewer than ``needed`` (a micro-batch on every data-parallel
    rank) are left to train on.
    """
    held = holdout_size(total, fraction)
    if total - held < needed:
        raise UsageError(
            f"--eval-holdout {fraction:g} holds out {held} of the data's {total} {unit}, leaving "
            f"{total - held} to train on, fewer than {needed} (--micro-batch x data-parallel "
            "ranks); lower --eval-holdout or add data"
        )
    return held


def eval_batches(count: int, ranks: int, micro: int, most: int) -> int:
    """Micro-batches each rank runs per evaluation: enough to cover the holdout, at most ``most``."""
    return max(1, min(most, math.ceil(count / (ranks * micro))))


def rank_rows(
    count: int, rank: int, ranks: int, micro: int, batches: int
) -> list[list[int | None]]:
    """The held-out sequence ids of each of ``rank``'s ``batches`` micro-batches.

    Batch ``i`` holds places ``(i * ranks + rank) * micro ...`` of the holdout: no two ranks
    share a sequence. A place past the holdout's end is ``None`` (a padding row).
    """
    out = []
    for i in range(batches):
        first = (i * ranks + rank) * micro
        out.append([p if p < count else None for p in range(first, first + micro)])
    return out


class HeldOut:
    """The held-out sequences: ``count`` of them, ``read(ids)`` a ``[len(ids), L]`` LongTensor.

    ``text`` says what they are, for the run's log (``the last 5 of 100 blocks of 64 tokens``).
    """

    def __init__(self, count: int, read: Callable[[list[int]], torch.Tensor], text: str) -> None:
        self.count = count
        self.read = read
        self.text = text

    @classmethod
    def of_rows(cls, rows: torch.Tensor, text: str) -> HeldOut:
        """The rows of a ``[count, L]`` tensor."""
        return cls(int(rows.shape[0]), lambda ids: rows[ids], text)

    def batch(self, ids: list[int | None]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Inputs, labels (-100 on padding rows: no loss) and how many rows are real."""
        import torch

        real = [i is not None for i in ids]
        rows = self.read([i if i is not None else 0 for i in ids])
        labels = rows.clone()
        labels[torch.tensor([not r for r in real], dtype=torch.bool)] = -100
        return rows, labels, sum(real)
