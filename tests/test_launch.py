"""Launch artifacts: what emit_launch writes, that train.py accepts its flags, and that it runs."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tools.launch import emit_launch
from tools.schemas import FrameworkChoice, GPUSpec, HardwareSpec, ModelSpec, TrainingBrief
from tools.smoke import free_port
from tools.smoke_train import parse_args

GPT2_TINY = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 2,
    "vocab_size": 256,
    "n_positions": 128,
}
DEEPSPEED = FrameworkChoice(primary="deepspeed", stack=["pytorch", "deepspeed"], rationale="x")
DDP = FrameworkChoice(primary="pytorch_ddp", stack=["pytorch", "pytorch_ddp"], rationale="x")
A100 = GPUSpec(name="A100-80GB", memory_gb=80, bf16_tflops=312)
V100 = GPUSpec(name="V100-32GB", memory_gb=32, fp16_tflops=125)
DS_CONFIG: dict[str, Any] = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-5}},
    "zero_optimization": {"stage": 2},
}


def gpus(nodes: int, per_node: int, gpu: GPUSpec = A100) -> HardwareSpec:
    return HardwareSpec(source="described", nodes=nodes, gpus_per_node=per_node, gpu=gpu)


def cpu_only() -> HardwareSpec:
    return HardwareSpec(source="local", nodes=1, gpus_per_node=0)


def model() -> ModelSpec:
    return ModelSpec(
        name="tiny",
        params=0,
        layers=2,
        hidden=64,
        heads=2,
        vocab=256,
        seq_len=64,
        largest_layer_params=0,
        hf_config=GPT2_TINY,
    )


def brief(precision: str = "bf16", seq_len: int = 1024) -> TrainingBrief:
    return TrainingBrief(goal="test run", model="tiny", seq_len=seq_len, precision=precision)  # type: ignore[arg-type]


def script_args(command: list[str]) -> list[str]:
    """The arguments train.py gets (the launcher's own flags come before the script)."""
    return command[command.index("train.py") + 1 :]


def launch_line(out: Path) -> str:
    return (out / "launch.sh").read_text().splitlines()[-1]


def test_deepspeed_plan_writes_config_script_and_launcher(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    spec = emit_launch(out, brief(), gpus(1, 8), model(), DEEPSPEED, DS_CONFIG, steps=50)
    command = spec.command
    assert isinstance(command, list) and all(isinstance(arg, str) for arg in command)
    assert command[:3] == ["deepspeed", "--num_gpus", "8"]
    assert "--hostfile" not in command
    assert set(spec.files) == {"model_config.json", "train.py", "ds_config.json", "launch.sh"}
    for path in spec.files.values():
        assert Path(path).is_file() and Path(path).parent == out
    assert json.loads((out / "ds_config.json").read_text()) == DS_CONFIG
    assert json.loads((out / "model_config.json").read_text()) == GPT2_TINY
    assert (out / "train.py").read_text() == (
        Path(__file__).parents[1] / "tools" / "smoke_train.py"
    ).read_text()
    assert launch_line(out) == shlex.join(command)
    assert os.access(out / "launch.sh", os.X_OK)

    # Every flag is one train.py accepts (the DeepSpeed launcher adds --local_rank itself).
    args = parse_args([*script_args(command), "--local_rank=0"])
    assert args.deepspeed_config == Path("ds_config.json")
    assert (args.steps, args.seq_len, args.micro_batch) == (50, 1024, 4)
    assert args.metrics_dir == Path("metrics")


def test_deepspeed_plan_on_several_nodes_writes_a_hostfile(tmp_path: Path) -> None:
    spec = emit_launch(tmp_path, brief(), gpus(2, 8), model(), DEEPSPEED, DS_CONFIG)
    command = spec.command
    assert command[: command.index("train.py")] == [
        "deepspeed",
        "--hostfile",
        "hostfile",
        "--num_nodes",
        "2",
        "--num_gpus",
        "8",
    ]
    assert (tmp_path / "hostfile").read_text() == "node0 slots=8\nnode1 slots=8\n"
    assert spec.files["hostfile"] == str(tmp_path / "hostfile")


def test_ddp_plan_launches_torchrun_without_deepspeed(tmp_path: Path) -> None:
    spec = emit_launch(tmp_path, brief(), gpus(1, 8), model(), DDP, None, steps=20)
    command = spec.command
    assert command[: command.index("train.py")] == [
        "torchrun",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "8",
    ]
    assert "--deepspeed_config" not in command
    assert set(spec.files) == {"model_config.json", "train.py", "launch.sh"}
    assert not (tmp_path / "ds_config.json").exists()
    assert launch_line(tmp_path) == shlex.join(command)
    assert "pytorch_ddp" in (tmp_path / "launch.sh").read_text()

    args = parse_args(script_args(command))
    assert args.deepspeed_config is None  # train.py's plain DDP mode
    assert args.bf16 and not args.fp16
    assert (args.steps, args.seq_len, args.micro_batch) == (20, 1024, 1)


def test_ddp_plan_on_several_nodes_uses_c10d_rendezvous(tmp_path: Path) -> None:
    spec = emit_launch(tmp_path, brief(), gpus(2, 8), model(), DDP, None)
    command = spec.command
    assert command[: command.index("train.py")] == [
        "torchrun",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "8",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "node0:29500",
    ]
    assert "hostfile" not in spec.files and not (tmp_path / "hostfile").exists()
    assert "each of the 2 nodes" in (tmp_path / "launch.sh").read_text()
    parse_args(script_args(command))


@pytest.mark.parametrize(
    ("precision", "hardware", "flag"),
    [
        ("auto", gpus(1, 4, V100), "--fp16"),
        ("fp32", gpus(1, 4), None),
        ("bf16", cpu_only(), None),
    ],
    ids=["fp16-gpu", "fp32", "cpu"],
)
def test_ddp_precision_flag_follows_the_plan(
    tmp_path: Path, precision: str, hardware: HardwareSpec, flag: str | None
) -> None:
    command = emit_launch(tmp_path, brief(precision), hardware, model(), DDP, None).command
    half = [arg for arg in command if arg in ("--bf16", "--fp16")]
    assert half == ([flag] if flag else [])
    parse_args(script_args(command))


def test_switching_to_ddp_removes_the_deepspeed_files(tmp_path: Path) -> None:
    emit_launch(tmp_path, brief(), gpus(2, 8), model(), DEEPSPEED, DS_CONFIG)
    assert (tmp_path / "ds_config.json").exists() and (tmp_path / "hostfile").exists()
    emit_launch(tmp_path, brief(), gpus(1, 8), model(), DDP, None)
    assert not (tmp_path / "ds_config.json").exists()
    assert not (tmp_path / "hostfile").exists()


# --- the emitted launch, run for real on this machine's CPU ---------------------------------


def _run_launch(out: Path, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # launch.sh calls the launchers by name, as a user's shell would find them in the venv.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra_env)
    return subprocess.run(
        ["bash", str(out / "launch.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
    )


def _assert_ran(out: Path, proc: subprocess.CompletedProcess[str], steps: int) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"step {steps}/{steps} loss" in proc.stdout + proc.stderr
    metrics: dict[str, Any] = json.loads((out / "metrics" / "rank0.json").read_text())
    assert metrics["status"] == "ok" and metrics["steps"] == steps
    return metrics


@pytest.mark.slow
def test_emitted_ddp_launch_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    emit_launch(out, brief(seq_len=32), cpu_only(), model(), DDP, None, steps=3)
    # torchrun reads its --master_port default from PET_MASTER_PORT; a free one avoids 29500.
    proc = _run_launch(out, {"PET_MASTER_PORT": str(free_port())})
    metrics = _assert_ran(out, proc, 3)
    assert metrics["mode"] == "ddp" and metrics["world_size"] == 1


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_emitted_deepspeed_launch_runs_on_cpu(tmp_path: Path) -> None:
    # The DeepSpeed launcher has no environment override for its default port.
    if _port_in_use(29500):
        pytest.skip("port 29500 (the DeepSpeed launcher's default) is in use")
    out = tmp_path / "ds"
    cpu_config = {
        "train_batch_size": 1,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        # torch_adam: the same update without JIT-building DeepSpeed's CPU fused_adam op.
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 2},
    }
    emit_launch(out, brief(seq_len=32), cpu_only(), model(), DEEPSPEED, cpu_config, steps=3)
    proc = _run_launch(out, {"DS_ACCELERATOR": "cpu"})
    metrics = _assert_ran(out, proc, 3)
    assert metrics["mode"] == "deepspeed" and metrics["deepspeed"]
