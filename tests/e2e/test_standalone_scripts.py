"""The standalone scripts run from a copy of their folder, anywhere, with nothing of ours around.

tools/smoke/scripts/ is copied whole into a plan (``trainer/``) and into every smoke run's
folder (``scripts/``). A script there imports its siblings by plain name (``import job_data``):
Python puts a script's own folder first on ``sys.path``, under ``python``, ``torchrun`` and the
``deepspeed`` launcher alike. Here the folder is copied elsewhere and run from a third folder with
no PYTHONPATH, so nothing of the repository can stand in for a missing sibling.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

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
