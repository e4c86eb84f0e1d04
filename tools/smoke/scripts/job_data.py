"""The run's data: the user's, tokenized and packed into blocks, or synthetic patterns.

``--data PATH`` is a JSON-lines file (``--text-field``, default ``text``), a text file, a
folder of them, or a ``datasets`` folder saved with ``save_to_disk``. It is tokenized with
``--tokenizer`` (default: ``--model-path``), documents joined with the EOS token and packed into
``--seq-len`` blocks, shuffled with ``--seed`` each epoch and dealt to the data-parallel ranks in
turn. Every rank reads and checks it before the model is built: an empty, unreadable or
non-UTF-8 file or a line that is not JSON stops every rank with one line naming the file (exit
2). A long document is tokenized in pieces of at most 64 Ki characters, never whole. Without
``--data`` the run draws synthetic repeated-pattern sequences (the smoke test).

``--data`` naming a folder ``prepare_data.py`` wrote (token shards and ``index.json``; the
pretraining path) needs no tokenizer: each data-parallel rank streams only its own samples of
``--seq-len + 1`` tokens from the memory-mapped shards, never the whole corpus (``ShardData``;
token_shards.py says which samples each rank and micro-batch get).

``--eval-holdout FRACTION``: the last FRACTION of the blocks (or samples) is ``held_out`` for
job_eval.py, split off before any rank draws (holdout.py).
"""

from __future__ import annotations

import argparse
import array
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers
from harness import UsageError
from holdout import HeldOut, split_holdout
from token_shards import (
    ShardError,
    TokenStream,
    batches_per_epoch,
    is_shard_folder,
    micro_batch_samples,
    read_index,
    sample_count,
)

# Token patterns are drawn from a small alphabet, so even a tiny random-init model sees a
# large, quick drop from ln(vocab): first by learning which tokens occur at all, then by
# copying the repeated pattern (an induction-style task).
_ALPHABET_SIZE = 16
_NUM_PATTERNS = 8
_PATTERN_LEN = (3, 6)
_DATA_SUFFIXES = (".jsonl", ".json", ".txt")
# Text is handed to the tokenizer in pieces of at most this many characters (cut at a space
# where there is one): a 200 MB line tokenized whole takes many GB in a fast tokenizer.
_PIECE_CHARS = 1 << 16
# Documents (or pieces of one long document) per tokenizer call.
_ENCODE_BATCH = 256
_PIECES_PER_CALL = 16


def read_texts(path: Path, text_field: str) -> list[str]:
    """Every document under ``path``: JSON lines, text files, or a saved ``datasets`` folder.

    A problem (no such file, not UTF-8, a line that is not JSON, nothing in it) is a UsageError
    naming the file (and line).
    """
    if not path.exists():
        raise UsageError(f"--data {path}: no such file or folder")
    if path.is_dir() and (path / "state.json").exists() and (path / "dataset_info.json").exists():
        texts = _dataset_texts(path, text_field)
    else:
        files = (
            sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _DATA_SUFFIXES)
            if path.is_dir()
            else [path]
        )
        if not files:
            raise UsageError(f"--data {path}: no {'/'.join(_DATA_SUFFIXES)} files in it")
        texts = []
        for file in files:
            if file.suffix in (".jsonl", ".json"):
                texts += _json_lines(file, text_field)
            else:
                texts.append(_decoded(_read_bytes(file), f"--data {file}"))
    texts = [text for text in texts if text]
    if not texts:
        raise UsageError(f"--data {path}: no text in it (empty, or every {text_field!r} is empty)")
    return texts


def _dataset_texts(path: Path, text_field: str) -> list[str]:
    try:
        import datasets
    except ImportError as exc:
        raise UsageError(f"--data {path} is a datasets folder: pip install datasets") from exc
    table = datasets.load_from_disk(str(path))
    if isinstance(table, datasets.DatasetDict):
        table = table["train"] if "train" in table else next(iter(table.values()))
    if text_field not in table.column_names:
        raise UsageError(
            f"--data {path}: no column {text_field!r} (columns {table.column_names}); "
            "set --text-field"
        )
    return [str(text) for text in table[text_field]]


