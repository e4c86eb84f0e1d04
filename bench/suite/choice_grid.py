"""Choice quality vs search: the planner's pick against the best of a measured grid.

DeepSpeed's autotuner needs GPUs; here a grid search stands in for it. On this machine
(2 CPU ranks, the smoke runner's CPU setting) every strategy x micro-batch of the grid trains
a small llama-style model for real (bench/suite/grid_train.py, all in one DeepSpeed launch) and the
best measured tokens/s is the search's answer. The planner answers the same question without
running anything: tools/planning/search.py ``search_strategy`` for the same model, world size and
global batch. The figures: the measured throughput of the planner's pick over the best
measured throughput, and the grid's wall time over the planner's.

The model is bench/configs/llama-1.1b.json scaled to the CPU smoke budget by the smoke
runner's own ``scale_model_config`` (the shape ``app.py smoke`` trains on CPU). The DeepSpeed
configs are the planner's (``emit_deepspeed_config`` for each strategy, micro-batch and
accumulation at a fixed global batch) adapted to CPU ranks as the smoke runner adapts them
(``adapt_ds_config``: fp32, torch AdamW); ``ddp`` is DeepSpeed's ZeRO stage 0, which is what
the planner's ds_config.json for ``ddp`` runs.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import LLAMA_1B_CONFIG, PY, ROOT, BenchError, bench_env, median, run_cmd

MODEL_CONFIG = LLAMA_1B_CONFIG
RANKS = 2
SEQ_LEN = 64
GLOBAL_BATCH = 16  # sequences per optimizer step over the 2 ranks: 8 per rank
FULL = {
    "strategies": ["ddp", "zero1", "zero2", "zero3"],
    "micro_batches": [1, 2, 4, 8],
    "warmup": 2,
    "steps": 8,
    "rounds": 3,
}
QUICK = {
    "strategies": ["ddp", "zero2", "zero3"],
    "micro_batches": [2, 8],
    "warmup": 1,
    "steps": 3,
    "rounds": 2,
}


def smoke_model() -> tuple[dict[str, Any], dict[str, Any]]:
    """The CPU smoke shape of the llama-1.1b bench config: (HF config dict, shape)."""
    from tools.smoke import scale_model_config

    hf = {k: v for k, v in json.loads(MODEL_CONFIG.read_text()).items() if not k.startswith("_")}
    return scale_model_config(hf, seq_len=SEQ_LEN, device="cpu")


def _hardware() -> Any:
    """2 CPU ranks, as the planner's schema describes a GPU-less machine (gpu None)."""
    import psutil

    from tools.core.schemas import HardwareSpec

    # Not profile_local(): it imports torch to look for CUDA, which the planner itself never
    # needs for a described machine, and would be charged to the planner's time.
    return HardwareSpec(
        source="local",
        nodes=1,
        gpus_per_node=RANKS,
        gpu=None,
        cpu_cores=_cores(),
        ram_gb=round(psutil.virtual_memory().total / 2**30, 1),
    )


def _brief() -> Any:
    from tools.core.schemas import TrainingBrief

    return TrainingBrief(
        model="llama-1.1b-smoke",
        task="pretrain",
        seq_len=SEQ_LEN,
        global_batch_size=GLOBAL_BATCH,
        hardware="local",
        precision="fp32",
    )


def planner_pick(shape: dict[str, Any]) -> dict[str, Any]:
    """What search_strategy chooses for this model on 2 CPU ranks, and how long it took."""
    from tools.planning import search_strategy
    from tools.smoke import shape_spec

    model = shape_spec({**shape, "seq_len": SEQ_LEN})
    hardware = _hardware()
    brief = _brief()
    start = time.perf_counter()
    plan = search_strategy(model, hardware, brief)
    seconds = time.perf_counter() - start
    return {
        "strategy": plan.chosen,
        "micro_batch": plan.micro_batch_size,
        "accumulation": plan.gradient_accumulation_steps,
        "activation_checkpointing": plan.activation_checkpointing,
        "search_strategy_s": seconds,
        "rule": (
            "no GPU in the hardware spec, so no speed model: search_strategy returns "
            "the memory-only choice, the simplest strategy that fits with the largest micro-batch"
        ),
        "assumptions": plan.assumptions[:3],
    }


