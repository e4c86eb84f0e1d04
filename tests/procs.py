"""Helpers for the tests that run the real CLI in subprocesses and kill it (SIGKILL).

Shared by test_durability.py, test_crash_resume.py and test_atomic.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> list[str]:
    """The argv that runs ``python app.py ARGS`` with this interpreter."""
    return [sys.executable, str(ROOT / "app.py"), *args]


def ours(home: Path) -> list[psutil.Process]:
    """Live processes started for this test's runs (their arguments name the run dir in home)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if any(str(home) in arg for arg in proc.info["cmdline"] or ()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_none_left(home: Path, guard_s: float = 15.0) -> list[psutil.Process]:
    """Wait (at most ``guard_s``, a hang guard) until no process of ours is left; the rest."""
    deadline = time.monotonic() + guard_s
    while ours(home) and time.monotonic() < deadline:
        time.sleep(0.5)
    return ours(home)


def history_nodes(db: Path, thread: str) -> list[str]:
    """The nodes each checkpoint of ``thread`` was about to run, oldest first."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from graphs import build_graph
    from tools.core.settings import Settings

    with SqliteSaver.from_conn_string(str(db)) as saver:
        graph = build_graph(checkpointer=saver, settings=Settings.load())
        config = {"configurable": {"thread_id": thread}}
        return [n for snap in reversed(list(graph.get_state_history(config))) for n in snap.next]


def read_until(
    proc: subprocess.Popen[str], lines: Iterable[str], marker: str, guard_s: float = 300.0
) -> list[str]:
    """Read ``lines`` (a pipe of ``proc``) until one contains ``marker``; the lines read.

    Fails (with what was read) when the stream ends or ``guard_s`` passes first: a hang guard,
    not a timing assertion.
    """
    seen: list[str] = []
    started = time.monotonic()
    for line in lines:
        seen.append(line.rstrip("\n"))
        if marker in line:
            return seen
        assert time.monotonic() - started < guard_s, "\n".join(seen)
    raise AssertionError(f"{marker!r} never came (rc {proc.poll()}):\n" + "\n".join(seen))


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc``'s process group (start it with ``start_new_session=True``) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
