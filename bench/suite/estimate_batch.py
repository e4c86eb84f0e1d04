"""``app.py estimate --batch`` on 1,000 setups: wall time of one cold process, per setup.

Run ``python bench/suite/estimate_batch.py [--setups N] [--json FILE]`` from the repository root
(section ``estimate_batch`` of bench/run.py). It writes ``setups`` JSON lines (default 1,000)
to a temporary file, a deterministic mix of catalog GPUs (datacenter and consumer), model
families and sizes (dense, mixture of experts, encoder, vision), task, precision, sequence
length, global batch, and some pinned layouts, strategies and micro-batches, then runs
``python app.py estimate --batch FILE --json OUT`` once, in its own process, and reports its
wall time (interpreter start-up and imports included), the time per setup, and how many lines
were estimated and skipped (a setup that cannot run is a skipped line, on purpose: some are
pinned past what the model or cluster allows). Target (issue 30): 1,000 setups in under 60 s
on a 2-core machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import bench_env, run_cmd  # noqa: E402

TARGET_S = 60.0
SETUPS = 1000
# (model, largest sequence it takes): dense LLMs 0.5B-405B, mixtures of experts, an encoder,
# a vision transformer and a CNN.
MODELS = (
    ("qwen2.5-0.5b", 4096), ("llama-3.2-1b", 8192), ("gpt2", 1024), ("phi-3-mini", 4096),
    ("llama-3-8b", 8192), ("mistral-7b", 8192), ("gemma-2-9b", 4096), ("llama-2-13b", 4096),
    ("qwen2.5-32b", 32768), ("llama-3-70b", 8192), ("llama-3.1-405b", 8192),
    ("mixtral-8x7b", 8192), ("qwen3-30b-a3b", 8192), ("deepseek-v2-lite", 4096),
    ("mixtral-8x22b", 8192), ("bert-large", 512), ("vit-large", 197), ("resnet-50", 1),
)  # fmt: skip
HARDWARE = (
    "1x8xH100-80GB", "4x8xH100-80GB", "64x8xH100-80GB", "1x8xA100-80GB", "2x8xA100-40GB",
    "1x8xH200", "1x8xB200", "1x8xMI300X", "1x8xV100-32GB", "1x4xRTX4090", "1x1xRTX3090",
    "1x4xL40S", "1x8xA10G", "1x1xL4", "1x4xT4",
)  # fmt: skip
TASKS = ("pretrain", "finetune", "lora")
PRECISIONS = (None, "bf16", "fp16", "fp32", "pure-bf16")
SEQS = (512, 1024, 2048, 4096, 8192, 32768)
BATCHES = (8, 32, 64, 256, 1024)
# Pins, every few lines: a layout, a strategy, a micro-batch, recompute, a framework.
PINS: tuple[dict[str, Any], ...] = (
    {}, {}, {}, {"tp": 2}, {"tp": 8, "pp": 2}, {"strategy": "zero3"}, {"micro_batch": 2},
    {"checkpointing": "full"}, {"framework": "fsdp"}, {"framework": "megatron", "tp": 4},
    {"strategy": "zero2_offload_optimizer"}, {"optimizer": "adam8bit"},
)  # fmt: skip


def setups(n: int = SETUPS) -> list[dict[str, Any]]:
    """``n`` estimate requests, a deterministic walk through the axes above (no randomness)."""
    grid = itertools.product(range(len(MODELS)), range(len(HARDWARE)), range(len(SEQS)))
    rows: list[dict[str, Any]] = []
    for i, (m, h, s) in enumerate(grid):
        if len(rows) == n:
            break
        model, longest = MODELS[m]
        row: dict[str, Any] = {
            "model": model,
            "hardware": HARDWARE[(h + i) % len(HARDWARE)],
            "task": TASKS[i % len(TASKS)],
            "seq_len": min(SEQS[s], longest) if longest > 1 else 1,
            "global_batch": BATCHES[(i // 3) % len(BATCHES)],
        }
        precision = PRECISIONS[(i // 7) % len(PRECISIONS)]
        if precision is not None:
            row["precision"] = precision
        row.update(PINS[(i // 2) % len(PINS)])
        rows.append(row)
    return rows


def measure(n: int = SETUPS) -> dict[str, Any]:
    """Run one ``estimate --batch`` over ``n`` setups; its wall time and what it answered."""
    with tempfile.TemporaryDirectory(prefix="tw-batch-") as tmp:
        src, out = Path(tmp) / "setups.jsonl", Path(tmp) / "out.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in setups(n)))
        argv = [sys.executable, "app.py", "estimate", "--batch", str(src), "--json", str(out)]
        done = run_cmd(argv, timeout=600, env=bench_env(), check=False)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"estimate --batch exit {done.returncode}: {done.output[-2000:]}")
        answers = [json.loads(line) for line in out.read_text().splitlines()]
    errors = [a for a in answers if "error" in a and "line" in a]
    reasons: dict[str, int] = {}
    for a in errors:
        head = a["error"].split(":")[0]
        reasons[head] = reasons.get(head, 0) + 1
    return {
        "what": f"python app.py estimate --batch FILE --json OUT, {n} setups, one cold process",
        "setups": n,
        "wall_s": done.wall_s,
        "per_setup_ms": done.wall_s / n * 1000,
        "target_s": TARGET_S,
        "met": done.wall_s < TARGET_S,
        "answers": len(answers),
        "estimated": len(answers) - len(errors),
        "skipped": len(errors),
        "skipped_by_field": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
        "exit_code": done.returncode,
        "stderr_tail": done.output.strip().splitlines()[-1:],
    }


def main(argv: list[str] | None = None) -> int:
    """Measure and print (and with ``--json`` write) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", type=int, default=SETUPS)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    result = measure(args.setups)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
