"""Megatron-DeepSpeed and torchtitan launches run from the plan's folder and load what they need.

The generated launch.sh, train.sbatch and convert_checkpoint.sh run here against stand-ins: a
``torchrun`` on PATH that execs Python on its script (or ``-m`` module) argument, a fake
``$MEGATRON_DIR`` whose pretrain_gpt.py and tools/hf2megads_weight_converter.py record their
argv and cwd, and a fake ``torchtitan`` package on PYTHONPATH whose ``torchtitan.train`` reads
torchtitan.toml from its cwd. A command that resolved a file from anywhere but the plan's
folder, loaded the wrong checkpoint, or started without the weights a fine-tune needs fails
here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from specs import model_parallel_plan, tiny_spec

from tools.artifacts.launch import emit_launch
from tools.core.schemas import (
    FrameworkChoice,
    GPUSpec,
    HardwareSpec,
    LaunchSpec,
    TrainingBrief,
)
from tools.research.model_catalog import lookup_model

H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989)
HW = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=H100)
MEGATRON = FrameworkChoice(
    primary="megatron", stack=["pytorch", "megatron", "deepspeed"], rationale="x"
)
TORCHTITAN = FrameworkChoice(primary="torchtitan", stack=["pytorch", "torchtitan"], rationale="x")

# A stand-in torchrun: drops torchrun's own options (each with its value) and execs Python on
# the rest, the script or ``-m module`` and its arguments, recording the options it dropped.
FAKE_TORCHRUN = """#!/usr/bin/env bash
set -euo pipefail
opts=()
while [[ $# -gt 0 && $1 == --* ]]; do opts+=("$1" "$2"); shift 2; done
export FAKE_TORCHRUN="${opts[*]}"
exec "$PYTHON" "$@"
"""
# What every stand-in script records: its path, argv, cwd and torchrun's options, to $RECORD.
RECORD_HEAD = (
    "import json, os, sys\n"
    "seen = {'script': sys.argv[0], 'argv': sys.argv[1:], 'cwd': os.getcwd(),\n"
    "        'torchrun': os.environ['FAKE_TORCHRUN']}\n"
)
FAKE_PRETRAIN = RECORD_HEAD + (
    "args = seen['argv']\n"
    "seen['ds_config'] = json.load(open(args[args.index('--deepspeed_config') + 1]))\n"
    "json.dump(seen, open(os.environ['RECORD'], 'w'))\n"
)
# The converter writes what Megatron-DeepSpeed's save_checkpoint leaves: DeepSpeed's tag file.
FAKE_CONVERTER = RECORD_HEAD + (
    "args = seen['argv']\n"
    "seen['ds_config'] = json.load(open(args[args.index('--deepspeed_config') + 1]))\n"
    "save = args[args.index('--save') + 1]\n"
    "os.makedirs(os.path.join(save, 'global_step0'))\n"
    "open(os.path.join(save, 'latest'), 'w').write('global_step0')\n"
    "json.dump(seen, open(os.environ['RECORD'], 'w'))\n"
)
FAKE_TITAN_TRAIN = RECORD_HEAD + (
    "import tomllib\n"
    "args = seen['argv']\n"
    "job = tomllib.load(open(args[args.index('--job.config_file') + 1], 'rb'))\n"
    "seen['job'] = job\n"
    "initial = job['checkpoint'].get('initial_load_path')\n"
    "seen['initial'] = sorted(os.listdir(initial)) if initial and os.path.isdir(initial) else None\n"
    "json.dump(seen, open(os.environ['RECORD'], 'w'))\n"
)


# A two-layer Llama: the dense layout Megatron-DeepSpeed's converter maps (a GPT-2 it refuses).
LLAMA_TINY = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "tie_word_embeddings": False,
}
MIXTRAL_TINY = {
    **LLAMA_TINY,
    "model_type": "mixtral",
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}


def _config(stage: int, dp: int) -> dict[str, Any]:
    return {
        "train_batch_size": 4 * dp,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 4,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
    }


def _brief(task: str) -> TrainingBrief:
    return TrainingBrief(goal="x", model="tiny", task=task, seq_len=128, global_batch_size=8)  # type: ignore[arg-type]


class Stand:
    """The stand-ins' folders and an environment that finds them."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.checkout = tmp_path / "Megatron-DeepSpeed"
        (self.checkout / "tools").mkdir(parents=True)
        (self.checkout / "pretrain_gpt.py").write_text(FAKE_PRETRAIN)
        (self.checkout / "tools" / "hf2megads_weight_converter.py").write_text(FAKE_CONVERTER)
        titan = tmp_path / "site" / "torchtitan"
        titan.mkdir(parents=True)
        (titan / "__init__.py").write_text("")
        (titan / "train.py").write_text(FAKE_TITAN_TRAIN)
        # The release launch.sh checks for (importlib.metadata reads it).
        meta = tmp_path / "site" / "torchtitan-0.2.2.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torchtitan\nVersion: 0.2.2\n")
        # What Megatron launches check before torchrun (DeepSpeed <= 0.19.6, megatron_env.py).
        compression = tmp_path / "site" / "deepspeed" / "compression"
        compression.mkdir(parents=True)
        for part in ("__init__.py", "compression/__init__.py", "compression/compress.py"):
            (tmp_path / "site" / "deepspeed" / part).write_text("")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "torchrun").write_text(FAKE_TORCHRUN)
        # sbatch's helpers: one host, and srun runs its command here once.
        (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho localhost\n")
        (bin_dir / "srun").write_text('#!/usr/bin/env bash\nshift\nexec "$@"\n')
        for tool in bin_dir.iterdir():
            tool.chmod(0o755)
        self.record = tmp_path / "seen.json"
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PYTHON": sys.executable,
            "PYTHONPATH": str(tmp_path / "site"),
            "RECORD": str(self.record),
            "MEGATRON_DIR": str(self.checkout),
        }

    def run(self, script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """``bash script`` from the tmp root (not the plan's folder), with a fresh record."""
        self.record.unlink(missing_ok=True)
        return subprocess.run(
            ["bash", str(script), *args],
            cwd=self.root,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def seen(self) -> dict[str, Any]:
        return json.loads(self.record.read_text())


def _refused(res: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit 2 with one line on stderr that names ``words``."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), res.stderr


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _megatron(
    out: Path,
    task: str,
    stage: int = 1,
    tp: int = 2,
    pp: int = 2,
    config: dict[str, Any] | None = None,
) -> LaunchSpec:
    dp = HW.world_size // (tp * pp)
    return emit_launch(
        out,
        _brief(task),
        HW,
        tiny_spec(config or LLAMA_TINY),
        MEGATRON,
        _config(stage, dp),
        memory=model_parallel_plan(f"zero{stage}", tp, pp, accumulation=4),
    )


def test_megatron_fine_tune_converts_then_trains_then_resumes_from_its_folder(
    tmp_path: Path,
) -> None:
    stand, out = Stand(tmp_path), tmp_path / "plan"
    spec = _megatron(out, "finetune")
    assert {"convert_checkpoint.sh", "ds_config_convert.json"} <= set(spec.files)
    for name in ("launch.sh", "train.sbatch"):
        text = (out / name).read_text()
        assert "checkpoints/converted/latest" in text and "./convert_checkpoint.sh" in text
    command = spec.command
    assert _flag(command, "--save") == "checkpoints/train" and "--save-interval" in command
    # The fine-tune keeps the pipeline model: the converter writes only that layout.
    assert "--no-pipeline-parallel" not in command
    # The guide's command runs by hand: the first run's arguments, not launch.sh's array.
    guide = (out / "MEGATRON.md").read_text()
    assert "${LOAD" not in guide and "--load checkpoints/converted --finetune" in guide
    assert "./convert_checkpoint.sh /path/to/hf-model" in guide

    # No converted checkpoint yet: one line naming the conversion, and nothing runs.
    _refused(stand.run(out / "launch.sh"), "convert_checkpoint.sh")
    assert not stand.record.exists()

    # The conversion: a relative HF folder is the caller's, the rest resolves from the plan's.
    hf = tmp_path / "hf-model"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    _refused(stand.run(out / "convert_checkpoint.sh"), "HF_MODEL_DIR")
    res = stand.run(out / "convert_checkpoint.sh", "hf-model")
    assert res.returncode == 0, res.stderr
    seen = stand.seen()
    argv = seen["argv"]
    assert seen["cwd"] == str(out)
    assert seen["script"] == str(stand.checkout / "tools" / "hf2megads_weight_converter.py")
    assert _flag(argv, "--hf-ckpt-dir") == str(hf) == _flag(argv, "--tokenizer-model")
    assert _flag(argv, "--load-mode") == "auto" and _flag(argv, "--save") == "checkpoints/converted"
    assert _flag(argv, "--tensor-model-parallel-size") == "2"
    assert _flag(argv, "--pipeline-model-parallel-size") == "2"
    assert _flag(argv, "--num-layers") == _flag(command, "--num-layers")
    assert _flag(argv, "--zero-stage") == "0" and "--no-pipeline-parallel" not in argv
    # One rank per tensor x pipeline slot; DeepSpeed's batch arithmetic agrees with Megatron's.
    assert "--nproc_per_node 4" in seen["torchrun"]
    assert seen["ds_config"]["train_batch_size"] == int(_flag(argv, "--global-batch-size"))
    assert (out / "checkpoints" / "converted" / "latest").is_file()

    # The first run loads the converted weights, model only.
    res = stand.run(out / "launch.sh")
    assert res.returncode == 0, res.stderr
    seen = stand.seen()
    argv = seen["argv"]
    assert seen["cwd"] == str(out) and seen["script"] == str(stand.checkout / "pretrain_gpt.py")
    assert seen["ds_config"] == json.loads((out / "ds_config.json").read_text())
    assert _flag(argv, "--load") == "checkpoints/converted" and "--finetune" in argv
    assert _flag(argv, "--save") == "checkpoints/train"

    # Once the job saved a checkpoint, a restart resumes from it: optimizer, RNG and step too.
    (out / "checkpoints" / "train").mkdir()
    (out / "checkpoints" / "train" / "latest").write_text("global_step500")
    res = stand.run(out / "launch.sh")
    assert res.returncode == 0, res.stderr
    argv = stand.seen()["argv"]
    assert _flag(argv, "--load") == "checkpoints/train" and "--finetune" not in argv

    # The SLURM job runs the same command from the submit directory, and only from the plan's.
    res = stand.run(out / "train.sbatch", SLURM_SUBMIT_DIR=str(out), SLURM_JOB_NODELIST="x")
    assert res.returncode == 0, res.stderr
    assert stand.seen()["cwd"] == str(out)
    res = stand.run(out / "train.sbatch", SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_NODELIST="x")
    _refused(res, "ds_config.json", "plan's folder")


def test_megatron_pretraining_needs_no_conversion_and_resumes(tmp_path: Path) -> None:
    stand, out = Stand(tmp_path), tmp_path / "plan"
    _megatron(out, "finetune")  # an earlier fine-tune plan in the same folder
    spec = _megatron(out, "pretrain")
    assert "convert_checkpoint.sh" not in spec.files and "--finetune" not in spec.command
    # Its conversion files went with it (the re-emit removes what this plan does not use).
    assert not (out / "convert_checkpoint.sh").exists()
    assert not (out / "ds_config_convert.json").exists()
    assert _flag(spec.command, "--load") == "checkpoints/train" == _flag(spec.command, "--save")
    res = stand.run(out / "launch.sh")
    assert res.returncode == 0, res.stderr
    assert stand.seen()["cwd"] == str(out)


def test_one_stage_fine_tune_keeps_the_pipeline_model_the_converter_writes(tmp_path: Path) -> None:
    pretrain = _megatron(tmp_path / "pretrain", "pretrain", tp=8, pp=1)
    assert "--no-pipeline-parallel" in pretrain.command
    finetune = _megatron(tmp_path / "finetune", "finetune", tp=8, pp=1)
    assert "--no-pipeline-parallel" not in finetune.command


def test_megatron_fine_tune_the_converter_cannot_serve_says_so(tmp_path: Path) -> None:
    """ZeRO-3 trains the plain model, which cannot load the converter's pipeline layout."""
    stand, out = Stand(tmp_path), tmp_path / "plan"
    spec = _megatron(out, "finetune", stage=3, tp=8, pp=1)
    assert "--no-pipeline-parallel" in spec.command
    assert "ds_config_convert.json" not in spec.files
    hf = tmp_path / "hf-model"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    _refused(stand.run(out / "convert_checkpoint.sh", str(hf)), "ZeRO stage", "stage 3")
    assert not stand.record.exists()
    assert "Not for this plan" in (out / "MEGATRON.md").read_text()


def test_megatron_fine_tune_of_a_mixture_of_experts_is_not_converted_as_dense(
    tmp_path: Path,
) -> None:
    """The converter maps dense Llama weights only: a Mixtral's convert_checkpoint.sh says so."""
    stand, out = Stand(tmp_path), tmp_path / "plan"
    spec = _megatron(out, "finetune", config=MIXTRAL_TINY)
    assert spec.command[spec.command.index("--num-experts") + 1] == "4"
    hf = tmp_path / "hf-model"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    _refused(stand.run(out / "convert_checkpoint.sh", str(hf)), "dense Llama", "4 experts")
    assert not stand.record.exists()
    assert "Not for this model" in (out / "MEGATRON.md").read_text()


def _torchtitan(out: Path, task: str) -> LaunchSpec:
    hw = HardwareSpec(source="described", nodes=2, gpus_per_node=8, gpu=H100)
    return emit_launch(
        out,
        _brief(task),
        hw,
        lookup_model("llama-3.1-70b", 4096),  # the model torchtitan's flavor 70B builds
        TORCHTITAN,
        None,
        memory=model_parallel_plan("zero1", 8, 2, accumulation=4),
    )


def test_torchtitan_fine_tune_loads_the_hf_weights_then_resumes_from_its_folder(
    tmp_path: Path,
) -> None:
    stand, out = Stand(tmp_path), tmp_path / "plan"
    _torchtitan(out, "finetune")
    job = tomllib.loads((out / "torchtitan.toml").read_text())
    checkpoint = job["checkpoint"]
    assert checkpoint["enable"] and checkpoint["interval"] >= 1
    assert checkpoint["initial_load_in_hf"] and checkpoint["initial_load_model_only"]

    _refused(stand.run(out / "launch.sh"), "hf_checkpoint", "safetensors")
    assert not stand.record.exists()

    hf = tmp_path / "hf-model"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"")
    (out / "hf_checkpoint").symlink_to(hf)
    res = stand.run(out / "launch.sh")
    assert res.returncode == 0, res.stderr
    seen = stand.seen()
    assert seen["cwd"] == str(out) and seen["job"] == job
    assert seen["initial"] == ["model.safetensors"]  # initial_load_path resolved from here
    assert "--nnodes 2" in seen["torchrun"] and "--nproc_per_node 8" in seen["torchrun"]

    # A checkpoint folder without a finished step would make torchtitan skip the HF weights.
    saved = out / job["job"]["dump_folder"] / checkpoint["folder"]
    saved.mkdir(parents=True)
    _refused(stand.run(out / "launch.sh"), str(saved.relative_to(out)), "random weights")
    # A finished step (DCP's .metadata): the job resumes, the HF weights no longer needed.
    (saved / "step-500").mkdir()
    (saved / "step-500" / ".metadata").write_bytes(b"")
    (out / "hf_checkpoint").unlink()
    res = stand.run(out / "launch.sh")
    assert res.returncode == 0, res.stderr

    res = stand.run(out / "train.sbatch", SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_NODELIST="x")
    _refused(res, "torchtitan.toml", "plan's folder")


def test_torchtitan_pretraining_starts_without_weights(tmp_path: Path) -> None:
    stand, out = Stand(tmp_path), tmp_path / "plan"
    _torchtitan(out, "pretrain")
    assert (
        "initial_load_path"
        not in tomllib.loads((out / "torchtitan.toml").read_text())["checkpoint"]
    )
    # Pretraining reads its tokenizer from [model] hf_assets_path: refused until it is there.
    refused = stand.run(out / "launch.sh")
    assert refused.returncode == 2 and "no tokenizer in assets/tokenizer" in refused.stderr
    (out / "assets" / "tokenizer").mkdir(parents=True)
    (out / "assets" / "tokenizer" / "tokenizer.json").write_text("{}")
    res = stand.run(out / "launch.sh")
    assert res.returncode == 0, res.stderr
    assert stand.seen()["cwd"] == str(out)
