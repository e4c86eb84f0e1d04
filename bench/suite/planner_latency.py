"""Planner latency: wall time of the deterministic planning steps for large models on 64 GPUs.

Run ``python bench/suite/planner_latency.py`` from the repository root. It prints a Markdown
table and writes bench/results/<date>-planner-latency.json. Target: "the planner answers in under 1 s for a 70B
model on 64 GPUs".

Regimes, measured separately because they differ by orders of magnitude:

- cold: a fresh Python process per run (``--cold-child``), median of ``--cold-runs``, timing
  each step from the first import of our tools (interpreter start-up excluded; the CLI row
  below includes it). Two totals:

  - planner: import tools, parse hardware and brief, lookup_model (catalog counts from
    knowledge/models/counts.json), search_strategy (what ``app.py estimate`` and the engineer's
    plan_parallelism call; it runs search_strategy), emit_deepspeed_config, and our pure-Python
    strict checks: no ``"auto"`` value (tools/review/config_keys.py ``auto_paths``) and the batch
    arithmetic train = micro x accumulation x world (emit also refuses a plan that breaks it).
    The child records whether torch, transformers or deepspeed got imported on the way.
  - with DeepSpeed validation: the planner plus ``validate_deepspeed_config``, which imports
    DeepSpeed (and with it torch) and parses the config with DeepSpeed's own DeepSpeedConfig at
    the target world size; unknown top-level keys can only be caught there, since DeepSpeed's
    parser is what says which keys it reads. Plans made by the agents always pay this.

- cold live count (``--live-child``): lookup_model in a fresh process for the same config with
  one extra key (``_name_or_path``), so counts.json misses and it imports torch/transformers
  and counts on the ``meta`` device: the cost for configs that are not in the catalog, and what
  every catalog lookup cost before the counts were shipped.
- CLI: wall time of ``python app.py estimate --model M --hardware H --task pretrain --seq-len S
  --global-batch B`` as a user runs it (lookup and search_strategy; estimate emits no DeepSpeed
  config), next to ``python -c pass`` (interpreter start-up), median of ``--cold-runs``.
- warm: the same process after one full pass, median of ``--repeats`` runs per step, as a
  long-lived ``app.py chat`` session or the LangGraph server pays.

Only the deterministic tools are timed: no LLM, no knowledge search, no smoke run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / f"{datetime.date.today().isoformat()}-planner-latency.json"
TARGET_S = 1.0
SCENARIOS = [
    # (model, hardware, global batch, seq len): 1024 sequences of 4096 tokens (4M tokens/step).
    ("llama-3-70b", "8x8xH100-80GB", 1024, 4096),
    ("llama-3.1-405b", "8x8xH100-80GB", 1024, 4096),
    # Issue 17: the full search (strategy x TP x PP x micro-batch x recompute) for 405B on
    # 1,024 H100s must answer in under FULL_SEARCH_TARGET_S cold.
    ("llama-3.1-405b", "128x8xH100-80GB", 1024, 4096),
]
FULL_SEARCH_TARGET_S = 1.5
PLANNER_STEPS = (
    "import_tools",
    "parse_hardware",
    "lookup_model",
    "search_strategy",
    "emit_deepspeed_config",
    "strict_check",
)
VALIDATION_STEPS = ("import_deepspeed", "validate_deepspeed_config")
WARM_STEPS = PLANNER_STEPS[1:] + VALIDATION_STEPS[1:]
HEAVY = ("torch", "transformers", "deepspeed")


def strict_check(config: dict[str, Any], world_size: int) -> None:
    """The pure-Python half of validate_deepspeed_config: no "auto", consistent batch sizes."""
    from tools.artifacts.deepspeed_config import ConfigError
    from tools.review.config_keys import auto_paths

    autos = auto_paths(config)
    if autos:
        raise ConfigError('"auto" is not resolved by DeepSpeed', key=autos[0])
    micro = config["train_micro_batch_size_per_gpu"]
    accumulation = config["gradient_accumulation_steps"]
    if micro * accumulation * world_size != config["train_batch_size"]:
        raise ConfigError(
            f"{micro} x {accumulation} x {world_size} != {config['train_batch_size']}",
            key="train_batch_size",
        )


def one_pass(model_id: str, hardware_spec: str, global_batch: int, seq_len: int) -> dict[str, Any]:
    """Run the planner steps, then DeepSpeed's validation, once; return each step's seconds."""
    times: dict[str, Any] = {}
    start = time.perf_counter()
    from tools.artifacts.deepspeed_config import emit_deepspeed_config
    from tools.artifacts.ds_validate import validate_deepspeed_config
    from tools.core.schemas import TrainingBrief
    from tools.planning import data_parallel_size, search_strategy
    from tools.research.hardware import parse_hardware
    from tools.research.model_catalog import lookup_model

    times["import_tools"] = time.perf_counter() - start

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
    plan = search_strategy(model, hardware, brief)
    times["search_strategy"] = time.perf_counter() - start

    start = time.perf_counter()
    config = emit_deepspeed_config(plan, model, hardware, brief)
    times["emit_deepspeed_config"] = time.perf_counter() - start

    start = time.perf_counter()
    # DeepSpeed's batch arithmetic counts data-parallel ranks: world / (tensor x pipeline).
    ranks = data_parallel_size(
        hardware, plan.tensor_parallel, plan.pipeline_parallel, plan.context_parallel
    )
    strict_check(config, ranks)
    times["strict_check"] = time.perf_counter() - start
    times["heavy_imported_by_planner"] = [m for m in HEAVY if m in sys.modules]

    start = time.perf_counter()
    # validate_deepspeed_config would import it itself; timed apart to show what it costs.
    import deepspeed  # noqa: F401

    times["import_deepspeed"] = time.perf_counter() - start

    start = time.perf_counter()
    validate_deepspeed_config(config, ranks)
    times["validate_deepspeed_config"] = time.perf_counter() - start

    times["planner"] = sum(times[step] for step in PLANNER_STEPS)
    times["with_deepspeed_validation"] = times["planner"] + sum(
        times[step] for step in VALIDATION_STEPS
    )
    times["chosen"] = plan.chosen
    times["world_size"] = hardware.world_size
    times["params"] = model.params
    return times


def live_lookup(model_id: str, seq_len: int) -> dict[str, Any]:
    """lookup_model for a catalog config that counts.json cannot serve (one extra key)."""
    start = time.perf_counter()
    from tools.research import model_catalog as models

    config = {**models._catalog_config(model_id), "_name_or_path": f"bench/{model_id}"}
    import_s = time.perf_counter() - start
    start = time.perf_counter()
    spec = models.lookup_model(config, seq_len)
    lookup_s = time.perf_counter() - start
    assert spec.source.endswith("on meta"), "expected a live count"
    return {"import_tools": import_s, "lookup_model_live": lookup_s, "params": spec.params}


def child_runs(flag: str, payload: Any, runs: int) -> list[dict[str, Any]]:
    """Each run in a fresh interpreter, so imports and caches start empty."""
    results = []
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, __file__, flag, json.dumps(payload)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results


def wall_runs(argv: list[str], runs: int) -> list[float]:
    """Wall seconds of a whole command, interpreter start-up included."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - start)
    return times


