"""The standalone scripts run from a copy of their folder, anywhere, with nothing of ours around.

tools/smoke/scripts/ is copied whole into a plan (``trainer/``) and into every smoke run's
folder (``scripts/``). A script there imports its siblings by plain name (``import job_data``):
Python puts a script's own folder first on ``sys.path``, under ``python``, ``torchrun`` and the
``deepspeed`` launcher alike. Here the folder is copied elsewhere and run from a third folder with
no PYTHONPATH, so nothing of the repository can stand in for a missing sibling.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.smoke.tf_launch import TF_PYTHON

SCRIPTS = Path(__file__).resolve().parents[2] / "tools" / "smoke" / "scripts"


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the folder, and an empty folder to run it from."""
    copy = tmp_path / "box" / "trainer"
    shutil.copytree(SCRIPTS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return copy, cwd


def _run(python: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run(
        [python, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_train_help_runs_from_a_copy_and_imports_no_torch(tmp_path: Path) -> None:
    copy, cwd = _copy(tmp_path)
    proc = _run(sys.executable, ["-X", "importtime", str(copy / "train.py"), "--help"], cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: train.py") and "--deepspeed_config" in proc.stdout
    # Every sibling it needs for --help came from the copy, and torch stayed unloaded.
    imported = re.findall(r"^import time:.*\|\s+(\S+)$", proc.stderr, flags=re.MULTILINE)
    assert "harness" in imported and not {"torch", "transformers"} & set(imported)


def test_a_bad_argument_from_a_copy_is_one_line_and_exit_2(tmp_path: Path) -> None:
    copy, cwd = _copy(tmp_path)
    proc = _run(sys.executable, [str(copy / "train.py"), "--metrics-dir", "m"], cwd)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "train.py: error: --init random needs --model-config (or --model-path for its config.json)"
    )
    assert "Traceback" not in proc.stderr


# A one-layer Llama small enough to train three steps on one CPU process in seconds.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


@pytest.mark.slow
def test_a_copy_trains_a_tiny_model_outside_the_repository(tmp_path: Path) -> None:
    copy, cwd = _copy(tmp_path)
    assert not copy.resolve().is_relative_to(SCRIPTS.parents[2])
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    argv = [str(copy / "train.py"), "--model-config", str(config), "--metrics-dir", "m"]
    argv += ["--steps", "3", "--seq-len", "16", "--micro-batch", "2"]
    proc = _run(sys.executable, argv, cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # One plain process (no launcher): DDP mode on one rank, the metrics where it was told.
    result = json.loads((cwd / "m" / "rank0.json").read_text())
    assert result["status"] == "ok" and result["steps"] == 3 and result["world_size"] == 1
    assert result["mode"] == "ddp" and result["init"] == "random"
    assert len(result["losses"]) == 3 and all(loss > 0 for loss in result["losses"])
    assert "step 3/3 loss" in proc.stdout


def test_the_layout_stand_in_runs_from_a_copy(tmp_path: Path) -> None:
    copy, cwd = _copy(tmp_path)
    proc = _run(sys.executable, [str(copy / "parallel_train.py"), "--help"], cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: parallel_train.py") and "--tp" in proc.stdout
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 8}))
    proc = _run(sys.executable, [str(copy / "parallel_train.py"), *_layout_args(config)], cwd)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == (
        "parallel_train.py: error: model config lacks intermediate_size"
    )


def _layout_args(config: Path) -> list[str]:
    return ["--model-config", str(config), "--metrics-dir", "m", "--reference"]


@pytest.mark.skipif(
    not TF_PYTHON.exists() and os.environ.get("CI", "").lower() != "true",
    reason=f"{TF_PYTHON} is missing: run `make tf-venv`",
)
def test_the_tensorflow_worker_runs_from_a_copy_in_its_own_venv(tmp_path: Path) -> None:
    copy, cwd = _copy(tmp_path)
    # .venv-tf has TensorFlow and no torch: harness.py must need nothing more than the stdlib.
    proc = _run(str(TF_PYTHON), [str(copy / "tf_train.py"), "--help"], cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: tf_train.py") and "--kind" in proc.stdout


# Two ranks print at once into the launcher's one log, as ranks do under ``python -u``.
_RANK_PRINTS = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from harness import tee_rank_log, whole_lines
whole_lines()
tee_rank_log(Path(sys.argv[2]), sys.argv[3])
for step in range(1, 5001):
    print(f"rank {sys.argv[3]} step {step}/5000 loss 1.2345 lr 0.001 " + "x" * 40, flush=True)
"""


def test_two_ranks_printing_at_once_keep_every_line_whole(tmp_path: Path) -> None:
    """A step line the supervisor reads (``last: step N``) is never split by another rank's."""
    log = tmp_path / "smoke.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    with open(log, "wb") as shared:
        ranks = [
            subprocess.Popen(
                [sys.executable, "-u", "-c", _RANK_PRINTS, str(SCRIPTS), str(tmp_path), rank],
                stdout=shared,
                env=env,
            )
            for rank in ("0", "1")
        ]
        assert [proc.wait(timeout=120) for proc in ranks] == [0, 0]
    lines = log.read_text().splitlines()
    line = re.compile(r"rank [01] step \d+/5000 loss 1\.2345 lr 0\.001 x{40}")
    spoiled = [text for text in lines if not line.fullmatch(text)]
    assert len(lines) == 10000 and spoiled == [], spoiled[:3]
    assert (tmp_path / "rank1.log").read_text().count("\n") == 5000
