"""Checkpoints: complete once their manifest is written, resumed only when they verify.

``--checkpoint-dir DIR --save-every N`` saves every N steps (DeepSpeed's own checkpoint format in
DeepSpeed mode, ``torch.distributed.checkpoint`` otherwise) into ``DIR/stepN``; once every rank
has saved, ``stepN/manifest.json`` (each file's size and SHA-256) marks it complete and
``latest`` names it. Of the checkpoints this job saved (``DIR/saved.json``) the newest
``--keep-checkpoints`` are kept; nothing else in ``DIR`` is deleted but the job's own unfinished
saves, and a complete checkpoint in the way of a save is moved aside (``stepN.replaced``). A run
started again with the same directory resumes, data position and schedule included, from the
checkpoint ``latest`` names when it verifies and loads, else from the newest one that does,
saying so; a checkpoint whose files do not match its manifest is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import write_json_atomic
from job_ranks import barrier, from_rank0, gather, get_rank, get_world_size, say, stop_every_rank

if TYPE_CHECKING:
    from job_loop import Job

# One folder per saved step (exactly ``stepN``: the only names the job resumes from or
# removes); in it, once every rank has saved, a manifest of its files (sizes, SHA-256) that
# marks it complete; then ``latest`` names it. ``saved.json`` records the folders this job
# saved (the only ones rotation deletes).
_STEP_DIR = "step{step}"
_STEP_NAME = re.compile(r"step([0-9]+)")
LATEST = "latest"
MANIFEST = "manifest.json"
RECORD = "saved.json"
_HASH_BLOCK_BYTES = 1 << 20


def _step_of(tag: str) -> int | None:
    """N of a folder named exactly ``stepN``; None for any other name."""
    match = _STEP_NAME.fullmatch(tag)
    return int(match[1]) if match else None


def checkpoint_files(folder: Path) -> list[str]:
    """Every file under ``folder`` but its manifest, as sorted relative paths."""
    names = []
    for path in folder.rglob("*"):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and not path.is_symlink() and name != MANIFEST:
            names.append(name)
    return sorted(names)


def _file_entry(path: Path) -> dict[str, Any]:
    """A file's size and SHA-256."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK_BYTES):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


def write_manifest(root: Path, tag: str, step: int) -> None:
    """Mark ``root/tag`` complete: every file's size and SHA-256, in ``manifest.json``.

    Every rank hashes a share of the files (rank 0 lists them); rank 0 writes the manifest.
    """
    folder = root / tag
    names = from_rank0(checkpoint_files(folder) if get_rank() == 0 else None)
    parts = gather(
        {name: _file_entry(folder / name) for name in names[get_rank() :: get_world_size()]}
    )
    if get_rank() == 0:
        files = {name: entry for part in parts for name, entry in part.items()}
        write_json_atomic(folder / MANIFEST, {"step": step, "files": dict(sorted(files.items()))})


def _read_manifest(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest's files, or why there is no usable manifest."""
    path = folder / MANIFEST
    if not path.is_file():
        return None, f"no {MANIFEST}: a save cut short, or an older train.py's"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, f"{MANIFEST} is unreadable"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (
        not isinstance(files, dict)
        or not files
        or not all(_entry_ok(*item) for item in files.items())
    ):
        return None, f"{MANIFEST} is not a checkpoint manifest"
    return files, None


def _entry_ok(name: Any, entry: Any) -> bool:
    return (
        isinstance(name, str)
        and not name.startswith("/")
        and ".." not in name.split("/")
        and isinstance(entry, dict)
        and isinstance(entry.get("bytes"), int)
        and isinstance(entry.get("sha256"), str)
    )


def _file_problem(folder: Path, name: str, entry: dict[str, Any]) -> str | None:
    try:
        size = (folder / name).stat().st_size
    except OSError:
        return f"{name} is missing"
    if size != entry["bytes"]:
        return f"{name} has {size:,} bytes, not the {entry['bytes']:,} saved"
    try:
        if _file_entry(folder / name)["sha256"] != entry["sha256"]:
            return f"{name} changed after it was saved (SHA-256)"
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror})"
    return None


