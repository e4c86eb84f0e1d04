"""Shared pieces of the benchmarks: the machine record, subprocesses with a hard timeout, stats."""

from __future__ import annotations

import datetime
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
# Dated reports, named by what they measure (``dated``); bench/README.md lists them.
RESULTS = BENCH / "results"
# The recorded H200 runs of bench/gpu/gpu_check.sh that the memory sections read back.
GPU_CHECK_RUNS = [
    RESULTS / "2026-11-29-gpu-check-h200.json",
    RESULTS / "2026-11-29-gpu-check-validation-h200.json",
]
# A shared input: a ~1.1B llama-style model config (TinyLlama's shape).
LLAMA_1B_CONFIG = BENCH / "configs" / "llama-1.1b.json"
PY = sys.executable
# What the smoke runner gives its CPU ranks (tools/smoke/commands.py _child_env): the grid's ranks run
# under the same conditions.
CPU_RANK_ENV = {
    "DS_ACCELERATOR": "cpu",
    "MALLOC_MMAP_THRESHOLD_": "65536",
    "PYTHONUNBUFFERED": "1",
}
# The telemetry and offline switches tools/core/settings.py sets, for every command we start.
QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "ANONYMIZED_TELEMETRY": "False",
    "CREWAI_DISABLE_TELEMETRY": "true",
    "OTEL_SDK_DISABLED": "true",
    "LANGCHAIN_TRACING_V2": "false",
}


class BenchError(RuntimeError):
    """A benchmark step that could not produce its figure (timeout, non-zero exit)."""


@dataclass
class Completed:
    """A finished command: exit code, combined output, wall seconds."""

    argv: list[str]
    returncode: int
    output: str
    wall_s: float


def run_cmd(
    argv: list[str],
    *,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    check: bool = True,
) -> Completed:
    """Run ``argv`` in its own process group; on timeout stop the whole group (TERM, then KILL).

    Wall time covers the whole command, interpreter start-up included.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except BaseException as exc:  # timeout, Ctrl-C: nothing we started may outlive us
        _stop_group(proc)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise BenchError(f"timed out after {timeout:g} s: {' '.join(argv)[:200]}") from None
        raise
    wall = time.perf_counter() - start
    done = Completed(list(argv), proc.returncode, output, wall)
    if check and proc.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise BenchError(f"exit {proc.returncode}: {' '.join(argv)[:200]}\n{tail}")
    return done


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the group (app.py smoke then stops its own launchers), SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.communicate(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def bench_env(*, cpu_ranks: bool = False, **extra: str) -> dict[str, str]:
    """This environment, telemetry off, plus (``cpu_ranks``) the CPU-rank settings and ``extra``."""
    env = dict(os.environ)
    env.update(QUIET_ENV)
    if cpu_ranks:
        env.update(CPU_RANK_ENV)
    env.update(extra)
    return env


def dated(name: str, when: datetime.date | None = None) -> Path:
    """``bench/results/<YYYY-MM-DD>-<name>``: where a run of today files what it measured."""
    day = when or datetime.datetime.now(datetime.UTC).date()
    return RESULTS / f"{day.isoformat()}-{name}"


def median(values: list[float]) -> float:
    """The median (of a non-empty list)."""
    return float(statistics.median(values))


def rel_error(predicted: float, reference: float) -> float:
    """(predicted - reference) / reference."""
    return predicted / reference - 1.0


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (how busy the machine was)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict[str, object]:
    """Where and with what the figures were measured."""
    from tools.research.hardware import cpu_model, package_version

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": usable,
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "ram_gb": _ram_gb(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": package_version("torch"),
        "deepspeed": package_version("deepspeed"),
        "transformers": package_version("transformers"),
        "langgraph": package_version("langgraph"),
        "git_head": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "load_average_start": load_average(),
    }


def _ram_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None
