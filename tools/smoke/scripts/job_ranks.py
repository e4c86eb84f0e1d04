"""The ranks of one job: who this rank is, and every rank stopping together or none.

A problem one rank finds (a checkpoint folder in use, bad data, no checkpoint that loads) stops
every rank with one line, rank 0 printing it, and exit code 2: no rank is left waiting for the
others in a collective, and no rank of a refused job (another node's included) trains.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import torch
from harness import UsageError


def get_rank() -> int:
    """This rank's index in the process group (0 outside one)."""
    return int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0


def get_world_size() -> int:
    """The number of ranks (1 outside a process group)."""
    return int(torch.distributed.get_world_size()) if torch.distributed.is_initialized() else 1


def get_local_rank(args: argparse.Namespace) -> int:
    """This rank's index on its node (the DeepSpeed launcher's ``--local_rank``, else torchrun's)."""
    if args.local_rank is not None:
        return int(args.local_rank)
    return int(os.environ.get("LOCAL_RANK", 0))


def gather(value: Any) -> list[Any]:
    """Every rank's ``value`` in rank order (this rank's alone outside a process group)."""
    if not torch.distributed.is_initialized():
        return [value]
    values: list[Any] = [None] * get_world_size()
    torch.distributed.all_gather_object(values, value)
    return values


def from_rank0(value: Any) -> Any:
    """Rank 0's ``value``, on every rank."""
    if not torch.distributed.is_initialized():
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait for every rank (a no-op outside a process group)."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def say(text: str) -> None:
    """One line from rank 0."""
    if get_rank() == 0:
        print(text, flush=True)


def agree(problem: str | None) -> None:
    """Stop every rank when any rank found ``problem`` (``stop_every_rank``)."""
    for rank, found in enumerate(gather(problem)):
        if found:
            stop_every_rank(found if rank == 0 else f"rank {rank}: {found}")


def stop_every_rank(problem: str) -> None:
    """Raise the UsageError every rank raises for the same ``problem``, rank 0 printing it first.

    Every rank waits until the line is out, and ignores SIGTERM from here on: a launcher
    stops the other ranks when the first one exits, and they are ending with exit code 2.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if get_rank() == 0:
        print(f"train.py: error: {problem}", file=sys.stderr, flush=True)
    barrier()
    raise UsageError(problem, shown=False)


class StopRequest:
    """SIGTERM (SLURM preemption, a launcher stopping): finish the step, save, exit 0.

    Installed only when the run has a checkpoint directory (something to save). Every rank
    learns of a request on any rank at the step's end (``train_loop`` all-reduces it with the
    loss), so they all save the same step. Later SIGTERMs change nothing: SLURM signals the
    launcher and the ranks together and the launcher then forwards its own, and a save cut
    short by a second one would lose the step. What ends a rank that cannot finish (one stuck
    in a collective) is the launcher's SIGKILL after its grace period (torchrun's and
    DeepSpeed's: 30 s), or Ctrl-C.
    """

    requested = False

    @classmethod
    def install(cls) -> None:
        """Catch SIGTERM from now on."""

        def handler(_signum: int, _frame: Any) -> None:
            if not cls.requested:
                print(
                    f"[rank {get_rank()}] SIGTERM: saving a checkpoint after this step, then exiting",
                    file=sys.stderr,
                    flush=True,
                )
            cls.requested = True

        signal.signal(signal.SIGTERM, handler)
