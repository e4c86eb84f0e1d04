"""Launch artifacts: what emit_launch writes, that train.py accepts its flags, and that it runs."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from specs import GPT2_TINY, model_parallel_plan, tiny_spec
from train import parse_args

from tools.artifacts.launch import JOB_DIR, JOB_SCRIPT, emit_launch, job_command
from tools.artifacts.save import save_plan
from tools.artifacts.scripts import Shell, shell_join
from tools.core.outputs import MANIFEST, listed, write_file
from tools.core.schemas import (
    FrameworkChoice,
    GPUSpec,
    HardwareSpec,
    ModelSpec,
    TrainingBrief,
)
from tools.smoke import free_port

DEEPSPEED = FrameworkChoice(primary="deepspeed", stack=["pytorch", "deepspeed"], rationale="x")
DDP = FrameworkChoice(primary="pytorch_ddp", stack=["pytorch", "pytorch_ddp"], rationale="x")
MEGATRON = FrameworkChoice(
    primary="megatron", stack=["pytorch", "megatron", "deepspeed"], rationale="x"
)
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
    return tiny_spec(GPT2_TINY)


def brief(precision: str = "bf16", seq_len: int = 1024, task: str = "finetune") -> TrainingBrief:
    return TrainingBrief(
        goal="test run", model="tiny", seq_len=seq_len, precision=precision, task=task
    )  # type: ignore[arg-type]


def script_args(command: list[str]) -> list[str]:
    """The arguments train.py gets (the launcher's own flags come before the script)."""
    return command[command.index(JOB_SCRIPT) + 1 :]


# The standalone scripts' folder, which a plan that runs train.py holds whole as trainer/.
SCRIPTS = Path(__file__).resolve().parents[2] / "tools" / "smoke" / "scripts"
JOB_FILES = {f"trainer/{p.name}" for p in [*SCRIPTS.glob("*.py"), *SCRIPTS.glob("*.md")]}


def launch_line(out: Path) -> str:
    return (out / "launch.sh").read_text().splitlines()[-1]


def script_line(command: list[str]) -> str:
    """The plan's command as launch.sh runs it: $MODEL_PATH and $DATA read, "$@" passed on."""
    return shell_join([*job_command(command), Shell('"$@"')])


def test_deepspeed_plan_writes_config_script_and_launcher(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    spec = emit_launch(out, brief(), gpus(1, 8), model(), DEEPSPEED, DS_CONFIG, steps=50)
    command = spec.command
    assert isinstance(command, list) and all(isinstance(arg, str) for arg in command)
    assert command[:3] == ["deepspeed", "--num_gpus", "8"]
    assert "--hostfile" not in command
    assert JOB_SCRIPT == "trainer/train.py" and "trainer/train.py" in JOB_FILES
    assert set(spec.files) == JOB_FILES | {
        "model_config.json",
        "ds_config.json",
        "ds_config_hf.json",
        "launch.sh",
        "train.sbatch",
        "accelerate_config.yaml",
    }
    for name, path in spec.files.items():
        assert Path(path).is_file() and Path(path) == out / name
    assert json.loads((out / "ds_config.json").read_text()) == DS_CONFIG
    assert json.loads((out / "model_config.json").read_text()) == GPT2_TINY
    # The whole folder, byte for byte: train.py and every module it imports.
    for source in [*SCRIPTS.glob("*.py"), *SCRIPTS.glob("*.md")]:
        assert (out / JOB_DIR / source.name).read_bytes() == source.read_bytes()
    assert not (out / "train.py").exists()
    assert launch_line(out) == script_line(command)
    assert os.access(out / "launch.sh", os.X_OK)

    # Every flag is one train.py accepts (the DeepSpeed launcher adds --local_rank itself).
    args = parse_args([*script_args(command), "--local_rank=0"])
    assert args.deepspeed_config == Path("ds_config.json")
    assert (args.steps, args.seq_len, args.micro_batch) == (50, 1024, 4)
    assert args.metrics_dir == Path("metrics")


def test_deepspeed_plan_on_several_nodes_writes_a_hostfile(tmp_path: Path) -> None:
    spec = emit_launch(tmp_path, brief(), gpus(2, 8), model(), DEEPSPEED, DS_CONFIG)
    command = spec.command
    assert command[: command.index(JOB_SCRIPT)] == [
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


def test_deepspeed_plan_writes_the_hugging_face_trainer_flavour(tmp_path: Path) -> None:
    spec = emit_launch(tmp_path, brief(), gpus(1, 8), model(), DEEPSPEED, DS_CONFIG)
    assert spec.files["ds_config_hf.json"] == str(tmp_path / "ds_config_hf.json")
    flavour = json.loads((tmp_path / "ds_config_hf.json").read_text())
    assert flavour == {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "bf16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
        "zero_optimization": {"stage": 2},
    }
    # The strict config next to it keeps its numbers; a DDP re-emit removes both.
    assert json.loads((tmp_path / "ds_config.json").read_text()) == DS_CONFIG
    emit_launch(tmp_path, brief(), gpus(1, 8), model(), DDP, None)
    assert not (tmp_path / "ds_config_hf.json").exists()


def test_ddp_plan_launches_torchrun_without_deepspeed(tmp_path: Path) -> None:
    spec = emit_launch(tmp_path, brief(), gpus(1, 8), model(), DDP, None, steps=20)
    command = spec.command
    assert command[: command.index(JOB_SCRIPT)] == [
        "torchrun",
        "--nnodes",
        "1",
        "--nproc_per_node",
        "8",
    ]
    assert "--deepspeed_config" not in command
    assert set(spec.files) == JOB_FILES | {
        "model_config.json",
        "launch.sh",
        "train.sbatch",
        "accelerate_config.yaml",
    }
    assert not (tmp_path / "ds_config.json").exists()
    assert launch_line(tmp_path) == script_line(command)
    assert "pytorch_ddp" in (tmp_path / "launch.sh").read_text()

    args = parse_args(script_args(command))
    assert args.deepspeed_config is None  # train.py's plain DDP mode
    assert args.bf16 and not args.fp16
    assert (args.steps, args.seq_len, args.micro_batch) == (20, 1024, 1)


def test_ddp_plan_on_several_nodes_uses_c10d_rendezvous(tmp_path: Path) -> None:
    spec = emit_launch(tmp_path, brief(), gpus(2, 8), model(), DDP, None)
    command = spec.command
    assert command[: command.index(JOB_SCRIPT)] == [
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


# --- the other launchers and guides ---------------------------------------------------------

FSDP = FrameworkChoice(primary="pytorch_fsdp", stack=["pytorch", "pytorch_fsdp"], rationale="x")
HOROVOD = FrameworkChoice(primary="horovod", stack=["pytorch", "horovod"], rationale="x")
TENSORFLOW = FrameworkChoice(primary="tensorflow", stack=["tensorflow"], rationale="x")
PLANS = {
    "deepspeed-2x8": (DEEPSPEED, DS_CONFIG, gpus(2, 8)),
    "deepspeed-1x8": (DEEPSPEED, DS_CONFIG, gpus(1, 8)),
    "ddp-2x8": (DDP, None, gpus(2, 8)),
    "ddp-cpu": (DDP, None, cpu_only()),
    "fsdp-2x8": (FSDP, None, gpus(2, 8)),
    "horovod-2x8": (HOROVOD, None, gpus(2, 8)),
    "tensorflow-2x8": (TENSORFLOW, None, gpus(2, 8)),
}
COVERAGE = "trainwright's own train.py covers DeepSpeed, PyTorch DDP and FSDP only"


def emit(out: Path, plan: str) -> list[str]:
    framework, config, hardware = PLANS[plan]
    return emit_launch(out, brief(), hardware, model(), framework, config, steps=50).command


def code_blocks(markdown: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", markdown, flags=re.DOTALL)


def _fake_tools(bin_dir: Path, args_file: Path) -> dict[str, str]:
    """Stand-ins for SLURM and the launchers: srun runs its command as node 1 of the job."""
    bin_dir.mkdir()
    fakes = {
        "scontrol": "printf 'nodeA\\nnodeB\\n'",
        "srun": 'while [[ $1 == --* ]]; do shift; done\nSLURM_NODEID=1 exec "$@"',
        "deepspeed": f'printf "%s\\n" "$@" > {shlex.quote(str(args_file))}',
        "torchrun": f'printf "%s\\n" "$@" > {shlex.quote(str(args_file))}',
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize("plan", list(PLANS))
def test_every_command_is_an_argument_list_and_every_script_parses(
    tmp_path: Path, plan: str
) -> None:
    command = emit(tmp_path, plan)
    assert command and all(isinstance(arg, str) for arg in command)
    scripts = sorted([*tmp_path.glob("*.sh"), *tmp_path.glob("*.sbatch")])
    assert tmp_path / "launch.sh" in scripts
    for script in scripts:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"
    runs_train_py = JOB_SCRIPT in command
    assert launch_line(tmp_path) == (script_line(command) if runs_train_py else shlex.join(command))


def test_deepspeed_multi_node_writes_a_no_ssh_script_per_node(tmp_path: Path) -> None:
    from deepspeed.launcher.runner import parse_args as deepspeed_args

    emit(tmp_path, "deepspeed-2x8")
    assert (tmp_path / "hostfile").read_text() == "node0 slots=8\nnode1 slots=8\n"
    for rank in (0, 1):
        script = tmp_path / f"launch_node{rank}.sh"
        assert os.access(script, os.X_OK)
        # As bash runs it with MODEL_PATH and DATA unset: the plan's weights, no --data.
        lines = script.read_text().splitlines()
        default = next(ln for ln in lines if ln.startswith('[[ -n "${MODEL_PATH:-}" ]]'))
        # The script's own arguments go on to train.py, as launch.sh's do (none given here).
        assert lines[-1].endswith('"$@"')
        line = lines[-1].replace('${DATA:+--data} ${DATA:+"$DATA"}', "").removesuffix('"$@"')
        weights = shlex.split(default.split("MODEL_PATH=", 1)[1])[0]
        argv = [weights if arg == "$MODEL_PATH" else arg for arg in shlex.split(line)]
        assert argv[0] == "deepspeed"
        # The installed DeepSpeed launcher's own argparse accepts every flag.
        args = deepspeed_args(argv[1:])
        assert args.no_ssh and args.node_rank == rank
        assert (args.master_addr, args.master_port) == ("node0", 29500)
        assert (args.num_nodes, args.num_gpus, args.hostfile) == (2, 8, "hostfile")
        assert args.user_script == JOB_SCRIPT
        parse_args([*args.user_args, "--local_rank=0"])
    assert not (tmp_path / "launch_node2.sh").exists()

    emit(tmp_path, "deepspeed-1x8")  # one node: nothing to coordinate without ssh
    assert not list(tmp_path.glob("launch_node*.sh")) and not (tmp_path / "hostfile").exists()


@pytest.mark.parametrize("plan", ["deepspeed-2x8", "ddp-2x8"])
def test_sbatch_starts_one_launcher_per_node(tmp_path: Path, plan: str) -> None:
    out = tmp_path / "plan"
    emit(out, plan)
    sbatch = (out / "train.sbatch").read_text()
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --time=24:00:00",
    ):
        assert line in sbatch.splitlines()
    assert re.search(r"^#SBATCH --cpus-per-task=\d+$", sbatch, flags=re.MULTILINE)
    assert re.search(r"^#SBATCH --job-name=\S+$", sbatch, flags=re.MULTILINE)

    # Run it with stand-in SLURM tools to see what the launcher on node 1 really receives.
    args_file = tmp_path / "args.txt"
    env = {**os.environ, **_fake_tools(tmp_path / "bin", args_file)}
    env |= {"SLURM_SUBMIT_DIR": str(out), "SLURM_JOB_NODELIST": "node[A-B]", "SLURM_JOB_ID": "7"}
    proc = subprocess.run(
        ["bash", str(out / "train.sbatch")], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    argv = args_file.read_text().splitlines()
    if plan.startswith("deepspeed"):
        from deepspeed.launcher.runner import parse_args as deepspeed_args

        assert (out / "hostfile.7").read_text() == "nodeA slots=8\nnodeB slots=8\n"
        args = deepspeed_args(argv)
        assert args.no_ssh and args.node_rank == 1 and args.master_addr == "nodeA"
        assert (args.hostfile, args.num_nodes, args.num_gpus) == ("hostfile.7", 2, 8)
        parse_args([*args.user_args, "--local_rank=0"])
    else:
        assert argv[: argv.index(JOB_SCRIPT)] == [
            "--nnodes",
            "2",
            "--nproc_per_node",
            "8",
            "--rdzv_id",
            "7",
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            "nodeA:29500",
        ]
        parse_args(script_args(argv))


# The launcher stand-in: a rank that saved on SIGTERM writes the stop file (train.py's rank 0,
# harness.record_stop), then the launcher exits as torchrun and DeepSpeed's launcher do.
_STOPPING_LAUNCHER = """\
[[ -n "${TRAINWRIGHT_STOP_FILE:-}" ]] || { echo "no TRAINWRIGHT_STOP_FILE" >&2; exit 9; }
[[ "$SAVED" == 1 ]] && echo "stopped at step 12 on SIGTERM, saved in checkpoints/step12" > "$TRAINWRIGHT_STOP_FILE"
exit "$LAUNCHER_EXIT"
"""


@pytest.mark.parametrize("plan", ["deepspeed-2x8", "ddp-2x8"])
@pytest.mark.parametrize(
    ("saved", "launcher_exit", "job_exit"),
    [(1, 1, 0), (0, 1, 1), (0, 0, 0), (1, 0, 0)],
    ids=["saved-launcher-1", "not-saved", "clean", "saved-launcher-0"],
)
def test_sbatch_ends_a_stop_that_saved_with_exit_0(
    tmp_path: Path, plan: str, saved: int, launcher_exit: int, job_exit: int
) -> None:
    """torchrun and DeepSpeed's launcher exit 1 on SIGTERM after the ranks saved: the job exits 0.

    A launcher that fails without the ranks' word that they saved keeps its exit code (the job
    ends FAILED); the stop file is gone after the job either way.
    """
    out = tmp_path / "plan"
    emit(out, plan)
    env = {**os.environ, **_fake_tools(tmp_path / "bin", tmp_path / "args.txt")}
    for launcher in ("deepspeed", "torchrun"):
        (tmp_path / "bin" / launcher).write_text("#!/usr/bin/env bash\n" + _STOPPING_LAUNCHER)
    env |= {"SLURM_SUBMIT_DIR": str(out), "SLURM_JOB_NODELIST": "node[A-B]", "SLURM_JOB_ID": "7"}
    env |= {"SAVED": str(saved), "LAUNCHER_EXIT": str(launcher_exit)}
    stale = out / ".trainwright-stopped.7"
    stale.write_text("stopped at step 3 on SIGTERM, an earlier run\n")  # not this run's word
    proc = subprocess.run(
        ["bash", str(out / "train.sbatch")], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == job_exit, proc.stdout + proc.stderr
    said = "stopped at step 12 on SIGTERM, saved in checkpoints/step12" in proc.stdout
    assert said == (saved == 1 and launcher_exit != 0), proc.stdout
    assert "step 3" not in proc.stdout
    assert not stale.exists()


@pytest.mark.parametrize(
    ("plan", "distributed_type", "processes", "machines"),
    [
        ("deepspeed-2x8", "DEEPSPEED", 16, 2),
        ("deepspeed-1x8", "DEEPSPEED", 8, 1),
        ("ddp-2x8", "MULTI_GPU", 16, 2),
        ("ddp-cpu", "NO", 1, 1),
    ],
)
def test_accelerate_config_matches_the_plan(
    tmp_path: Path, plan: str, distributed_type: str, processes: int, machines: int
) -> None:
    emit(tmp_path, plan)
    config = yaml.safe_load((tmp_path / "accelerate_config.yaml").read_text())
    assert config["compute_environment"] == "LOCAL_MACHINE"
    assert config["distributed_type"] == distributed_type
    assert (config["num_processes"], config["num_machines"]) == (processes, machines)
    assert config["machine_rank"] == 0 and config["main_process_port"] == 29500
    assert config["mixed_precision"] == ("no" if plan == "ddp-cpu" else "bf16")
    if distributed_type == "DEEPSPEED":
        assert config["deepspeed_config"]["deepspeed_config_file"] == "ds_config.json"
        assert (tmp_path / config["deepspeed_config"]["deepspeed_config_file"]).is_file()
    else:
        assert "deepspeed_config" not in config


@pytest.mark.parametrize(("precision", "expected"), [("auto", "fp16"), ("fp32", "no")])
def test_accelerate_mixed_precision_follows_the_resolved_precision(
    tmp_path: Path, precision: str, expected: str
) -> None:
    emit_launch(tmp_path, brief(precision), gpus(1, 4, V100), model(), DDP, None)
    config = yaml.safe_load((tmp_path / "accelerate_config.yaml").read_text())
    assert config["mixed_precision"] == expected


def test_horovod_plan_gets_horovodrun_and_a_porting_guide(tmp_path: Path) -> None:
    command = emit(tmp_path, "horovod-2x8")
    assert command == ["horovodrun", "-np", "16", "-H", "node0:8,node1:8"] + [
        "python",
        "train_horovod.py",
    ]
    guide = (tmp_path / "HOROVOD.md").read_text()
    assert COVERAGE in guide and shlex.join(command) in guide
    for step in (
        "hvd.init()",
        "torch.cuda.set_device(hvd.local_rank())",
        "hvd.DistributedOptimizer",
        "hvd.broadcast_parameters",
        "hvd.broadcast_optimizer_state",
        "lr * hvd.size()",
    ):
        assert step in guide
    # We do not write a Horovod training script, nor train.py, which cannot run under horovodrun.
    for absent in ("train_horovod.py", JOB_DIR, "train.py", "ds_config.json", "train.sbatch"):
        assert not (tmp_path / absent).exists()


def test_tensorflow_plan_gets_one_tf_config_per_worker(tmp_path: Path) -> None:
    command = emit(tmp_path, "tensorflow-2x8")
    assert command == ["python", "train_tensorflow.py"]
    guide = (tmp_path / "TF_CONFIG.md").read_text()
    assert COVERAGE in guide and "MultiWorkerMirroredStrategy" in guide
    configs = [json.loads(block) for block in code_blocks(guide, "json")]
    assert [c["task"] for c in configs] == [
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    assert all(c["cluster"] == {"worker": ["node0:12345", "node1:12345"]} for c in configs)
    for snippet in code_blocks(guide, "python"):
        ast.parse(snippet)
    assert not (tmp_path / JOB_DIR).exists()
    # launch.sh refuses to start a worker that does not know its place in the cluster.
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    proc = subprocess.run(
        ["bash", str(tmp_path / "launch.sh")], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "TF_CONFIG.md" in proc.stderr


@pytest.mark.parametrize(("nodes", "strategy"), [(2, "HYBRID_SHARD"), (1, "FULL_SHARD")])
def test_fsdp_plan_gets_torchrun_and_a_wrapping_guide(
    tmp_path: Path, nodes: int, strategy: str
) -> None:
    command = emit_launch(tmp_path, brief(), gpus(nodes, 8), model(), FSDP, None).command
    assert command[0] == "torchrun" and JOB_SCRIPT in command
    assert ["--nnodes", str(nodes), "--nproc_per_node", "8"] == command[1:5]
    # train.py's FSDP2 mode with the same sharding the guide describes.
    args = parse_args(script_args(command))
    assert args.fsdp and args.fsdp_sharding == {"HYBRID_SHARD": "hybrid"}.get(strategy, "full")
    guide = (tmp_path / "FSDP.md").read_text()
    assert "FSDP2 mode" in guide and f"ShardingStrategy.{strategy}" in guide
    assert "transformer_auto_wrap_policy" in guide and "torch.bfloat16" in guide
    (snippet,) = code_blocks(guide, "python")
    tree = ast.parse(snippet)
    # The decoder-layer class it names for this gpt2 model really exists.
    (layer_import,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("modeling_gpt2")
    ]
    module = importlib.import_module(layer_import.module or "")
    assert all(hasattr(module, alias.name) for alias in layer_import.names)
    assert (tmp_path / "train.sbatch").exists() and (tmp_path / JOB_SCRIPT).exists()
    for absent in ("accelerate_config.yaml", "ds_config.json"):
        assert not (tmp_path / absent).exists()


@pytest.mark.parametrize(
    ("chosen", "sharding", "offload"),
    [
        ("ddp", "NO_SHARD", False),
        ("zero1", "SHARD_GRAD_OP", False),
        ("zero2", "SHARD_GRAD_OP", False),
        ("zero3", "FULL_SHARD", False),
        ("zero3_offload_all", "FULL_SHARD", True),
    ],
)
def test_fsdp_guide_shards_as_the_memory_plan_counts(
    tmp_path: Path, chosen: str, sharding: str, offload: bool
) -> None:
    # The guide's FSDP mode is the plan's chosen row, not one fixed mode: a ZeRO-1 plan under
    # FSDP wrote FULL_SHARD (ZeRO-3-like) while the report said zero1.
    from tools.planning import search_strategy

    hw, b = gpus(2, 8), brief()
    plan = search_strategy(model(), hw, b)
    memory = plan.model_copy(update={"chosen": chosen})
    emit_launch(tmp_path, b, hw, model(), FSDP, None, memory=memory)
    guide = (tmp_path / "FSDP.md").read_text()
    assert f"ShardingStrategy.{sharding}" in guide
    assert f"cpu_offload=CPUOffload(offload_params={offload})" in guide
    (snippet,) = code_blocks(guide, "python")
    ast.parse(snippet)


def test_switching_plans_removes_the_other_plans_files(tmp_path: Path) -> None:
    emit(tmp_path, "deepspeed-2x8")
    emit(tmp_path, "horovod-2x8")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != MANIFEST) == [
        "HOROVOD.md",
        "launch.sh",
        "model_config.json",
    ]
    emit(tmp_path, "ddp-2x8")
    assert not (tmp_path / "HOROVOD.md").exists() and (tmp_path / JOB_SCRIPT).exists()


def test_a_reemit_removes_the_single_train_py_of_an_older_plan(tmp_path: Path) -> None:
    # Plans written before trainer/ had train.py beside launch.sh (recorded as ours).
    write_file(tmp_path, "train.py", "# an older version's train.py\n")
    emit(tmp_path, "ddp-2x8")
    assert not (tmp_path / "train.py").exists() and (tmp_path / JOB_SCRIPT).is_file()
    assert "train.py" not in listed(tmp_path)


def test_save_keeps_the_trainer_folder_where_launch_sh_finds_it(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    spec = emit_launch(out, brief(), gpus(1, 8), model(), DDP, None)
    saved = tmp_path / "saved"
    copied = save_plan({"launch": spec.model_dump()}, str(saved))
    assert saved.resolve() / JOB_SCRIPT in copied
    for name in JOB_FILES:
        assert (saved / name).read_bytes() == (out / name).read_bytes()
    assert not (saved / "train.py").exists()
    assert (saved / "launch.sh").read_text() == (out / "launch.sh").read_text()


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
    emit_launch(out, brief(seq_len=32, task="pretrain"), cpu_only(), model(), DDP, None, steps=3)
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
    emit_launch(
        out, brief(seq_len=32, task="pretrain"), cpu_only(), model(), DEEPSPEED, cpu_config, steps=3
    )
    proc = _run_launch(out, {"DS_ACCELERATOR": "cpu"})
    metrics = _assert_ran(out, proc, 3)
    assert metrics["mode"] == "deepspeed" and metrics["deepspeed"]


# --- a tensor/pipeline-parallel plan: Megatron-DeepSpeed, not train.py -----------------------


def _llama_70b() -> ModelSpec:
    return ModelSpec(
        name="llama-3-70b",
        params=70_553_706_496,
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        vocab=128_256,
        intermediate=28_672,
        largest_layer_params=1_050_673_152,
        seq_len=8192,
        family="llama",
    )


@pytest.mark.parametrize("nodes", [1, 2])
def test_tensor_pipeline_plan_launches_megatron_deepspeed(tmp_path: Path, nodes: int) -> None:
    hw = gpus(nodes, 8)
    tp, pp = 4, 2
    dp = hw.world_size // (tp * pp)
    config = {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 64 // dp,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95]}},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {"warmup_num_steps": 20, "total_num_steps": 321},
        },
        "activation_checkpointing": {"partition_activations": True},
    }
    # An earlier data-parallel plan in the same folder wrote train.py (and recorded it).
    emit_launch(tmp_path, brief(), gpus(1, 8), model(), DEEPSPEED, DS_CONFIG)
    assert (tmp_path / JOB_SCRIPT).is_file()
    memory = model_parallel_plan("zero1", tp, pp, 1, 64 // dp)
    seq_brief = brief(seq_len=8192).model_copy(update={"global_batch_size": 64})
    spec = emit_launch(tmp_path, seq_brief, hw, _llama_70b(), MEGATRON, config, memory=memory)
    command = spec.command
    assert set(spec.files) == {
        "model_config.json",
        "ds_config.json",
        "ds_config_convert.json",  # a fine-tune: the Hugging Face weights are converted first
        "convert_checkpoint.sh",
        "MEGATRON.md",
        "launch.sh",
        "train.sbatch",
    }
    # No train.py, HF flavour or Accelerate config: they would size batches by all GPUs.
    assert not (tmp_path / JOB_DIR).exists()
    assert json.loads((tmp_path / "ds_config.json").read_text()) == config
    script = next(a for a in command if a.endswith('/pretrain_gpt.py"'))
    assert command[0] == "torchrun" and "MEGATRON_DIR" in script
    args = command[command.index(script) + 1 :]

    def flag(name: str) -> str:
        return args[args.index(name) + 1]

    assert flag("--tensor-model-parallel-size") == "4"
    assert flag("--pipeline-model-parallel-size") == "2"
    assert flag("--num-layers") == "80" and flag("--num-key-value-heads") == "8"
    assert flag("--micro-batch-size") == "1" and flag("--global-batch-size") == "64"
    assert flag("--train-iters") == "321" and flag("--lr-warmup-iters") == "20"
    assert flag("--deepspeed_config") == "ds_config.json" and flag("--zero-stage") == "1"
    assert {"--bf16", "--sequence-parallel", "--deepspeed", "--swiglu"} <= set(args)
    assert "--no-pipeline-parallel" not in args
    guide = (tmp_path / "MEGATRON.md").read_text()
    assert f"tensor parallel 4 x pipeline parallel 2 x data parallel {dp}" in guide
    for script in ("launch.sh", "train.sbatch"):
        proc = subprocess.run(["bash", "-n", str(tmp_path / script)], capture_output=True)
        assert proc.returncode == 0, proc.stderr
    if nodes > 1:
        assert "srun" in (tmp_path / "train.sbatch").read_text()


def test_tensor_only_plan_turns_megatrons_pipeline_off(tmp_path: Path) -> None:
    config = dict(DS_CONFIG, train_batch_size=16, gradient_accumulation_steps=4)
    memory = model_parallel_plan("zero1", 8, 1, 4, 4)
    spec = emit_launch(tmp_path, brief(), gpus(1, 8), model(), MEGATRON, config, memory=memory)
    assert "--no-pipeline-parallel" in spec.command
    # A data-parallel plan (the default memory=None) keeps the DeepSpeed launcher and train.py.
    plain = emit_launch(tmp_path, brief(), gpus(1, 8), model(), DEEPSPEED, DS_CONFIG)
    assert plain.command[0] == "deepspeed" and not (tmp_path / "MEGATRON.md").exists()
