"""Memory estimate accuracy: against DeepSpeed's estimators, CPU smoke runs and the GPU check.

(a) ``estimator_grid``: our per-GPU model-state bytes (tools/planning/memory.py ``model_state_bytes``,
    the figure the planner adds activations and buffers to) vs DeepSpeed's
    ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs`` (the
    functions behind ``estimate_zero{2,3}_model_states_mem_needs_all_cold``, whose tables print
    the same numbers) over models x GPU counts x ZeRO stage and offload. Pure arithmetic.
(b) ``smoke_cases``: our predicted peak vs the measured peak of real ``app.py smoke`` runs on
    2 CPU ranks (anonymous RSS above the pre-model baseline; the prediction is the memory
    model's total for the shape that ran, without the CUDA context and fragmentation margin
    that this reading does not contain: tools/smoke/predict.py ``predict_peak_bytes``).
(c) ``gpu_cases``: the H200 runs of bench/gpu/gpu_check.sh, read from bench/results/*-gpu-check*.json (not
    re-run), with the prediction recomputed by today's memory model.

Relative error everywhere: (ours - reference) / reference; negative means we under-estimate.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from bench.common import PY, bench_env, median, rel_error, run_cmd

GRID_MODELS = ["gpt2", "gpt2-xl", "llama-3-8b", "llama-2-13b", "llama-3-70b"]  # 124M .. 70.6B
GRID_HARDWARE = [(1, 1), (1, 8), (8, 8)]  # (nodes, GPUs per node): 1, 8 and 64 GPUs
# DeepSpeed has estimators for ZeRO-2 and ZeRO-3 only (none for DDP or ZeRO-1).
GRID_STRATEGIES = [
    "zero2",
    "zero2_offload_optimizer",
    "zero3",
    "zero3_offload_optimizer",
    "zero3_offload_all",
]
# Two sizes the smoke run builds on CPU (tools/smoke/scale.py CPU_BUDGET): gpt2 scaled to 3.7M
# parameters and TinyLlama-1.1B's config scaled to 6.1M (llama MLP, grouped-query attention).
SMOKE_MODELS = ["gpt2", "bench/configs/llama-1.1b.json"]
SMOKE_STEPS = 10
SMOKE_STEPS_QUICK = 5  # the peak comes with the first optimizer step
SMOKE_FULL = ["ddp", "zero1", "zero2", "zero3"]
SMOKE_QUICK = ["zero2", "zero3"]


def estimator_grid(
    models: list[str] | None = None,
    hardware: list[tuple[int, int]] | None = None,
    strategies: list[str] | None = None,
) -> dict[str, Any]:
    """Our model-state bytes per GPU vs DeepSpeed's, per case, with the median |error|."""
    from types import SimpleNamespace

    from bench.suite.planner_cases import deepspeed_model_states
    from tools.planning import model_state_bytes
    from tools.research.model_catalog import lookup_model

    cases = []
    for model_id in models or GRID_MODELS:
        model = lookup_model(model_id, 1024)
        for nodes, per_node in hardware or GRID_HARDWARE:
            world = nodes * per_node
            hw = SimpleNamespace(nodes=nodes, gpus_per_node=per_node)
            for strategy in strategies or GRID_STRATEGIES:
                ours = sum(
                    model_state_bytes(
                        model.params,
                        model.params,
                        model.largest_layer_params,
                        world,
                        strategy,  # type: ignore[arg-type]
                        precision="bf16",
                    ).gpu.values()
                )
                theirs = deepspeed_model_states(model, hw, strategy, "pretrain")
                assert theirs is not None
                cases.append(
                    {
                        "model": model_id,
                        "params": model.params,
                        "gpus": world,
                        "strategy": strategy,
                        "ours_bytes": ours,
                        "deepspeed_bytes": int(theirs),
                        "error": rel_error(ours, theirs),
                    }
                )
    errors = [abs(c["error"]) for c in cases]
    worst = max(cases, key=lambda c: abs(c["error"]))
    by_strategy = {
        s: {
            "median_abs_error": median([abs(c["error"]) for c in cases if c["strategy"] == s]),
            "max_abs_error": max(abs(c["error"]) for c in cases if c["strategy"] == s),
        }
        for s in dict.fromkeys(c["strategy"] for c in cases)
    }
    return {
        "what": (
            "per-GPU model-state bytes (bf16 mixed precision, Adam, every parameter trained): "
            "tools/planning/memory.py model_state_bytes vs DeepSpeed's estimate_zero2/zero3_"
            "model_states_mem_needs (zero_init=True, as the _all_cold tables)"
        ),
        "deepspeed_functions": [
            "deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs",
            "deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs",
        ],
        "cases": cases,
        "n": len(cases),
        "median_abs_error": median(errors),
        "max_abs_error": max(errors),
        "within_1pct": sum(e <= 0.01 for e in errors),
        "worst": worst,
        "by_strategy": by_strategy,
    }


