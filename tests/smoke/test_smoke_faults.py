"""Smoke runner: every strategy, injected faults, the two-node path, the CLI and the review."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from procs import ours
from specs import GPT2_TINY, TINY_GPT2_BRIEF_YAML, tiny_spec

from tools.artifacts.deepspeed_config import smoke_ds_config
from tools.core.schemas import FrameworkChoice, HardwareSpec, SmokeResult, TrainingBrief
from tools.core.settings import Settings
from tools.review.checks import MAX_MEMORY_GAP, check_plan
from tools.smoke import (
    DeepSpeedRun,
    SmokeSpec,
    TorchrunRun,
    format_bytes,
    group_alive,
    predict_peak_bytes,
    run_smoke_test,
    with_prediction,
)
from tools.smoke.memory_cap import rank_address_space

ROOT = Path(__file__).resolve().parents[2]
# What tools/smoke/commands.py puts in every launched process's environment (read by
# tools/smoke/scripts/harness.py).
SUPERVISOR_ENV = "TRAINWRIGHT_SMOKE_SUPERVISOR_PID"


def assert_nothing_left(result: SmokeResult) -> None:
    launch = json.loads((Path(result.run_dir or "") / "launch.json").read_text())
    assert launch["pgids"]
    for pgid in launch["pgids"]:
        assert group_alive(pgid) == [], f"process group {pgid} still has live processes"
    # torchrun starts each rank in a session of its own, outside the launcher's group: no
    # process that names the run dir (a rank's script is in it) may be left either.
    left = ours(Path(result.run_dir or ""))
    assert not left, [(p.pid, p.info["cmdline"][:3]) for p in left]


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
        ("hang", "timeout:", "last: step "),
    ],
)
def test_injected_fault_gives_its_reason_and_leaves_no_process(
    settings: Settings, inject: str, prefix: str, detail: str
) -> None:
    # Two DeepSpeed ranks took ~38 s to reach step 1 on the 2-core CI machine: the hang's limit
    # leaves room for that start (a hang guard, not a timing check).
    limit = 90.0 if inject == "hang" else settings.smoke_timeout_s
    # The hang comes after step 5, when the ranks have written their partial metrics once.
    at = 6 if inject == "hang" else 3
    config = smoke_ds_config(tiny_spec(GPT2_TINY), "zero2", world_size=2)
    # The hung run is stopped by the stall watch 10 s after its last step, well inside the limit.
    stall = 10.0 if inject == "hang" else None
    spec = SmokeSpec(
        mode=DeepSpeedRun(config),
        steps=30,
        inject=inject,
        inject_step=at,
        timeout_s=limit,
        stall_s=stall,
    )
    lines: list[str] = []
    result = run_smoke_test(tiny_spec(GPT2_TINY), spec, settings, on_progress=lines.append)
    assert result.status == "failed"
    assert result.inject == inject
    assert result.failure_kind == prefix.rstrip(":"), result.reason
    assert result.reason.startswith(prefix), result.reason
    assert detail in result.reason, result.reason
    if inject == "hang":
        # The reason quotes the last step the run reached: one before the hang at step 6 (a
        # loaded machine may stop the run before it gets there, never after).
        last = re.search(r"last: step (\d+)/30", result.reason)
        assert last is not None and 1 <= int(last.group(1)) <= 5, result.reason
        # Stopped as stalled (no new step for the stall limit), not at the 90 s limit.
        assert result.reason.startswith("timeout: stalled: no new step for "), result.reason
        assert result.wall_time_s is not None and result.wall_time_s < limit, result.wall_time_s
        # The timeout's kill had the ranks (grandchildren of the launcher) to reach, and the
        # partial metrics survive it, so the report still shows how far the run got.
        assert "spawned with command" in (Path(result.run_dir or "") / "smoke.log").read_text()
        assert any(line.startswith("step ") for line in lines)
        if int(last.group(1)) == 5:
            assert len(result.losses) == 5 and result.step_time_s
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
    config = smoke_ds_config(model, strategy, world_size=2, nodes=2)
    mode = DeepSpeedRun(config) if config is not None else TorchrunRun()
    result = run_smoke_test(model, SmokeSpec(mode=mode, steps=30, nodes=2), settings)
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


# --- resource limits: memory cap, Ctrl-C -------------------------------------------------------


def run_processes(needle: Path, supervisor: int) -> list[int]:
    """Live processes of a run: ``needle`` in their arguments or ``supervisor`` in their env."""
    marker = f"{SUPERVISOR_ENV}={supervisor}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and (str(needle).encode() in cmdline or marker in environ):
            found.append(int(name))
    return found


def rank_pids(needle: Path) -> list[int]:
    """The training ranks (the run dir's scripts/train.py) running under ``needle``."""
    pids = []
    for pid in run_processes(needle, supervisor=-1):
        with contextlib.suppress(OSError):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:]
            # The script is the first argument that is not an option (launchers pass it on).
            script = next((arg for arg in args if not arg.startswith(b"-")), b"")
            if script.endswith(b"/scripts/train.py"):
                pids.append(pid)
    return pids


