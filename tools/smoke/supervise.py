"""Supervise a smoke run's launchers: process groups, the memory cap, the timeout, Ctrl-C.

Every launcher leads its own process group, so one killpg reaches it, its ranks and any
compiler they start; nothing of a run may outlive the call that started it. The runs in
progress in this process are kept here, so that a Ctrl-C in any thread can stop them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from tools.core.files import write_atomic

KILL_GRACE_S = 5.0
# After Ctrl-C (or SystemExit) the user is waiting: the ranks die at SIGTERM at once, and only
# the launchers' own interpreter teardown (seconds) would use a longer grace.
INTERRUPT_GRACE_S = 1.0
POLL_S = 0.2
# The memory cap a run gets by default (Settings.smoke_memory_cap unset): this share of the
# machine's RAM, or of its cgroup's limit when that is lower. The cap bounds the resident
# memory of every process of the run together (launchers and ranks; shared library pages
# count in each process that maps them).
DEFAULT_MEMORY_CAP_FRACTION = 0.5
# On CPU every rank also runs under an address-space limit (RLIMIT_AS) of the cap plus this
# much. torch, OpenMP and glibc's per-thread arenas reserve address space they never touch (a
# CPU rank maps ~1.4 GiB for ~0.5 GiB resident), so this limit is only a backstop for an
# allocation too fast for the watchdog's poll. Never on CUDA, which reserves huge ranges.
ADDRESS_SPACE_HEADROOM = 8 * 2**30
# Starts a launcher under an address-space limit: sets RLIMIT_AS, then execs the launcher (a
# shim rather than preexec_fn, which is unsafe when the caller has other threads).
_RLIMIT_SHIM = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_AS, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"
)
_PROGRESS = re.compile(r"^step \d+/\d+ ")


class _Outcome:
    """What happened to the launched process group."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.timed_out = False
        self.start_error = ""
        self.last_progress = ""
        self.log_text = ""
        self.timeout_s = 0.0
        # Set when the run's processes held more than the memory cap: (cap, held) in bytes.
        self.over_cap: tuple[int, int] | None = None
        self.address_space = 0