def smoke_cases(
    strategies: list[str],
    *,
    steps: int = SMOKE_STEPS,
    timeout: float = 300,
    models: list[str] | None = None,
) -> dict[str, Any]:
    """Real ``app.py smoke`` runs on 2 CPU ranks: measured peak vs our prediction, per strategy."""
    cases = []
    models = models or SMOKE_MODELS
    runs = [(model, strategy) for model in models for strategy in strategies]
    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as tmp:
        env = bench_env(TRAINWRIGHT_HOME=str(Path(tmp) / "home"))
        for i, (model, strategy) in enumerate(runs):
            run_dir = Path(tmp) / f"{i}-{strategy}"
            out = Path(tmp) / f"{i}-{strategy}.json"
            argv = [PY, "app.py", "smoke", "--model", model, "--strategy", strategy]
            argv += ["--steps", str(steps), "--run-dir", str(run_dir), "--json", str(out)]
            done = run_cmd(argv, timeout=timeout, env=env, check=False)
            if not out.exists():
                tail = " | ".join(done.output.strip().splitlines()[-3:])
                cases.append(
                    {"model": model, "strategy": strategy, "status": "no result", "reason": tail}
                )
                continue
            res = json.loads(out.read_text())
            measured = res.get("peak_memory_bytes")
            baseline = res.get("baseline_memory_bytes") or 0
            predicted = res.get("predicted_peak_memory_bytes")
            above = measured - baseline if measured is not None else None
            case: dict[str, Any] = {
                "model": model,
                "strategy": strategy,
                "status": res["status"],
                "argv": ["python", *argv[1:6], "--steps", str(steps)],
                "wall_s": done.wall_s,
                "world_size": res["world_size"],
                "shape": {
                    k: res["model_shape"].get(k)
                    for k in (
                        "family",
                        "params",
                        "layers",
                        "hidden",
                        "vocab",
                        "seq_len",
                        "micro_batch_size",
                    )
                },  # fmt: skip
                "peak_rss_bytes": measured,
                "baseline_bytes": baseline,
                "measured_bytes": above,
                "predicted_bytes": predicted,
                "step_time_s": res.get("step_time_s"),
            }
            if res["status"] == "passed" and above and predicted:
                case["error"] = rel_error(predicted, above)
            else:
                case["reason"] = res.get("reason")
            cases.append(case)
    errors = [abs(c["error"]) for c in cases if "error" in c]
    return {
        "what": (
            f"`python app.py smoke --model M --strategy S --steps {steps}` (M: {', '.join(models)}) on 2 CPU "
            "ranks: peak anonymous RSS above the pre-model baseline (max over ranks) vs the "
            "planner's prediction for the shape that ran (total minus fragmentation margin)"
        ),
        "cases": cases,
        "n": len(errors),
        "median_abs_error": median(errors) if errors else None,
        "max_abs_error": max(errors) if errors else None,
    }


def gpu_cases() -> dict[str, Any]:
    """The recorded H200 runs (bench/gpu/gpu_check.sh), with today's prediction."""
    from bench.gpu.gpu_check_table import gpu_rows

    rows = gpu_rows()
    ds = [abs(r["error"]) for r in rows if r["strategy"] != "ddp"]
    everything = [abs(r["error"]) for r in rows]
    return {
        "what": (
            "GPU, measured by bench/gpu/gpu_check.sh (torch.cuda.max_memory_allocated per rank) vs "
            "tools/smoke/predict.py predict_peak_bytes recomputed now; read from the JSON, not re-run"
        ),
        "measured_on": sorted({r["when"] for r in rows if r.get("when")}),
        "gpu": sorted({r["gpu"] for r in rows if r.get("gpu")}),
        "cases": rows,
        "n": len(rows),
        "median_abs_error": median(everything) if everything else None,
        "median_abs_error_deepspeed": median(ds) if ds else None,
        "max_abs_error": max(everything) if everything else None,
    }
