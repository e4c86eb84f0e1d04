"""What the standalone scripts share, standard library only: errors, logs, files, memory, supervision, faults.

train.py, parallel_train.py and tf_train.py import it from beside them (a script's folder is
first on sys.path); tf_train.py runs in .venv-tf, which has no torch, so nothing here may
import more than the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

# Exit codes: a bad argument or input (as argparse uses), and a run stopped by a non-finite loss.
EXIT_USAGE = 2
EXIT_NAN = 3
# torchrun (and any env:// launcher) sets these for every rank.
DIST_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# The alloc fault: a block of this size every interval (~1 GiB/s), written so it is resident.
_ALLOC_BLOCK_BYTES = 64 << 20
_ALLOC_INTERVAL_S = 0.05


class UsageError(Exception):
    """A bad argument or input: one line, exit code 2.

    ``shown`` False: another rank prints the line (every rank stops, one says why).
    """

    def __init__(self, message: str, *, shown: bool = True) -> None:
        super().__init__(message)
        self.shown = shown


def dist_env_present() -> bool:
    """Whether a launcher (torchrun) set up this process as one rank of a process group."""
    return all(os.environ.get(key) for key in DIST_ENV)


# ---- logs and files ------------------------------------------------------------------------------


class _Tee:
    """A text stream that writes to the console stream and to a per-rank log file."""

    def __init__(self, stream: Any, log: Any) -> None:
        self.stream = stream
        self.log = log

    def write(self, text: str) -> int:
        self.log.write(text)
        self.log.flush()
        return int(self.stream.write(text))

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def whole_lines() -> None:
    """Write each line of stdout and stderr in one piece, so the ranks' lines never interleave.

    The ranks share the launcher's log file, and under ``python -u`` a print writes its text and
    its newline as two writes: another rank's line could land between them, and a step line
    the supervisor reads (``last: step N``) would be spoiled. Line buffering without
    write-through holds the text until its newline and writes both at once.
    """
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)


def tee_rank_log(log_dir: Path, rank: int | str) -> None:
    """Copy this rank's Python-level stdout and stderr into ``log_dir/rank{rank}.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"rank{rank}.log", "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    sys.stdout = _Tee(sys.stdout, log)
    sys.stderr = _Tee(sys.stderr, log)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so that a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


# ---- a stop on SIGTERM, for the script that started the launcher --------------------------------
# torchrun and DeepSpeed's launcher exit 1 when SIGTERM reaches them, also when every rank saved
# and exited 0. train.sbatch exports STOP_FILE_ENV; rank 0 writes the file once the final
# checkpoint is saved, and the script ends the job with exit 0 (tools/artifacts/templates/).
STOP_FILE_ENV = "TRAINWRIGHT_STOP_FILE"


def record_stop(step: int, checkpoint: Path) -> None:
    """Say, in ``$TRAINWRIGHT_STOP_FILE`` when it is set, that the run saved ``checkpoint`` and stopped."""
    where = os.environ.get(STOP_FILE_ENV)
    if not where:
        return
    path = Path(where)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"stopped at step {step} on SIGTERM, saved in {checkpoint}\n")
    os.replace(tmp, path)


# ---- memory ------------------------------------------------------------------------------------


def anon_rss_bytes() -> int:
    """This process's anonymous resident memory (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def peak_rss_bytes() -> int:
    """This process's peak resident memory (ru_maxrss, KiB on Linux).

    On macOS ru_maxrss is in bytes, where this over-reports harmlessly large.
    """
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


# ---- supervision: a run must not outlive the process that started it --------------------------
# Launchers put ranks in sessions of their own (torchrun does), so killing the group of the
# script that started them does not reach them. Each rank watches the processes it was started
# under and ends its own process group when one goes (SIGKILL included): the smoke runner
# (tools/smoke/supervise.py puts its pid in SUPERVISOR_ENV), the job's launch.sh or train.sbatch
# (which export ``JOB_ENV=PID@HOST``: only ranks on that host watch it), and the launcher that
# is this rank's parent (torchrun, DeepSpeed's launch.py) when a launcher started it.
SUPERVISOR_ENV = "TRAINWRIGHT_SMOKE_SUPERVISOR_PID"
JOB_ENV = "TRAINWRIGHT_JOB_PID"
_SUPERVISOR_POLL_S = 0.5
_SAY_S = 0.2  # how long a rank that is ending waits for its last line to go out


def start_ticks(pid: int) -> str | None:
    """A live process's start time (/proc/PID/stat field 22); None when gone or a zombie."""
    if not os.path.exists("/proc/self/stat"):  # not Linux: liveness only
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def supervisor() -> list[tuple[int, str]]:
    """The smoke runner's supervising process, when it started this one."""
    value = os.environ.get(SUPERVISOR_ENV, "")
    return [(int(value), "supervising process")] if value.isdigit() else []