def warm_runs(scenario: tuple[str, str, int, int], repeats: int) -> list[dict[str, Any]]:
    """One pass to warm imports and caches, then ``repeats`` timed passes in this process."""
    one_pass(*scenario)
    return [one_pass(*scenario) for _ in range(repeats)]


def warm_live_counts(model_id: str, repeats: int) -> list[float]:
    """A live meta count with imports warm and no cache: a session asking about a new config."""
    from tools.research import model_catalog as models

    config_json = json.dumps(models._catalog_config(model_id), sort_keys=True)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        models._count.__wrapped__(config_json)
        times.append(time.perf_counter() - start)
    return times


def median(runs: list[dict[str, Any]], key: str) -> float:
    """Median seconds of one step over runs."""
    return statistics.median(run[key] for run in runs)


def fmt(seconds: float) -> str:
    """Seconds for the table, in µs, ms or s."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _child(run: Any, payload: str) -> None:
    with contextlib.redirect_stdout(sys.stderr):
        # DeepSpeed and transformers print at import; keep our one JSON line clean.
        result = run(*json.loads(payload))
    print(json.dumps(result))


def _git_head() -> str | None:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:
        return None
    return proc.stdout.strip() or None


def main() -> None:
    """Measure every scenario cold and warm, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="warm runs per scenario")
    parser.add_argument("--cold-runs", type=int, default=5, help="fresh processes per measure")
    parser.add_argument("--cold-child", help=argparse.SUPPRESS)
    parser.add_argument("--live-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_child:
        _child(one_pass, args.cold_child)
        return
    if args.live_child:
        _child(live_lookup, args.live_child)
        return

    sys.path.insert(0, str(ROOT))
    runs = max(3, args.cold_runs)
    interpreter = wall_runs([sys.executable, "-c", "pass"], runs)
    rows: list[dict[str, Any]] = []
    for scenario in SCENARIOS:
        model_id, hardware_spec, global_batch, seq_len = scenario
        cold = child_runs("--cold-child", scenario, runs)
        live = child_runs("--live-child", [model_id, seq_len], runs)
        # The scenario's batch: estimate's default global batch (32) cannot split over 64 GPUs.
        cli_argv = ["app.py", "estimate", "--model", model_id, "--hardware", hardware_spec]
        cli_argv += ["--task", "pretrain", "--seq-len", str(seq_len)]
        cli_argv += ["--global-batch", str(global_batch)]
        cli = wall_runs([sys.executable, *cli_argv], runs)
        with contextlib.redirect_stdout(sys.stderr):
            warm = warm_runs(scenario, args.repeats)
            warm_live = warm_live_counts(model_id, max(3, args.repeats // 4))
        row: dict[str, Any] = {
            "model": model_id,
            "hardware": hardware_spec,
            "world_size": int(warm[0]["world_size"]),
            "global_batch_size": global_batch,
            "seq_len": seq_len,
            "params": warm[0]["params"],
            "chosen": warm[0]["chosen"],
            "cold_runs": runs,
            "warm_runs": args.repeats,
            "cold_median_s": {
                k: median(cold, k)
                for k in (*PLANNER_STEPS, "planner", *VALIDATION_STEPS, "with_deepspeed_validation")
            },
            "cold_max_planner_s": max(run["planner"] for run in cold),
            # Must stay empty: the planner path imports none of torch, transformers, deepspeed.
            "cold_heavy_imported_by_planner": sorted(
                {m for run in cold for m in run["heavy_imported_by_planner"]}
            ),
            "cold_live_count_median_s": {
                "import_tools": median(live, "import_tools"),
                "lookup_model_live": median(live, "lookup_model_live"),
            },
            "cli_estimate_argv": ["python", *cli_argv],
            "cli_estimate_median_s": statistics.median(cli),
            "python_pass_median_s": statistics.median(interpreter),
            "warm_median_s": {
                **{k: median(warm, k) for k in WARM_STEPS},
                "planner": statistics.median(
                    sum(run[k] for k in PLANNER_STEPS[1:]) for run in warm
                ),
                "with_deepspeed_validation": statistics.median(
                    sum(run[k] for k in (*PLANNER_STEPS[1:], *VALIDATION_STEPS[1:])) for run in warm
                ),
                "live_count_imports_warm": statistics.median(warm_live),
            },
        }
        rows.append(row)

    print("\n".join(table(rows, runs, args.repeats)))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "target_s": TARGET_S,
                # HEAD when measured; the measured tree may carry uncommitted changes on top.
                "head_commit": _git_head(),
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


def table(rows: list[dict[str, Any]], runs: int, repeats: int) -> list[str]:
    """The Markdown summary: one block of steps per scenario, then the verdicts."""
    lines = [
        f"Target: under {TARGET_S:.0f} s for a 70B model on 64 GPUs. Cold: median of {runs} "
        "fresh processes, timed from the first import of our tools (interpreter start-up "
        f"excluded). Warm: median of {repeats} runs in one process.",
        "",
        "| model | step | cold | warm |",
        "|---|---|---|---|",
    ]
    labels = {
        "import_tools": "import tools",
        "parse_hardware": "parse hardware + brief",
        "lookup_model": "lookup_model (counts.json)",
        "search_strategy": "search_strategy",
        "emit_deepspeed_config": "emit_deepspeed_config",
        "strict_check": 'strict check ("auto", batch arithmetic)',
        "planner": "**planner**",
        "import_deepspeed": "import deepspeed (+ torch)",
        "validate_deepspeed_config": "validate_deepspeed_config (DeepSpeedConfig)",
        "with_deepspeed_validation": "**with DeepSpeed validation**",
    }
    for row in rows:
        cold_t, warm_t = row["cold_median_s"], row["warm_median_s"]
        first = f"{row['model']} ({row['chosen']})"
        for step, label in labels.items():
            warm = fmt(warm_t[step]) if step in warm_t else "-"
            lines.append(f"| {first} | {label} | {fmt(cold_t[step])} | {warm} |")
            first = ""
        live = row["cold_live_count_median_s"]
        lines.append(
            f"| | lookup_model, config not in counts.json (live meta count) | "
            f"{fmt(live['lookup_model_live'])} | {fmt(warm_t['live_count_imports_warm'])} |"
        )
        lines.append(
            f"| | CLI `app.py estimate` wall (`python -c pass`: "
            f"{fmt(row['python_pass_median_s'])}) | {fmt(row['cli_estimate_median_s'])} | - |"
        )
    lines.append("")
    for row in rows:
        planner = row["cold_median_s"]["planner"]
        validated = row["cold_median_s"]["with_deepspeed_validation"]
        heavy = ", ".join(row["cold_heavy_imported_by_planner"]) or "none"
        lines.append(
            f"{row['model']} on {row['hardware']}: cold planner {fmt(planner)} "
            f"({'meets' if planner < TARGET_S else 'misses'} the 1 s target; heavy imports: "
            f"{heavy}); with DeepSpeed validation {fmt(validated)} "
            f"({'meets' if validated < TARGET_S else 'misses'} it); `app.py estimate` "
            f"{fmt(row['cli_estimate_median_s'])} wall, "
            f"{fmt(row['cli_estimate_median_s'] - row['python_pass_median_s'])} over a bare "
            "interpreter."
        )
        if row["world_size"] >= 1024:
            lines.append(
                f"{row['model']} on {row['world_size']} GPUs, full search: cold planner "
                f"{fmt(planner)} ({'meets' if planner < FULL_SEARCH_TARGET_S else 'misses'} the "
                f"{FULL_SEARCH_TARGET_S:g} s target of issue 17)."
            )
    return lines


if __name__ == "__main__":
    main()