def _read_bytes(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as exc:
        raise UsageError(f"--data {file}: cannot read it ({exc.strerror or exc})") from exc


def _decoded(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8 text, or a UsageError saying where it is not."""
    if b"\0" in raw:
        raise UsageError(f"{where}: binary data (a NUL byte at byte {raw.index(0) + 1}), not text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1}); "
            "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from exc


def _json_lines(file: Path, text_field: str) -> list[str]:
    texts = []
    try:
        with open(file, "rb") as fh:
            # Lines end at \n only: JSON strings may hold U+2028 and other line separators.
            for number, raw in enumerate(fh, start=1):
                if number == 1:
                    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
                line = _decoded(raw, f"--data {file}:{number}")
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"--data {file}:{number}: not JSON ({exc.msg})") from exc
                if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                    raise UsageError(
                        f"--data {file}:{number}: no string field {text_field!r}; set --text-field"
                    )
                texts.append(record[text_field])
    except OSError as exc:
        raise UsageError(f"--data {file}: cannot read it ({exc.strerror or exc})") from exc
    return texts


def split_text(text: str, limit: int = _PIECE_CHARS) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters.

    Each piece ends before a space or newline in its second half where there is one, so a
    word is rarely cut.
    """
    pieces = []
    start = 0
    while len(text) - start > limit:
        end = start + limit
        cut = max(
            text.rfind(" ", start + limit // 2, end), text.rfind("\n", start + limit // 2, end)
        )
        if cut > start:
            end = cut
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces


def special_ends(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text (BOS, ...)."""
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i], full[i + len(plain) :]
    return [], []


def encode_texts(tokenizer: Any, texts: Iterable[str]) -> Iterator[list[int] | array.array]:
    """Each document's token ids, special tokens included, in order.

    A document longer than ``_PIECE_CHARS`` characters is tokenized in pieces (``split_text``)
    and its ids joined between the tokenizer's special tokens: the tokenizer never sees more
    than ``_PIECE_CHARS`` characters of one text at once.
    """
    prefix, suffix = special_ends(tokenizer)
    batch: list[str] = []
    for text in texts:
        if len(text) <= _PIECE_CHARS:
            batch.append(text)
            if len(batch) == _ENCODE_BATCH:
                yield from tokenizer(batch, add_special_tokens=True)["input_ids"]
                batch = []
            continue
        if batch:
            yield from tokenizer(batch, add_special_tokens=True)["input_ids"]
            batch = []
        ids = array.array("q", prefix)
        pieces = split_text(text)
        for first in range(0, len(pieces), _PIECES_PER_CALL):
            chunk = pieces[first : first + _PIECES_PER_CALL]
            for piece_ids in tokenizer(chunk, add_special_tokens=False)["input_ids"]:
                ids.extend(piece_ids)
        ids.extend(suffix)
        yield ids
    if batch:
        yield from tokenizer(batch, add_special_tokens=True)["input_ids"]


def pack_tokens(
    token_lists: Iterable[list[int] | array.array], eos: int | None, seq_len: int
) -> torch.Tensor:
    """Join the documents (EOS after each) and cut the stream into ``[blocks, seq_len]``.

    The tail shorter than a block is dropped, as packed pretraining and fine-tuning recipes do.
    The stream is kept as 8-byte integers, not a list of Python ints (a tenth of the memory).
    """
    stream = array.array("q")
    for ids in token_lists:
        stream.extend(ids)
        if eos is not None:
            stream.append(eos)
    blocks = len(stream) // seq_len
    if blocks == 0:
        return torch.empty((0, seq_len), dtype=torch.long)
    flat = torch.frombuffer(stream, dtype=torch.long, count=blocks * seq_len)
    return flat.clone().view(blocks, seq_len)


class TokenData:
    """Packed blocks of the user's data, shuffled each epoch and dealt round-robin to the ranks.

    Which blocks micro-batch ``i`` of a rank holds depends only on (seed, i, rank), so a resumed
    run continues with the batches the stopped one would have drawn next.
    """

    def __init__(self, blocks: torch.Tensor, batch: int, seed: int, rank: int, ranks: int) -> None:
        per_rank = blocks.shape[0] // ranks
        if per_rank < batch:
            raise UsageError(
                f"--data gives {blocks.shape[0]} blocks of {blocks.shape[1]} tokens: fewer than "
                f"{batch} per data-parallel rank ({ranks} ranks); add data or lower --seq-len"
            )
        self.blocks = blocks
        self.batch = batch
        self.seed = seed
        self.rank = rank
        self.ranks = ranks
        self.per_rank = per_rank
        self.position = 0  # micro-batches drawn so far
        self.held_out: HeldOut | None = None  # --eval-holdout's blocks, split off before

    def skip(self, batches: int) -> None:
        """Continue after ``batches`` micro-batches (a resumed run)."""
        self.position += batches

    def batches_per_epoch(self) -> int:
        """Micro-batches a rank draws before the data repeats (in a new order)."""
        return self.per_rank // self.batch

    def next(self) -> torch.Tensor:
        """Return the next ``[batch, seq_len]`` LongTensor of this rank's shard."""
        epoch, index = divmod(self.position, self.batches_per_epoch())
        order = torch.randperm(
            self.blocks.shape[0], generator=torch.Generator().manual_seed(self.seed + epoch)
        )
        mine = order[self.rank :: self.ranks][: self.per_rank]
        self.position += 1
        return self.blocks[mine[index * self.batch : (index + 1) * self.batch]]


def load_token_data(args: argparse.Namespace, rank: int, ranks: int) -> tuple[TokenData, int]:
    """The user's dataset for this rank, and how many tokens it holds in all."""
    name = args.tokenizer or args.model_path
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--tokenizer {name}: cannot load a tokenizer ({exc})") from exc
    texts = read_texts(args.data, args.text_field)
    blocks = pack_tokens(encode_texts(tokenizer, texts), tokenizer.eos_token_id, args.seq_len)
    if blocks.shape[0] // ranks < args.micro_batch:
        raise UsageError(
            f"--data {args.data}: {blocks.shape[0]} blocks of {args.seq_len} tokens, fewer than "
            f"{args.micro_batch} per data-parallel rank ({ranks} ranks); add data or lower --seq-len"
        )
    tokens, held = int(blocks.numel()), None
    if args.eval_holdout:
        # The end of the token stream: the last blocks, never dealt to a training rank.
        total, unit = blocks.shape[0], f"blocks of {args.seq_len} tokens"
        count = split_holdout(total, args.eval_holdout, ranks * args.micro_batch, unit)
        blocks, rest = blocks[: total - count], blocks[total - count :]
        held = HeldOut.of_rows(
            rest,
            f"the last {count} of {total} {unit} ({args.eval_holdout * 100:g}%), never trained on",
        )
    data = TokenData(blocks, args.micro_batch, args.seed, rank, ranks)
    data.held_out = held
    return data, tokens


# The sample ids a run's metrics list (rank{R}.json ``data_samples``), at most this many.
_RECORDED_SAMPLES = 100_000


class ShardData:
    """This data rank's samples of a ``prepare_data.py`` folder, read from the memmaps as drawn.

    Micro-batch ``position`` holds the samples token_shards.micro_batch_samples names for
    (position, rank), ``[batch, seq_len + 1]`` tokens: the model's loss shifts them, so each
    sample trains its ``seq_len`` targets. ``info`` is what the metrics say, the sample ids
    drawn included.
    """

    def __init__(
        self,
        folder: Path,
        seq_len: int,
        batch: int,
        seed: int,
        rank: int,
        ranks: int,
        holdout: float | None = None,
    ) -> None:
        try:
            self.index = read_index(folder)
        except ShardError as exc:
            raise UsageError(f"--data {exc}") from exc
        self.stream = TokenStream(folder, self.index)
        self.samples = sample_count(self.stream.tokens, seq_len)
        if batches_per_epoch(self.samples, ranks, batch) < 1:
            raise UsageError(
                f"--data {folder}: {self.stream.tokens:,} tokens make {self.samples} samples of "
                f"{seq_len + 1} tokens, fewer than {batch} per data-parallel rank ({ranks} ranks); "
                "add data or lower --seq-len"
            )
        self.held_out = self._hold_out(holdout, seq_len, batch * ranks)
        held = self.held_out.count if self.held_out is not None else 0
        self.seq_len, self.batch, self.seed, self.rank, self.ranks = (
            seq_len,
            batch,
            seed,
            rank,
            ranks,
        )
        self.position = 0  # micro-batches drawn so far (the checkpoint's data_position)
        self.drawn: list[int] = []
        self.info: dict[str, Any] = {
            "data": str(folder),
            "data_format": "token-shards",
            "data_tokens": self.stream.tokens,
            "data_samples_total": self.samples + held,
            "data_samples_held_out": held,
            "data_rank": rank,
            "data_start_position": 0,
            "data_samples": self.drawn,
        }

    def _hold_out(self, fraction: float | None, seq_len: int, needed: int) -> HeldOut | None:
        """Split the last ``fraction`` of the samples off for evaluation (none trains on them)."""
        if not fraction:
            return None
        total, unit = self.samples, f"samples of {seq_len + 1} tokens"
        count = split_holdout(total, fraction, needed, unit)
        self.samples = first = total - count
        return HeldOut(
            count,
            lambda ids: torch.from_numpy(self.stream.samples([first + i for i in ids], seq_len)),
            f"the last {count} of {total} {unit} ({fraction * 100:g}%), never trained on",
        )

    def skip(self, batches: int) -> None:
        """Continue after ``batches`` micro-batches (a resumed run): nothing is read."""
        self.position += batches
        self.info["data_start_position"] = self.position

    def batches_per_epoch(self) -> int:
        """Micro-batches a rank draws before the order repeats (a new order each epoch)."""
        return batches_per_epoch(self.samples, self.ranks, self.batch)

    def next(self) -> torch.Tensor:
        """Return the next ``[batch, seq_len + 1]`` LongTensor of this rank's slice."""
        ids = micro_batch_samples(
            self.position, self.rank, self.ranks, self.batch, self.samples, self.seed
        )
        self.position += 1
        if len(self.drawn) < _RECORDED_SAMPLES:
            self.drawn.extend(ids)
        return torch.from_numpy(self.stream.samples(ids, self.seq_len))


def shards_given(args: argparse.Namespace) -> bool:
    """Whether ``--data`` names a ``prepare_data.py`` folder."""
    return args.data is not None and is_shard_folder(args.data)


def load_data(args: argparse.Namespace, rank: int, ranks: int) -> TokenData | ShardData:
    """This data rank's data: token shards streamed, or the user's text tokenized here."""
    if shards_given(args):
        return ShardData(
            args.data,
            args.seq_len,
            args.micro_batch,
            args.seed,
            rank,
            ranks,
            args.eval_holdout,
        )
    return load_token_data(args, rank, ranks)[0]


class PatternData:
    """Endless batches of sequences that repeat a short token pattern."""

    def __init__(self, vocab_size: int, seq_len: int, batch: int, seed: int, rank: int) -> None:
        # Patterns are shared by all ranks (same seed); the draws differ per rank, as data
        # parallelism would shard a real dataset.
        shared = torch.Generator().manual_seed(seed)
        alphabet_size = min(_ALPHABET_SIZE, vocab_size)
        alphabet = torch.randperm(vocab_size, generator=shared)[:alphabet_size]
        self.patterns: list[torch.Tensor] = []
        for _ in range(_NUM_PATTERNS):
            length = int(
                torch.randint(_PATTERN_LEN[0], _PATTERN_LEN[1] + 1, (1,), generator=shared)
            )
            idx = torch.randint(0, alphabet_size, (length,), generator=shared)
            self.patterns.append(alphabet[idx])
        self.gen = torch.Generator().manual_seed(seed * 1000 + 17 + rank)
        self.seq_len = seq_len
        self.batch = batch
        self.position = 0  # batches drawn so far

    def skip(self, batches: int) -> None:
        """Draw and drop ``batches`` batches (a resumed run continues the same stream)."""
        for _ in range(batches):
            self.next()

    def next(self) -> torch.Tensor:
        """Return one ``[batch, seq_len]`` LongTensor."""
        self.position += 1
        rows = []
        for _ in range(self.batch):
            pattern = self.patterns[
                int(torch.randint(0, len(self.patterns), (1,), generator=self.gen))
            ]
            reps = self.seq_len // len(pattern) + 2
            offset = int(torch.randint(0, len(pattern), (1,), generator=self.gen))
            rows.append(pattern.repeat(reps)[offset : offset + self.seq_len])
        return torch.stack(rows)
