"""Planner latency: wall time of the deterministic planning steps for large models on 64 GPUs.

Run ``python bench/planner_latency.py`` from the repository root. It prints a Markdown table
and writes bench/planner_latency.json. Target: "the planner answers in under 1 s for a 70B
model on 64 GPUs".

Two regimes, measured separately because they differ by orders of magnitude:

- cold: a fresh Python process per run (``--cold-child``), timing each step from the first
  import of our tools; this includes importing torch/transformers (model on the ``meta``
  device) and DeepSpeed (the validator), as a one-shot ``app.py plan`` pays. Interpreter
  start-up itself is not included.
- warm: the same process after one full pass, median of ``--repeats`` runs per step, as a
  long-lived ``app.py chat`` session or the LangGraph server pays. lookup_model is then served
  from its lru_cache (tools/models.py ``_count``), which is what that process really gets.

Only the deterministic tools are timed: no LLM, no knowledge search, no smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().with_name("planner_latency.json")
TARGET_S = 1.0
SCENARIOS = [
    # (model, hardware, global batch, seq len): 1024 sequences of 4096 tokens (4M tokens/step).
    ("llama-3-70b", "8x8xH100-80GB", 1024, 4096),
    ("llama-3.1-405b", "8x8xH100-80GB", 1024, 4096),
]
STEPS = ("lookup_model", "plan_memory", "emit_deepspeed_config", "validate_deepspeed_config")
# Heavy imports, timed on their own so cold lookup/validate show their own work. In a warm
# process they cost nothing (already in sys.modules).
IMPORTS = ("import_tools", "import_torch_transformers", "import_deepspeed")


def one_pass(
    model_id: str, hardware_spec: str, global_batch: int, seq_len: int
) -> dict[str, float]:
    """Run lookup, plan, emit and validate once; return each step's seconds."""
    times: dict[str, float] = {}
    start = time.perf_counter()
    from tools.deepspeed_config import emit_deepspeed_config, validate_deepspeed_config
    from tools.hardware import parse_hardware
    from tools.memory import plan_memory
    from tools.models import lookup_model
    from tools.schemas import TrainingBrief

    times["import_tools"] = time.perf_counter() - start

    start = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    times["import_torch_transformers"] = time.perf_counter() - start

    start = time.perf_counter()
    import deepspeed  # noqa: F401

    times["import_deepspeed"] = time.perf_counter() - start

    start = time.perf_counter()
    hardware = parse_hardware(hardware_spec)
    brief = TrainingBrief(
        model=model_id,
        seq_len=seq_len,
        global_batch_size=global_batch,
        hardware=hardware_spec,
        precision="bf16",
        task="pretrain",
    )
    times["parse_hardware"] = time.perf_counter() - start

    start = time.perf_counter()
    model = lookup_model(model_id, seq_len)
    times["lookup_model"] = time.perf_counter() - start

    start = time.perf_counter()
    plan = plan_memory(model, hardware, brief)
    times["plan_memory"] = time.perf_counter() - start

    start = time.perf_counter()
    config = emit_deepspeed_config(plan, model, hardware, brief)
    times["emit_deepspeed_config"] = time.perf_counter() - start

    start = time.perf_counter()
    validate_deepspeed_config(config, hardware.world_size)
    times["validate_deepspeed_config"] = time.perf_counter() - start

    times["end_to_end"] = sum(times[step] for step in ("parse_hardware", *STEPS))
    times["end_to_end_with_imports"] = times["end_to_end"] + sum(times[k] for k in IMPORTS)
    times["chosen"] = plan.chosen  # type: ignore[assignment]
    times["world_size"] = hardware.world_size
    return times


def cold_runs(scenario: tuple[str, str, int, int], runs: int) -> list[dict[str, float]]:
    """Each run in a fresh interpreter, so imports and caches start empty."""
    results = []
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, __file__, "--cold-child", json.dumps(scenario)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


def warm_runs(scenario: tuple[str, str, int, int], repeats: int) -> list[dict[str, float]]:
    """One pass to warm imports and caches, then ``repeats`` timed passes in this process."""
    one_pass(*scenario)
    return [one_pass(*scenario) for _ in range(repeats)]


