r"""Tokenize a text corpus once, in parallel, into memory-mapped token shards for pretraining.

    python trainer/prepare_data.py corpus/ more.jsonl --out data/tokens \
        --tokenizer meta-llama/Llama-3.1-8B --workers 16
    DATA=data/tokens ./launch.sh        # the job streams each rank's slice of the shards

Inputs are ``.txt`` files (a file is one document) and ``.jsonl`` files (a line is one
document, its ``--text-field``), or folders of them, read in sorted order. The corpus is cut
into chunks of about ``--chunk-mb`` at line ends; each worker process tokenizes a chunk (the
tokenizer's own special tokens, then its EOS id after each document) into one shard,
``shard_NNNNN.bin`` (token_shards.py says the format), written under a temporary name and
renamed when complete. ``index.json`` lists the shards done so far: the same command again
skips those and redoes any other (a partial shard included), and refuses a folder prepared from
other inputs or settings. The tokenizer is the model's (the plan passes it): a local folder, or
a hub id already in the local cache; nothing is downloaded when ``HF_HUB_OFFLINE=1``. Like the
(nanoGPT's ``prepare.py``, Megatron's ``preprocess_data.py``) tools it follows, it needs only
the standard library, numpy and transformers. Exit 2 with one line on bad input.
"""

from __future__ import annotations

import argparse
import array
import hashlib
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from token_shards import FORMAT, INDEX, SHARD_NAME, token_dtype, write_index

EXIT_USAGE = 2
_SUFFIXES = (".txt", ".jsonl")
_ENCODE_BATCH = 256  # documents per tokenizer call
_PIECE_CHARS = 1 << 16  # a long document reaches the tokenizer in pieces of this many characters
_TOKENIZER: Any = None  # each worker's (inherited on fork, loaded once on spawn)


class PrepareError(Exception):
    """Bad input: one line naming the file (and line)."""


def main(argv: list[str] | None = None) -> int:
    """Prepare the shards; 0 when the folder is complete, 2 on bad input."""
    args = _parse(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one thread per worker process
    try:
        return prepare(args)
    except PrepareError as exc:
        print(f"prepare_data.py: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path, help=".txt/.jsonl files or folders")
    parser.add_argument("--out", required=True, type=Path, help="the shards' folder")
    parser.add_argument(
        "--tokenizer",
        required=True,
        help="tokenizer folder, the model's folder, or a cached hub id",
    )
    parser.add_argument("--text-field", default="text", help="the JSON field holding the text")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="tokenizing processes"
    )
    parser.add_argument("--chunk-mb", type=float, default=64.0, help="input bytes per shard")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.chunk_mb <= 0:
        parser.error("--workers must be at least 1 and --chunk-mb above 0")
    return args


def input_files(inputs: list[Path]) -> list[Path]:
    """Every ``.txt``/``.jsonl`` file named or under a named folder, in order."""
    files: list[Path] = []
    for path in inputs:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _SUFFIXES)
            if not found:
                raise PrepareError(f"{path}: no {'/'.join(_SUFFIXES)} files in it")
            files += found
        elif path.is_file():
            if path.suffix not in _SUFFIXES:
                raise PrepareError(f"{path}: not a {'/'.join(_SUFFIXES)} file")
            files.append(path)
        else:
            raise PrepareError(f"{path}: no such file or folder")
    return files


def chunk_ranges(path: Path, chunk_bytes: int) -> list[tuple[int, int]]:
    """``path`` cut into byte ranges of about ``chunk_bytes``, each ending at a line end."""
    size = path.stat().st_size
    ranges, start = [], 0
    with open(path, "rb") as fh:
        while start < size:
            end = min(size, start + chunk_bytes)
            if end < size:
                fh.seek(end)
                rest = fh.readline()  # to the end of the line the cut falls in
                end += len(rest)
            ranges.append((start, end))
            start = end
    return ranges


def _load_tokenizer(name: str) -> Any:
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PrepareError(f"--tokenizer {name}: cannot load a tokenizer ({first})") from exc


