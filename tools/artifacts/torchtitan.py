"""Full 3D plans on torchtitan: the TOML job config and TORCHTITAN.md.

A setup with pipeline parallelism on a Llama model whose shape torchtitan defines
(tools/research/framework.py ``setup_framework``) runs on torchtitan (github.com/pytorch/torchtitan),
PyTorch's FSDP2 x tensor x pipeline (x context) parallel trainer. The section and key names below
are torchtitan's ``JobConfig`` dataclasses (torchtitan/config/job_config.py at pytorch/torchtitan
commit 000204a4a8bf3d0f31adc44fc29855fbb6ea13d8): ``[parallelism]`` data_parallel_replicate_degree,
data_parallel_shard_degree, tensor_parallel_degree, pipeline_parallel_degree,
pipeline_parallel_schedule, pipeline_parallel_microbatch_size, context_parallel_degree;
``[activation_checkpoint] mode`` none/selective/full; ``[training]`` local_batch_size,
global_batch_size, seq_len, steps, max_norm, enable_cpu_offload, mixed_precision_param. The
launch is torchtitan's own (run_train.sh): ``torchrun ... -m torchtitan.train --job.config_file``.
"""

from __future__ import annotations

import json
from typing import Any

from tools.artifacts.scripts import comment_text, render
from tools.core.schemas import HardwareSpec, MemoryPlan, ModelSpec, TrainingBrief
from tools.research.framework import torchtitan_flavor

TORCHTITAN_CONFIG = "torchtitan.toml"
TORCHTITAN_MODULE = "torchtitan.train"
# The job-config keys' source, named in the TOML and the guide.
TORCHTITAN_COMMIT = "000204a4a8bf3d0f31adc44fc29855fbb6ea13d8"
# Learning rates for the torchtitan recipe by task: torchtitan's llama3 train configs use 8e-4
# (8B) down to 8e-5 (405B) for pretraining; a fine-tune starts lower (the DeepSpeed recipe's
# 2e-5, tools/artifacts/deepspeed_config.py _RECIPES).
_LR = {"pretrain": 8e-5, "finetune": 2e-5}


def setup_of(memory: MemoryPlan) -> dict[str, Any]:
    """The chosen setup's degrees and recompute policy, from the memory plan.

    ``setup`` (checkpointing none/selective/full, virtual_stages, context_parallel) is read
    when the plan has it, else the plan's own fields: full recomputation iff checkpointing.
    """
    setup = getattr(memory, "setup", None)

    def field(name: str, default: Any) -> Any:
        if setup is None:
            return default
        value = setup.get(name) if isinstance(setup, dict) else getattr(setup, name, None)
        return default if value is None else value

    checkpointing = field("checkpointing", "full" if memory.activation_checkpointing else "none")
    return {
        "tensor_parallel": int(field("tensor_parallel", memory.tensor_parallel)),
        "pipeline_parallel": int(field("pipeline_parallel", memory.pipeline_parallel)),
        "context_parallel": int(field("context_parallel", 1)),
        "virtual_stages": int(field("virtual_stages", 1)),
        "micro_batch_size": int(field("micro_batch_size", memory.micro_batch_size)),
        "gradient_accumulation_steps": int(
            field("gradient_accumulation_steps", memory.gradient_accumulation_steps)
        ),
        "checkpointing": str(checkpointing),
    }


