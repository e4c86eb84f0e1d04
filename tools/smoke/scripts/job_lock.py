"""One job per checkpoint folder: rank 0 holds ``DIR/job.lock`` for the whole run.

A second job on the directory is refused (exit 2) naming the holder, and a lock whose holder
died is taken over, saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from harness import UsageError, start_ticks

LOCK = "job.lock"


class JobLock:
    """Rank 0 holds ``DIR/job.lock`` for the whole run: an flock, and a line saying who holds it.

    A second job on the folder is refused, naming the holder. The kernel drops the flock when
    its process dies however it dies; the file then still names the dead holder, whose lock the
    next job takes over, saying so. Where the filesystem has no flock (some network mounts) the
    holder's pid decides on its own host; another host's holder is taken to be alive.
    """

    fd: int | None = None

    @classmethod
    def take(cls, root: Path) -> None:
        """Hold the lock of ``root``, or raise UsageError naming the job that holds it."""
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--checkpoint-dir {root}: cannot create it ({exc.strerror})") from exc
        path = root / LOCK
        for _ in range(5):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise UsageError(
                    f"--checkpoint-dir {root}: cannot open {path} ({exc.strerror})"
                ) from exc
            locked = _flock(fd)
            try:
                same = locked is not True or os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # replaced or removed while we locked it: try the new one
                os.close(fd)
                continue
            holder = _read_holder(fd)
            if locked is False or (holder and _holder_alive(holder, flock_works=locked is True)):
                os.close(fd)
                hint = "" if locked is False else f"; if that job is gone, delete {path}"
                raise UsageError(
                    f"--checkpoint-dir {root} is in use by another job ({_holder_text(holder)}, "
                    f"lock {path}); wait for it to end or use another folder{hint}"
                )
            if holder:
                print(
                    f"{path}: taking over the lock of {_holder_text(holder)}, which is gone",
                    flush=True,
                )
            _write_holder(fd)
            cls.fd = fd
            return
        raise UsageError(
            f"--checkpoint-dir {root}: {path} keeps changing; is another job starting?"
        )

    @classmethod
    def release(cls) -> None:
        """Empty the file (no holder) and drop the flock; a no-op where not held."""
        if cls.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(cls.fd, 0)
        with contextlib.suppress(OSError):
            os.close(cls.fd)
        cls.fd = None


def _flock(fd: int) -> bool | None:
    """True: locked; False: another process holds it; None: the filesystem has no flock."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        holder = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {"unreadable": True}
    return holder if isinstance(holder, dict) else {"unreadable": True}


def _write_holder(fd: int) -> None:
    pid = os.getpid()
    holder = {
        "pid": pid,
        "host": socket.gethostname(),
        "start": start_ticks(pid),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    data = (json.dumps(holder) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    with contextlib.suppress(OSError):
        os.fsync(fd)


def _holder_alive(holder: dict[str, Any], *, flock_works: bool) -> bool:
    """Whether the process the lock file names may still run (the flock being free)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname():
        # Where flock works it is the answer (network filesystems pass it between hosts).
        return not flock_works
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    started = start_ticks(pid)
    return started is not None and started == holder.get("start")


def _holder_text(holder: dict[str, Any]) -> str:
    if not holder or "pid" not in holder:
        return "holder unknown"
    since = f", since {holder['since']}" if holder.get("since") else ""
    return f"pid {holder['pid']} on {holder.get('host', '?')}{since}"