def settings(args: argparse.Namespace, tokenizer: Any, files: list[Path]) -> dict[str, Any]:
    """What the shards depend on; its hash tells a resumable folder from another corpus's."""
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    found = {
        "format": FORMAT,
        "tokenizer": args.tokenizer,
        "vocab_size": len(tokenizer),
        "dtype": token_dtype(len(tokenizer)),
        "eos_id": tokenizer.eos_token_id,
        "text_field": args.text_field,
        "chunk_bytes": int(args.chunk_mb * 2**20),
    }
    digest = hashlib.sha256(json.dumps([found, stats]).encode()).hexdigest()
    return {**found, "inputs_sha256": digest}


def _start_index(out: Path, base: dict[str, Any], tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The index to fill: the folder's own when it is this corpus's, else a new one."""
    if (out / INDEX).is_file():
        try:
            old = json.loads((out / INDEX).read_text())
        except (OSError, ValueError):
            old = {}
        if old.get("inputs_sha256") != base["inputs_sha256"]:
            raise PrepareError(
                f"--out {out} holds shards of other inputs or settings (inputs hash "
                f"{str(old.get('inputs_sha256'))[:12]}, not {base['inputs_sha256'][:12]}); "
                "use another folder or delete it"
            )
        return old
    shards = [{"name": SHARD_NAME.format(t["shard"]), "tokens": None} for t in tasks]
    eos = "the tokenizer's EOS id after each document" if base["eos_id"] is not None else "none"
    return {**base, "eos": eos, "complete": False, "shards": shards, "tokens": None}


def _done(out: Path, index: dict[str, Any], shard: int) -> bool:
    entry = index["shards"][shard]
    path = out / entry["name"]
    itemsize = np.dtype(index["dtype"]).itemsize
    return (
        isinstance(entry["tokens"], int)
        and path.is_file()
        and (path.stat().st_size == entry["tokens"] * itemsize)
    )


def prepare(args: argparse.Namespace) -> int:
    """Tokenize every chunk not yet done, in ``--workers`` processes; then mark the index complete."""
    files = input_files(args.inputs)
    if args.workers > 1:
        # The worker processes are the parallelism. A fast tokenizer's own thread pool, once
        # used in this process, can hold a lock at the moment a worker is forked, and that
        # worker then waits on it for ever: the pool stays off (set before the first call).
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    global _TOKENIZER
    _TOKENIZER = _load_tokenizer(args.tokenizer)
    base = settings(args, _TOKENIZER, files)
    tasks = [
        {"file": str(f), "start": s, "end": e, "eos": base["eos_id"], "dtype": base["dtype"]}
        for f in files
        for s, e in chunk_ranges(f, base["chunk_bytes"])
    ]
    for number, task in enumerate(tasks):
        task |= {"shard": number, "field": args.text_field, "out": str(args.out)}
    args.out.mkdir(parents=True, exist_ok=True)
    index = _start_index(args.out, base, tasks)
    todo = [t for t in tasks if not _done(args.out, index, t["shard"])]
    started = time.perf_counter()
    print(
        f"prepare_data: {len(files)} file(s), {len(tasks)} shard(s), {len(tasks) - len(todo)} "
        f"already done; {base['dtype']} ids, vocabulary {base['vocab_size']:,}, "
        f"eos {base['eos_id']}",
        flush=True,
    )
    if base["eos_id"] is None:
        print("prepare_data: the tokenizer has no EOS token: documents are joined without one")
    for shard, tokens, docs in _run(todo, args.workers, args.tokenizer):
        index["shards"][shard]["tokens"] = tokens
        index["shards"][shard]["documents"] = docs
        write_index(args.out, index)
    index["tokens"] = sum(s["tokens"] for s in index["shards"])
    index["complete"] = True
    write_index(args.out, index)
    print(
        f"prepare_data: {index['tokens']:,} tokens in {len(tasks)} shard(s) in {args.out} "
        f"({time.perf_counter() - started:.1f}s)",
        flush=True,
    )
    return 0


def _run(todo: list[dict[str, Any]], workers: int, name: str) -> Iterator[tuple[int, int, int]]:
    """Each task's (shard, tokens, documents) as it completes."""
    if workers == 1 or len(todo) <= 1:
        yield from map(tokenize_chunk, todo)
        return
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with context.Pool(min(workers, len(todo)), initializer=_init_worker, initargs=(name,)) as pool:
        yield from pool.imap_unordered(tokenize_chunk, todo)


def _init_worker(name: str) -> None:
    global _TOKENIZER
    if _TOKENIZER is None:  # spawn: a fresh interpreter
        _TOKENIZER = _load_tokenizer(name)


def _documents(task: dict[str, Any]) -> list[str]:
    """The chunk's documents: its text (a ``.txt`` chunk), or each JSON line's field."""
    path = Path(task["file"])
    with open(path, "rb") as fh:
        fh.seek(task["start"])
        raw = fh.read(task["end"] - task["start"])
    if path.suffix == ".txt":
        return [_text(raw, f"{path} (the chunk at byte {task['start']})")]
    docs = []
    for line_no, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        where = f"{path} (line {line_no} of the chunk at byte {task['start']})"
        try:
            record = json.loads(_text(line, where))
        except json.JSONDecodeError as exc:
            raise PrepareError(f"{where}: not JSON ({exc.msg})") from exc
        if not isinstance(record, dict) or not isinstance(record.get(task["field"]), str):
            raise PrepareError(f"{where}: no string field {task['field']!r}; set --text-field")
        docs.append(record[task["field"]])
    return docs


def _text(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise PrepareError(f"{where}: not UTF-8 text (byte {exc.start + 1} of it)") from exc


def special_ends(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text (BOS, ...)."""
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i], full[i + len(plain) :]
    return [], []


def _pieces(text: str) -> list[str]:
    """``text`` in pieces of at most ``_PIECE_CHARS`` characters (cut at a space where there is one)."""
    pieces, start = [], 0
    while len(text) - start > _PIECE_CHARS:
        end = start + _PIECE_CHARS
        cut = text.rfind(" ", start + _PIECE_CHARS // 2, end)
        end = cut if cut > start else end
        pieces.append(text[start:end])
        start = end
    return [*pieces, text[start:]]


def encode_chunk(task: dict[str, Any], docs: list[str]) -> array.array:
    """The chunk's token ids: per document its special tokens, its text, its EOS.

    A ``.txt`` file is one document cut into chunks: its special tokens open its first chunk
    and its EOS ends its last. Text reaches the tokenizer ``_ENCODE_BATCH`` pieces at a time.
    """
    prefix, suffix = special_ends(_TOKENIZER)
    ends = suffix + ([task["eos"]] if task["eos"] is not None else [])
    ids = array.array("I" if task["dtype"] == "uint32" else "H")
    if Path(task["file"]).suffix == ".txt":
        size = Path(task["file"]).stat().st_size
        opening, closing = prefix if task["start"] == 0 else [], ends if task["end"] >= size else []
        groups = [(opening, _pieces(docs[0]), closing)]
    else:
        groups = [(prefix, _pieces(doc), ends) for doc in docs]
    pending: list[tuple[list[int], list[str], list[int]]] = []
    waiting = 0  # pieces in pending
    for number, group in enumerate(groups, start=1):
        pending.append(group)
        waiting += len(group[1])
        if waiting >= _ENCODE_BATCH or number == len(groups):
            texts = [piece for g in pending for piece in g[1]]
            encoded = iter(_TOKENIZER(texts, add_special_tokens=False)["input_ids"])
            for opening, pieces, closing in pending:
                ids.extend(opening)
                for _ in pieces:
                    ids.extend(next(encoded))
                ids.extend(closing)
            pending, waiting = [], 0
    return ids


def tokenize_chunk(task: dict[str, Any]) -> tuple[int, int, int]:
    """Tokenize one chunk into its shard (temporary name, then renamed); (shard, tokens, docs)."""
    docs = _documents(task)
    ids = encode_chunk(task, docs) if docs else array.array("H")
    out = Path(task["out"]) / SHARD_NAME.format(task["shard"])
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as fh:
        stored = np.dtype(task["dtype"]).newbyteorder("<")  # little-endian on any machine
        np.frombuffer(ids, dtype=task["dtype"]).astype(stored, copy=False).tofile(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out)
    return task["shard"], len(ids), len(docs)


if __name__ == "__main__":
    sys.exit(main())
