"""Process groups of a smoke run: find the run's processes, measure them, kill them.

Every launcher leads its own process group (supervise.py); torchrun's ranks lead sessions of
their own, found as the launchers' descendants through /proc.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Collection

KILL_GRACE_S = 5.0
# Every launched process (the launchers, their ranks, the TensorFlow workers) finds the
# supervisor's pid here: each rank ends itself when that process dies (SIGKILL included), and
# the launch shim (supervise.py) asks the kernel to kill the launcher itself at that moment.
SUPERVISOR_ENV = "TRAINWRIGHT_SMOKE_SUPERVISOR_PID"


def descendants(pids: set[int]) -> set[int]:
    """``pids`` and every live descendant of them, from each thread's ``children`` file."""
    found: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone
        found.add(pid)
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                    todo.extend(int(c) for c in fh.read().split())
            except (OSError, ValueError):
                continue
    return found


def group_pids(pgids: Collection[int]) -> list[int]:
    """The pids in the process groups ``pgids`` (one read of /proc/PID/stat per process)."""
    wanted = set(pgids)
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) in wanted:
                pids.append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def kill_groups(
    procs: list[subprocess.Popen[bytes]],
    grace_s: float = KILL_GRACE_S,
    groups: Collection[int] = (),
) -> None:
    """End every process group of the run: the launchers', and ``groups`` with their members.

    SIGTERM first so each launcher (DeepSpeed's runner or torchrun) can stop its ranks cleanly,
    then SIGKILL for whatever is left after the grace period (at once with no grace). Each
    launcher leads its own group (start_new_session); torchrun's ranks lead sessions of their
    own, found as the launchers' descendants now and during the run (``groups``), so a
    launcher killed before it could stop them leaves no rank behind. A group found earlier is
    signalled only while a member still carries this supervisor's pid (SUPERVISOR_ENV), never
    a stranger that reused the number. Orphaned ranks may linger as zombies when PID 1 does not
    reap, so liveness ignores zombies.
    """
    mine = {proc.pid for proc in procs}
    others = (set(groups) | descendant_groups(procs)) - mine
    targets = mine | {pgid for pgid in others if _group_is_ours(pgid)}
    targets.discard(os.getpgid(0))  # never this process's own group

    def alive() -> set[int]:
        running = {proc.pid for proc in procs if proc.poll() is None}
        return running | _live_groups(targets)

    live = alive()
    for pgid in live if grace_s > 0 else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        live = alive()
        if live:
            time.sleep(0.1)
    for pgid in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    # A killed process is gone only once the kernel has freed its memory (a large one takes
    # a moment); wait for that, so that nothing of the run is left when this returns.
    deadline = time.monotonic() + KILL_GRACE_S
    while live and time.monotonic() < deadline:
        live = alive()
        if live:
            time.sleep(0.05)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE_S)


def descendant_groups(procs: list[subprocess.Popen[bytes]]) -> set[int]:
    """The process groups of the live descendants of the launchers (not the launchers' own)."""
    roots = {proc.pid for proc in procs}
    groups = set()
    for pid in descendants(roots) - roots:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    return groups - roots


def _proc_stat(pid: str) -> tuple[str, int] | None:
    """A process's state letter and process group (/proc/PID/stat), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _live_groups(pgids: Collection[int]) -> set[int]:
    """Which of the process groups ``pgids`` still hold a live (non-zombie) process."""
    wanted = set(pgids)
    if not wanted:
        return set()
    if not os.path.exists("/proc/self/stat"):
        return {pgid for pgid in wanted if group_alive(pgid)}
    live = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _proc_stat(name)
            if stat is not None and stat[1] in wanted and stat[0] not in ("Z", "X"):
                live.add(stat[1])
    return live


def _group_is_ours(pgid: int) -> bool:
    """Whether a live member of group ``pgid`` was started under this supervisor (its env)."""
    marker = f"{SUPERVISOR_ENV}={os.getpid()}".encode()
    for pid in group_pids([pgid]):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    return True
        except OSError:
            continue
    return False


def group_alive(pgid: int) -> list[int]:
    """Return the pids of live (non-zombie) processes in process group ``pgid``."""
    import psutil

    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return alive


def group_rss_bytes(pgids: Collection[int]) -> int:
    """The resident memory of every process in the process groups ``pgids``, summed (bytes).

    One read of ``/proc/PID/stat`` per process gives both its group and its RSS (zombies hold
    none); psutil stands in where there is no /proc.
    """
    wanted = set(pgids)
    total = 0
    if not os.path.exists("/proc/self/stat"):
        import psutil

        for proc in psutil.process_iter():
            with contextlib.suppress(OSError, psutil.Error):
                if os.getpgid(proc.pid) in wanted:
                    total += int(proc.memory_info().rss)
        return total
    page = os.sysconf("SC_PAGE_SIZE")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            # Fields 5 (pgrp) and 24 (rss, in pages) of proc(5), counted after the name.
            if int(fields[2]) in wanted:
                total += int(fields[21]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total