class _ActiveRun:
    """A supervised run in progress: ``stop`` asks it to end, ``done`` says it has."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.done = threading.Event()


_ACTIVE: set[_ActiveRun] = set()
_ACTIVE_LOCK = threading.Lock()
# Set by the handler stop_runs_on_interrupt installs: this process was interrupted, so runs
# still being started (in other threads) do not launch anything.
_INTERRUPTED = threading.Event()


def _launch_and_wait(
    commands: list[list[str]],
    env: dict[str, str],
    run_dir: Path,
    timeout_s: float,
    on_progress: Callable[[str], None] | None,
    *,
    memory_cap: int = 0,
    address_space: int = 0,
) -> _Outcome:
    """Start one launcher per node, each in its own process group, and supervise them all.

    Node 0 logs to ``smoke.log`` (its progress lines reach ``on_progress``), node R to
    ``smoke-node{R}.log``; the training script also writes ``logs/rank{R}.log`` per rank. The
    run ends when every launcher has exited, when one fails (the others are stopped: their
    ranks would only wait for the missing peers), at the timeout, or when the groups together
    hold more resident memory than ``memory_cap`` (checked every POLL_S; 0: no cap). Every
    group is then sent SIGTERM and, after a grace period, SIGKILL (at once over the cap), also
    on Ctrl-C or any error. ``address_space`` (bytes, 0: none) is the RLIMIT_AS each launcher
    starts under, inherited by its ranks.
    """
    outcome = _Outcome()
    outcome.timeout_s = timeout_s
    outcome.address_space = address_space
    log_paths = [
        run_dir / ("smoke.log" if i == 0 else f"smoke-node{i}.log") for i in range(len(commands))
    ]
    procs: list[subprocess.Popen[bytes]] = []
    grace = KILL_GRACE_S
    run = _ActiveRun()
    with _ACTIVE_LOCK:
        _ACTIVE.add(run)
    try:
        if _INTERRUPTED.is_set():
            raise KeyboardInterrupt  # Ctrl-C came while this run was being prepared
        if not _start_launchers(commands, log_paths, env, run_dir, address_space, procs, outcome):
            return outcome
        pgids = [p.pid for p in procs]
        write_atomic(
            run_dir / "launch.json",
            json.dumps(
                {
                    "commands": commands,
                    "pids": pgids,
                    "pgids": pgids,
                    "memory_cap_bytes": memory_cap or None,
                    "address_space_limit_bytes": address_space or None,
                },
                indent=2,
            ),
        )
        offset, pending = _watch(procs, log_paths[0], run, outcome, memory_cap, on_progress)
        if outcome.over_cap is not None:
            # As the kernel's OOM killer would: the memory is still growing.
            grace = 0.0
        _pump_log(log_paths[0], offset, pending + b"\n", outcome, on_progress)
    except (KeyboardInterrupt, SystemExit):
        grace = min(grace, INTERRUPT_GRACE_S)
        raise
    finally:
        # Also on KeyboardInterrupt or any error: nothing of the run may outlive this call. A
        # second Ctrl-C waits until the groups are gone.
        try:
            with _interrupts_deferred():
                _kill_groups(procs, grace)
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE.discard(run)
            run.done.set()
    if outcome.returncode is None and procs:
        outcome.returncode = next(
            (p.returncode for p in procs if p.returncode), procs[0].returncode
        )
    texts = []
    for log_path in log_paths:
        with contextlib.suppress(OSError):
            texts.append(log_path.read_text(errors="replace"))
    outcome.log_text = "\n".join(texts)
    return outcome


def _start_launchers(
    commands: list[list[str]],
    log_paths: list[Path],
    env: dict[str, str],
    run_dir: Path,
    address_space: int,
    procs: list[subprocess.Popen[bytes]],
    outcome: _Outcome,
) -> bool:
    """Start each launcher into ``procs``; False (``outcome.start_error`` set) if one cannot start."""
    for cmd, log_path in zip(commands, log_paths, strict=True):
        argv = cmd
        if address_space:
            argv = [sys.executable, "-S", "-c", _RLIMIT_SHIM, str(address_space), *cmd]
        with open(log_path, "wb") as log, _interrupts_deferred():
            # Ctrl-C waits until the launcher is in ``procs``, so the caller's kill reaches it.
            try:
                procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=run_dir,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        # Its own session and process group, so one killpg reaches the
                        # launcher, its ranks and any compiler it started, and nothing of ours.
                        start_new_session=True,
                    )
                )
            except OSError as exc:
                outcome.start_error = str(exc)
                return False
    return True


def _watch(
    procs: list[subprocess.Popen[bytes]],
    log_path: Path,
    run: _ActiveRun,
    outcome: _Outcome,
    memory_cap: int,
    on_progress: Callable[[str], None] | None,
) -> tuple[int, bytes]:
    """Poll the launchers until they end, one fails, the timeout or the cap; the log read so far."""
    pgids = [p.pid for p in procs]
    deadline = time.monotonic() + outcome.timeout_s
    next_memory_check = 0.0
    offset = 0
    pending = b""
    while True:
        if run.stop.is_set():
            raise KeyboardInterrupt  # stop_all_runs (the CLI's Ctrl-C, from another thread)
        codes = [proc.poll() for proc in procs]
        offset, pending = _pump_log(log_path, offset, pending, outcome, on_progress)
        failed = [code for code in codes if code not in (None, 0)]
        if failed or all(code is not None for code in codes):
            outcome.returncode = failed[0] if failed else 0
            return offset, pending
        if memory_cap and time.monotonic() >= next_memory_check:
            checked = time.monotonic()
            held = group_rss_bytes(pgids)
            # Every poll, unless a scan of /proc is slow (thousands of processes): then
            # at most a tenth of a core goes to it.
            next_memory_check = checked + 10 * (time.monotonic() - checked)
            if held > memory_cap:
                outcome.over_cap = (memory_cap, held)
                return offset, pending
        if time.monotonic() >= deadline:
            outcome.timed_out = True
            return offset, pending
        time.sleep(POLL_S)


def stop_all_runs(wait_s: float = KILL_GRACE_S + 5.0) -> int:
    """Stop every smoke run in progress in this process; return how many there were.

    For a Ctrl-C that reaches the main thread while runs are supervised in other threads (a
    LangGraph node runs in a worker thread): each run kills its process groups and raises
    KeyboardInterrupt in its own thread. Waits up to ``wait_s`` for them to be gone.
    """
    with _ACTIVE_LOCK:
        runs = list(_ACTIVE)
    for run in runs:
        run.stop.set()
    deadline = time.monotonic() + wait_s
    for run in runs:
        run.done.wait(max(0.0, deadline - time.monotonic()))
    return len(runs)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt, so that it stops the same way."""


