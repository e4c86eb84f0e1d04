"""Tensor/pipeline layouts as smoke runs: the torch-native stand-in under the smoke supervisor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from specs import tiny_spec
from test_smoke import LLAMA_TINY
from test_smoke_faults import assert_nothing_left

from tools.core.errors import InputError
from tools.core.settings import Settings
from tools.smoke import LayoutRun, SmokeSpec, run_smoke_test

ROOT = Path(__file__).resolve().parents[2]


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "smoke", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.slow
def test_cli_tp2_pp2_runs_on_four_ranks_holding_their_share(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "--model", "llama-3-8b", "--tp", "2", "--pp", "2", "--json", "s.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["status"] == "passed" and result["world_size"] == 4
    assert result["mode"] == "native-3d:tp2xpp2xdp1"
    assert (
        "torch-native stand-in for the plan's layout: DTensor TP 2 x pipelining PP 2"
        in (result["reason"])
    )
    assert "(ddp, as native-3d:tp2xpp2xdp1, 4 cpu rank(s))" in proc.stdout
    total = 0
    for rank in range(4):
        metrics = json.loads((Path(result["run_dir"]) / "metrics" / f"rank{rank}.json").read_text())
        assert metrics["local_param_count"] == metrics["expected_local_param_count"]
        total += metrics["local_param_count"]
    # Each (pp stage, tp shard) pair holds one quarter-ish; the norms are replicated over tp.
    assert total < 0.6 * 2 * result["model_shape"]["params"]
    assert result["predicted_peak_memory_bytes"] and result["peak_memory_bytes"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("inject", "verdict"), [("crash", "crash:"), ("nan", "nan"), ("oom", "oom:"), ("alloc", "oom:")]
)
def test_layout_faults_give_their_verdict_and_leave_nothing(
    settings: Settings, inject: str, verdict: str
) -> None:
    cap = 3 * 2**30 if inject == "alloc" else None  # the leak is the cap's to stop
    spec = SmokeSpec(mode=LayoutRun.of(2, 1, 1), steps=20, inject=inject, memory_cap=cap)
    result = run_smoke_test(tiny_spec(LLAMA_TINY), spec, settings)
    assert result.status == "failed" and result.failure_kind == verdict.rstrip(":")
    assert result.run_mode is not None and result.run_mode.setup.label() == "ddp+tp2"
    assert result.reason.startswith(verdict), result.reason
    assert_nothing_left(result)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: SmokeSpec(mode=LayoutRun.of(2, 1, 1), inject="nope"), "inject"),
        (lambda: LayoutRun.of(2, 1, 1, "zigzag"), "pp_schedule"),  # type: ignore[arg-type]
        (lambda: LayoutRun.of(0, 1, 1), "layout"),
        (lambda: LayoutRun.of(8, 8, 2), "layout"),
        (lambda: SmokeSpec(mode=LayoutRun.of(2, 1, 1), nodes=2), "nodes"),
    ],
)
def test_layouts_the_stand_in_cannot_run_are_refused(build: object, field: str) -> None:
    with pytest.raises(InputError) as err:
        build()  # type: ignore[operator]
    assert err.value.field == field


def test_cli_dp_without_a_layout_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "--model", "gpt2", "--dp", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "trainwright: error: --dp: goes with --tp or --pp (plain data parallelism is --strategy)"
    ]
