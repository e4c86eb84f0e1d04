"""An output folder's manifest: stored, rewritten under the folder's lock, entries checked.

tools/core/outputs.py writes and removes every file through it.

The manifest lists the relative name, size and SHA-256 of every file trainwright wrote in
the folder, plus the temporary files of writes in flight; ``matches_entry`` says whether a
file on disk is still the one an entry recorded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tools.core import files as _files
from tools.core.files import TEMP_RE

MANIFEST = ".trainwright-manifest.json"
# What outputs.py ``hold`` locks: an empty file, never written or removed.
LOCK = ".trainwright-lock"
_OURS = (MANIFEST, LOCK)
# The manifest's own temporary file: its name is recorded in the manifest it replaces.
_MANIFEST_TMP_RE = re.compile(r"^\.trainwright-manifest\.json\.[0-9a-f]{16}\.tmp$")
# A smoke run refreshes its reservations this often; a file changed more than the grace after
# the last refresh was changed by someone else (the run's ranks stop within about a second of
# losing their supervisor: tools/smoke/scripts/harness.py ``watch``).
KEEP_RESERVED_S = 1.0
RESERVED_GRACE_S = 3.0
# A file bigger than this is never hashed to decide ownership (ours are far smaller).
_HASH_LIMIT = 256 * 1024 * 1024


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_doc(folder: Path) -> dict[str, Any] | None:
    """The manifest as stored; None when the folder has none, {} when it cannot be read."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: ours, but it vouches for no file
    return data if isinstance(data, dict) else {}


def read_manifest(folder: Path) -> dict[str, dict[str, Any]] | None:
    """The manifest's files (name -> {size, sha256}); None when the folder has none."""
    data = _read_doc(folder)
    if data is None:
        return None
    files = data.get("files")
    files = files if isinstance(files, dict) else {}
    return {str(k): v for k, v in files.items() if isinstance(v, dict) and "sha256" in v}


def _recorded_temps(data: dict[str, Any] | None) -> set[str]:
    """The temporary files the manifest records (relative names that look like ours)."""
    temps = (data or {}).get("temps")
    found = set()
    for name in temps if isinstance(temps, list) else []:
        parts = Path(str(name)).parts
        if parts and ".." not in parts and not Path(str(name)).is_absolute():
            if TEMP_RE.match(parts[-1]):
                found.add(str(name))
    return found


def _remove_temp(path: Path) -> None:
    """Remove a temporary file the manifest recorded (a regular file or a link, not a folder)."""
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            path.unlink()


def write_manifest(
    folder: Path, files: dict[str, dict[str, Any]], temps: Iterable[str] = ()
) -> None:
    """Rewrite the manifest (under the lock) listing ``files`` and the writes in flight ``temps``.

    A temporary file the old manifest recorded and ``temps`` no longer lists belongs to a
    writer that is gone (all writers hold the lock): it is removed. The manifest is written
    through the temporary name it records itself, so a kill mid-write leaves a file the next
    write knows.
    """
    old = _read_doc(folder)
    temps = sorted(set(temps))
    for name in _recorded_temps(old) - set(temps):
        _remove_temp(folder / name)
    own = str((old or {}).get("tmp") or "")
    if _MANIFEST_TMP_RE.match(own):
        _remove_temp(folder / own)  # what a kill mid-write left
    if not _MANIFEST_TMP_RE.match(own) or os.path.lexists(folder / own):
        own = f"{MANIFEST}.{secrets.token_hex(8)}.tmp"
    text = json.dumps(
        {"version": 1, "files": dict(sorted(files.items())), "temps": temps, "tmp": own}, indent=1
    )
    _files.write_atomic_bytes(folder / MANIFEST, (text + "\n").encode(), tmp=folder / own)


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the folder itself (Linux locks directories too)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def foreign_entries(folder: Path) -> list[str]:
    """What is in ``folder`` besides our manifest, its temporary file and our lock file.

    (A manifest temporary file left by a kill before the first manifest existed is not counted,
    so the folder is not refused for it; it is not removed either: nothing records it.)
    """
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n not in _OURS and not _MANIFEST_TMP_RE.match(n))


def file_entry(path: Path) -> dict[str, Any]:
    """The manifest entry of the file at ``path`` as it is now: its size and SHA-256."""
    return {"size": path.stat().st_size, "sha256": _sha256(path)}


def _written_while_reserved(path: Path, entry: dict[str, Any]) -> bool:
    """Whether ``path`` was last changed while the run that reserved it was alive.

    ``alive`` is the run's last refresh (``keep_reserved``); its ranks stop writing within the
    grace after it. The ctime moves on every write, rename, link or chmod and cannot be set
    back, so a file the user wrote or edited after the run is seen as such. An entry without
    ``alive`` (an older version's) vouches for nothing.
    """
    alive = entry.get("alive")
    if not isinstance(alive, (int, float)) or isinstance(alive, bool):
        return False
    return os.lstat(path).st_ctime <= alive + RESERVED_GRACE_S


def matches_entry(path: Path, entry: dict[str, Any] | None, data: bytes | None) -> bool:
    """Whether the existing regular file ``path`` is what ``entry`` recorded, or is ``data``.

    An entry written just before its file (``prev``: what the file held until then) matches
    either, so a process killed between the two writes leaves a file the next run still owns;
    a ``reserved`` entry (a file our child processes were to write) matches what was written
    while that run was alive (``_written_while_reserved``).
    """
    if entry is not None and entry.get("reserved") and _written_while_reserved(path, entry):
        return True
    if entry is not None and entry.get("prev") and matches_entry(path, entry["prev"], None):
        return True
    size = path.stat().st_size
    if size > _HASH_LIMIT:
        return False
    digest: str | None = None
    if entry is not None and entry.get("size") == size:
        digest = _sha256(path)
        if digest == entry.get("sha256"):
            return True
    if data is not None and len(data) == size:
        digest = digest or _sha256(path)
        return digest == hashlib.sha256(data).hexdigest()
    return False
