"""Supervise a smoke run's launchers: process groups, the memory cap, the timeout, Ctrl-C.

Every launcher leads its own process group, so one killpg reaches it, its ranks and any
compiler they start; nothing of a run may outlive the call that started it. The process
groups (groups.py), the memory cap (memory_cap.py) and stopping on Ctrl-C (stopping.py) have
modules of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tools.core.errors import InputError
from tools.core.files import write_atomic
from tools.core.manifest import KEEP_RESERVED_S
from tools.core.outputs import owned, write_file
from tools.smoke.groups import KILL_GRACE_S, SUPERVISOR_ENV, descendant_groups, kill_groups
from tools.smoke.memory_cap import (
    GROUP_SCAN_S,
    MEMORY_POLL_S,
    RunMemory,
    close_cgroup,
    memory_cgroup,
)
from tools.smoke.outcome import Outcome
from tools.smoke.stopping import (
    ActiveRun,
    interrupts_deferred,
    stop_requested,
    track_run,
    untrack_run,
)

# After Ctrl-C (or SystemExit) the user is waiting: the ranks die at SIGTERM at once, and only
# the launchers' own interpreter teardown (seconds) would use a longer grace.
INTERRUPT_GRACE_S = 1.0
POLL_S = 0.2
# A run is stalled when no new step came for its stall limit or for this many times the longest
# wait between two of its steps so far, whichever is longer (a slow machine is not a stall).
STALL_STEP_FACTOR = 10.0
# Starts every launcher: with the supervisor's pid in its environment, asks for SIGKILL when
# the supervisor dies (Linux's PR_SET_PDEATHSIG, kept across exec; the check of the parent
# after it closes the race with a supervisor that died first), joins the cgroup when one is
# given, sets RLIMIT_AS when a limit is given, then execs the launcher (a shim rather than
# preexec_fn, which is unsafe when the caller has other threads).
_RLIMIT_SHIM = (
    "import os, resource, sys; n = int(sys.argv[1]); cg = sys.argv[2]\n"
    f"sup = os.environ.get({SUPERVISOR_ENV!r}, '')\n"
    "if sup.isdigit():\n"
    "    try:\n"
    "        import ctypes; ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
    "    except (AttributeError, OSError):\n"
    "        pass\n"
    "    if os.getppid() != int(sup): os._exit(137)\n"
    "if cg:\n"
    "    with open(cg, 'w') as f: f.write(str(os.getpid()))\n"
    "if n: resource.setrlimit(resource.RLIMIT_AS, (n, n))\n"
    "os.execv(sys.argv[3], sys.argv[3:])"
)
PROGRESS_LINE = re.compile(r"^step \d+/\d+ ")


def launch_and_wait(
    commands: list[list[str]],
    env: dict[str, str],
    run_dir: Path,
    timeout_s: float,
    on_progress: Callable[[str], None] | None,
    *,
    memory_cap: int = 0,
    address_space: int = 0,
    keep_alive: Callable[[], None] | None = None,
    stall_s: float = 0.0,
) -> Outcome:
    """Start one launcher per node, each in its own process group, and supervise them all.

    Node 0 logs to ``smoke.log`` (its progress lines reach ``on_progress``), node R to
    ``smoke-node{R}.log``; the training script also writes ``logs/rank{R}.log`` per rank. The
    run ends when every launcher has exited, when one fails (the others are stopped: their
    ranks would only wait for the missing peers), at the timeout, or when the groups together
    hold more resident memory than ``memory_cap`` (sampled every MEMORY_POLL_S; 0: no cap). Every
    group is then sent SIGTERM and, after a grace period, SIGKILL (at once over the cap), also
    on Ctrl-C or any error. ``address_space`` (bytes, 0: none) is the RLIMIT_AS each launcher
    starts under, inherited by its ranks.
    With a cap, the launchers also start in a cgroup v2 of their own whose ``memory.max`` is
    the cap where this process's cgroup allows one (``memory_cgroup``); the kernel then holds
    the sum itself, and an OOM kill inside it is the verdict ``oom`` too.
    ``stall_s`` (0: off): once the run has printed a step, no new step for that long (or for
    STALL_STEP_FACTOR times the longest wait between its steps so far, if longer) stops it as
    the timeout does, recorded as stalled (``Outcome.stalled_after_s``).
    ``keep_alive`` is called every KEEP_RESERVED_S from a thread of its own while the run lives
    (the run dir's reservations, tools/core/outputs.py ``keep_reserved``).
    """
    outcome = Outcome()
    outcome.timeout_s = timeout_s
    outcome.stall_s = stall_s
    outcome.address_space = address_space
    env = {**env, SUPERVISOR_ENV: str(os.getpid())}
    cgroup, outcome.cgroup = memory_cgroup(run_dir.name, memory_cap) if memory_cap else (None, "")
    log_paths = [
        run_dir / ("smoke.log" if i == 0 else f"smoke-node{i}.log") for i in range(len(commands))
    ]
    procs: list[subprocess.Popen[bytes]] = []
    grace = KILL_GRACE_S
    run = track_run()
    beat = _Heartbeat(keep_alive)
    try:
        if stop_requested():
            raise KeyboardInterrupt  # Ctrl-C came while this run was being prepared
        procs_file = str(cgroup / "cgroup.procs") if cgroup is not None else ""
        if not _start_launchers(
            commands, log_paths, env, run_dir, address_space, procs, outcome, procs_file
        ):
            return outcome
        pgids = [p.pid for p in procs]
        _write_record(
            run_dir,
            "launch.json",
            json.dumps(
                {
                    "commands": commands,
                    "pids": pgids,
                    "pgids": pgids,
                    "memory_cap_bytes": memory_cap or None,
                    "address_space_limit_bytes": address_space or None,
                    "cgroup": outcome.cgroup or None,
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
            with interrupts_deferred():
                kill_groups(procs, grace, outcome.groups)
                if cgroup is not None:
                    close_cgroup(cgroup, outcome, memory_cap)
                if memory_cap:
                    _write_memory_record(run_dir, outcome, memory_cap)
        finally:
            beat.stop()  # after the kill: nothing of the run writes any more
            untrack_run(run)
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


class _Heartbeat:
    """Calls ``keep_alive`` now and every KEEP_RESERVED_S in a daemon thread until ``stop``.

    A thread of its own, so the memory watchdog's fixed sampling rate never waits on the
    manifest's lock and fsync. An error in ``keep_alive`` stops the beat: after a kill the
    run's files then count as changed by someone else, which refuses them (the safe side).
    """

    def __init__(self, keep_alive: Callable[[], None] | None) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if keep_alive is not None:
            self._thread = threading.Thread(
                target=self._run, args=(keep_alive,), name="keep-reserved", daemon=True
            )
            self._thread.start()

    def _run(self, keep_alive: Callable[[], None]) -> None:
        while True:
            try:
                keep_alive()
            except (OSError, InputError):
                return
            if self._stop.wait(KEEP_RESERVED_S):
                return

    def stop(self) -> None:
        """End the beat and wait for a call in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _write_record(run_dir: Path, name: str, text: str) -> None:
    """A file of the supervisor's in the run dir: through its manifest when it has one."""
    if owned(run_dir):
        write_file(run_dir, name, text, field="--run-dir")
    else:
        write_atomic(run_dir / name, text)


_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def _start_launchers(
    commands: list[list[str]],
    log_paths: list[Path],
    env: dict[str, str],
    run_dir: Path,
    address_space: int,
    procs: list[subprocess.Popen[bytes]],
    outcome: Outcome,
    procs_file: str = "",
) -> bool:
    """Start each launcher into ``procs``; False (``outcome.start_error`` set) if one cannot start."""
    for cmd, log_path in zip(commands, log_paths, strict=True):
        argv = [sys.executable, "-S", "-c", _RLIMIT_SHIM, str(address_space), procs_file, *cmd]
        # Never through a link: check_files refused one before, and one made since is refused.
        try:
            fd = os.open(log_path, _LOG_FLAGS, 0o666)
        except OSError as exc:
            outcome.start_error = f"{log_path}: {exc.strerror}"
            return False
        with open(fd, "wb") as log, interrupts_deferred():
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
    run: ActiveRun,
    outcome: Outcome,
    memory_cap: int,
    on_progress: Callable[[str], None] | None,
) -> tuple[int, bytes]:
    """Poll the launchers until they end, one fails, the timeout or the cap; the log read so far.

    With a cap, the run's memory is sampled every MEMORY_POLL_S: the sleep is what is left of
    the period after the sample, so a slow machine shortens the pause, never the rate.
    """
    deadline = time.monotonic() + outcome.timeout_s
    offset = 0
    pending = b""
    watch = RunMemory([p.pid for p in procs]) if memory_cap else None
    period = MEMORY_POLL_S if memory_cap else POLL_S
    next_log = next_groups = 0.0
    stall = _StallWatch(outcome.stall_s)
    while True:
        tick = time.monotonic()
        if run.stop.is_set():
            raise KeyboardInterrupt  # stop_all_runs (the CLI's Ctrl-C, from another thread)
        if tick >= next_groups:
            outcome.groups |= descendant_groups(procs)
            next_groups = tick + GROUP_SCAN_S
        codes = [proc.poll() for proc in procs]
        if tick >= next_log or any(code is not None for code in codes):
            offset, pending = _pump_log(log_path, offset, pending, outcome, on_progress)
            next_log = tick + POLL_S
        failed = [code for code in codes if code not in (None, 0)]
        if failed or all(code is not None for code in codes):
            outcome.returncode = failed[0] if failed else 0
            return offset, pending
        if watch is not None:
            held = watch.sample(outcome)
            if held > memory_cap:
                outcome.over_cap = (memory_cap, held)
                return offset, pending
        now = time.monotonic()
        if now >= deadline:
            outcome.timed_out = True
            return offset, pending
        if stall.stalled(outcome.last_progress, now):
            outcome.timed_out = True
            outcome.stalled_after_s = round(now - stall.since, 1)
            return offset, pending
        time.sleep(max(0.0, period - (time.monotonic() - tick)))


