"""The supervisor's stall watch and timeout, on stand-in launchers (fast, no training).

tests/smoke/test_smoke_faults.py's hang case proves the stall on real DeepSpeed ranks; here
the three ways it can go are pinned down on a plain Python child that prints step lines.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

from tools.smoke.supervise import launch_and_wait


def _steps(tmp_path: Path, waits: list[float], then_sleep_s: float) -> list[str]:
    """A child that prints ``step i/n`` after each wait, then sleeps."""
    script = tmp_path / "steps.py"
    script.write_text(
        "import time\n"
        f"waits = {waits!r}\n"
        "for i, wait in enumerate(waits, start=1):\n"
        "    time.sleep(wait)\n"
        "    print(f'step {i}/{len(waits)} loss 1.0', flush=True)\n"
        f"time.sleep({then_sleep_s})\n"
    )
    return [sys.executable, str(script)]


def _run(tmp_path: Path, command: list[str], timeout_s: float, stall_s: float):  # type: ignore[no-untyped-def]
    lines: list[str] = []
    started = time.monotonic()
    outcome = launch_and_wait([command], {}, tmp_path, timeout_s, lines.append, stall_s=stall_s)
    return outcome, lines, time.monotonic() - started


def test_a_run_quiet_after_its_steps_is_stopped_as_stalled(tmp_path: Path) -> None:
    outcome, lines, took = _run(tmp_path, _steps(tmp_path, [0.1, 0.1, 0.1], 120), 120, 1.0)
    assert outcome.timed_out and outcome.stalled_after_s is not None
    assert 1.0 <= outcome.stalled_after_s < 30, outcome.stalled_after_s
    assert lines[-1].startswith("step 3/3") and outcome.last_progress.startswith("step 3/3")
    assert took < 60  # a hang guard: the 120 s limit was never reached
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or ())
    ]


def test_no_step_yet_is_the_timeouts_not_a_stall(tmp_path: Path) -> None:
    outcome, lines, _ = _run(tmp_path, _steps(tmp_path, [], 120), 2.0, 0.5)
    assert outcome.timed_out and outcome.stalled_after_s is None and not lines


def test_slow_steps_are_not_a_stall(tmp_path: Path) -> None:
    # The last step comes 1.5 s after the one before, past the 0.5 s limit but inside ten
    # times the slowest wait so far (0.3 s): a run that slows down is not a stall.
    outcome, lines, _ = _run(tmp_path, _steps(tmp_path, [0.1, 0.3, 0.1, 1.5], 0), 60, 0.5)
    assert not outcome.timed_out and outcome.returncode == 0, outcome.log_text
    assert len(lines) == 4
