"""Nothing of a smoke run outlives its supervisor: SIGKILL of the CLI, SIGTERM of a hung worker.

torchrun starts every rank in a session of its own, and the TensorFlow workers are launchers
themselves, so no single kill of a process group reaches a whole run. Each standalone worker
(train.py, parallel_train.py, tf_train.py) watches the supervisor named by
TRAINWRIGHT_SMOKE_SUPERVISOR_PID and ends itself when it dies, saying so on its stderr; the
launch shim asks the kernel to kill each launcher with the supervisor; and the supervisor's own
kill reaches the ranks' sessions. Before the fix, a `smoke --tp 2 --pp 2` or a TensorFlow run
whose CLI was SIGKILLed at step 3 trained on to its last step, and a TensorFlow worker hung in
a collective or a sleep ignored SIGTERM (TensorFlow's coordination service catches it).

The waits below are hang guards, not timing checks: what is asserted is that the processes
end, and that the workers say why.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from procs import ours, read_until, wait_none_left

from tools.smoke import free_port
from tools.smoke.tf_launch import TF_PYTHON, base_env, worker_commands

ROOT = Path(__file__).resolve().parents[2]
# What the supervisor puts in every launched process's environment (tools/smoke/supervise.py).
SUPERVISOR_ENV = "TRAINWRIGHT_SMOKE_SUPERVISOR_PID"
# A hang guard for the run to reach its third step on a loaded 2-core machine.
START_GUARD_S = 400.0
# A hang guard for the processes to be gone (they go within about a second).
GONE_GUARD_S = 60.0

needs_tf = pytest.mark.skipif(
    not TF_PYTHON.exists() and os.environ.get("CI", "").lower() != "true",
    reason=f"{TF_PYTHON} is missing: run `make tf-venv`",
)

RUNS = {
    "tp2-pp2": ["--model", "llama-3-8b", "--tp", "2", "--pp", "2"],
    "torchrun-ddp": ["--model", "gpt2", "--strategy", "ddp"],
    "deepspeed": ["--model", "gpt2", "--strategy", "zero2"],
    "tensorflow": ["--model", "gpt2", "--framework", "tensorflow"],
}


def _kill_leftovers(home: Path) -> None:
    for proc in ours(home):
        with contextlib.suppress(psutil.Error):
            proc.kill()


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(RUNS))
def test_sigkill_of_the_cli_at_step_3_leaves_no_process_of_the_run(
    tmp_path: Path, run: str
) -> None:
    if run == "tensorflow" and not TF_PYTHON.exists():
        pytest.skip(f"{TF_PYTHON} is missing: run `make tf-venv`")
    home = Path(os.environ["TRAINWRIGHT_HOME"])
    run_dir = home / "runs" / "killed"
    cli = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "smoke", *RUNS[run], "--steps", "100000"]
        + ["--timeout", "3600", "--run-dir", str(run_dir)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert cli.stderr is not None
        read_until(cli, cli.stderr, "step 3/100000", guard_s=START_GUARD_S)
        workers = [p for p in ours(home) if p.pid != cli.pid]
        assert workers, "the run has no processes to orphan"
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait()
        left = wait_none_left(home, guard_s=GONE_GUARD_S)
        assert not left, [(p.pid, p.info["cmdline"][:4]) for p in left]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(cli.pid, signal.SIGKILL)
        cli.wait()
        _kill_leftovers(home)
    if run == "tensorflow":
        return  # its workers are launchers, which the kernel kills with the supervisor
    # The ranks ended themselves: the first to notice says so (torchrun's ranks each sit in a
    # session of their own, DeepSpeed's share their launcher's group; a rank whose peer went
    # first may end on the broken connection before its own watch).
    # Every worker says it in one spelling; a rank may notice its launcher (killed with the CLI)
    # before the CLI itself.
    line = re.compile(rf"(supervising process {cli.pid}|launcher \d+) is gone; stopping the run")
    logs = sorted((run_dir / "logs").glob("rank*.log"))
    said = [bool(line.search(log.read_text(errors="replace"))) for log in logs]
    assert any(said), [log.read_text(errors="replace")[-400:] for log in logs]


def _tf_workers(
    run_dir: Path, args: list[str], extra_env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    """2 TensorFlow workers of ``args``, each in a session of its own, logging to run_dir."""
    ports = [free_port(), free_port()]
    procs = []
    for argv, env in worker_commands(2, ports, run_dir, args):
        procs.append(
            subprocess.Popen(
                argv,
                env={**base_env(), **env, **extra_env},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    return procs


def _wait_for_line(path: Path, text: str, procs: list[subprocess.Popen[bytes]]) -> None:
    guard = time.monotonic() + START_GUARD_S
    while not (path.exists() and text in path.read_text(errors="replace")):
        assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
        assert time.monotonic() < guard, f"{text!r} never came in {path}"
        time.sleep(0.5)


def _end(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@needs_tf
@pytest.mark.slow
def test_tf_workers_end_themselves_when_their_supervisor_dies(tmp_path: Path) -> None:
    # A stand-in supervisor that is not the workers' parent: no kernel death signal helps them.
    supervisor = subprocess.Popen(["sleep", "3600"])
    run_dir = tmp_path / "run"
    args = ["--kind", "image", "--steps", "100000"]
    procs = _tf_workers(run_dir, args, {SUPERVISOR_ENV: str(supervisor.pid)})
    try:
        _wait_for_line(run_dir / "logs" / "rank0.log", "step 3/100000", procs)
        supervisor.kill()
        supervisor.wait()
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=GONE_GUARD_S)
        assert all(p.returncode is not None for p in procs), "a worker outlived its supervisor"
    finally:
        _end(procs)
        supervisor.kill()
        supervisor.wait()
    # The first to notice says so and SIGKILLs its group; its peer may end on the lost peer.
    line = f"tf_train.py: supervising process {supervisor.pid} is gone; stopping the run"
    said = [line in (run_dir / "logs" / f"rank{r}.log").read_text(errors="replace") for r in (0, 1)]
    assert any(said), said


@needs_tf
@pytest.mark.slow
def test_sigterm_ends_tf_workers_hung_in_a_collective_and_in_a_sleep(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["--kind", "image", "--steps", "100000", "--inject", "hang", "--inject-step", "3"]
    procs = _tf_workers(run_dir, args, {})
    try:
        # Worker 0 sleeps inside step 3; worker 1 goes on into the step's all-reduce and waits.
        for rank in range(2):
            _wait_for_line(run_dir / "logs" / f"rank{rank}.log", "[inject] hang at step 3", procs)
        time.sleep(2)  # worker 1 is now blocked in the collective (positioning, not timing)
        codes = []
        for proc in (procs[1], procs[0]):  # the collective first: its peer is still alive
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=GONE_GUARD_S)
            codes.append(proc.returncode)
        assert codes == [-signal.SIGTERM, -signal.SIGTERM]
    finally:
        _end(procs)
