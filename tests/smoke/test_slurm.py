"""The plan's train.sbatch under a real scheduler: a one-node SLURM cluster on this machine.

``sbatch`` runs the generated script as written (tests/smoke/slurm_cluster.py starts munged,
slurmctld and slurmd; ``make slurm`` installs Debian's slurm-wlm and munge) for a tiny Llama
fine-tune on 2 CPU ranks (tests/train_fixture.py), three times on one checkpoint folder:

1. SIGTERM to the batch script only (``scancel --batch``; scancel and preemption signal it too):
   the script passes it to the job step, and the ranks save the step they stopped at; the job
   ends COMPLETED, exit code 0 (torchrun's own exit 1 on the signal is not the job's).
2. A resubmit resumes there; SIGTERM to the job step only (``scancel --signal=TERM``, what
   ``#SBATCH --signal=TERM@120`` sends before the time limit): they save again.
3. A resubmit resumes there and runs to the end: the job completes, exit code 0.

Where slurmd cannot start (not root, SLURM not installed) the test says why and skips, and
fails under CI=true, so that a missing scheduler is never a silent pass in CI.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import Cluster, unavailable
from train_fixture import save_model, write_dataset

from tools.artifacts.launch import emit_launch
from tools.core.schemas import FrameworkChoice, HardwareSpec, TrainingBrief
from tools.research.model_catalog import lookup_model
from tools.smoke.commands import free_port

pytestmark = pytest.mark.slow

DDP = FrameworkChoice(primary="pytorch_ddp", stack=["pytorch", "pytorch_ddp"], rationale="x")
RANKS = 2
SEQ = 32
# Runs 1 and 2 would go on for ever; the signal comes once the run has logged this many steps.
FOREVER = ["--steps", "100000", "--log-every", "1", "--save-every", "100000"]
AFTER = 2
_JOB_GUARD_S = 300.0  # hang guards, not timings
_STOPPED = re.compile(r"^stopped at step (\d+) on SIGTERM", re.MULTILINE)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The running cluster, stopped and cleaned up at the end of the session."""
    why = unavailable()
    if why is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(
                f"SLURM cannot start here: {why}; run `make slurm` as root before `make test`"
            )
        pytest.skip(f"SLURM cannot start here: {why}")
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _plan(root: Path) -> Path:
    """The plan's files for a saved tiny Llama on 2 ranks of this machine (CPUs as they are)."""
    model = save_model(root / "model")
    brief = TrainingBrief(
        goal="slurm test",
        model=str(model),
        task="finetune",
        seq_len=SEQ,
        precision="fp32",  # type: ignore[arg-type]
    )
    hardware = HardwareSpec(
        source="described", nodes=1, gpus_per_node=RANKS, cpu_cores=os.cpu_count() or 1
    )
    out = root / "plan"
    emit_launch(out, brief, hardware, lookup_model(str(model), SEQ), DDP, None, steps=4)
    return out


def _submit(slurm: Cluster, out: Path, data: Path, *args: str) -> str:
    env = dict(slurm.env)
    # The job finds torchrun as a user's shell finds it in the venv; sbatch passes this on.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env |= {"DATA": str(data), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PET_MASTER_PORT"] = str(free_port())  # not torchrun's default 29500
    res = slurm.run("sbatch", "--parsable", "train.sbatch", *args, cwd=out, env=env)
    return res.stdout.strip().split(";")[0]


def _log(out: Path, job: str) -> str:
    path = out / f"slurm-{job}.out"
    return path.read_text() if path.exists() else ""


def _signal_after(slurm: Cluster, out: Path, job: str, step: int, *scancel: str) -> str:
    """Once the job has logged ``step``, ``scancel SCANCEL JOB``; its log once it has ended."""
    deadline = time.monotonic() + _JOB_GUARD_S
    while not re.search(rf"^step {step}/", _log(out, job), re.MULTILINE):
        state = slurm.job(job)["JobState"]
        assert state in ("PENDING", "CONFIGURING", "RUNNING"), (state, _log(out, job))
        assert time.monotonic() < deadline, _log(out, job)
        time.sleep(0.2)
    slurm.run("scancel", *scancel, job)
    fields = slurm.wait_job(job, _JOB_GUARD_S)
    log = _log(out, job)
    # The ranks saved and exited 0; the launcher's exit 1 on the signal does not fail the job.
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    assert re.search(r"^train.sbatch: stopped at step \d+ on SIGTERM, saved in ", log, re.M), log
    return log


def _stopped(out: Path, log: str) -> int:
    """The step the ranks stopped at on SIGTERM, checked against the checkpoint they saved."""
    found = _STOPPED.findall(log)
    assert len(found) == 1, log[-4000:]
    assert "is gone; stopping the run" not in log, log[-4000:]  # not ended by their watch
    step = int(found[0])
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step{step}"
    metrics = json.loads((out / "metrics" / "rank0.json").read_text())
    assert metrics["status"] == "preempted", metrics
    return step


def test_sbatch_runs_the_plan_stops_on_sigterm_saving_and_resumes(
    slurm: Cluster, tmp_path: Path
) -> None:
    out = _plan(tmp_path)
    data = write_dataset(tmp_path / "train.jsonl")
    assert f"#SBATCH --gpus-per-node={RANKS}" in (out / "train.sbatch").read_text()

    # 1. SIGTERM to the batch script alone: it passes the signal on and waits for the ranks.
    job = _submit(slurm, out, data, *FOREVER)
    log = _signal_after(slurm, out, job, AFTER, "--batch", "--signal=TERM")
    first = _stopped(out, log)
    assert first >= AFTER

    # 2. The resubmit resumes there; SIGTERM to the job step, as --signal=TERM@120 sends it.
    job = _submit(slurm, out, data, *FOREVER)
    log = _signal_after(slurm, out, job, first + AFTER, "--signal=TERM")
    assert f"resumed from checkpoints/step{first} at step {first}\n" in log, log[-4000:]
    second = _stopped(out, log)
    assert second >= first + AFTER

    # 3. The resubmit resumes there and finishes: the job completes with its checkpoints.
    job = _submit(slurm, out, data, "--steps", str(second + 2), "--log-every", "1")
    fields = slurm.wait_job(job, _JOB_GUARD_S)
    log = _log(out, job)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    assert f"resumed from checkpoints/step{second} at step {second}\n" in log, log[-4000:]
    assert re.findall(r"^step (\d+)/", log, re.MULTILINE) == [str(second + 1), str(second + 2)]
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step{second + 2}"
    metrics = json.loads((out / "metrics" / "rank0.json").read_text())
    assert metrics["status"] == "ok" and metrics["world_size"] == RANKS, metrics
