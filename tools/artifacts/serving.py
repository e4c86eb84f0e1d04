"""The launch files of an inference plan: serve.sh for the engine (and serve_ds.py for DeepSpeed).

Written through the output folder's manifest (tools/core/outputs.py), like every other file.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from tools.core.inference_types import InferencePlan
from tools.core.outputs import check_files, write_file
from tools.core.schemas import LaunchSpec
from tools.planning.serve_flags import no_serve_reason

SERVE_SCRIPT = "serve.sh"
DS_SCRIPT = "serve_ds.py"

_DS_SERVE = '''"""Serve a Hugging Face causal LM with DeepSpeed-Inference tensor parallelism.

Started by serve.sh (deepspeed --num_gpus N serve_ds.py ...): each rank loads the model,
deepspeed.init_inference shards it over the N GPUs, and rank 0 answers prompts read one per
line from stdin. DeepSpeed-MII wraps the same engine in an HTTP server.
"""

import argparse
import os
import sys

import deepspeed
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "int8"])
parser.add_argument("--max-tokens", type=int, default=2048)
parser.add_argument("--new-tokens", type=int, default=256)
args = parser.parse_args()

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("LOCAL_RANK", "0"))
dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.int8}[args.dtype]
tokenizer = AutoTokenizer.from_pretrained(args.model)
model = AutoModelForCausalLM.from_pretrained(
    args.model, torch_dtype=torch.float16 if dtype is torch.int8 else dtype
)
engine = deepspeed.init_inference(
    model,
    tensor_parallel={"tp_size": world},
    dtype=dtype,
    replace_with_kernel_inject=True,
    max_out_tokens=args.max_tokens,
)
device = torch.device("cuda", rank)
for line in sys.stdin:
    prompt = line.strip()
    if not prompt:
        continue
    inputs = tokenizer(prompt, return_tensors="pt").to(device)
    out = engine.module.generate(**inputs, max_new_tokens=args.new_tokens)
    if rank == 0:
        print(tokenizer.decode(out[0], skip_special_tokens=True), flush=True)
'''


def serve_script(plan: InferencePlan) -> str:
    """serve.sh: the engine command for one replica, with the plan's numbers as comments."""
    lines = [
        "#!/usr/bin/env bash",
        f"# Inference plan: {plan.engine}, tensor parallel {plan.tensor_parallel}"
        + (f" x pipeline parallel {plan.pipeline_parallel}" if plan.pipeline_parallel > 1 else ""),
        f"# context {plan.context_len} tokens, up to {plan.max_concurrency} concurrent "
        f"sequences fit (planned {plan.concurrency}); {plan.weight_dtype} weights, "
        f"{plan.kv_dtype} KV cache",
    ]
    lines += [f"# {comment}" for comment in plan.assumptions if "checkpoint quantized" in comment]
    if plan.replicas > 1:
        lines.append(
            f"# {plan.replicas} replicas: run this once per group of "
            f"{plan.tensor_parallel * plan.pipeline_parallel} GPUs (CUDA_VISIBLE_DEVICES), "
            "each on its own port, behind a load balancer"
        )
    if plan.pipeline_parallel > 1:
        lines.append("# pipeline parallel across nodes: start a Ray cluster over the nodes first")
    lines += ["set -euo pipefail", 'cd "$(dirname "$0")"', f"exec {shlex.join(plan.command)}", ""]
    return "\n".join(lines)


def emit_serving(out_dir: Path, plan: InferencePlan) -> LaunchSpec:
    """Write serve.sh (and serve_ds.py for DeepSpeed-Inference) under ``out_dir``.

    Only for a plan that fits: when not one sequence fits, the engine would stop at start-up
    (or, told a smaller format than the plan's, serve something else), so no file is written
    and the plan and the launch notes say why (``no_serve_reason``).
    """
    why = no_serve_reason(plan)
    if why is not None:
        if why not in plan.assumptions:
            plan.assumptions.append(why)
        return LaunchSpec(command=[], files={}, notes=[why])
    texts = {SERVE_SCRIPT: serve_script(plan)}
    if plan.engine == "deepspeed-inference":
        texts[DS_SCRIPT] = _DS_SERVE
    check_files(out_dir, texts)
    files = {}
    for name, text in texts.items():
        files[name] = str(write_file(out_dir, name, text, executable=name.endswith(".sh")))
    return LaunchSpec(command=list(plan.command), files=files)
