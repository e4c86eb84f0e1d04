"""Smoke runner: every strategy, injected faults, the two-node path, the CLI and the review."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from specs import GPT2_TINY, tiny_spec

from tools.review import MAX_MEMORY_GAP, check_plan
from tools.schemas import FrameworkChoice, HardwareSpec, SmokeResult, TrainingBrief
from tools.settings import Settings
from tools.smoke import (
    group_alive,
    predict_peak_bytes,
    run_smoke_test,
    smoke_ds_config,
    with_prediction,
)

ROOT = Path(__file__).resolve().parents[1]


def assert_nothing_left(result: SmokeResult) -> None:
    launch = json.loads((Path(result.run_dir or "") / "launch.json").read_text())
    assert launch["pgids"]
    for pgid in launch["pgids"]:
        assert group_alive(pgid) == [], f"process group {pgid} still has live processes"


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "app.py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
        stdin=subprocess.DEVNULL,
    )


# --- real runs -------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_zero1_run_passes_and_writes_the_contract_json(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    proc = run_cli(
        "smoke", "--model", "gpt2", "--strategy", "zero1", "--world-size", "2", "--json", str(out)
    )
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    data = json.loads(out.read_text())
    assert set(SmokeResult.model_fields) <= set(data)
    assert data["status"] == "passed" and data["strategy"] == "zero1"
    assert data["world_size"] == 2 and data["device"] == "cpu"
    assert data["model_shape"]["family"] == "gpt2"
    assert data["predicted_peak_memory_bytes"] > 0 and data["peak_memory_bytes"] > 0
    ds = json.loads((Path(data["run_dir"]) / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 1
    assert "step 30/30" in proc.stderr
    assert "smoke test: passed (zero1" in proc.stdout
    # Per-rank logs next to the launcher's.
    assert {p.name for p in (Path(data["run_dir"]) / "logs").glob("rank*.log")} == {
        "rank0.log",
        "rank1.log",
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("inject", "prefix", "detail"),
    [
        ("crash", "crash:", "injected crash on rank 1 at step 3"),
        ("oom", "oom:", "can't allocate memory"),
        ("nan", "nan:", "non-finite loss"),
        ("hang", "timeout:", "last: step 2/"),
    ],
)
def test_injected_fault_gives_its_reason_and_leaves_no_process(
    settings: Settings, inject: str, prefix: str, detail: str
) -> None:
    limit = 40.0 if inject == "hang" else settings.smoke_timeout_s
    result = run_smoke_test(
        tiny_spec(GPT2_TINY),
        smoke_ds_config(tiny_spec(GPT2_TINY), "zero2", world_size=2),
        settings,
        steps=30,
        inject=inject,
        inject_step=3,
        timeout_s=limit,
    )
    assert result.status == "failed"
    assert result.inject == inject
    assert result.reason.startswith(prefix), result.reason
    assert detail in result.reason, result.reason
    assert_nothing_left(result)
    if inject == "crash":
        # The failing rank is named, not the peer that lost its connection to it.
        assert "on rank 1" in result.reason.splitlines()[0]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zero2", "ddp"], ids=["deepspeed-no-ssh", "torchrun"])
def test_two_node_run_passes_through_the_multi_node_launch(
    settings: Settings, strategy: str
) -> None:
    model = tiny_spec(GPT2_TINY)
    result = run_smoke_test(
        model,
        smoke_ds_config(model, strategy, world_size=2, nodes=2),
        settings,
        steps=30,
        nodes=2,
    )
    assert result.status == "passed", result.reason
    assert result.nodes == 2 and result.world_size == 2
    run_dir = Path(result.run_dir or "")
    commands = json.loads((run_dir / "launch.json").read_text())["commands"]
    assert len(commands) == 2
    for rank, cmd in enumerate(commands):
        if strategy == "zero2":
            assert "--no_ssh" in cmd
            assert cmd[cmd.index("--node_rank") + 1] == str(rank)
            assert cmd[cmd.index("--hostfile") + 1] == str(run_dir / "hostfile")
        else:
            assert cmd[cmd.index("--nnodes") + 1] == "2"
            assert cmd[cmd.index("--node_rank") + 1] == str(rank)
    if strategy == "zero2":
        assert (run_dir / "hostfile").read_text() == "node0 slots=1\nnode1 slots=1\n"
    assert (run_dir / "smoke-node1.log").exists()
    assert_nothing_left(result)


# --- CLI input errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--strategy", "zero9"], "--strategy"),
        (["--inject", "fire"], "--inject"),
        (["--steps", "0"], "--steps"),
        (["--timeout", "-1"], "--timeout"),
        (["--nodes", "3"], "nodes"),
    ],
)
def test_cli_smoke_rejects_bad_input_with_one_line(args: list[str], needle: str) -> None:
    proc = run_cli("smoke", "--model", "gpt2", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


# --- prediction and review -------------------------------------------------------------------

SHAPE = {
    "family": "gpt2",
    "params": 3_709_952,
    "largest_layer_params": 8192 * 256,
    "layers": 2,
    "hidden": 256,
    "heads": 4,
    "kv_heads": None,
    "intermediate": None,
    "vocab": 8192,
    "seq_len": 64,
    "micro_batch_size": 1,
}


def test_prediction_leaves_out_what_the_measurement_cannot_see() -> None:
    from tools.memory import CUDA_CONTEXT_BYTES, FRAGMENTATION_MARGIN, estimate_strategy
    from tools.schemas import GPUSpec
    from tools.smoke import shape_spec

    cpu = predict_peak_bytes(SHAPE, "zero2", "cpu", 2)
    full = estimate_strategy(
        shape_spec(SHAPE),
        HardwareSpec(source="local", nodes=1, gpus_per_node=2),
        "zero2",
        precision="fp32",
        task="pretrain",
        seq_len=64,
    ).per_gpu_bytes.total
    assert abs(cpu * (1 + FRAGMENTATION_MARGIN) - full) <= 2
    gpu = predict_peak_bytes(SHAPE, "zero2", "cuda", 2)
    gpu_full = estimate_strategy(
        shape_spec(SHAPE),
        HardwareSpec(
            source="local", nodes=1, gpus_per_node=2, gpu=GPUSpec(name="x", memory_gb=1e6)
        ),
        "zero2",
        precision="bf16",
        task="pretrain",
        seq_len=64,
    ).per_gpu_bytes.total
    assert abs((gpu + CUDA_CONTEXT_BYTES) * (1 + FRAGMENTATION_MARGIN) - gpu_full) <= 2
    # On CPU ranks "offload" is RAM to RAM: the prediction is the base stage's.
    assert predict_peak_bytes(SHAPE, "zero2_offload_optimizer", "cpu", 2) == cpu


def _smoke(measured: int, baseline: int = 0) -> SmokeResult:
    result = SmokeResult(
        status="passed",
        world_size=2,
        steps=30,
        losses=[5.0] * 5 + [2.0] * 25,
        peak_memory_bytes=measured + baseline,
        baseline_memory_bytes=baseline,
        model_shape=SHAPE,
        strategy="zero2",
    )
    return with_prediction(result)


def test_with_prediction_sets_the_gap_against_the_run_above_its_baseline() -> None:
    predicted = predict_peak_bytes(SHAPE, "zero2", "cpu", 2)
    result = _smoke(int(predicted * 1.5), baseline=400 << 20)
    assert result.predicted_peak_memory_bytes == predicted
    assert result.memory_gap == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize(
    ("factor", "severity"), [(1.10, "info"), (0.90, "info"), (1.25, "warning"), (0.70, "warning")]
)
def test_review_flags_a_memory_gap_above_15_percent(factor: float, severity: str) -> None:
    predicted = predict_peak_bytes(SHAPE, "zero2", "cpu", 2)
    smoke = _smoke(int(predicted * factor))
    assert abs(smoke.memory_gap or 0) > MAX_MEMORY_GAP or severity == "info"
    brief = TrainingBrief(model="gpt2", hardware="local", global_batch_size=2, seq_len=64)
    hardware = HardwareSpec(source="local", nodes=1, gpus_per_node=0)
    framework = FrameworkChoice(primary="deepspeed", stack=["deepspeed"], rationale="test")
    findings = check_plan(brief, hardware, framework, None, {}, smoke)
    gap = [f for f in findings if f.check == "predicted_vs_measured"]
    assert len(gap) == 1 and gap[0].severity == severity, gap
    assert f"{factor - 1:+.0%}" in gap[0].message


def test_review_gives_the_oom_fix_after_an_oom() -> None:
    smoke = SmokeResult(status="failed", reason="oom: out of memory on rank(s) [0]: ...")
    brief = TrainingBrief(model="gpt2", hardware="local", global_batch_size=2, seq_len=64)
    hardware = HardwareSpec(source="local", nodes=1, gpus_per_node=0)
    framework = FrameworkChoice(primary="deepspeed", stack=["deepspeed"], rationale="test")
    findings = check_plan(brief, hardware, framework, None, {}, smoke)
    verdict = [f for f in findings if f.check == "smoke_verdict"]
    assert verdict[0].severity == "error"
    assert "ZeRO stage" in verdict[0].fix and "activation checkpointing" in verdict[0].fix
