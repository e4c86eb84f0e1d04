"""TensorFlow MultiWorkerMirroredStrategy smoke runs: 2 CPU workers on localhost, supervised.

The workers run tools/smoke/scripts/tf_train.py in ``.venv-tf`` (``make tf-venv``; ``make test`` builds
it), started by tools/smoke/supervise.py ``launch_and_wait`` from tools/smoke/tf_launch.py's
commands. Without ``.venv-tf`` the tests skip locally and fail under CI=true, where it is built.
Loss thresholds come from measured runs (20 steps, 2 workers, the default learning rates;
each worker's first loss, then the mean of its last 3): image 1.40 -> 0.10-0.12, text
3.5-3.7 -> 0.50-0.57. The thresholds (first above 1.2 / 2.5, last below 0.6 / 1.0) leave
room for a loaded machine's other thread orderings, and fail a run that does not learn.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from procs import wait_none_left

from tools.smoke import free_port
from tools.smoke.supervise import launch_and_wait
from tools.smoke.tf_launch import TF_PYTHON, base_env, supervised_commands, worker_commands

WORKERS = 2
STEPS = 20
# A hang guard per run (a healthy one takes 10-35 s on 2 shared cores), not a timing check.
TIMEOUT_S = 120.0


@pytest.fixture(autouse=True)
def _tf_venv() -> None:
    if TF_PYTHON.exists():
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{TF_PYTHON} is missing: `make tf-venv` (or `make test`) builds it")
    pytest.skip(f"{TF_PYTHON} is missing: run `make tf-venv` to build the TensorFlow venv")


def _run(run_dir: Path, train_args: list[str]) -> tuple[Any, list[dict[str, Any]]]:
    """Run 2 workers under the supervisor; its outcome and the rank files written."""
    run_dir.mkdir(parents=True)
    ports = [free_port() for _ in range(WORKERS)]
    commands = supervised_commands(WORKERS, ports, run_dir, train_args)
    outcome = launch_and_wait(commands, base_env(), run_dir, TIMEOUT_S, None)
    assert not wait_none_left(run_dir), "worker processes outlived the run"
    ranks = []
    for rank in range(WORKERS):
        path = run_dir / "metrics" / f"rank{rank}.json"
        if path.exists():
            ranks.append(json.loads(path.read_text()))
    return outcome, ranks


def test_commands_give_each_worker_its_tf_config(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    pairs = worker_commands(WORKERS, ports, tmp_path, ["--kind", "text"])
    configs = [json.loads(env["TF_CONFIG"]) for _argv, env in pairs]
    assert [c["task"]["index"] for c in configs] == [0, 1]
    assert all(c["cluster"]["worker"] == [f"127.0.0.1:{p}" for p in ports] for c in configs)
    assert all(env["CUDA_VISIBLE_DEVICES"] == "" for _argv, env in pairs)
    lines = supervised_commands(WORKERS, ports, tmp_path, ["--kind", "text"])
    assert Path(lines[0][0]).is_absolute() and lines[0][0].endswith("env")
    assert f"TF_CONFIG={pairs[1][1]['TF_CONFIG']}" in lines[1]
    assert lines[1][lines[1].index(str(TF_PYTHON)) :] == pairs[1][0]
    with pytest.raises(ValueError):
        worker_commands(WORKERS, [ports[0], ports[0]], tmp_path, [])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "first_above", "last_below"), [("image", 1.2, 0.6), ("text", 2.5, 1.0)]
)
def test_two_workers_learn(
    tmp_path: Path, kind: str, first_above: float, last_below: float
) -> None:
    run_dir = tmp_path / kind
    outcome, ranks = _run(run_dir, ["--kind", kind, "--steps", str(STEPS)])
    assert outcome.returncode == 0 and not outcome.timed_out, outcome.log_text[-3000:]
    assert len(ranks) == WORKERS, outcome.log_text[-3000:]
    assert outcome.last_progress.startswith(f"step {STEPS}/{STEPS} loss "), outcome.last_progress
    for rank, metrics in enumerate(ranks):
        assert metrics["rank"] == rank and metrics["world_size"] == WORKERS
        assert metrics["status"] == "ok" and metrics["steps"] == STEPS
        assert len(metrics["losses"]) == len(metrics["step_times_s"]) == STEPS
        assert metrics["peak_memory_bytes"] > 0
        # Each worker's own loss, on its own draws: first (near ln(classes)) and the last 3.
        losses = metrics["losses"]
        assert losses[0] > first_above, losses
        assert sum(losses[-3:]) / 3 < last_below, losses
    # The gradient all-reduce keeps the replicas equal: the same weights on both workers.
    assert ranks[0]["weights_checksum"] == pytest.approx(ranks[1]["weights_checksum"], rel=1e-6)
    assert (run_dir / "logs" / "rank1.log").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("inject", "code"), [("nan", 3), ("crash", None)])
def test_injected_faults_fail_the_run(tmp_path: Path, inject: str, code: int | None) -> None:
    run_dir = tmp_path / inject
    outcome, ranks = _run(
        run_dir,
        ["--kind", "image", "--steps", str(STEPS), "--inject", inject, "--inject-step", "4"],
    )
    assert not outcome.timed_out, outcome.log_text[-3000:]
    assert outcome.returncode not in (None, 0), outcome.log_text[-3000:]
    if code is not None:
        assert outcome.returncode == code
    if inject == "nan":
        assert [m["status"] for m in ranks] == ["nan", "nan"]
        assert all(len(m["losses"]) == 4 for m in ranks)
        assert "step 4/20 loss nan" in outcome.log_text
    else:
        assert "injected crash on worker 1 at step 4" in outcome.log_text
        assert "step 3/20 loss" in outcome.log_text
        assert "step 4/20 loss" not in outcome.log_text


@pytest.mark.slow
def test_cli_tensorflow_smoke_passes_with_the_pytorch_verdicts(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(root / "app.py"), "smoke", "--framework", "tensorflow"]
        + ["--model", "resnet-50", "--steps", "20", "--json", "s.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["status"] == "passed" and result["mode"] == "tensorflow:image"
    assert result["world_size"] == WORKERS and len(result["losses"]) == 20
    assert "TensorFlow MultiWorkerMirroredStrategy, 2 CPU workers" in result["reason"]
    assert "(tensorflow:image, 2 cpu rank(s))" in proc.stdout
    assert not wait_none_left(Path(result["run_dir"]))
