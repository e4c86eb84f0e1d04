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
``.<name>.<host>-<pid>.<random>.tmp``, a dot file that no reader of ours lists. Nothing here
deletes a file because its name looks like one of ours: a user's ``.notes.tmp`` or
``.plan.json.abcd1234.tmp`` is theirs. In an output folder of ours the manifest records each
temporary file by its exact name before it is made, and the next write there removes what a
killed writer left (tools/core/outputs.py); elsewhere a leftover stays until the user removes it.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
from pathlib import Path

# The temporary names ``temp_path`` makes; a name recorded as ours must also look like one.
TEMP_RE = re.compile(r"^\..+\.[0-9a-f]{6}-\d+\.[0-9a-f]{8}\.tmp$")
# Longest target-name part kept in a temporary name (NAME_MAX is 255 bytes on Linux).
_NAME_BUDGET = 200

HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def temp_path(path: Path) -> Path:
    """A fresh temporary name beside ``path``: ``.<name>.<host>-<pid>.<8 hex>.tmp``."""
    name = path.name
    while len(name.encode()) > _NAME_BUDGET:
        name = name[:-1]
    return path.with_name(f".{name}.{HOST_TAG}-{os.getpid()}.{secrets.token_hex(4)}.tmp")


def write_atomic_bytes(
    path: Path, data: bytes, *, executable: bool = False, tmp: Path | None = None
) -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename; see the module docstring.

    ``executable`` makes the file executable (0755 under umask 022), for launch scripts.
    ``tmp`` is the temporary file's name (beside ``path``) when the caller recorded one
    (``temp_path``); it must not exist yet.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path) if tmp is None else Path(tmp)
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