def checkpoint_problem(root: Path, tag: str) -> str | None:
    """Why ``root/tag`` is not a complete checkpoint, or None; every rank checks a share."""
    files, problem = from_rank0(_read_manifest(root / tag) if get_rank() == 0 else None)
    if problem is not None:
        return str(problem)
    names = sorted(files)
    for name in names[get_rank() :: get_world_size()]:
        problem = _file_problem(root / tag, name, files[name])
        if problem:
            break
    found = [p for p in gather(problem) if p]
    return found[0] if found else None


def checkpoint_candidates(root: Path) -> tuple[list[str], list[str]]:
    """The checkpoints to try in order, and what is wrong with ``latest`` (if anything).

    First the ``stepN`` folder ``latest`` names, then every other ``stepN`` folder with a
    manifest, newest first. ``latest`` naming anything but a ``stepN`` folder of ``root``
    (``../other``, an absolute path, a missing step) is not followed.
    """
    if not root.is_dir():
        return [], []
    complete = sorted(
        (
            p.name
            for p in root.iterdir()
            if _step_of(p.name) is not None and _real_dir(p) and (p / MANIFEST).is_file()
        ),
        key=lambda name: _step_of(name) or 0,
        reverse=True,
    )
    latest, named, notes = root / LATEST, None, []
    if latest.is_file():
        try:
            text = latest.read_text().strip()
        except (OSError, UnicodeDecodeError):
            text = "(unreadable)"
        if _step_of(text) is None:
            notes.append(f"{latest} names {text!r}, not a step folder of {root}")
        elif not _real_dir(root / text):
            notes.append(f"{latest} names {text}, which is missing")
        else:
            named = text
    elif latest.exists() or latest.is_symlink():
        notes.append(f"{latest} is not a file")
    elif complete:
        notes.append(f"{latest} is missing")
    return ([named] if named else []) + [tag for tag in complete if tag != named], notes


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def resume(job: Job, root: Path) -> tuple[str | None, dict[str, Any]]:
    """Load the checkpoint to continue from; returns its tag and state (None, {}: none).

    ``latest``'s when it is complete (its manifest verifies) and loads, else the newest
    complete one that loads, saying in one line why. A checkpoint that does not verify is never
    loaded: this job's own is moved aside (``stepN.corrupt``; an unfinished save is removed).
    When complete checkpoints exist and none of them loads, the job stops (exit 2): a
    half-loaded model must not train, nor save over them.
    """
    record = read_record(root) if get_rank() == 0 and root.is_dir() else None
    candidates, notes = from_rank0(checkpoint_candidates(root) if get_rank() == 0 else None)
    load_failed = False
    for tag in candidates:
        problem = checkpoint_problem(root, tag)
        if problem:
            notes.append(f"{root / tag} is incomplete or corrupt ({problem})")
            if record is not None:
                notes[-1] += _dispose(root, tag, record)
            continue
        failure = None
        try:
            state = job.load(root, tag)
        except Exception as exc:  # on any rank: every rank falls back together
            failure = _one_line(exc)
        failures = [f for f in gather(failure) if f]
        if failures:
            load_failed = True
            notes.append(f"{root / tag} did not load ({failures[0]})")
            continue
        if notes:
            say(f"{'; '.join(notes)}; resuming from {root / tag}, the newest complete checkpoint")
        return tag, state
    if load_failed:
        stop_every_rank(
            f"--checkpoint-dir {root}: no checkpoint loads ({'; '.join(notes)}); move them "
            "elsewhere to start afresh"
        )
    if notes:
        say(f"{'; '.join(notes)}; no complete checkpoint in {root}, so starting from step 1")
    return None, {}


def read_record(root: Path) -> dict[str, Any]:
    """``saved.json``: the ``stepN`` folders this job saved (oldest first) and the one it is saving."""
    path = root / RECORD
    record: dict[str, Any] = {"saved": [], "saving": None}
    if not path.exists():
        return record
    try:
        found = json.loads(path.read_text())
        saved = [tag for tag in found["saved"] if _step_of(tag) is not None]
        saving = found.get("saving")
        record = {"saved": saved, "saving": saving if _step_of(saving or "") is not None else None}
    except (OSError, ValueError, TypeError, KeyError):
        print(f"{path} is unreadable: starting a new record of saved checkpoints", flush=True)
    return record