def request_stop() -> None:
    """Ask every smoke run in progress to stop, and keep new ones from launching.

    What Ctrl-C does to smoke runs (from a signal handler or any thread); ``clear_stop``
    lifts the ban once the interrupted work has ended (a chat's next plan).
    """
    _INTERRUPTED.set()
    with _ACTIVE_LOCK:
        runs = list(_ACTIVE)
    for run in runs:
        run.stop.set()


def clear_stop() -> None:
    """Let smoke runs launch again after an interrupt (``request_stop``) was dealt with.

    For a program that goes on after Ctrl-C (the chat): without it every later run in the
    process would end at once with KeyboardInterrupt.
    """
    _INTERRUPTED.clear()


def stop_requested() -> bool:
    """Whether an interrupt asked runs to stop and ``clear_stop`` has not been called since."""
    return _INTERRUPTED.is_set()


def kill_child_groups() -> int:
    """SIGKILL the process group of every child of this process that leads one; how many.

    The last resort of a program that exits at once after Ctrl-C or SIGTERM: launchers lead
    their own groups, so this reaches their ranks and compilers too.
    """
    import psutil

    groups = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(child.pid) == child.pid:
                    groups.append(child.pid)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    return len(groups)


def stop_runs_on_interrupt() -> None:
    """Make Ctrl-C (SIGINT) also stop smoke runs supervised in other threads.

    Python raises KeyboardInterrupt in the main thread only; a run in a worker thread (a
    LangGraph node, a batch job) would go on while the main thread waits for that thread to
    finish. The handler this installs (main thread only; a no-op elsewhere) asks every run to
    stop, keeps new ones from launching, then does what the previous handler did (raise
    KeyboardInterrupt). For programs such as the CLI; call it before starting runs.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        return  # started with Ctrl-C ignored (a background job): keep it that way

    def _interrupt(signum: int, frame: Any) -> None:
        request_stop()
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _interrupt)


def stop_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that ``finally`` blocks stop the launched groups.

    Smoke runs start their launchers in new sessions (so one killpg reaches every rank); a
    process killed by SIGTERM's default action would leave them running. Call it in a
    program's main thread (the CLI, the GPU check) before starting runs.
    """

    def _exit(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C) for the duration of the block, then raise KeyboardInterrupt.

    Only in the main thread, where Python delivers signals; elsewhere a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and sys.exc_info()[0] is None:
            raise KeyboardInterrupt


def _pump_log(
    log_path: Path,
    offset: int,
    pending: bytes,
    outcome: _Outcome,
    on_progress: Callable[[str], None] | None,
) -> tuple[int, bytes]:
    try:
        with open(log_path, "rb") as log:
            log.seek(offset)
            chunk = log.read()
    except OSError:
        return offset, pending
    offset += len(chunk)
    *lines, pending = (pending + chunk).split(b"\n")
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if _PROGRESS.match(line):
            outcome.last_progress = line
            if on_progress is not None:
                on_progress(line)
    return offset, pending


def _kill_groups(procs: list[subprocess.Popen[bytes]], grace_s: float = KILL_GRACE_S) -> None:
    # SIGTERM first so each launcher (DeepSpeed's runner or torchrun) can stop its ranks
    # cleanly, then SIGKILL for whatever is left after the grace period (at once with no
    # grace). Each launcher leads its own group (start_new_session). Orphaned ranks may
    # linger as zombies when PID 1 does not reap, so liveness ignores zombies.
    def alive(proc: subprocess.Popen[bytes]) -> bool:
        return proc.poll() is None or bool(group_alive(proc.pid))

    live = [proc for proc in procs if alive(proc)]
    for proc in live if grace_s > 0 else []:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        live = [proc for proc in live if alive(proc)]
        if live:
            time.sleep(0.1)
    for proc in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    # A killed process is gone only once the kernel has freed its memory (a large one takes
    # a moment); wait for that, so that nothing of the run is left when this returns.
    deadline = time.monotonic() + KILL_GRACE_S
    while live and time.monotonic() < deadline:
        live = [proc for proc in live if alive(proc)]
        if live:
            time.sleep(0.05)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE_S)


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


def default_memory_cap() -> int:
    """The default memory cap of a smoke run: half of this machine's RAM (or cgroup limit)."""
    return int(DEFAULT_MEMORY_CAP_FRACTION * _usable_memory())


def _usable_memory() -> int:
    total = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    # A container's memory limit (cgroup v2, then v1) is what the run can really use.
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(path).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and 0 < int(limit) < total:
            total = int(limit)
        break
    return total


def format_bytes(n: int) -> str:
    """``n`` bytes as MiB below 1 GiB (``512 MiB``), else GiB with one decimal (``8.0 GiB``)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