def planner_cold(shape: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """The planner in a fresh interpreter: import our tools and search (wall and in-process)."""
    code = (
        f"import json, sys, time; t = time.perf_counter(); sys.path.insert(0, {str(ROOT)!r}); "
        "from bench.suite.choice_grid import planner_pick; "
        "pick = planner_pick(json.loads(sys.argv[1])); "
        "pick['import_and_search_s'] = time.perf_counter() - t; print(json.dumps(pick))"
    )
    done = run_cmd([PY, "-c", code, json.dumps(shape)], timeout=timeout, env=bench_env())
    pick = json.loads(done.output.strip().splitlines()[-1])
    return {"wall_s": done.wall_s, "import_and_search_s": pick["import_and_search_s"]}


def grid_entries(
    shape: dict[str, Any], strategies: list[str], micro_batches: list[int]
) -> list[dict[str, Any]]:
    """One entry per strategy x micro-batch: the planner's ds_config for it, adapted to CPU."""
    from tools.artifacts.deepspeed_config import emit_deepspeed_config
    from tools.core.schemas import MemoryPlan
    from tools.smoke import adapt_ds_config, shape_spec, smoke_lr

    model = shape_spec({**shape, "seq_len": SEQ_LEN})
    hardware = _hardware()
    brief = _brief()
    per_rank = GLOBAL_BATCH // RANKS
    entries = []
    for strategy in strategies:
        for micro in micro_batches:
            if per_rank % micro:
                continue
            accumulation = per_rank // micro
            plan = MemoryPlan(
                strategies=[],
                chosen=strategy,  # type: ignore[arg-type]
                micro_batch_size=micro,
                gradient_accumulation_steps=accumulation,
            )
            config = emit_deepspeed_config(plan, model, hardware, brief)
            config, _ = adapt_ds_config(
                config,
                device="cpu",
                ranks=RANKS,
                micro_batch_size=micro,
                scaled=model,
                lr=smoke_lr(int(shape["hidden"])),
            )
            # adapt_ds_config sets accumulation 1 (a smoke run steps every micro-batch); the
            # grid keeps the plan's split of the global batch.
            config["gradient_accumulation_steps"] = accumulation
            config["train_batch_size"] = micro * accumulation * RANKS
            entries.append(
                {
                    "label": f"{strategy} mb{micro}x{accumulation}",
                    "strategy": strategy,
                    "micro_batch": micro,
                    "accumulation": accumulation,
                    "ds_config": config,
                }
            )
    return entries


def run_grid(
    entries: list[dict[str, Any]],
    model_config: dict[str, Any],
    *,
    warmup: int,
    steps: int,
    rounds: int = 1,
    timeout: float,
    work: Path,
) -> tuple[list[dict[str, Any]], float, str]:
    """All entries in one ``deepspeed --num_gpus 2`` launch; (records, wall seconds, output)."""
    from tools.smoke import free_port

    work.mkdir(parents=True, exist_ok=True)
    (work / "model_config.json").write_text(json.dumps(model_config))
    (work / "grid.json").write_text(json.dumps(entries))
    out = work / "records.json"
    argv = [
        PY, "-m", "deepspeed.launcher.runner",
        # A missing hostfile keeps the launcher on this machine (as tools/smoke/commands.py does).
        "--hostfile", str(work / "no-hostfile"), "--num_gpus", str(RANKS),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(ROOT / "bench" / "suite" / "grid_train.py"),
        "--model-config", str(work / "model_config.json"), "--grid", str(work / "grid.json"),
        "--warmup", str(warmup), "--steps", str(steps), "--rounds", str(rounds),
        "--seq-len", str(SEQ_LEN),
        "--out", str(out),
    ]  # fmt: skip
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    env = bench_env(cpu_ranks=True, OMP_NUM_THREADS=str(max(1, _cores() // RANKS)), TMPDIR=str(tmp))
    done = run_cmd(argv, timeout=timeout, env=env, check=False)
    records = json.loads(out.read_text()) if out.exists() else []
    if done.returncode != 0 and len(records) < len(entries) * rounds:
        tail = "\n".join(done.output.strip().splitlines()[-15:])
        raise BenchError(f"grid launch exit {done.returncode}\n{tail}")
    return records, done.wall_s, done.output


def _cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def measure(quick: bool, *, timeout: float = 900) -> dict[str, Any]:
    """Run the grid, ask the planner, compare."""
    setting = QUICK if quick else FULL
    model_config, shape = smoke_model()
    pick = planner_pick(shape)
    micro_batches = list(setting["micro_batches"])
    if pick["micro_batch"] not in micro_batches:
        micro_batches.append(pick["micro_batch"])  # the pick must be measured
    strategies = list(setting["strategies"])
    if pick["strategy"] not in strategies:
        strategies.append(pick["strategy"])
    entries = grid_entries(shape, strategies, micro_batches)
    cold = planner_cold(shape)
    with tempfile.TemporaryDirectory(prefix="bench-grid-") as tmp:
        records, grid_wall, _ = run_grid(
            entries,
            model_config,
            warmup=int(setting["warmup"]),
            steps=int(setting["steps"]),
            rounds=int(setting["rounds"]),
            timeout=timeout,
            work=Path(tmp),
        )
    configs = summarize(records)
    ok = [c for c in configs if c["tokens_per_s"] is not None]
    if not ok:
        raise BenchError(f"no grid entry ran: {records}")
    best = max(ok, key=lambda c: c["tokens_per_s"])
    picked = next(
        (
            c
            for c in ok
            if c["strategy"] == pick["strategy"] and c["micro_batch"] == pick["micro_batch"]
        ),
        None,
    )
    ranked = sorted(ok, key=lambda c: -c["tokens_per_s"])
    return {
        "what": (
            f"tokens/s of every strategy x micro-batch on {RANKS} CPU ranks (real DeepSpeed "
            f"runs in one launch; per configuration {setting['warmup']} warm-up + "
            f"{setting['steps']} timed optimizer steps, tokens/s at the median step, "
            f"median over {setting['rounds']} interleaved round(s); global batch "
            f"{GLOBAL_BATCH} x {SEQ_LEN} tokens), best vs the planner's pick"
        ),
        "model": {k: shape[k] for k in ("family", "params", "layers", "hidden", "heads", "vocab")},
        "model_source": f"{MODEL_CONFIG.relative_to(ROOT)} scaled by tools.smoke.scale_model_config (CPU budget)",
        "ranks": RANKS,
        "seq_len": SEQ_LEN,
        "global_batch": GLOBAL_BATCH,
        "warmup_steps": setting["warmup"],
        "timed_steps": setting["steps"],
        "rounds": setting["rounds"],
        "strategies": strategies,
        "micro_batches": sorted(micro_batches),
        "planner": pick,
        "planner_cold_wall_s": cold["wall_s"],
        "planner_cold_import_and_search_s": cold["import_and_search_s"],
        "grid_wall_s": grid_wall,
        "grid_configs": len(entries),
        "configs": configs,
        "best": best,
        "pick_measured": picked,
        "pick_rank": (ranked.index(picked) + 1) if picked else None,
        "ratio_pick_over_best": picked["tokens_per_s"] / best["tokens_per_s"] if picked else None,
        "grid_over_planner_wall": grid_wall / cold["wall_s"],
        "records": records,
    }


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration: median tokens/s over its rounds (None if every round failed)."""
    rows: dict[str, dict[str, Any]] = {}
    for rec in records:
        row = rows.setdefault(
            rec["label"],
            {k: rec.get(k) for k in ("label", "strategy", "micro_batch", "accumulation")}
            | {"rounds_tokens_per_s": [], "errors": []},
        )
        if rec.get("status") == "ok":
            row["rounds_tokens_per_s"].append(rec["tokens_per_s"])
        else:
            row["errors"].append(rec.get("error"))
    for row in rows.values():
        rates = row["rounds_tokens_per_s"]
        row["tokens_per_s"] = median(rates) if rates else None
    return list(rows.values())
