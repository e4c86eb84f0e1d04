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

from tools.core.errors import InputError
from tools.core.files import write_atomic
from tools.core.outputs import KEEP_RESERVED_S, owned, write_file

KILL_GRACE_S = 5.0
# After Ctrl-C (or SystemExit) the user is waiting: the ranks die at SIGTERM at once, and only
# the launchers' own interpreter teardown (seconds) would use a longer grace.
INTERRUPT_GRACE_S = 1.0
POLL_S = 0.2
# The memory cap a run gets by default (Settings.smoke_memory_cap unset): half of the machine's
# RAM (or of its cgroup's limit when that is lower), and never more than the memory available
# now less a margin for the rest of the machine. The cap bounds the resident memory of every
# process of the run together (launchers and ranks; shared library pages count in each
# process that maps them).
DEFAULT_MEMORY_CAP_FRACTION = 0.5
# What the default leaves to everything else: this share of the RAM, at least 1 GiB.
MEMORY_MARGIN_FRACTION = 0.1
MIN_MEMORY_MARGIN = 2**30
# The watchdog samples the run's memory this often, whatever else the machine runs: it reads
# /proc/PID/statm of the run's own processes only (found through /proc/PID/task/*/children,
# with a scan of /proc for the run's process groups every GROUP_SCAN_S), never the whole of
# /proc at every sample.
MEMORY_POLL_S = 0.05
GROUP_SCAN_S = 1.0
# On CPU every rank also runs under an address-space limit (RLIMIT_AS): its share of the cap
# (cap / ranks) plus an allowance for address space that is reserved but never touched: torch
# and OpenMP map ~1 GiB more than they hold (a CPU rank maps ~1.5 GiB for ~0.5 GiB resident),
# and glibc reserves a 64 MiB arena per thread that allocates, up to one per OpenMP thread.
# The limit stops one allocation larger than a rank's share before the watchdog's next sample.
# Never on CUDA, which reserves huge ranges.
ADDRESS_SPACE_ALLOWANCE = 2 * 2**30
ARENA_BYTES = 64 * 2**20
# Every launched process (the launchers, their ranks, the TensorFlow workers) finds the
# supervisor's pid here: each rank ends itself when that process dies (SIGKILL included), and
# the launch shim below asks the kernel to kill the launcher itself at that moment.
SUPERVISOR_ENV = "TRAINWRIGHT_SMOKE_SUPERVISOR_PID"
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


class Outcome:
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
        # What the watchdog saw: the largest sum of resident memory (bytes), how many samples,
        # the longest time between two samples and the longest sample (seconds).
        self.peak_rss = 0
        self.samples = 0
        self.max_gap_s = 0.0
        self.max_sample_s = 0.0
        # The cgroup v2 the run's processes were in (its memory.max is the cap), or why none.
        self.cgroup = ""
        # The process groups of the run's processes other than the launchers' own: torchrun
        # starts each rank in a session of its own, which no kill of its group reaches.
        self.groups: set[int] = set()


class _ActiveRun:
    """A supervised run in progress: ``stop`` asks it to end, ``done`` says it has.

    ``thread`` is the thread supervising it (``stop_runs_in_thread``).
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.done = threading.Event()
        self.thread = threading.get_ident()


_ACTIVE: set[_ActiveRun] = set()
_ACTIVE_LOCK = threading.Lock()
# Set by the handler stop_runs_on_interrupt installs: this process was interrupted, so runs
# still being started (in other threads) do not launch anything.
_INTERRUPTED = threading.Event()


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
    ``keep_alive`` is called every KEEP_RESERVED_S from a thread of its own while the run lives
    (the run dir's reservations, tools/core/outputs.py ``keep_reserved``).
    """
    outcome = Outcome()
    outcome.timeout_s = timeout_s
    outcome.address_space = address_space
    env = {**env, SUPERVISOR_ENV: str(os.getpid())}
    cgroup, outcome.cgroup = memory_cgroup(run_dir.name, memory_cap) if memory_cap else (None, "")
    log_paths = [
        run_dir / ("smoke.log" if i == 0 else f"smoke-node{i}.log") for i in range(len(commands))
    ]
    procs: list[subprocess.Popen[bytes]] = []
    grace = KILL_GRACE_S
    run = _ActiveRun()
    with _ACTIVE_LOCK:
        _ACTIVE.add(run)
    beat = _Heartbeat(keep_alive)
    try:
        if _INTERRUPTED.is_set():
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
            with _interrupts_deferred():
                _kill_groups(procs, grace, outcome.groups)
                if cgroup is not None:
                    _close_cgroup(cgroup, outcome, memory_cap)
                if memory_cap:
                    _write_memory_record(run_dir, outcome, memory_cap)
        finally:
            beat.stop()  # after the kill: nothing of the run writes any more
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
        with open(fd, "wb") as log, _interrupts_deferred():
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
    watch = _RunMemory([p.pid for p in procs]) if memory_cap else None
    period = MEMORY_POLL_S if memory_cap else POLL_S
    next_log = next_groups = 0.0
    while True:
        tick = time.monotonic()
        if run.stop.is_set():
            raise KeyboardInterrupt  # stop_all_runs (the CLI's Ctrl-C, from another thread)
        if tick >= next_groups:
            outcome.groups |= _descendant_groups(procs)
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
        if time.monotonic() >= deadline:
            outcome.timed_out = True
            return offset, pending
        time.sleep(max(0.0, period - (time.monotonic() - tick)))


