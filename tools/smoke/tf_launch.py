"""The commands that start a TensorFlow MultiWorkerMirroredStrategy smoke run on this machine.

One process per worker, each with its own ``TF_CONFIG`` (the cluster's worker addresses and its
own index), running tools/smoke/scripts/tf_train.py with ``.venv-tf``'s interpreter (TensorFlow lives
in its own venv: its protobuf and numpy pins clash with the main one's). Nothing here imports
TensorFlow. The supervisor (tools/smoke/supervise.py ``launch_and_wait``) gives all of its
commands one environment, so ``supervised_commands`` puts each worker's own variables on its
command line through ``env``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tools.smoke.standalone import TF_SCRIPT

ROOT = Path(__file__).resolve().parents[2]
TF_VENV = ROOT / ".venv-tf"
TF_PYTHON = TF_VENV / "bin" / "python"
TF_TRAIN = TF_SCRIPT
HOST = "127.0.0.1"


def tf_config(ports: list[int], index: int, host: str = HOST) -> str:
    """The ``TF_CONFIG`` of worker ``index`` in a cluster of one worker per port on ``host``."""
    if not 0 <= index < len(ports):
        raise ValueError(f"worker index {index} outside a cluster of {len(ports)}")
    cluster = {"worker": [f"{host}:{port}" for port in ports]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def worker_env(ports: list[int], index: int, *, device: str = "cpu") -> dict[str, str]:
    """The variables worker ``index`` needs on top of the caller's environment."""
    env = {"TF_CONFIG": tf_config(ports, index), "TF_CPP_MIN_LOG_LEVEL": "2"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU probing, even where one is visible
    return env


def worker_commands(
    workers: int,
    ports: list[int],
    run_dir: Path,
    train_args: list[str],
    *,
    python: Path = TF_PYTHON,
    device: str = "cpu",
) -> list[tuple[list[str], dict[str, str]]]:
    """For each worker: its argv and its own variables (``worker_env``).

    Each worker writes ``run_dir/metrics/rank{R}.json`` and ``run_dir/logs/rank{R}.log``;
    ``train_args`` (``--kind``, ``--steps``, ...) go to every worker.
    """
    if workers < 1:
        raise ValueError("a run needs at least one worker")
    if len(ports) != workers:
        raise ValueError(f"{workers} workers need {workers} ports, got {len(ports)}")
    if len(set(ports)) != len(ports):
        raise ValueError(f"ports must differ: {ports}")
    run_dir = run_dir.resolve()
    argv = [
        str(python),
        str(TF_TRAIN),
        *train_args,
        "--metrics-dir",
        str(run_dir / "metrics"),
        "--log-dir",
        str(run_dir / "logs"),
    ]
    return [(list(argv), worker_env(ports, i, device=device)) for i in range(workers)]


def supervised_commands(
    workers: int,
    ports: list[int],
    run_dir: Path,
    train_args: list[str],
    *,
    python: Path = TF_PYTHON,
    device: str = "cpu",
) -> list[list[str]]:
    """``worker_commands`` as ``env VAR=... argv`` lines, for a supervisor with one environment.

    ``env`` is given by its absolute path: the supervisor's address-space shim execs the first
    word without a PATH search.
    """
    env_bin = shutil.which("env") or "/usr/bin/env"
    return [
        [env_bin, *(f"{key}={value}" for key, value in extra.items()), *argv]
        for argv, extra in worker_commands(
            workers, ports, run_dir, train_args, python=python, device=device
        )
    ]


def base_env() -> dict[str, str]:
    """The environment every worker shares: the caller's, less any ``TF_CONFIG`` of its own."""
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env
