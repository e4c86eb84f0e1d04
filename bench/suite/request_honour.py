"""Nothing silent: is each part of a sweep request in the plan, or said where it is not?

bench/suite/launch_agreement.py draws requests from a grid of models, machines, tasks and request
words; this module checks each plan against the words it was asked with: the model, the GPU type
and count, and every word (a sequence length, a batch, a learning rate, a step count, a token
budget, a framework, a ZeRO stage, a tensor/pipeline/expert degree, a micro-batch, fp8, an
evaluation cadence). A part is honoured when the plan carries it (brief, chosen setup,
framework), said when a line of the plan's "not as asked" (memory.not_honoured), a wish marked
not honoured or a "not understood" quote names it; else it is silent, a finding.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Plan = dict[str, Any]


def _setup(key: str, value: int) -> Callable[[Plan], bool]:
    return lambda p: p["memory"]["setup"][key] == value


def _brief(key: str, value: float) -> Callable[[Plan], bool]:
    return lambda p: p["brief"].get(key) == value


def _framework(name: str) -> Callable[[Plan], bool]:
    return lambda p: p["framework"]["primary"] == name


def _steps(n: int) -> Callable[[Plan], bool]:
    """The step count, or the tokens it trains (the brief keeps steps as dataset_tokens)."""

    def honoured(p: Plan) -> bool:
        b = p["brief"]
        return b.get("train_steps") == n or b.get("dataset_tokens") == float(
            n * b["global_batch_size"] * b["seq_len"]
        )

    return honoured


def _fp8(p: Plan) -> bool:
    return ((p["brief"].get("recipe") or {}).get("precision") or p["brief"]["precision"]) == "fp8"


# Each grid word: (honoured in the plan, words a line that says otherwise would name).
WORD_CHECKS: dict[str, tuple[Callable[[Plan], bool], tuple[str, ...]]] = {
    "seq len 4096": (_brief("seq_len", 4096), ("4096", "seq")),
    "global batch 256": (_brief("global_batch_size", 256), ("256", "batch")),
    "lr 1e-4": (_brief("learning_rate", 1e-4), ("1e-4", "learning rate", "lr")),
    "for 300 steps": (_steps(300), ("300 steps", "steps")),
    "with megatron": (_framework("megatron"), ("megatron",)),
    "with fsdp": (_framework("pytorch_fsdp"), ("fsdp",)),
    "with deepspeed zero-3": (
        # Megatron-DeepSpeed runs DeepSpeed's ZeRO too.
        lambda p: (
            p["framework"]["primary"] in ("deepspeed", "megatron")
            and p["memory"]["setup"]["strategy"].startswith("zero3")
        ),
        ("zero-3", "zero3", "deepspeed"),
    ),
    "tensor parallel 2": (_setup("tensor_parallel", 2), ("tensor",)),
    "pipeline parallel 2": (_setup("pipeline_parallel", 2), ("pipeline",)),
    "context length 16384": (_brief("seq_len", 16384), ("16384", "16,384", "context")),
    "micro batch 2": (_setup("micro_batch_size", 2), ("micro",)),
    "on 20B tokens": (_brief("dataset_tokens", 2e10), ("20b", "tokens")),
    "with torchtitan": (_framework("torchtitan"), ("torchtitan",)),
    "expert parallel 8": (_setup("expert_parallel", 8), ("expert",)),
    "in fp8": (_fp8, ("fp8",)),
    "eval every 100 steps": (_brief("eval_every", 100), ("eval",)),
}


def said_lines(plan: Plan) -> list[str]:
    """The plan's lines that say a part of the request was not done as asked (lower case)."""
    req = plan.get("request") or {}
    lines = list(plan["memory"].get("not_honoured") or [])
    lines += [
        f"{w.get('wish')} {w.get('how')}" for w in req.get("wishes") or [] if not w.get("honoured")
    ]
    lines += list(req.get("not_understood") or [])
    return [str(x).lower() for x in lines]


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def machine_parts(machine: str) -> tuple[int, str, int | None]:
    """GPU count, type word and memory (GB, where named) of a grid machine."""
    m = re.fullmatch(r"(?:(\d+) nodes of )?(\d+) (.+?)(?: (\d+)GB)?", machine)
    assert m is not None, machine
    count = int(m[2]) * (int(m[1]) if m[1] else 1)
    return count, m[3], int(m[4]) if m[4] else None


def silent_parts(plan: Plan, model: str, machine: str, words: list[str]) -> list[str]:
    """The parts of the request the plan neither carries nor says it changed."""
    said = said_lines(plan)
    out: list[str] = []
    hw = plan["hardware"]
    count, gpu, memory = machine_parts(machine)
    gpu_name = str((hw.get("gpu") or {}).get("name") or "")
    if hw["nodes"] * hw["gpus_per_node"] != count:
        out.append(f"{machine}: planned {hw['nodes']}x{hw['gpus_per_node']}")
    if _norm(gpu) not in _norm(gpu_name) or (
        memory is not None and (hw.get("gpu") or {}).get("memory_gb") != memory
    ):
        out.append(f"{machine}: planned {gpu_name}")
    if _norm(model) != _norm(str((plan.get("model") or {}).get("name") or "")):
        out.append(f"{model}: planned {(plan.get('model') or {}).get('name')}")
    for word in words:
        honoured, names = WORD_CHECKS[word]
        if honoured(plan):
            continue
        if not any(n in line for line in said for n in names):
            out.append(f"'{word}' neither planned nor said")
    return out