class _RunMemory:
    """The resident memory of one run's processes, sampled cheaply and at a fixed rate.

    The processes are the launchers and their descendants (``/proc/PID/task/*/children``),
    plus, every GROUP_SCAN_S, whatever else is in the launchers' process groups (a scan of
    /proc's stat files, for a process that was re-parented). Each sample reads one
    ``/proc/PID/statm`` per process: its resident pages.
    """

    def __init__(self, pgids: list[int]) -> None:
        self.pgids = pgids
        self.known: set[int] = set(pgids)
        self.next_scan = 0.0
        self.last = 0.0
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def sample(self, outcome: Outcome) -> int:
        started = time.monotonic()
        if not os.path.exists("/proc/self/statm"):
            held = group_rss_bytes(self.pgids)
        else:
            if started >= self.next_scan:
                self.known |= set(_group_pids(self.pgids))
                self.next_scan = started + GROUP_SCAN_S
            self.known = _descendants(self.known)
            held = 0
            for pid in list(self.known):
                try:
                    with open(f"/proc/{pid}/statm", "rb") as fh:
                        held += int(fh.read().split()[1]) * self.page
                except (OSError, IndexError, ValueError):
                    self.known.discard(pid)  # gone
        done = time.monotonic()
        if self.last:
            outcome.max_gap_s = max(outcome.max_gap_s, done - self.last)
        self.last = done
        outcome.samples += 1
        outcome.max_sample_s = max(outcome.max_sample_s, done - started)
        outcome.peak_rss = max(outcome.peak_rss, held)
        return held


def _descendants(pids: set[int]) -> set[int]:
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


def _group_pids(pgids: Collection[int]) -> list[int]:
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


# ---- cgroup v2 ---------------------------------------------------------------------------------


def _cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` on most systems), or None."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            return Path(left.split()[4])
    return None


def _own_cgroup() -> str | None:
    """This process's cgroup v2 path (``0::/path`` in /proc/self/cgroup), or None."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip() or "/"
    except OSError:
        pass
    return None


def memory_cgroup(
    name: str, cap: int, root: Path | None = None, own: str | None = None
) -> tuple[Path | None, str]:
    """A new cgroup v2 for one run with ``memory.max`` = ``cap``, or None and the reason why not.

    It is made under this process's own cgroup, which must have the memory controller enabled
    for its children (``cgroup.subtree_control``) and be writable (a delegated subtree, or
    root). Swap is turned off in it where the kernel has swap accounting. ``root`` and
    ``own`` stand in for the mount point and this process's cgroup path (tests).
    """
    root = root if root is not None else _cgroup2_mount()
    own = own if own is not None else _own_cgroup()
    if root is None or own is None:
        return None, "none: no cgroup v2 hierarchy"
    parent = root / own.lstrip("/")
    try:
        controllers = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None, f"none: cannot read {parent / 'cgroup.subtree_control'}"
    if "memory" not in controllers:
        return None, f"none: the memory controller is not enabled for children of {parent}"
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64] or "run"
    group = parent / f"trainwright-{safe}-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        return None, f"none: cannot create a cgroup in {parent}: {exc.strerror}"
    try:
        (group / "memory.max").write_text(str(cap))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None, f"none: cannot set memory.max in {parent}: {exc.strerror}"
    with contextlib.suppress(OSError):
        (group / "memory.swap.max").write_text("0")
    return group, str(group)


def _close_cgroup(group: Path, outcome: Outcome, memory_cap: int) -> None:
    """Count an OOM kill inside the run's cgroup as over the cap, then remove the cgroup."""
    try:
        events = dict(
            line.split() for line in (group / "memory.events").read_text().splitlines() if line
        )
        if int(events.get("oom_kill", 0)) > 0 and outcome.over_cap is None:
            peak = memory_cap
            with contextlib.suppress(OSError, ValueError):
                peak = int((group / "memory.peak").read_text())
            outcome.over_cap = (memory_cap, max(peak, outcome.peak_rss))
    except (OSError, ValueError):
        pass
    with contextlib.suppress(OSError):
        group.rmdir()


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


def _kill_groups(
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
    others = (set(groups) | _descendant_groups(procs)) - mine
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


def _descendant_groups(procs: list[subprocess.Popen[bytes]]) -> set[int]:
    """The process groups of the live descendants of the launchers (not the launchers' own)."""
    roots = {proc.pid for proc in procs}
    groups = set()
    for pid in _descendants(roots) - roots:
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
    for pid in _group_pids([pgid]):
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


def rank_address_space(memory_cap: int, ranks: int) -> int:
    """The RLIMIT_AS of each CPU rank (and launcher) under ``memory_cap``; 0 with no cap.

    The cap split across the ranks, plus ADDRESS_SPACE_ALLOWANCE and one glibc arena per
    OpenMP thread of a rank, for address space that is reserved but never touched: one rank
    alone cannot take the whole cap in one allocation.
    """
    if memory_cap <= 0:
        return 0
    threads = max(1, (os.cpu_count() or 1) // max(1, ranks))  # each rank's OMP_NUM_THREADS
    return memory_cap // max(1, ranks) + ADDRESS_SPACE_ALLOWANCE + threads * ARENA_BYTES


def default_memory_cap() -> int:
    """The default memory cap of a smoke run, leaving headroom for the rest of the machine.

    Half of this machine's RAM (or of its cgroup's limit), but no more than the memory
    available now (MemAvailable) less a margin of a tenth of the RAM (at least 1 GiB); never
    below 64 MiB, the least a run may be given (a run then ends as ``oom`` at once).
    """
    usable = _usable_memory()
    cap = int(DEFAULT_MEMORY_CAP_FRACTION * usable)
    available = _available_memory()
    if available is not None:
        margin = max(MIN_MEMORY_MARGIN, int(MEMORY_MARGIN_FRACTION * usable))
        cap = min(cap, available - margin)
    return max(cap, 64 * 2**20)


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, or None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


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
