"""The launcher follows the setup: the plan's framework and its launch files agree.

DP-only setups launch as before; tensor parallelism alone on a Hugging Face model runs on
DeepSpeed AutoTP (``tensor_parallel.autotp_size`` in ds_config.json); a pipeline on a Llama
model torchtitan defines runs on torchtitan (a TOML job config); any other split on Megatron's
pretrain_gpt.py. Real CLI runs for the three kinds of setup, and the Megatron launch.sh run with
a stand-in torchrun that checks the paths it is handed from where it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from inproc import run_main
from specs import GPT2_TINY, LLAMA3_70B, model_parallel_plan, tiny_spec

from tools.artifacts.deepspeed_config import ConfigError, emit_deepspeed_config
from tools.artifacts.ds_validate import validate_deepspeed_config
from tools.artifacts.launch import emit_launch
from tools.core.errors import ToolFailure
from tools.core.schemas import (
    FrameworkChoice,
    GPUSpec,
    HardwareSpec,
    TrainingBrief,
)
from tools.research.framework import follow_setup, setup_framework
from tools.research.model_catalog import lookup_model

ROOT = Path(__file__).resolve().parents[2]
H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989)
DEEPSPEED = FrameworkChoice(primary="deepspeed", stack=["pytorch", "deepspeed"], rationale="x")
MEGATRON = FrameworkChoice(
    primary="megatron", stack=["pytorch", "megatron", "deepspeed"], rationale="x"
)


def _cli(tmp_path: Path, request: str) -> tuple[dict[str, Any], Path]:
    out = tmp_path / "o"
    res = run_main("plan", request, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads((out / "plan.json").read_text()), out


def assert_framework_and_files_agree(plan: dict[str, Any], out: Path) -> None:
    """framework deepspeed -> ds_config.json + deepspeed launch; torchtitan -> a .toml and a
    torchrun launch of torchtitan.train; megatron -> pretrain_gpt.py; never Megatron elsewhere."""
    framework = plan["framework"]["primary"]
    command = plan["launch"]["command"]
    files = set(plan["launch"]["files"])
    megatron = any(a.rstrip('"').endswith("pretrain_gpt.py") for a in command)
    assert megatron == (framework == "megatron"), (framework, command)
    assert ("MEGATRON.md" in files) == (framework == "megatron")
    titan = "torchtitan.train" in command
    assert titan == (framework == "torchtitan") == ("torchtitan.toml" in files)
    if framework == "deepspeed":
        assert command[0] == "deepspeed" and "ds_config.json" in files
        assert (out / "ds_config.json").is_file() and "trainer/train.py" in command
    if framework == "torchtitan":
        assert command[0] == "torchrun" and command[command.index("-m") + 1] == "torchtitan.train"
        toml = command[command.index("--job.config_file") + 1]
        assert (out / toml).is_file() and plan["deepspeed_config"] is None
    memory = plan["memory"]
    tp, pp = memory["tensor_parallel"], memory["pipeline_parallel"]
    autotp = ((plan["deepspeed_config"] or {}).get("tensor_parallel") or {}).get("autotp_size")
    # AutoTP is in the config exactly when DeepSpeed itself runs a tensor-parallel split.
    assert (autotp == tp) == (framework == "deepspeed" and tp > 1)
    if tp * pp > 1:
        assert framework in ("deepspeed", "torchtitan", "megatron")
        assert framework != "deepspeed" or pp == 1


@pytest.mark.slow
def test_dp_only_plan_keeps_the_plain_launch(tmp_path: Path) -> None:
    plan, out = _cli(tmp_path, "fine-tune llama-3-8b on 8 H100")
    assert (plan["memory"]["tensor_parallel"], plan["memory"]["pipeline_parallel"]) == (1, 1)
    assert_framework_and_files_agree(plan, out)
    assert not (out / "torchtitan.toml").exists() and not (out / "MEGATRON.md").exists()


@pytest.mark.slow
def test_tensor_parallel_alone_runs_on_deepspeed_autotp(tmp_path: Path) -> None:
    plan, out = _cli(tmp_path, "fine-tune llama-3-8b on 8 H100 with TP 4")
    memory = plan["memory"]
    assert (memory["tensor_parallel"], memory["pipeline_parallel"]) == (4, 1)
    assert plan["framework"]["primary"] == "deepspeed"
    assert_framework_and_files_agree(plan, out)
    config = json.loads((out / "ds_config.json").read_text())
    assert config == plan["deepspeed_config"]
    assert config["tensor_parallel"] == {"autotp_size": 4}
    assert config["zero_optimization"]["stage"] <= 2
    # AutoTP gets no mpu: DeepSpeedConfig checks the batch at the whole world (8 ranks), while
    # the 2 data-parallel groups of 4 tensor ranks read the brief's sequences.
    validate_deepspeed_config(config, 8)
    with pytest.raises(ConfigError):
        validate_deepspeed_config(config, 8 // 4)
    # No files that size batches by the whole world.
    assert not (out / "ds_config_hf.json").exists()
    assert not (out / "accelerate_config.yaml").exists()


@pytest.mark.slow
def test_tensor_by_pipeline_on_llama_runs_on_torchtitan(tmp_path: Path) -> None:
    plan, out = _cli(tmp_path, "pretrain llama-3.1-70b on 4 nodes of 8 H100 with TP 4 and PP 4")
    memory = plan["memory"]
    assert (memory["tensor_parallel"], memory["pipeline_parallel"]) == (4, 4)
    assert plan["framework"]["primary"] == "torchtitan"
    assert "torchtitan" in plan["framework"]["rationale"]
    assert_framework_and_files_agree(plan, out)
    job = tomllib.loads((out / "torchtitan.toml").read_text())
    par = job["parallelism"]
    degrees = (
        par["data_parallel_replicate_degree"]
        * par["data_parallel_shard_degree"]
        * par["tensor_parallel_degree"]
        * par["pipeline_parallel_degree"]
        * par["context_parallel_degree"]
    )
    assert degrees == 32 and (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (
        4,
        4,
    )
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    training = job["training"]
    assert training["global_batch_size"] == plan["brief"]["global_batch_size"]
    assert training["global_batch_size"] == training["local_batch_size"] * dp
    assert training["local_batch_size"] % par["pipeline_parallel_microbatch_size"] == 0
    assert training["seq_len"] == plan["brief"]["seq_len"]
    assert job["model"] == job["model"] | {"name": "llama3", "flavor": "70B"}
    assert job["activation_checkpoint"]["mode"] in ("none", "selective", "full")
    assert "initial_load_path" not in job["checkpoint"]  # pretraining: nothing to load
    assert "TORCHTITAN.md" in plan["launch"]["files"]


def test_setup_framework_picks_by_split_model_and_zero_stage() -> None:
    gpt2 = tiny_spec(GPT2_TINY)
    assert (
        setup_framework(LLAMA3_70B, model_parallel_plan("zero1", 8, 1)) == "megatron"
    )  # no HF config
    # Llama 3.1 70B: the model torchtitan's flavor 70B builds (tools/research/titan_flavors.py).
    llama = lookup_model("llama-3.1-70b", 4096)
    assert setup_framework(llama, model_parallel_plan("zero1", 1, 1)) is None
    assert setup_framework(llama, model_parallel_plan("zero1", 8, 1)) == "deepspeed"
    assert setup_framework(gpt2, model_parallel_plan("zero2", 2, 1)) == "deepspeed"
    # AutoTP training takes ZeRO 0-2 only; ZeRO-3 with tensor parallelism is FSDP2 x TP on
    # torchtitan for the Llama 3.1 it builds exactly (Megatron has no Llama 3.1 RoPE scaling),
    # on Megatron for a model torchtitan does not build.
    assert setup_framework(llama, model_parallel_plan("zero3", 8, 1)) == "torchtitan"
    assert setup_framework(LLAMA3_70B, model_parallel_plan("zero3", 8, 1)) == "megatron"
    assert setup_framework(llama, model_parallel_plan("zero1", 8, 2)) == "torchtitan"
    # No torchtitan model definition for GPT-2 (nor a Llama of another shape): Megatron.
    assert setup_framework(gpt2, model_parallel_plan("zero1", 2, 2)) == "megatron"
    odd = llama.model_copy(update={"layers": 40})
    assert setup_framework(odd, model_parallel_plan("zero1", 4, 2)) == "megatron"
    # A wish for Megatron stands; a DeepSpeed choice moves to what the split needs.
    assert follow_setup(MEGATRON, llama, model_parallel_plan("zero1", 8, 2)).primary == "megatron"
    moved = follow_setup(DEEPSPEED, llama, model_parallel_plan("zero1", 8, 2))
    assert moved.primary == "torchtitan" and moved.stack == ["pytorch", "torchtitan"]
    assert "deepspeed" in [a.name for a in moved.alternatives]


def test_autotp_config_refuses_zero3_and_pipelines() -> None:
    hw = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=H100)
    brief = TrainingBrief(goal="x", model="llama-3-70b", global_batch_size=8)
    for plan in (
        model_parallel_plan("zero3", 4, 1, 1, 4),
        model_parallel_plan("zero1", 2, 2, 1, 4),
    ):
        with pytest.raises(ConfigError) as err:
            emit_deepspeed_config(plan, LLAMA3_70B, hw, brief, autotp=True)
        assert err.value.key == "tensor_parallel.autotp_size"
    config = emit_deepspeed_config(
        model_parallel_plan("zero2", 4, 1, 1, 4), LLAMA3_70B, hw, brief, autotp=True
    )
    assert config["tensor_parallel"] == {"autotp_size": 4}
    # AutoTP: DeepSpeed checks the batch at every rank (8), the 2 data-parallel groups read it.
    validate_deepspeed_config(config, 8)
    megatron = emit_deepspeed_config(
        model_parallel_plan("zero2", 4, 1, 1, 4), LLAMA3_70B, hw, brief
    )
    assert "tensor_parallel" not in megatron  # Megatron brings its own tensor groups


def _tiny_tp2_pp2() -> tuple[HardwareSpec, TrainingBrief, dict[str, Any]]:
    """One 8 x H100 node, a tiny brief, and the ZeRO-1 config of a TP 2 x PP 2 split (DP 2)."""
    hw = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=H100)
    brief = TrainingBrief(goal="x", model="tiny", seq_len=128, global_batch_size=8)
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 4,
        "zero_optimization": {"stage": 1},
    }
    return hw, brief, config


def test_a_split_under_a_framework_that_cannot_run_it_is_refused(tmp_path: Path) -> None:
    hw, brief, config = _tiny_tp2_pp2()
    with pytest.raises(ToolFailure):
        emit_launch(
            tmp_path,
            brief,
            hw,
            tiny_spec(GPT2_TINY),
            DEEPSPEED,
            config,
            memory=model_parallel_plan("zero1", 2, 2, 1, 4),
        )
    assert not (tmp_path / "launch.sh").exists()


def test_megatron_launch_finds_its_script_and_config_from_where_it_runs(tmp_path: Path) -> None:
    """launch.sh runs from the plan's folder; pretrain_gpt.py comes from $MEGATRON_DIR."""
    out, checkout, bin_dir = tmp_path / "plan", tmp_path / "Megatron-DeepSpeed", tmp_path / "bin"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text("# stand-in\n")
    bin_dir.mkdir()
    record = tmp_path / "seen.json"
    # A stand-in torchrun: records its cwd, the script it got and whether the files exist there.
    (bin_dir / "torchrun").write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "args = sys.argv[1:]\n"
        "script = next(a for a in args if a.endswith('pretrain_gpt.py'))\n"
        "ds = args[args.index('--deepspeed_config') + 1]\n"
        f"json.dump({{'script': os.path.isfile(script), 'ds': os.path.isfile(ds), "
        f"'load': args[args.index('--load') + 1] if '--load' in args else None}}, "
        f"open({str(record)!r}, 'w'))\n"
    )
    (bin_dir / "torchrun").chmod(0o755)
    hw, brief, config = _tiny_tp2_pp2()
    spec = emit_launch(
        out,
        brief,
        hw,
        tiny_spec(GPT2_TINY),
        MEGATRON,
        config,
        memory=model_parallel_plan("zero1", 2, 2, 1, 4),
    )
    # A fine-tune loads the converted checkpoint; launch.sh picks it (test_launch_frameworks.py).
    assert "--finetune" in Path(spec.files["launch.sh"]).read_text()
    guide = (out / "MEGATRON.md").read_text()
    assert "hf2megads_weight_converter.py" in guide
    (out / "checkpoints" / "converted").mkdir(parents=True)
    (out / "checkpoints" / "converted" / "latest").write_text("global_step0")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("MEGATRON_DIR", None)
    # A Python without deepspeed.compression (DeepSpeed 0.19.7 removed it; megatron_env.py):
    # one line naming the release, and nothing runs.
    (bin_dir / "no-compression").write_text("#!/usr/bin/env bash\nexit 1\n")
    (bin_dir / "no-compression").chmod(0o755)
    res = subprocess.run(
        ["bash", str(out / "launch.sh")],
        cwd=tmp_path,
        env={**env, "PYTHON": str(bin_dir / "no-compression")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "deepspeed==0.19.6" in res.stderr and not record.exists()
    # A stand-in Python that has what Megatron-DeepSpeed imports.
    (bin_dir / "ds-0.19.6").write_text("#!/usr/bin/env bash\nexit 0\n")
    (bin_dir / "ds-0.19.6").chmod(0o755)
    env["PYTHON"] = str(bin_dir / "ds-0.19.6")
    # Without MEGATRON_DIR: one clear line, and nothing runs.
    res = subprocess.run(
        ["bash", str(out / "launch.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode != 0 and "MEGATRON_DIR" in res.stderr and not record.exists()
    env["MEGATRON_DIR"] = str(checkout)
    res = subprocess.run(
        ["bash", str(out / "launch.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    seen = json.loads(record.read_text())
    assert seen == {"script": True, "ds": True, "load": "checkpoints/converted"}