def _toml_value(value: Any) -> str:
    """A TOML scalar: booleans lower-case, strings as JSON strings (a subset of TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value) if isinstance(value, float) else str(value)


def job_config(
    brief: TrainingBrief,
    model: ModelSpec,
    hardware: HardwareSpec,
    memory: MemoryPlan,
    steps: int,
    precision: str,
) -> dict[str, dict[str, Any]]:
    """The torchtitan job config for the plan, section -> key -> value."""
    setup = setup_of(memory)
    tp, pp, cp = setup["tensor_parallel"], setup["pipeline_parallel"], setup["context_parallel"]
    world = hardware.world_size
    dp = world // (tp * pp * cp)
    micro, accumulation = setup["micro_batch_size"], setup["gradient_accumulation_steps"]
    virtual = setup["virtual_stages"]
    # DDP replicates; every ZeRO row shards (FSDP2 shards parameters, gradients and optimizer
    # states, at most the per-GPU bytes of the plan's ZeRO-1/2/3 rows).
    replicate, shard = (dp, 1) if memory.chosen == "ddp" else (1, dp)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": tp,
        "pipeline_parallel_degree": pp,
        # Interleaved 1F1B with v stages per rank (Narayanan et al. 2021 sec. 2.2); 1F1B else.
        "pipeline_parallel_schedule": "Interleaved1F1B" if virtual > 1 else "1F1B",
        "pipeline_parallel_microbatch_size": micro,
        "context_parallel_degree": cp,
    }
    if pp > 1 and virtual > 1 and model.layers % (pp * virtual) == 0:
        parallelism["pipeline_parallel_layers_per_stage"] = model.layers // (pp * virtual)
    task = "pretrain" if brief.task == "pretrain" else "finetune"
    config: dict[str, dict[str, Any]] = {
        "job": {"dump_folder": "./outputs", "description": comment_text(brief.goal or model.name)},
        "model": {
            "name": "llama3",
            "flavor": torchtitan_flavor(model) or "",
            "tokenizer_path": "./assets/tokenizer/original/tokenizer.model",
        },
        "optimizer": {"name": "AdamW", "lr": _LR[task], "eps": 1e-8},
        "lr_scheduler": {"warmup_steps": max(1, min(200, steps // 10))},
        "training": {
            "dataset": "c4",
            # Per data-parallel rank and step: with a pipeline it is split into micro-batches
            # of pipeline_parallel_microbatch_size, the plan's accumulation steps.
            "local_batch_size": micro * accumulation,
            "global_batch_size": micro * accumulation * dp,
            "seq_len": brief.seq_len,
            "max_norm": 1.0,
            "steps": steps,
            "enable_cpu_offload": "offload" in memory.chosen,
            "mixed_precision_param": "bfloat16" if precision == "bf16" else "float32",
        },
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": setup["checkpointing"]},
        "checkpoint": {"enable_checkpoint": True, "folder": "checkpoint", "interval": 500},
    }
    if task == "finetune":
        # The converted Hugging Face weights (TORCHTITAN.md: convert_from_hf.py), model only.
        config["checkpoint"] |= {
            "initial_load_path": "./converted_checkpoint",
            "initial_load_model_only": True,
        }
    return config


def job_toml(config: dict[str, dict[str, Any]]) -> str:
    """The job config as TOML text, headed by the source of its keys."""
    lines = [
        "# torchtitan job config written by trainwright; keys as in torchtitan/config/"
        f"job_config.py (pytorch/torchtitan {TORCHTITAN_COMMIT}).",
    ]
    for section, values in config.items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def torchtitan_md(
    command: list[str], hardware: HardwareSpec, model: ModelSpec, config: dict[str, Any]
) -> str:
    """TORCHTITAN.md: why the plan runs on torchtitan, how to start it, what the config says."""
    par = config["parallelism"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    degrees = (
        f"data parallel {dp} x tensor parallel {par['tensor_parallel_degree']} x pipeline "
        f"parallel {par['pipeline_parallel_degree']} x context parallel "
        f"{par['context_parallel_degree']} = {hardware.world_size} GPUs"
    )
    finetune = "initial_load_path" in config["checkpoint"]
    convert = (
        "This is a fine-tune: convert the Hugging Face weights to torchtitan's DCP checkpoint "
        "first, with torchtitan's `scripts/checkpoint_conversion/convert_from_hf.py` (from a "
        "torchtitan checkout) into `./converted_checkpoint`, which `[checkpoint] "
        "initial_load_path` loads (model weights only)."
        if finetune
        else "This is pretraining from random weights: no checkpoint to convert."
    )
    return render(
        "TORCHTITAN.md",
        model=model.name,
        flavor=config["model"]["flavor"],
        degrees=degrees,
        nodes=hardware.nodes,
        config_file=TORCHTITAN_CONFIG,
        command=" ".join(command),
        commit=TORCHTITAN_COMMIT,
        schedule=par["pipeline_parallel_schedule"],
        mode=config["activation_checkpoint"]["mode"],
        local_batch=config["training"]["local_batch_size"],
        global_batch=config["training"]["global_batch_size"],
        convert=convert,
    )
