"""Stopping smoke runs: the runs in progress in this process, Ctrl-C, SIGTERM.

The runs in progress are kept here, so that a Ctrl-C in any thread can stop them all; each
run (supervise.py ``launch_and_wait``) kills its own process groups when asked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from tools.smoke.groups import KILL_GRACE_S


class ActiveRun:
    """A supervised run in progress: ``stop`` asks it to end, ``done`` says it has.

    ``thread`` is the thread supervising it (``stop_runs_in_thread``).
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.done = threading.Event()
        self.thread = threading.get_ident()


_ACTIVE: set[ActiveRun] = set()
_ACTIVE_LOCK = threading.Lock()
# Set by the handler stop_runs_on_interrupt installs: this process was interrupted, so runs
# still being started (in other threads) do not launch anything.
_INTERRUPTED = threading.Event()


def track_run() -> ActiveRun:
    """Register a run about to start, so that ``stop_all_runs`` and Ctrl-C reach it."""
    run = ActiveRun()
    with _ACTIVE_LOCK:
        _ACTIVE.add(run)
    return run


def untrack_run(run: ActiveRun) -> None:
    """Forget a run whose processes are gone, and tell whoever waits for it (``run.done``)."""
    with _ACTIVE_LOCK:
        _ACTIVE.discard(run)
    run.done.set()


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


def stop_runs_in_thread(thread: int) -> int:
    """Ask the smoke runs the thread ``thread`` supervises to stop; how many there were.

    For one piece of work cancelled among others (a served run's node, graphs/cancel.py):
    each such run kills its process groups and raises KeyboardInterrupt in its own thread;
    runs of other threads go on. Does not wait.
    """
    with _ACTIVE_LOCK:
        runs = [run for run in _ACTIVE if run.thread == thread]
    for run in runs:
        run.stop.set()
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
def interrupts_deferred() -> Iterator[None]:
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
