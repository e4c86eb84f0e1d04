"""Atomic file writes: a reader (or a crash) sees the old file or the new one, never half.

Every report, config, plan, launch script and index trainwright writes goes through here: the
bytes go to a temporary file in the target's directory, which is flushed, fsynced and renamed
over the target (``os.replace``, atomic on POSIX within one filesystem). A process killed at
any point (SIGKILL included) leaves the old file or the complete new one.

File modes: the file gets ``0o666`` (``0o777`` when ``executable``) less the process umask,
as ``open()`` gives a new file, so reports end up 0644 and launch scripts 0755 under the usual
umask 022 (and 0600 / 0700 under umask 077). The mode comes from the kind of file, not from
the file it replaces: a rerun also repairs the 0600 files an earlier ``mkstemp``-based version
left.

A kill between creating the temporary file and the rename leaves that temporary file behind:
``.<name>.<host>-<pid>.<random>.tmp``, a dot file that no reader of ours lists. The next write
into the same directory removes the ones whose writer is gone (same host tag, no such pid, or
older than an hour for another host's), and never one that a live writer is still filling.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import time
from pathlib import Path

# Temporary files of ours: ".<target name>.<host tag>-<pid>.<8 hex>.tmp".
_TMP_RE = re.compile(r"^\..+\.(?P<host>[0-9a-f]{6})-(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")
# What tempfile.mkstemp made for the earlier version of write_atomic: ".<name>.<8 chars>.tmp".
_LEGACY_SUFFIX_RE = re.compile(r"^[a-z0-9_]{8}\.tmp$")
# A temporary file older than this is stale even when its writer may be alive elsewhere (a
# shared filesystem written from several hosts): one write takes milliseconds.
STALE_AFTER_S = 3600.0
# Longest target-name part kept in a temporary name (NAME_MAX is 255 bytes on Linux).
_NAME_BUDGET = 200

_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _tmp_path(path: Path) -> Path:
    name = path.name
    while len(name.encode()) > _NAME_BUDGET:
        name = name[:-1]
    return path.with_name(f".{name}.{_HOST}-{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def clean_stale_temps(path: Path) -> list[Path]:
    """Remove temporary files left in ``path``'s directory by writers that were killed.

    Ours (any target in the directory) go when their pid is gone on this host, or when they are
    older than ``STALE_AFTER_S``; the earlier ``mkstemp`` names (``.<path.name>.XXXXXXXX.tmp``)
    go when older than that. Returns what was removed; errors (a race with another cleaner, a
    read-only directory) are ignored, since a leftover temporary file harms nothing.
    """
    removed: list[Path] = []
    legacy_prefix = f".{path.name}."
    now = time.time()
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.endswith(".tmp") or not name.startswith("."):
            continue
        match = _TMP_RE.match(name)
        try:
            if match:
                if not entry.is_file(follow_symlinks=False):
                    continue
                dead = match["host"] == _HOST and not _alive(int(match["pid"]))
                if not dead and now - entry.stat(follow_symlinks=False).st_mtime < STALE_AFTER_S:
                    continue
            elif name.startswith(legacy_prefix) and _LEGACY_SUFFIX_RE.match(
                name[len(legacy_prefix) :]
            ):
                if now - entry.stat(follow_symlinks=False).st_mtime < STALE_AFTER_S:
                    continue
            else:
                continue
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def write_atomic_bytes(path: Path, data: bytes, *, executable: bool = False) -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename; see the module docstring.

    ``executable`` makes the file executable (0755 under umask 022), for launch scripts.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(path)
    tmp = _tmp_path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o777 if executable else 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, text: str, *, executable: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; see ``write_atomic_bytes``."""
    write_atomic_bytes(path, text.encode("utf-8"), executable=executable)


def copy_atomic(source: Path, dest: Path) -> None:
    """Copy ``source`` to ``dest`` atomically; an executable source gives an executable copy."""
    source = Path(source)
    write_atomic_bytes(dest, source.read_bytes(), executable=bool(os.stat(source).st_mode & 0o111))


# Names that stand for one of this process's open descriptors.
_FD_NAMES = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_FD_RE = re.compile(r"^/(?:dev/fd|proc/self/fd)/(\d+)$")


def _named_fd(path: Path) -> int | None:
    text = str(path)
    if text in _FD_NAMES:
        return _FD_NAMES[text]
    match = _FD_RE.match(text)
    return int(match.group(1)) if match else None


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_through(path: Path, text: str, field: str = "--json") -> None:
    """Write ``text`` to what ``path`` names, without replacing anything but a regular file.

    - ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``: written to that open descriptor (after
      flushing Python's own buffers), so the bytes land where the shell sent the stream.
    - An existing non-regular file (a character device such as ``/dev/null``, a FIFO, a
      socket): opened and written; never replaced, so ``/dev/null`` stays a device.
    - A symlink: resolved, and its target replaced atomically; the link stays a link.
    - Anything else: ``write_atomic``. A directory is an ``InputError`` naming ``field``.
    """
    import stat
    import sys

    path = Path(path)
    data = text.encode("utf-8")
    fd = _named_fd(path)
    if fd is not None:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        _write_fd(fd, data)
        return
    try:
        st = os.stat(path)  # follows symlinks: what the name leads to
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        from tools.core.errors import InputError, shown

        raise InputError(field, f"{shown(str(path), 160)} is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        out = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            _write_fd(out, data)
        finally:
            os.close(out)
        return
    # A symlink (dangling or not) keeps being one: its target gets the new file.
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    write_atomic_bytes(target, data)