@pytest.mark.slow
def test_memory_cap_stops_a_leaking_rank_with_oom(settings: Settings) -> None:
    # Rank 0 allocates ~1 GiB/s from step 3; the run's normal footprint (2 ranks, 2
    # launchers) is ~1.5 GiB resident, so a 3 GiB cap is crossed only by the leak. (A higher
    # cap does not help: the leaking rank's address-space share then stops it first.)
    cap = 3 * 2**30
    config = smoke_ds_config(tiny_spec(GPT2_TINY), "zero2", world_size=2)
    spec = SmokeSpec(
        mode=DeepSpeedRun(config), steps=30, inject="alloc", inject_step=3, memory_cap=cap
    )
    result = run_smoke_test(tiny_spec(GPT2_TINY), spec, settings)
    assert result.status == "failed" and result.failure_kind == "oom"
    first = result.reason.splitlines()[0]
    assert first.startswith(f"oom: memory cap {format_bytes(cap)} exceeded"), result.reason
    run_dir = Path(result.run_dir or "")
    seen = f"{first}\nmemory.json: {(run_dir / 'memory.json').read_text()}"
    assert "(the run's processes held " in first and "last: step 2/30" in first, seen
    assert_nothing_left(result)
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["memory_cap_bytes"] == cap
    assert launch["address_space_limit_bytes"] == rank_address_space(cap, 2)
    assert "[inject] alloc at step 3 on rank 0" in (run_dir / "logs" / "rank0.log").read_text()