def _unfinished(root: Path, tag: str, record: dict[str, Any]) -> bool:
    """Whether ``root/tag`` is a save of this job cut short (recorded as saving, no manifest)."""
    return (
        tag == record["saving"] and _real_dir(root / tag) and not (root / tag / MANIFEST).exists()
    )


def _set_aside(root: Path, tag: str, record: dict[str, Any], suffix: str) -> Path:
    """Rename ``root/tag`` to a free ``tag.suffix[-N]`` and drop it from the record."""
    aside, n = root / f"{tag}.{suffix}", 1
    while aside.exists() or aside.is_symlink():
        n += 1
        aside = root / f"{tag}.{suffix}-{n}"
    os.rename(root / tag, aside)
    record["saved"] = [t for t in record["saved"] if t != tag]
    if record["saving"] == tag:
        record["saving"] = None
    return aside


def _dispose(root: Path, tag: str, record: dict[str, Any]) -> str:
    """Out of the way with a checkpoint of this job that failed to verify; what was done."""
    if _unfinished(root, tag, record):
        shutil.rmtree(root / tag)
        record["saving"] = None
        write_json_atomic(root / RECORD, record)
        return ": removed it, a save of this job that did not finish"
    if tag not in record["saved"]:
        return ""  # not this job's: left where it is
    aside = _set_aside(root, tag, record, "corrupt")
    write_json_atomic(root / RECORD, record)
    return f": moved it to {aside}"


def _make_way(root: Path, tag: str, record: dict[str, Any]) -> None:
    """Clear the way to save ``root/tag``, never overwriting a checkpoint.

    An unfinished save of this job there is removed; anything else (a checkpoint an earlier
    run completed, something this job did not save) is moved aside, saying so.
    """
    folder = root / tag
    if not (folder.exists() or folder.is_symlink()):
        return
    if _unfinished(root, tag, record):
        shutil.rmtree(folder)
        print(f"removed {folder}: a save of this job that did not finish", flush=True)
        return
    ours = tag in record["saved"]
    aside = _set_aside(root, tag, record, "replaced")
    what = "a checkpoint an earlier run saved" if ours else "not a checkpoint this job saved"
    print(f"{folder} exists ({what}): moved it to {aside} to save this run's {tag}", flush=True)


def _rotate(root: Path, record: dict[str, Any], keep: int, current: str) -> None:
    """Delete this job's recorded checkpoints beyond the newest ``keep`` (never ``current``)."""
    saved = [tag for tag in record["saved"] if _real_dir(root / tag)]
    for tag in sorted(saved, key=lambda name: _step_of(name) or 0)[:-keep]:
        if tag != current:
            shutil.rmtree(root / tag, ignore_errors=True)
            saved.remove(tag)
    record["saved"] = saved


def save_checkpoint(job: Job, root: Path, step: int, position: int, keep: int) -> None:
    """Save ``root/stepN``; once every rank has, its manifest, ``latest`` and the record.

    Rotation then deletes this job's own recorded checkpoints beyond the newest ``keep`` and
    nothing else (a ``step6_good`` copy, a ``steps-notes/`` folder stay).
    """
    tag = _STEP_DIR.format(step=step)
    started = time.perf_counter()
    record: dict[str, Any] = {}
    if get_rank() == 0:
        record = read_record(root)
        _make_way(root, tag, record)
        record["saving"] = tag
        write_json_atomic(root / RECORD, record)
    barrier()
    job.save(root, tag, {"step": step, "data_position": position})
    barrier()
    write_manifest(root, tag, step)
    if get_rank() == 0:
        tmp = root / f".{LATEST}.tmp"
        tmp.write_text(tag)
        os.replace(tmp, root / LATEST)
        record["saved"] = [t for t in record["saved"] if t != tag] + [tag]
        record["saving"] = None
        _rotate(root, record, keep, tag)
        write_json_atomic(root / RECORD, record)
        print(f"checkpoint {root / tag} saved in {time.perf_counter() - started:.1f}s", flush=True)
    barrier()