class _StallWatch:
    """When the run's last step line last changed, and whether it has been quiet too long."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self.line = ""
        self.since = 0.0
        self.longest = 0.0  # the longest wait between two step lines so far

    def stalled(self, line: str, now: float) -> bool:
        """Note ``line`` (the last step line read) at ``now``; True when the run has stalled."""
        if self.stall_s <= 0 or not line:
            return False  # off, or no step yet: starting up is the timeout's to bound
        if line != self.line:
            if self.line:
                self.longest = max(self.longest, now - self.since)
            self.line, self.since = line, now
            return False
        return now - self.since > max(self.stall_s, STALL_STEP_FACTOR * self.longest)


def _write_memory_record(run_dir: Path, outcome: Outcome, memory_cap: int) -> None:
    """``memory.json`` in the run dir: the cap, the peak the watchdog saw, its sampling."""
    with contextlib.suppress(OSError, InputError):  # a refused record leaves the user's file
        _write_record(
            run_dir,
            "memory.json",
            json.dumps(
                {
                    "memory_cap_bytes": memory_cap,
                    "address_space_limit_bytes": outcome.address_space or None,
                    "cgroup": outcome.cgroup,
                    "peak_rss_bytes": outcome.peak_rss,
                    "samples": outcome.samples,
                    "period_s": MEMORY_POLL_S,
                    "max_gap_s": round(outcome.max_gap_s, 4),
                    "max_sample_s": round(outcome.max_sample_s, 4),
                    "over_cap_bytes": outcome.over_cap[1] if outcome.over_cap else None,
                },
                indent=2,
            )
            + "\n",
        )


def _pump_log(
    log_path: Path,
    offset: int,
    pending: bytes,
    outcome: Outcome,
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
        if PROGRESS_LINE.match(line):
            outcome.last_progress = line
            if on_progress is not None:
                on_progress(line)
    return offset, pending