def launch_script() -> list[tuple[int, str]]:
    """The job's launch.sh or train.sbatch, when it runs on this host."""
    pid, _, host = os.environ.get(JOB_ENV, "").partition("@")
    return [(int(pid), "launch script")] if pid.isdigit() and host == socket.gethostname() else []


def launcher() -> list[tuple[int, str]]:
    """The launcher that started this rank (its parent), when one did."""
    parent = os.getppid()
    return [(parent, "launcher")] if dist_env_present() and parent > 1 else []


def watch(script: str, watched: list[tuple[int, str]]) -> None:
    """End this process group when a process of ``watched`` (pid, what) dies; polled twice a second."""
    # Comparing start times guards against a pid being reused by another process.
    known = [(pid, what, start_ticks(pid)) for pid, what in watched]
    if not known:
        return

    def run() -> None:
        while True:
            for pid, what, started in known:
                if started is None or start_ticks(pid) != started:
                    # Said from another thread: with nobody reading the output any more, a
                    # full pipe would block the print, and the rank would never end.
                    line = f"{script}: {what} {pid} is gone; stopping the run"
                    threading.Thread(target=_print_err, args=(line,), daemon=True).start()
                    time.sleep(_SAY_S)
                    with contextlib.suppress(OSError):
                        os.killpg(os.getpgid(0), signal.SIGKILL)
                    os._exit(137)
            time.sleep(_SUPERVISOR_POLL_S)

    threading.Thread(target=run, name="supervisor-watch", daemon=True).start()


def _print_err(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


# ---- faults: the run fails for real at one step (--inject), for what supervises it -----------


class Faults:
    """The faults every script injects the same way; a script adds its own (nan, oom).

    ``crash`` raises on the last rank; ``hang`` makes rank 0 sleep inside the step, so every
    other rank blocks in its next collective; ``alloc`` makes rank 0 allocate (and touch)
    memory steadily until something stops it, for the supervisor's memory cap to catch.
    """

    def __init__(
        self, kind: str | None, step: int, rank: int, world_size: int, who: str = "rank"
    ) -> None:
        self.kind = kind
        self.step = step
        self.rank = rank
        self.world_size = world_size
        self.who = who  # what the script calls a rank in its lines ("worker" for TensorFlow)

    def due(self, step: int) -> bool:
        """Whether a fault fires at ``step``."""
        return self.kind is not None and step == self.step

    def fire(self, step: int) -> None:
        """Say which fault fires at ``step``, then crash, hang or leak where it is this rank's."""
        print(f"[inject] {self.kind} at step {step} on {self.who} {self.rank}", flush=True)
        if self.kind == "crash" and self.rank == self.world_size - 1:
            raise RuntimeError(f"injected crash on {self.who} {self.rank} at step {step}")
        if self.kind == "hang" and self.rank == 0:
            # The other ranks block in their next collective; only a supervisor's kill ends this.
            time.sleep(10**7)
        if self.kind == "alloc" and self.rank == 0:
            leak()


def leak() -> NoReturn:
    """Allocate and touch memory steadily until a cap (or the address-space limit) stops it."""
    held: list[bytearray] = []
    while True:
        held.append(bytearray(b"\x01") * _ALLOC_BLOCK_BYTES)
        time.sleep(_ALLOC_INTERVAL_S)


def cap_address_space(margin_bytes: int, held_bytes: int = 0) -> tuple[int, int]:
    """Limit the address space (RLIMIT_AS) to ``margin_bytes`` above what this process maps.

    ``held_bytes``: a larger figure to start from, where there is one. The limit stays under any
    hard limit already set (a supervisor's). Returns the limits before, for ``lift_cap``.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        vm_bytes = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = max(vm_bytes, held_bytes) + margin_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)  # under a supervisor's address-space limit
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return soft, hard


def lift_cap(limits: tuple[int, int]) -> None:
    """Set the address-space limits ``cap_address_space`` returned back."""
    resource.setrlimit(resource.RLIMIT_AS, limits)
