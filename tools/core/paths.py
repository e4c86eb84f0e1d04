"""Output paths the user names (``--out``, ``--json``, ``--run-dir``), checked before any work.

A path that cannot be written is bad input: one line naming the flag, exit 2, before the
minutes a plan takes, rather than an OS error at the end.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tools.core.errors import InputError, shown

TYPE_CHECKING = False  # typing stays out of `app.py --help` (app.py imports this module)
if TYPE_CHECKING:
    from typing import Literal

# The OS errors that mean "this path cannot be used", not "the machine failed" (a full disk).
PATH_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ENAMETOOLONG,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ELOOP,
        errno.EEXIST,
        errno.EINVAL,
        errno.EXDEV,
    }
)
# Kernel file systems: nothing of a plan belongs there, and writes fail late and oddly.
VIRTUAL_ROOTS = (Path("/proc"), Path("/sys"))
_NAME_MAX = 255
_PATH_MAX = 4096


def check_output_path(path: Path | None, field: str, kind: Literal["dir", "file"]) -> None:
    """Raise InputError (naming ``field``) unless ``path`` can become a ``kind`` we write.

    Refused: a NUL or an empty name, a name or component too long for the file system, a
    path under /proc or /sys, a file where a folder must be (the path itself for a folder, or
    any existing parent), a folder where a file must be, and a parent we may not write in.
    Character devices and FIFOs the user names as a file are left to the writer.
    """
    if path is None:
        return
    text = str(path)
    if "\x00" in text:
        raise InputError(field, "the path contains a NUL character")
    if not text.strip():
        raise InputError(field, "the path is empty")
    raw = os.fsencode(text)
    if len(raw) >= _PATH_MAX or any(len(part) > _NAME_MAX for part in raw.split(b"/")):
        raise InputError(field, f"{shown(text, 60)} is too long for a file name ({len(raw)} bytes)")
    absolute = Path(os.path.abspath(path))
    if any(absolute == root or root in absolute.parents for root in VIRTUAL_ROOTS):
        raise InputError(field, f"{shown(text, 120)} is on a kernel file system (/proc, /sys)")
    try:
        if absolute.exists():
            if kind == "dir" and not absolute.is_dir():
                raise InputError(field, f"{shown(text, 120)} exists and is not a directory")
            if kind == "file" and absolute.is_dir():
                raise InputError(field, f"{shown(text, 120)} is a directory, not a file")
        parent = absolute if kind == "dir" and absolute.is_dir() else absolute.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise InputError(field, f"{shown(text, 120)}: {shown(parent, 120)} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise InputError(field, f"{shown(text, 120)}: cannot write in {shown(parent, 120)}")
    except OSError as exc:
        raise InputError(field, f"{shown(text, 120)}: {exc.strerror}") from None


def confined(
    root: Path, name: str, field: str = "out_dir", *, absolute_inside: bool = False
) -> Path:
    """``root/name`` when it resolves inside ``root``; InputError for anything that leaves it.

    For folders a remote caller names (the LangGraph server's ``out_dir``): an absolute path,
    a ``..`` part, or a symlink that leads out of ``root`` is refused with one line.
    ``absolute_inside`` accepts an absolute path that resolves inside ``root`` (the folder as
    the graph state already holds it).
    """
    text = str(name)
    if "\x00" in text:
        raise InputError(field, "the path contains a NUL character")
    relative = Path(text)
    if (relative.is_absolute() and not absolute_inside) or text.startswith("~"):
        raise InputError(field, "must be a folder name inside the server's output root")
    if ".." in relative.parts:
        raise InputError(field, "must not contain '..'")
    base = Path(root).resolve()
    target = (base / relative).resolve()
    if target != base and not target.is_relative_to(base):
        raise InputError(field, "resolves outside the server's output root")
    return target