@pytest.mark.slow
def test_cli_memory_cap_below_the_footprint_is_an_oom_naming_the_cap(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    proc = run_cli(
        "smoke", "--model", "gpt2", "--memory-cap", "300MiB", "--json", str(out), "--timeout", "120"
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["status"] == "failed"
    assert data["reason"].startswith("oom: memory cap 300 MiB exceeded"), data["reason"]
    assert "oom: memory cap 300 MiB exceeded" in proc.stdout
    assert_nothing_left(SmokeResult.model_validate(data))


def _interrupt_cli(
    args: list[str], home: Path, ready: str, env: dict[str, str]
) -> dict[str, object]:
    """Start ``app.py ARGS`` in its own session, Ctrl-C it once ``ready`` shows on stderr."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), *args],
        cwd=home.parent,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        guard = time.monotonic() + 300  # hang guard
        while not any(ready in line for line in seen):
            line = lines.get(timeout=max(0.1, guard - time.monotonic()))
            assert line is not None, "\n".join(seen)
            seen.append(line)
        ranks = rank_pids(home)
        limits = [Path(f"/proc/{pid}/limits").read_text() for pid in ranks]
        # What a terminal's Ctrl-C does: SIGINT to the foreground process group (the CLI's).
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)  # hang guard
        elapsed = time.monotonic() - sent
        while (line := lines.get(timeout=10)) is not None:
            seen.append(line)
        left = run_processes(home, proc.pid)
    finally:
        with_leftovers = run_processes(home, proc.pid) if proc.poll() is not None else []
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in with_leftovers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    print(f"{args[0]}: exited {elapsed:.2f} s after SIGINT")
    return {
        "elapsed": elapsed,
        "code": proc.returncode,
        "stderr": seen,
        "left": left,
        "ranks": ranks,
        "limits": limits,
    }


@pytest.mark.slow
def test_ctrl_c_on_cli_smoke_exits_130_and_leaves_no_process(tmp_path: Path) -> None:
    home = Path(os.environ["TRAINWRIGHT_HOME"])
    run_dir = home / "runs" / "ctrl-c"
    args = ["smoke", "--model", "gpt2", "--steps", "100000", "--timeout", "600"]
    got = _interrupt_cli(
        [*args, "--memory-cap", "4GiB", "--run-dir", str(run_dir)],
        home,
        "step 2/100000",
        dict(os.environ),
    )
    stderr = got["stderr"]
    assert isinstance(stderr, list)
    assert got["code"] == 130, stderr[-20:]
    assert stderr[-1] == "trainwright: interrupted", stderr[-20:]
    assert got["left"] == [], got["left"]
    # Both ranks were running, each under the address-space limit the cap implies.
    assert len(got["ranks"]) == 2  # type: ignore[arg-type]
    limit = rank_address_space(4 * 2**30, 2)
    for text in got["limits"]:  # type: ignore[attr-defined]
        row = next(line for line in text.splitlines() if line.startswith("Max address space"))
        assert row.split()[3:5] == [str(limit), str(limit)], row
    launch = json.loads((run_dir / "launch.json").read_text())
    assert all(group_alive(pgid) == [] for pgid in launch["pgids"])


TINY_GPT2_BRIEF = TINY_GPT2_BRIEF_YAML


@pytest.mark.slow
def test_ctrl_c_on_cli_plan_during_its_smoke_run_leaves_no_process(tmp_path: Path) -> None:
    home = Path(os.environ["TRAINWRIGHT_HOME"])
    (home.parent / "brief.yaml").write_text(TINY_GPT2_BRIEF)
    env = {**os.environ, "TRAINWRIGHT_SMOKE_STEPS": "100000", "TRAINWRIGHT_SMOKE_TIMEOUT_S": "600"}
    got = _interrupt_cli(
        ["plan", "--brief", "brief.yaml", "--out", str(tmp_path / "plan-out")],
        home,
        "step 2/100000",
        env,
    )
    stderr = got["stderr"]
    assert isinstance(stderr, list)
    assert got["code"] == 130, stderr[-20:]
    assert stderr[-1] == "trainwright: interrupted", stderr[-20:]
    assert len(got["ranks"]) == 2  # type: ignore[arg-type]
    assert got["left"] == [], got["left"]
    assert not (tmp_path / "plan-out" / "plan.json").exists()


# --- CLI input errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--strategy", "zero9"], "--strategy"),
        (["--inject", "fire"], "--inject"),
        (["--steps", "0"], "--steps"),
        (["--timeout", "-1"], "--timeout"),
        (["--nodes", "3"], "nodes"),
        (["--memory-cap", "lots"], "--memory-cap"),
        (["--memory-cap", "12MiB"], "--memory-cap"),
        (["--memory-cap", "-1GiB"], "--memory-cap"),
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
    from tools.core.schemas import GPUSpec
    from tools.planning import estimate_strategy
    from tools.planning.overheads import CUDA_CONTEXT_BYTES, FRAGMENTATION_MARGIN, NCCL_BUFFER_BYTES
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
    # Device used = allocated + allocator slack + the CUDA context + NCCL's buffers (2 ranks).
    device = gpu * (1 + FRAGMENTATION_MARGIN) + CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES
    assert abs(device - gpu_full) <= 2
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
    smoke = SmokeResult(status="failed").failed("oom", "out of memory on rank(s) [0]: ...")
    brief = TrainingBrief(model="gpt2", hardware="local", global_batch_size=2, seq_len=64)
    hardware = HardwareSpec(source="local", nodes=1, gpus_per_node=0)
    framework = FrameworkChoice(primary="deepspeed", stack=["deepspeed"], rationale="test")
    findings = check_plan(brief, hardware, framework, None, {}, smoke)
    verdict = [f for f in findings if f.check == "smoke_verdict"]
    assert verdict[0].severity == "error"
    assert "ZeRO stage" in verdict[0].fix and "activation checkpointing" in verdict[0].fix


def test_bad_memory_cap_setting_exits_2_naming_the_variable() -> None:
    proc = subprocess.run(
        [sys.executable, "app.py", "smoke", "--model", "gpt2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TRAINWRIGHT_SMOKE_MEMORY_CAP": "8 gigs"},
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "TRAINWRIGHT_SMOKE_MEMORY_CAP" in lines[0], proc.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8GiB", 8 * 2**30), ("512MiB", 512 * 2**20), ("2G", 2 * 2**30), ("1.5 gb", 3 * 2**29),
     ("off", 0), ("1073741824", 2**30)],
)  # fmt: skip
def test_parse_memory_cap(text: str, expected: int) -> None:
    from tools.core.settings import parse_memory_cap

    assert parse_memory_cap(text) == expected
    assert Settings.load(smoke_memory_cap=expected).smoke_memory_cap == expected
