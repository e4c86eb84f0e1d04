"""FSDP smoke runs: train.py's FSDP2 mode under torchrun on 2 CPU ranks, faults and plans."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from specs import GPT2_TINY, tiny_spec
from test_smoke import LLAMA_TINY, assert_learned
from test_smoke_faults import assert_nothing_left

from tools.core.errors import InputError
from tools.core.settings import Settings
from tools.core.smoke_types import RunMode
from tools.smoke import SmokeSpec, TorchrunRun, run_smoke_test

ROOT = Path(__file__).resolve().parents[2]


def _rank_metrics(run_dir: str | None, rank: int) -> dict:
    return json.loads((Path(run_dir or "") / "metrics" / f"rank{rank}.json").read_text())


@pytest.mark.slow
def test_fsdp_full_sharding_learns_and_each_rank_holds_half(settings: Settings) -> None:
    spec = SmokeSpec(mode=TorchrunRun(fsdp="full"), steps=30, strategy="fsdp")
    result = run_smoke_test(tiny_spec(LLAMA_TINY), spec, settings)
    assert_learned(result, settings, deepspeed=False, mode="fsdp")
    assert result.mode == "fsdp:full"
    assert result.run_mode == RunMode(launcher="fsdp", fsdp_sharding="full")
    assert "FSDP2 (fully_shard, full sharding) under torchrun" in result.reason
    cmd = json.loads((Path(result.run_dir or "") / "launch.json").read_text())["commands"][0]
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert cmd[cmd.index("--fsdp-sharding") + 1] == "full"
    for rank in (0, 1):
        metrics = _rank_metrics(result.run_dir, rank)
        # fully_shard splits every parameter over the 2 ranks (dim 0, padded to even rows).
        assert metrics["local_param_bytes"] == pytest.approx(metrics["params"] * 4 / 2, rel=0.01)
        assert metrics["construction"] == "meta+broadcast"


@pytest.mark.slow
def test_fsdp_hybrid_over_two_nodes_replicates_across_them(settings: Settings) -> None:
    """Hybrid sharding shards within a node: 2 nodes of 1 rank each hold the whole model."""
    spec = SmokeSpec(mode=TorchrunRun(fsdp="hybrid"), steps=30, strategy="fsdp", nodes=2)
    result = run_smoke_test(tiny_spec(LLAMA_TINY), spec, settings)
    assert_learned(result, settings, deepspeed=False, mode="fsdp")
    assert result.mode == "fsdp:hybrid"
    for rank in (0, 1):
        metrics = _rank_metrics(result.run_dir, rank)
        assert metrics["local_param_bytes"] == pytest.approx(metrics["params"] * 4, rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("inject", "verdict"),
    [("nan", "nan:"), ("crash", "crash:"), ("oom", "oom:")],
)
def test_fsdp_faults_give_their_verdict_and_leave_nothing(
    settings: Settings, inject: str, verdict: str
) -> None:
    spec = SmokeSpec(
        mode=TorchrunRun(fsdp="full"), steps=30, strategy="fsdp", inject=inject, inject_step=3
    )
    result = run_smoke_test(tiny_spec(GPT2_TINY), spec, settings)
    assert result.status == "failed" and result.failure_kind == verdict.rstrip(":")
    assert result.reason.startswith(verdict), result.reason
    assert_nothing_left(result)


def test_an_unknown_sharding_or_offload_without_fsdp_is_refused() -> None:
    # A DeepSpeed config and an FSDP sharding cannot meet: a spec has one mode.
    with pytest.raises(InputError, match="fsdp"):
        TorchrunRun(fsdp="sideways")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="fsdp"):
        TorchrunRun(offload=True)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (
            ["--strategy", "zero2", "--fsdp-sharding", "full"],
            "--fsdp-sharding: needs --strategy fsdp",
        ),
        (["--strategy", "zero3", "--recompute"], "--recompute: is for ddp and fsdp"),
        (["--framework", "tensorflow", "--tp", "2"], "--tp: does not go with --framework"),
        (["--framework", "horovod", "--fsdp-sharding", "full"], "--fsdp-sharding: does not go"),
    ],
)
def test_cli_fsdp_flags_out_of_place_are_one_line_and_exit_2(
    args: list[str], problem: str, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "smoke", "--model", "gpt2", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trainwright: error: {problem}"), proc.stderr


@pytest.mark.slow
def test_an_fsdp_plan_runs_its_own_launch_setup_as_its_smoke_run(tmp_path: Path) -> None:
    """The plan's torchrun command's sharding and schedule are what its smoke run ran."""
    request = "fine-tune llama-3-8b on 8 H100, we want to use FSDP, no deepspeed"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "plan", request, "--out", "o", "--json", "p.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["framework"]["primary"] == "pytorch_fsdp"
    smoke, command = plan["smoke_test"], plan["launch"]["command"]
    assert smoke["status"] == "passed", smoke["reason"]
    assert smoke["mode"] == f"fsdp:{command[command.index('--fsdp-sharding') + 1]}"
    assert smoke["strategy"] == plan["memory"]["chosen"]
    warmup = command[command.index("--warmup-steps") + 1]
    assert f"plan's schedule cosine: warmup {warmup} -> " in smoke["reason"], smoke["reason"]
    ran = json.loads((Path(smoke["run_dir"]) / "launch.json").read_text())["commands"][0]
    assert ran[ran.index("--fsdp-sharding") + 1] == command[command.index("--fsdp-sharding") + 1]
    assert smoke["predicted_peak_memory_bytes"] and smoke["peak_memory_bytes"]
