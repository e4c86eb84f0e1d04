"""The verdict of a smoke run: passed, or failed with a kind of failure and a reason.

The kind (``SmokeResult.failure_kind``: ``oom``, ``nan``, ``diverged``, ``timeout``, ``crash``
or ``launcher_error``; tools/review/checks.py advises by it) is read from the ranks' metrics
files and the logs of the launchers and the ranks; the reason starts with it and says more.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from tools.core.schemas import SmokeResult
from tools.core.smoke_types import FailureKind
from tools.smoke.memory_cap import format_bytes
from tools.smoke.outcome import Outcome

WARMUP_STEPS = 3
MIN_LOSS_DROP = 0.10
# What an out-of-memory failure prints: torch's CUDA and CPU allocators, Python, the C++ runtime.
_OOM_MARKERS = (
    "CUDA out of memory",
    "OutOfMemoryError",
    "can't allocate memory",
    "MemoryError",
    "std::bad_alloc",
)
# A rank that died of SIGKILL we did not send: on Linux, almost always the kernel's OOM killer.
_KILLED_MARKERS = ("return code = -9", "Signals.SIGKILL", "exitcode  : -9")
# Errors a rank raises because a peer died, not because of its own fault.
_PEER_FAILURE_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "Socket Timeout",
)
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b")
# Log text that shows the launcher got as far as starting the ranks: DeepSpeed's runner logs
# the first when it starts them; torchrun raises the second when a rank it started fails.
_SPAWNED = ("spawned with command", "ChildFailedError")
# torchrun's own summary exception; the failing rank's exception above it names the cause.
_LAUNCHER_ERRORS = ("ChildFailedError",)


def step_times_s(run_dir: Path | str) -> list[float]:
    """Per-step wall times of a run, the slowest rank per step, from ``run_dir/metrics/rank*.json``.

    Ranks whose metrics file is missing or unreadable are left out; [] when none can be read.
    """
    per_rank = []
    for path in sorted(Path(run_dir, "metrics").glob("rank*.json")):
        try:
            per_rank.append([float(t) for t in json.loads(path.read_text())["step_times_s"]])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if not per_rank:
        return []
    n = min(len(times) for times in per_rank)
    return [max(times[i] for times in per_rank) for i in range(n)]


def run_verdict(
    base: SmokeResult,
    outcome: Outcome,
    metrics_dir: Path,
    ranks: int,
    steps: int,
    notes: list[str],
) -> SmokeResult:
    """The result of a finished run: its metrics merged into ``base``, and the verdict."""
    if outcome.start_error:
        return base.failed("launcher_error", outcome.start_error)
    metrics, missing = _read_metrics(metrics_dir, ranks)
    result = _merge(base, metrics) if metrics else base.model_copy()

    def failed(kind: FailureKind, detail: str, with_log: bool = False) -> SmokeResult:
        if with_log:
            detail = f"{detail}\n{_tail(outcome.log_text)}"
        return result.failed(kind, detail)

    if outcome.over_cap is not None:
        cap, held = outcome.over_cap
        where = outcome.last_progress or "before the first step"
        return failed(
            "oom",
            f"memory cap {format_bytes(cap)} exceeded (the run's processes held "
            f"{format_bytes(held)}); stopped; last: {where}",
        )
    if outcome.timed_out:
        where = outcome.last_progress or "before the first step"
        if outcome.stalled_after_s is not None:
            return failed(
                "timeout",
                f"stalled: no new step for {outcome.stalled_after_s:g} s (stall limit "
                f"{outcome.stall_s:g} s; a rank hung in a collective or a loop); stopped; "
                f"last: {where}",
            )
        return failed("timeout", f"stopped after {outcome.timeout_s:g} s; last: {where}")
    oom = _oom_error(base, outcome, metrics)
    if oom:
        return failed("oom", oom, with_log=True)
    nan_ranks = [m["rank"] for m in metrics if not all(map(math.isfinite, m.get("losses", [])))]
    if nan_ranks:
        return failed("nan", f"non-finite loss on rank(s) {nan_ranks} by step {len(result.losses)}")
    if outcome.returncode != 0:
        # Ranks that never spawned point at the launcher (bad arguments, port, no devices).
        if not any(marker in outcome.log_text for marker in _SPAWNED):
            return failed("launcher_error", f"launcher exited {outcome.returncode}", with_log=True)
        rank, error, tail = _failing_rank(metrics_dir.parent / "logs", outcome.log_text)
        where = f" on rank {rank}" if rank is not None else ""
        detail = f"exit code {outcome.returncode}{where}" + (f": {error}" if error else "")
        return result.failed("crash", f"{detail}\n{tail}")
    if missing:
        return failed("crash", f"rank(s) {missing} wrote no metrics", with_log=True)
    losses = result.losses
    if len(losses) < steps:
        return failed("crash", f"only {len(losses)}/{steps} steps recorded", with_log=True)
    drop, summary = _loss_drop(losses)
    if drop < MIN_LOSS_DROP:
        return failed("diverged", f"{summary}; needs at least {MIN_LOSS_DROP:.0%} lower")
    where = f"on {ranks} {result.device} rank(s)"
    return result.model_copy(
        update={"status": "passed", "reason": "; ".join([f"{summary} {where}", *notes])}
    )


def _oom_error(base: SmokeResult, outcome: Outcome, metrics: list[dict[str, Any]]) -> str:
    """What ran out of memory ("out of memory on rank(s) ...: <error>"), or "" if nothing did."""
    oom_ranks = [m["rank"] for m in metrics if m.get("status") == "oom"]
    killed = any(marker in outcome.log_text for marker in _KILLED_MARKERS)
    if not (oom_ranks or (outcome.returncode != 0 and (_oom_line(outcome.log_text) or killed))):
        return ""
    where = f" on rank(s) {oom_ranks}" if oom_ranks else ""
    error = _oom_line(outcome.log_text) or "a rank was killed by SIGKILL (the kernel's OOM killer?)"
    if outcome.address_space and base.inject != "oom":
        error += (
            f" (ranks ran under a {format_bytes(outcome.address_space)} address-space "
            "limit: its share of the memory cap plus an allowance)"
        )
    return f"out of memory{where}: {error}"


def _loss_drop(losses: list[float]) -> tuple[float, str]:
    """The relative drop from the first to the last few steps' mean loss, and a summary line."""
    window = max(1, min(5, len(losses) // 2))
    first = statistics.fmean(losses[:window])
    last = statistics.fmean(losses[-window:])
    drop = (first - last) / first if first > 0 else 0.0
    return drop, f"loss {first:.3f} -> {last:.3f} ({-drop:+.0%}) over {len(losses)} steps"


def _merge(base: SmokeResult, metrics: list[dict[str, Any]]) -> SmokeResult:
    n_steps = min(len(m.get("losses", [])) for m in metrics)
    losses = [statistics.fmean(float(m["losses"][i]) for m in metrics) for i in range(n_steps)]
    # A data-parallel step lasts as long as its slowest rank.
    times = [max(float(m["step_times_s"][i]) for m in metrics) for i in range(n_steps)]
    skip = min(WARMUP_STEPS, max(0, n_steps - 1))
    step_time_s = statistics.median(times[skip:]) if times else None
    tokens_per_step = sum(int(m.get("tokens_per_step", 0)) for m in metrics)
    result = base.model_copy()
    result.losses = losses
    result.step_time_s = step_time_s
    if step_time_s:
        result.tokens_per_s = tokens_per_step / step_time_s
    result.peak_memory_bytes = max(int(m.get("peak_memory_bytes", 0)) for m in metrics) or None
    result.baseline_memory_bytes = max(int(m.get("baseline_memory_bytes", 0)) for m in metrics)
    result.world_size = int(metrics[0].get("world_size", base.world_size))
    result.device_name = str(metrics[0].get("device_name") or base.device)
    if result.model_shape is not None and metrics[0].get("attn_implementation"):
        result.model_shape = {
            **result.model_shape,
            "attn_implementation": metrics[0]["attn_implementation"],
        }
    for key in ("allocated_at_start_bytes", "allocated_after_step1_bytes"):
        values = [int(m[key]) for m in metrics if m.get(key) is not None]
        if values and result.model_shape is not None:
            result.model_shape = {**result.model_shape, key: max(values)}
    gpu_process = [
        int(m["process_gpu_memory_bytes"]) for m in metrics if m.get("process_gpu_memory_bytes")
    ]
    result.process_gpu_memory_bytes = max(gpu_process) if gpu_process else None
    return result


def _read_metrics(metrics_dir: Path, ranks: int) -> tuple[list[dict[str, Any]], list[int]]:
    found, missing = [], []
    for rank in range(ranks):
        path = metrics_dir / f"rank{rank}.json"
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            missing.append(rank)
    return found, missing


def _failing_rank(logs_dir: Path, launcher_log: str) -> tuple[int | None, str, str]:
    """The rank that failed first, its error line and the tail of its log.

    When one rank dies, its peers fail next in their collectives ("Connection closed by peer",
    NCCL aborts); those errors are consequences, so a rank with any other error is preferred.
    Without per-rank logs, the launcher's log stands in.
    """
    found: list[tuple[int, str, str]] = []
    for path in sorted(logs_dir.glob("rank*.log")):
        try:
            rank = int(path.stem.removeprefix("rank"))
            text = path.read_text(errors="replace")
        except (OSError, ValueError):
            continue
        error = _error_line(text)
        if error:
            found.append((rank, error, text))
    primary = [f for f in found if not any(m in f[1] for m in _PEER_FAILURE_MARKERS)]
    for rank, error, text in primary or found:
        return rank, error, _tail(text)
    return None, _error_line(launcher_log), _tail(launcher_log)


def _oom_line(text: str) -> str:
    for raw in reversed(text.splitlines()):
        line = _RANK_PREFIX.sub("", raw).strip()
        if any(marker in line for marker in _OOM_MARKERS):
            return line[:300]
    return ""


def _error_line(text: str) -> str:
    # The exception line of the last traceback names the cause faster than the whole tail.
    for raw in reversed(text.splitlines()):
        line = _RANK_PREFIX.sub("", raw).strip()
        if _ERROR.match(line) and not any(name in line for name in _LAUNCHER_ERRORS):
            return line[:300]
    return ""


def _tail(text: str, lines: int = 25, max_chars: int = 3000) -> str:
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept)[-max_chars:]