def new_model_lookups(scenario: tuple[str, str, int, int], repeats: int) -> list[float]:
    """lookup_model with its caches cleared but imports warm: a session asking about a new model."""
    from tools import models

    times = []
    for _ in range(repeats):
        for cached in (models.load_model_catalog, models._name_index, models._count):
            cached.cache_clear()
        start = time.perf_counter()
        models.lookup_model(scenario[0], scenario[3])
        times.append(time.perf_counter() - start)
    return times


def median(runs: list[dict[str, float]], key: str) -> float:
    """Median seconds of one step over runs."""
    return statistics.median(run[key] for run in runs)


def fmt(seconds: float) -> str:
    """Seconds for the table, in µs, ms or s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def main() -> None:
    """Measure every scenario cold and warm, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="warm runs per scenario")
    parser.add_argument("--cold-runs", type=int, default=3, help="fresh processes per scenario")
    parser.add_argument("--cold-child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.cold_child:
        with open(os.devnull, "w") as devnull:
            # DeepSpeed and transformers print at import; keep our one JSON line clean.
            real_stdout = sys.stdout
            sys.stdout = devnull
            try:
                result = one_pass(*json.loads(args.cold_child))
            finally:
                sys.stdout = real_stdout
        print(json.dumps(result))
        return

    sys.path.insert(0, str(ROOT))
    rows: list[dict[str, Any]] = []
    for scenario in SCENARIOS:
        cold = cold_runs(scenario, args.cold_runs)
        with open(os.devnull, "w") as devnull:
            real_stdout = sys.stdout
            sys.stdout = devnull
            try:
                warm = warm_runs(scenario, args.repeats)
                new_model = new_model_lookups(scenario, max(3, args.repeats // 4))
            finally:
                sys.stdout = real_stdout
        model_id, hardware_spec, global_batch, seq_len = scenario
        row: dict[str, Any] = {
            "model": model_id,
            "hardware": hardware_spec,
            "world_size": int(warm[0]["world_size"]),
            "global_batch_size": global_batch,
            "seq_len": seq_len,
            "chosen": warm[0]["chosen"],
            "cold_runs": args.cold_runs,
            "warm_runs": args.repeats,
            "cold_median_s": {k: median(cold, k) for k in (*IMPORTS, *STEPS)},
            "warm_median_s": {k: median(warm, k) for k in STEPS},
        }
        row["cold_median_s"]["end_to_end"] = median(cold, "end_to_end_with_imports")
        row["warm_median_s"]["end_to_end"] = median(warm, "end_to_end")
        row["warm_max_end_to_end_s"] = max(run["end_to_end"] for run in warm)
        # Imports warm, lookup caches cleared (median of a few runs).
        row["warm_new_model_lookup_s"] = statistics.median(new_model)
        rows.append(row)

    lines = [
        f"Target: under {TARGET_S:.0f} s for a 70B model on 64 GPUs. Cold: median of "
        f"{args.cold_runs} fresh processes; its end to end includes the imports above it, "
        "not interpreter start-up. "
        f"Warm: median of {args.repeats} runs in one process.",
        "",
        "| model | chosen | step | cold | warm |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        cold_t, warm_t = row["cold_median_s"], row["warm_median_s"]
        lines.append(
            f"| {row['model']} | {row['chosen']} | import tools | {fmt(cold_t['import_tools'])} | - |"
        )
        for name in IMPORTS[1:]:
            lines.append(f"| | | {name.replace('_', ' ')} | {fmt(cold_t[name])} | - |")
        lines.append(
            f"| | | lookup_model, new model (caches cleared) | - | "
            f"{fmt(row['warm_new_model_lookup_s'])} |"
        )
        for step in (*STEPS, "end_to_end"):
            label = "**end to end**" if step == "end_to_end" else step
            lines.append(f"| | | {label} | {fmt(cold_t[step])} | {fmt(warm_t[step])} |")
    for row in rows:
        cold_e2e, warm_e2e = row["cold_median_s"]["end_to_end"], row["warm_median_s"]["end_to_end"]
        lines.append("")
        lines.append(
            f"{row['model']} on {row['hardware']}: warm {fmt(warm_e2e)} "
            f"({'meets' if warm_e2e < TARGET_S else 'misses'} the 1 s target), cold "
            f"{fmt(cold_e2e)} ({'meets' if cold_e2e < TARGET_S else 'misses'} it)."
        )
    print("\n".join(lines))

    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "target_s": TARGET_S,
                "machine": {
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                },
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
