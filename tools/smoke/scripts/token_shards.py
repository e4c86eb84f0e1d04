"""Token shards: the folder ``prepare_data.py`` writes and the job streams, and how ranks slice it.

A prepared folder holds ``shard_NNNNN.bin`` files (token ids, little-endian ``uint16``
when the vocabulary fits, else ``uint32``, no header: ``numpy.memmap`` reads them) and
``index.json``: the format, each shard's name and token count, the dtype, the tokenizer's name
and vocabulary size, how documents end (its EOS id after each), a hash of the inputs and
settings, and ``complete`` (false while ``prepare_data.py`` runs; it resumes from the shards
the index lists as done).

The shards read as one stream of tokens. Sample ``i`` is the ``seq_len + 1`` tokens from
``i * seq_len`` (as Megatron's GPTDataset: ``seq_len`` inputs and the ``seq_len`` targets they
predict; consecutive samples share one token), so a stream of ``N`` tokens holds
``(N - 1) // seq_len`` samples. Each epoch visits them in a fixed pseudo-random order (an
affine permutation seeded by the seed and the epoch: no index array in memory). Micro-batch
``p`` of data rank ``r`` out of ``R`` with ``B`` samples each holds the samples at places
``(k * R + r) * B ... + B - 1`` of epoch ``p // E``'s order, ``k = p % E`` and ``E`` the
micro-batches per rank per epoch: no two ranks, and no two micro-batches of an epoch, share a
sample, and ``p`` (saved in the checkpoint) alone says where a resumed run continues.

Standard library and numpy only: ``prepare_data.py`` runs without torch.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "trainwright-token-shards/1"
INDEX = "index.json"
SHARD_NAME = "shard_{:05d}.bin"
_AFFINE_MIX = 0x9E3779B97F4A7C15  # the golden-ratio constant: spreads seeds over the range


class ShardError(ValueError):
    """A prepared folder that cannot be read: one line naming the problem."""


def token_dtype(vocab_size: int) -> str:
    """``uint16`` when every id of the vocabulary fits in 16 bits, else ``uint32``."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def is_shard_folder(path: Path) -> bool:
    """Whether ``path`` is a folder ``prepare_data.py`` wrote (it holds our ``index.json``)."""
    index = path / INDEX
    if not index.is_file():
        return False
    try:
        return json.loads(index.read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def write_index(folder: Path, index: dict[str, Any]) -> None:
    """Write ``folder/index.json`` atomically (a reader never sees half of it)."""
    tmp = folder / f".{INDEX}.tmp"
    tmp.write_text(json.dumps(index, indent=1) + "\n")
    os.replace(tmp, folder / INDEX)


def read_index(folder: Path) -> dict[str, Any]:
    """The index of a complete prepared folder, checked against its shard files."""
    try:
        index = json.loads((folder / INDEX).read_text())
    except (OSError, ValueError) as exc:
        raise ShardError(f"{folder / INDEX}: cannot read it ({exc})") from exc
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise ShardError(f"{folder / INDEX}: not a prepare_data.py index ({FORMAT})")
    shards = index.get("shards") or []
    done = [s for s in shards if isinstance(s.get("tokens"), int)]
    if not index.get("complete") or len(done) != len(shards):
        raise ShardError(
            f"{folder}: prepare_data.py has not finished ({len(done)} of {len(shards)} shards); "
            "run the same prepare_data.py command again to complete it"
        )
    itemsize = np.dtype(index["dtype"]).itemsize
    for shard in shards:
        path = folder / shard["name"]
        size = path.stat().st_size if path.is_file() else -1
        if size != shard["tokens"] * itemsize:
            raise ShardError(
                f"{path}: {max(size, 0):,} bytes, not the {shard['tokens'] * itemsize:,} its "
                "index lists; prepare the data again"
            )
    return index


def sample_count(tokens: int, seq_len: int) -> int:
    """Samples of ``seq_len + 1`` tokens (stride ``seq_len``) in a stream of ``tokens``."""
    return max(0, (tokens - 1) // seq_len)


def _affine(n: int, seed: int) -> tuple[int, int]:
    """A multiplier coprime to ``n`` and an offset: ``i -> (a * i + b) % n`` permutes range(n)."""
    mixed = (seed * _AFFINE_MIX + 1) % (1 << 64)
    a = mixed % n if n > 1 else 1
    while math.gcd(a, n) != 1:
        a = (a + 1) % n
    return a, (mixed >> 32) % n


def epoch_order(n: int, seed: int, epoch: int, places: list[int]) -> list[int]:
    """The samples at ``places`` of epoch ``epoch``'s order of ``n`` samples."""
    a, b = _affine(n, seed * 1_000_003 + epoch)
    return [(a * place + b) % n for place in places]


def batches_per_epoch(samples: int, ranks: int, batch: int) -> int:
    """Micro-batches each rank draws before the order repeats (the rest of an epoch is unused)."""
    return samples // (ranks * batch)


def micro_batch_samples(
    position: int, rank: int, ranks: int, batch: int, samples: int, seed: int
) -> list[int]:
    """The sample ids of data rank ``rank``'s micro-batch number ``position`` (from 0)."""
    per_epoch = batches_per_epoch(samples, ranks, batch)
    if per_epoch < 1:
        raise ShardError(
            f"{samples} samples, fewer than {batch} per data-parallel rank ({ranks} ranks)"
        )
    epoch, k = divmod(position, per_epoch)
    first = (k * ranks + rank) * batch
    return epoch_order(samples, seed, epoch, list(range(first, first + batch)))


class TokenStream:
    """The shards of a prepared folder as one memory-mapped stream: nothing is read until asked."""

    def __init__(self, folder: Path, index: dict[str, Any]) -> None:
        dtype = np.dtype(index["dtype"]).newbyteorder("<")
        self.shards = [
            np.memmap(folder / s["name"], dtype=dtype, mode="r", shape=(s["tokens"],))
            for s in index["shards"]
            if s["tokens"] > 0
        ]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards]).tolist()
        self.tokens = int(self.starts[-1])

    def window(self, start: int, length: int) -> np.ndarray:
        """Tokens ``start`` to ``start + length`` as int64, across shard boundaries."""
        out = np.empty(length, dtype=np.int64)
        filled = 0
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        while filled < length:
            offset = start + filled - self.starts[shard]
            piece = self.shards[shard][offset : offset + length - filled]
            out[filled : filled + len(piece)] = piece
            filled += len(piece)
            shard += 1
        return out

    def samples(self, ids: list[int], seq_len: int) -> np.ndarray:
        """Samples ``ids`` as a ``[len(ids), seq_len + 1]`` int64 array."""
        return np.stack([self.window(i * seq_len, seq_len + 1) for i in ids])
