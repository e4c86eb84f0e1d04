"""Plans whose framework or layout the PyTorch DeepSpeed/DDP run does not cover run their own smoke.

Each plan is made offline by the CLI with its smoke run on (2-4 CPU ranks here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tools.smoke.tf_launch import TF_PYTHON

ROOT = Path(__file__).resolve().parents[2]


def _plan(tmp_path: Path, request: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "plan", request, "--out", "o", "--json", "p.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "p.json").read_text())


@pytest.mark.slow
def test_a_tensorflow_team_plan_smoke_tests_with_tensorflow_workers(tmp_path: Path) -> None:
    if not TF_PYTHON.exists() and os.environ.get("CI", "").lower() != "true":
        pytest.skip(f"{TF_PYTHON} is missing: run `make tf-venv`")
    plan = _plan(tmp_path, "train resnet-50 image classifier on 2 x 8 A100, our team uses keras")
    assert plan["framework"]["primary"] == "tensorflow"
    smoke = plan["smoke_test"]
    assert smoke["status"] == "passed", smoke["reason"]
    assert smoke["mode"] == "tensorflow:image" and smoke["world_size"] == 2
    assert plan["review"]["verdict"] == "approved", plan["review"]


@pytest.mark.slow
def test_a_pytorch_horovod_plan_smoke_tests_ddp_and_says_why(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "train resnet-50 with horovod on 2 nodes of 8 V100")
    assert plan["framework"]["primary"] == "horovod"
    smoke = plan["smoke_test"]
    assert smoke["status"] == "passed", smoke["reason"]
    assert smoke["mode"] == "ddp"
    assert "Horovod 0.28.1 does not build against torch >= 2.1" in smoke["reason"]
    assert "PR #3998" in (tmp_path / "o" / "HOROVOD.md").read_text()


@pytest.mark.slow
def test_a_tensor_parallel_plan_smoke_tests_its_layout_scaled_down(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "pretrain llama-3-70b on 2 x 8 H100 with megatron")
    memory, smoke = plan["memory"], plan["smoke_test"]
    assert memory["tensor_parallel"] > 1 and memory["chosen"] == "zero1"
    tp, pp = min(2, memory["tensor_parallel"]), min(2, memory["pipeline_parallel"])
    dp = 2 if tp * pp == 1 * 2 else 1
    assert smoke["status"] == "passed", smoke["reason"]
    assert smoke["mode"] == f"native-3d:tp{tp}xpp{pp}xdp{dp}"
    assert smoke["strategy"] == memory["chosen"] and smoke["world_size"] == tp * pp * dp
    assert "torch-native stand-in for the plan's layout" in smoke["reason"]
    report = (tmp_path / "o" / "report.md").read_text()
    assert "as the torch-native stand-in native-3d:" in report
