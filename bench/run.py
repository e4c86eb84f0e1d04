"""The benchmark suite: ``python bench/run.py --quick|--full`` writes a dated report to bench/results/.

Sections (each also importable from its module):

- memory: our model-state estimate vs DeepSpeed's estimators over a grid, the planner's six
  reference cases, our predicted peak vs real CPU smoke runs, and the recorded GPU runs
  (bench/suite/memory_accuracy.py, bench/suite/planner_cases.py, bench/gpu/gpu_check_table.py);
- choice: the planner's pick vs the best of a measured strategy x micro-batch grid on 2 CPU
  ranks (bench/suite/choice_grid.py, bench/suite/grid_train.py);
- latency: CLI cold start, an offline plan, a batch of briefs, heavy imports (bench/suite/latency.py);
- plan_cold: the CPU time of a cold offline plan without smoke, per graph node, and of `--help`
  against `python -c pass` (bench/suite/plan_cold.py);
- estimate_batch: `app.py estimate --batch` on 1,000 varied setups in one cold process
  (bench/suite/estimate_batch.py);
- sizing_cold: the cold time of `app.py size` for a 70B model over the priced GPU catalog
  (bench/suite/sizing_cold.py);
- overhead: our smoke run vs a minimal DeepSpeed script (bench/suite/overhead.py, which
  runs bench/suite/smoke_overhead.py);
- published: the speed model's tokens/s per GPU vs published throughputs (llm-foundry,
  torchtitan, Megatron-LM) in ../shared/published or $TRAINWRIGHT_PUBLISHED, per source and
  fit/held-out split (bench/calibration/published.py); skipped when the folder is absent;
- published_memory: the memory model vs published peak memory (bench/calibration/
  published_memory.py);
- families: the speed, images/s and memory comparisons per split, GPU family and model family
  against the accuracy targets, over the shared folder and bench/calibration/published_extra
  (bench/calibration/families.py).

``--quick`` (``make bench-quick``) runs fewer cases, steps and repeats, under 5 minutes on a
quiet 2-core machine; ``--full`` (``make bench``) more of each, roughly 10-20 minutes.
``--only`` runs some sections (the files then hold only those). A section that fails is
recorded with its error, the others still run, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import load_average, machine_info  # noqa: E402

SECTIONS = ("memory_grid", "planner_cases", "memory_gpu", "memory_smoke", "choice", "latency",
            "plan_cold", "estimate_batch", "sizing_cold", "overhead", "published",
            "published_memory", "families")  # fmt: skip
GIB = 2**30


def _memory_grid(quick: bool) -> dict[str, Any]:
    from bench.suite.memory_accuracy import estimator_grid

    return estimator_grid()


def _planner_cases(quick: bool) -> dict[str, Any]:
    import contextlib
    import io

    from bench.suite.planner_cases import plan_cases

    with contextlib.redirect_stdout(io.StringIO()):
        rows = plan_cases()
    return {"what": "bench/suite/planner_cases.py: six reference planning cases", "cases": rows}


def _memory_gpu(quick: bool) -> dict[str, Any]:
    from bench.suite.memory_accuracy import gpu_cases

    return gpu_cases()


def _memory_smoke(quick: bool) -> dict[str, Any]:
    from bench.suite.memory_accuracy import (
        SMOKE_FULL,
        SMOKE_QUICK,
        SMOKE_STEPS,
        SMOKE_STEPS_QUICK,
        smoke_cases,
    )

    if quick:
        return smoke_cases(SMOKE_QUICK, steps=SMOKE_STEPS_QUICK)
    return smoke_cases(SMOKE_FULL, steps=SMOKE_STEPS)


def _choice(quick: bool) -> dict[str, Any]:
    from bench.suite.choice_grid import measure

    return measure(quick)


def _latency(quick: bool) -> dict[str, Any]:
    from bench.suite.latency import measure

    return measure(quick)


def _plan_cold(quick: bool) -> dict[str, Any]:
    from bench.suite.plan_cold import measure

    return measure(quick)


def _estimate_batch(quick: bool) -> dict[str, Any]:
    from bench.suite.estimate_batch import measure

    return measure()


def _sizing_cold(quick: bool) -> dict[str, Any]:
    from bench.suite.sizing_cold import measure

    return measure(quick)


def _overhead(quick: bool) -> dict[str, Any]:
    from bench.suite.overhead import measure

    return measure(1 if quick else 3)


def _published(quick: bool) -> dict[str, Any]:
    from bench.calibration.published import measure

    return measure()


def _published_memory(quick: bool) -> dict[str, Any]:
    from bench.calibration.published_memory import measure

    return measure()


def _families(quick: bool) -> dict[str, Any]:
    from bench.calibration.families import measure

    return measure()


RUNNERS: dict[str, Callable[[bool], dict[str, Any]]] = {
    "memory_grid": _memory_grid,
    "planner_cases": _planner_cases,
    "memory_gpu": _memory_gpu,
    "memory_smoke": _memory_smoke,
    "choice": _choice,
    "latency": _latency,
    "plan_cold": _plan_cold,
    "estimate_batch": _estimate_batch,
    "sizing_cold": _sizing_cold,
    "overhead": _overhead,
    "published": _published,
    "published_memory": _published_memory,
    "families": _families,
}


def run(quick: bool, sections: list[str] | None = None) -> dict[str, Any]:
    """Run the sections in order; every figure with how it was measured, and the raw runs."""
    mode = "quick" if quick else "full"
    results: dict[str, Any] = {
        "mode": mode,
        "command": f"python bench/run.py --{mode}"
        + (f" --only {','.join(sections)}" if sections else ""),
        "only": list(sections) if sections else None,
        "machine": machine_info(),
        "sections": {},
        "section_wall_s": {},
        "errors": {},
    }
    start = time.perf_counter()
    for name in sections or SECTIONS:
        t = time.perf_counter()
        print(f"[bench] {name} ...", flush=True)
        try:
            results["sections"][name] = RUNNERS[name](quick)
        except Exception as exc:  # one broken section must not hide the others' figures
            results["errors"][name] = f"{type(exc).__name__}: {exc}"[:2000]
            traceback.print_exc()
        results["section_wall_s"][name] = time.perf_counter() - t
        print(f"[bench] {name}: {results['section_wall_s'][name]:.1f} s", flush=True)
    results["wall_s"] = time.perf_counter() - start
    results["machine"]["load_average_end"] = load_average()
    return results


# --- rendering ------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _apct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if x < 0.1:
        return f"{x * 1000:.1f} ms"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.1f} s"


def _busy_note(machine: dict[str, Any]) -> str:
    """A line on how busy the machine was.

    The start load is before any of our work; the end load includes the benchmark's own runs.
    """
    load = machine.get("load_average_start") or [0.0]
    end = machine.get("load_average_end") or [0.0]
    cores = machine.get("nproc") or 1
    if load[0] > 0.75 * cores:
        return (
            f"**Busy machine:** load average {load[0]:g} at start, before the benchmark, on "
            f"{cores} cores (other work was running), so timings and throughputs are noisy; "
            "ratios of interleaved runs are the more robust figures."
        )
    return (
        f"Load average {load[0]:g} at start (before the benchmark) and {end[0]:g} at the end "
        f"(including its own runs), on {cores} cores."
    )


def summary_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, value, how measured) for the headline table."""
    sec = results["sections"]
    rows: list[tuple[str, str, str]] = []
    if "memory_grid" in sec:
        g = sec["memory_grid"]
        rows.append((
            "Model-state estimate vs DeepSpeed's estimators",
            f"median abs error {_apct(g['median_abs_error'])}, max {_apct(g['max_abs_error'])} "
            f"({g['within_1pct']}/{g['n']} cases within 1%)",
            f"{g['n']} cases: 5 models 124M-70.6B x 1/8/64 GPUs x ZeRO-2/3, offload on/off; "
            "pure arithmetic",
        ))  # fmt: skip
    if "memory_smoke" in sec:
        m = sec["memory_smoke"]
        rows.append((
            "Predicted vs measured peak memory, CPU smoke runs",
            f"median abs error {_apct(m['median_abs_error'])}, max {_apct(m['max_abs_error'])} "
            f"({m['n']} runs)",
            "`app.py smoke --model "
            + "/".join(dict.fromkeys(c.get("model", "gpt2") for c in m["cases"]))
            + " --strategy "
            + "/".join(dict.fromkeys(c["strategy"] for c in m["cases"]))
            + "`, 2 CPU ranks, peak RSS above baseline",
        ))  # fmt: skip
    if "memory_gpu" in sec:
        m = sec["memory_gpu"]
        rows.append((
            f"Predicted vs measured peak memory, GPU ({', '.join(m['gpu'])})",
            f"median abs error {_apct(m['median_abs_error'])}, max {_apct(m['max_abs_error'])} "
            f"({m['n']} runs)",
            f"GPU, measured on {', '.join(sorted({w[:10] for w in m['measured_on']}))} by "
            "bench/gpu/gpu_check.sh (read from JSON, not re-run); prediction recomputed now",
        ))  # fmt: skip
    if "choice" in sec:
        c = sec["choice"]
        pick = c["pick_measured"] or {}
        rows.append((
            "Planner's pick vs best of a measured grid (tokens/s)",
            f"{c['ratio_pick_over_best']:.2f} (pick {pick.get('label')}: "
            f"{pick.get('tokens_per_s', 0):,.0f}; best {c['best']['label']}: "
            f"{c['best']['tokens_per_s']:,.0f}; pick ranks {c['pick_rank']}/{c['grid_configs']})"
            if c["ratio_pick_over_best"] is not None else "pick not measured",
            f"{c['grid_configs']} configs x {c['rounds']} round(s), real DeepSpeed on 2 CPU "
            f"ranks, {c['model']['params'] / 1e6:.1f}M-param llama",
        ))  # fmt: skip
        rows.append((
            "Grid search wall time vs planner wall time",
            f"{_s(c['grid_wall_s'])} vs {_s(c['planner_cold_wall_s'])} "
            f"({c['grid_over_planner_wall']:.0f}x)",
            "one `deepspeed --num_gpus 2` launch for the grid; planner in a fresh process "
            f"(search_strategy itself: {_s(c['planner']['search_strategy_s'])})",
        ))  # fmt: skip
    if "latency" in sec:
        lat = sec["latency"]
        cs = lat["cold_start"]
        rows.append((
            "`app.py --help` cold start vs `python -c pass`",
            f"{_s(cs['app_help_median_s'])} vs {_s(cs['python_pass_median_s'])} "
            f"({cs['ratio']:.2f}x)",
            f"median of {cs['repeats']} interleaved pairs",
        ))  # fmt: skip
        imp = lat["app_imports"]
        timed = [m for m in lat["heavy_imports"]["modules"] if m["import_median_s"] is not None]
        spread = ""
        if timed:
            fast = min(timed, key=lambda m: m["import_median_s"])
            slow = max(timed, key=lambda m: m["import_median_s"])
            spread = (
                f" (importing them costs {_s(fast['import_median_s'])}, {fast['module']}, to "
                f"{_s(slow['import_median_s'])}, {slow['module']})"
            )
        rows.append((
            "Heavy dependencies imported by `app.py --help`",
            (", ".join(imp["heavy_imported"]) or "none") + spread,
            f"`python -X importtime app.py --help`: {imp['modules_imported']} modules, "
            f"ours: {', '.join(imp['ours_imported']) or 'none'}",
        ))  # fmt: skip
        p = lat["plan_no_smoke"]
        rows.append((
            "Offline `app.py plan --no-smoke`, end to end",
            f"{_s(p['median_s'])} (first run, building the knowledge index: "
            f"{_s(p['first_run_with_index_build_s'])})",
            f"median of {p['repeats']}, brief {Path(p['what'].split('--brief ')[1].split()[0]).name}",
        ))  # fmt: skip
        b = lat["batch"]
        rows.append((
            f"Per brief, {b['briefs']}-brief batch without smoke",
            f"{_s(b['per_brief_s'])} ({_s(b['wall_s'])} total, {b['report_folders']} reports)",
            f"`app.py report DIR --no-smoke --jobs {b['jobs']}`, wall / briefs",
        ))  # fmt: skip
    if "plan_cold" in sec:
        rows += _plan_cold_rows(sec["plan_cold"])
    if "estimate_batch" in sec:
        e = sec["estimate_batch"]
        rows.append((
            f"`app.py estimate --batch`, {e['setups']:,} setups in one process",
            f"{_s(e['wall_s'])} ({e['per_setup_ms']:.1f} ms per setup; target < "
            f"{e['target_s']:g} s: {'met' if e['met'] else 'NOT met'}); {e['estimated']:,} "
            f"estimated, {e['skipped']:,} refused by the estimate",
            "bench/suite/estimate_batch.py: catalog GPUs x dense, MoE, encoder and vision models "
            "x task, precision, seq, batch and pins; one cold process, wall time",
        ))  # fmt: skip
    for name, c in sec.get("sizing_cold", {}).items():
        rows.append((
            f"Cold `app.py size`, {c['command'].split('size ')[1]}",
            f"wall median {_s(c['wall_median_s'])}, CPU median {_s(c['cpu_median_s'])} "
            f"(target < {c['target_s']:g} s; {c['rows']} rows over {c['gpu_types']} GPU types)",
            f"{c['runs']} fresh processes ({name}); bench/suite/sizing_cold.py",
        ))  # fmt: skip
    if "overhead" in sec:
        o = sec["overhead"]
        rows.append((
            "Smoke run vs minimal DeepSpeed script (30 steps)",
            f"{_s(o['smoke_median_s'])} vs {_s(o['minimal_median_s'])} ({o['ratio']:.2f}x)",
            f"median of {o['repeats']} interleaved pair(s) after a warm-up pair, whole commands",
        ))  # fmt: skip
    if "published" in sec:
        p = sec["published"]
        if "skipped" in p:
            rows.append(("Speed model vs published throughputs", "skipped", p["skipped"]))
        else:
            held = p["errors"].get("held-out", p["errors"][p["split"]])["all"]
            rank = p["ranking"].get("held-out", p["ranking"][p["split"]])
            rows.append((
                "Speed model vs published throughputs (held-out rows, tokens/s per GPU)",
                f"median abs error {_apct(held.get('median_abs_error'))}, "
                f"{_apct(held.get('within_20pct'))} within 20%, {held.get('off_by_2x', 0)} off "
                f"by 2x or more ({held['n']} rows); pick >= 95% of best in "
                f"{_apct(rank['share_pick_within_5pct'])} of {rank['n_grids']} grid(s)",
                f"bench/calibration/published.py, {p['rows']} published rows, each row's setup pinned",
            ))  # fmt: skip
    if "published_memory" in sec:
        m = sec["published_memory"]
        if "skipped" in m:
            rows.append(("Memory model vs published peak memory", "skipped", m["skipped"]))
        else:
            h, v = m["splits"]["held-out"], m["verdict"]
            rows.append((
                "Memory model vs published peak memory (held-out rows)",
                f"median abs error {_apct(h.get('median_abs_error'))}, "
                f"{_apct(h.get('within_15'))} within 15% ({h['rows']} rows); of {v['ran']} runs "
                f"that ran, {v['called_fits_safe']} fit with the {v['safe_headroom']:.0%} margin, "
                f"{v['called_tight']} tight, {len(v['false_alarms'])} called does not fit",
                "bench/calibration/published_memory.py: torchtitan and torchtune runs, each row's recipe and "
                "layout pinned, the quantity the row measured",
            ))  # fmt: skip
    return rows


def _plan_cold_rows(c: dict[str, Any]) -> list[tuple[str, str, str]]:
    plan, help_ = c["plan"], c["help"]
    return [
        (
            "Cold `app.py plan --no-smoke`, CPU (user+sys)",
            f"median {_s(plan['cpu_median_s'])}, min {_s(plan['cpu_min_s'])} "
            f"(target < {plan['target_cpu_s']:g} s; first run, building the knowledge index: "
            f"{_s(plan['first_run_builds_index_cpu_s'])})",
            f"{plan['runs']} fresh processes, brief llama3-8b-finetune-8xa100.yaml; per node: "
            "bench/suite/plan_cold.py",
        ),
        (
            "`app.py --help` CPU vs `python -c pass`",
            f"{_s(help_['app_help_cpu_median_s'])} vs {_s(help_['python_pass_cpu_median_s'])} "
            f"({help_['ratio']:.2f}x; target < {help_['target_ratio']:g}x)",
            f"medians of {help_['pairs']} interleaved pairs, user+sys",
        ),
    ]


def _published_memory_lines(m: dict[str, Any]) -> list[str]:
    """Section 6: the published peak-memory validation (aggregates only)."""
    from bench.calibration.published_memory import render_tables

    lines = ["", "## 6. Memory model vs published peak memory", ""]
    if "skipped" in m:
        return [*lines, f"Skipped: {m['skipped']}."]
    return lines + [
        "`python bench/calibration/published_memory.py` (every row's prediction on stdout; `--baseline "
        "DIR` for an older checkout, `--fit` for the one fitted constant). Split: fit when "
        "sha256(row_id) % 4 == 0. Fitted on the fit rows, and nothing else: the caching "
        "allocator's slack (reserved over allocated, tools/planning/overheads.py "
        "FRAGMENTATION_MARGIN). Rows are torchtitan's (torch max reserved) and torchtune's "
        "(peak active) own runs; each is predicted for its framework's recipe.",
        "",
        *render_tables(m),
    ]


def _published_lines(p: dict[str, Any]) -> list[str]:
    """Section 5: the published-throughput validation (aggregates only)."""
    lines = ["", "## 5. Speed model vs published throughputs", ""]
    if "skipped" in p:
        return [*lines, f"Skipped: {p['skipped']}."]
    lines += [
        f"{p['what']}. `python bench/calibration/published.py [--split fit|held-out|all] [--json FILE]`; "
        f"split: {p['split_rule']}. Ratio = predicted / measured. Measured values read as: "
        + ", ".join(f"{how} {n}" for how, n in p.get("measured_from", {}).items())
        + ".",
        "",
        "What was fitted on the fit rows, and nothing else (`python bench/calibration/fit_kernels.py`): the "
        "share of dense peak that GEMMs and attention kernels reach on A100 and on H100, and the "
        "key length at which attention reaches half its long-sequence efficiency "
        "(tools/planning/kernels.py KERNEL_FACTS and ATTENTION_S_HALF, a grid search minimizing "
        "the mean absolute log error). Every other "
        "constant comes from datasheets, the cited kernel and systems papers, or is an "
        "assumption stated where it is defined; H200 and B200 reuse H100's fractions.",
        "",
        "| split | source | rows | skipped | median abs error | within 10% | within 20% | "
        "off by 2x+ | worst over | worst under |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for split, by_source in p["errors"].items():
        for source, s in by_source.items():
            over, under = s.get("worst_over"), s.get("worst_under")
            lines.append(
                f"| {split} | {source} | {s['n']} | {s['n_skipped']} | "
                f"{_apct(s.get('median_abs_error'))} | {_apct(s.get('within_10pct'))} | "
                f"{_apct(s.get('within_20pct'))} | {s.get('off_by_2x', '-')} | "
                f"{'-' if over is None else f'{over:.2f}'} | "
                f"{'-' if under is None else f'{under:.2f}'} |"
            )
    last = p["errors"][list(p["errors"])[-1]]["all"]["skip_reasons"]
    if last:
        lines += ["", "Skipped rows by reason:", ""]
        lines += [f"- {n}: {reason}" for reason, n in last.items()]
    lines += [
        "",
        "Ranking: in each grid (strict: same source, model, GPU, GPU count, sequence and "
        "precision, at least two setups; loose: GPU count and sequence may differ), the "
        "measured throughput of the row the model predicts fastest over the best measured one.",
        "",
        "| grouping | split | grids | pick >= 95% of best | median pick / best | median Spearman |",
        "|---|---|---|---|---|---|",
    ]
    for kind, key in (("strict", "ranking"), ("loose", "ranking_loose")):
        for split, r in p.get(key, {}).items():
            rho = r["median_spearman"]
            best = r["median_pick_over_best"]
            lines.append(
                f"| {kind} | {split} | {r['n_grids']} | {_apct(r['share_pick_within_5pct'])} | "
                f"{'-' if best is None else f'{best:.2f}'} | "
                f"{'-' if rho is None else f'{rho:+.2f}'} |"
            )
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    """The report: the headline table, then one section per benchmark."""
    m = results["machine"]
    sec = results["sections"]
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `{results['command']}` (`make bench{'-quick' if results['mode'] == 'quick' else ''}`) "
        f"on {m['date_utc']}, in {results.get('wall_s', 0):.0f} s. Machine: {m['nproc']} CPU "
        f"cores ({m['cpu_model']}), {m['ram_gb']} GiB RAM, no GPU used; Python {m['python']}, "
        f"torch {m['torch']}, DeepSpeed {m['deepspeed']}, transformers {m['transformers']}; "
        f"commit {m['git_head']}{' + uncommitted changes' if m.get('git_dirty') else ''}. "
        f"Raw per-run numbers: bench/results/{report_stem(results)}.json.",
        "",
        _busy_note(m),
        "",
        "| figure | value | how measured |",
        "|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in summary_rows(results)]
    if results["errors"]:
        lines += ["", "**Sections that failed:**", ""]
        lines += [f"- {k}: `{v.splitlines()[0][:300]}`" for k, v in results["errors"].items()]
    if "memory_grid" in sec or "memory_smoke" in sec or "memory_gpu" in sec:
        lines += ["", "## 1. Memory estimate accuracy", ""]
        lines += [
            "Relative error = (ours - reference) / reference; negative: we under-estimate.",
            "",
        ]
    if "memory_grid" in sec:
        g = sec["memory_grid"]
        lines += [
            "### (a) Model states per GPU vs DeepSpeed's estimators",
            "",
            g["what"] + ". Per strategy:",
            "",
            "| strategy | median abs error | max abs error |",
            "|---|---|---|",
        ]
        lines += [
            f"| {s} | {_apct(v['median_abs_error'])} | {_apct(v['max_abs_error'])} |"
            for s, v in g["by_strategy"].items()
        ]
        off = [c for c in g["cases"] if abs(c["error"]) > 0.01]
        if off:
            lines += [
                "",
                "Cases more than 1% apart, all ZeRO-3. DeepSpeed's estimator charges 18 bytes per "
                "parameter over the GPUs plus 4 per parameter of the largest layer; ours adds "
                "the 16-bit gradient partition (2 bytes) and counts the fp32 gradient copy one "
                "sub-group at a time (stage3.py converts per sub-group, sub_group_size 1e9), so "
                "we are above DeepSpeed's figure when a rank's partition is under one sub-group "
                "and below it when it holds several:",
                "",
                "| model | GPUs | strategy | ours GiB | DeepSpeed GiB | error |",
                "|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {c['model']} | {c['gpus']} | {c['strategy']} | {c['ours_bytes'] / GIB:.2f} | "
                f"{c['deepspeed_bytes'] / GIB:.2f} | {_pct(c['error'])} |"
                for c in off
            ]
    if "planner_cases" in sec:
        lines += [
            "",
            "Reference planning cases (bench/suite/planner_cases.py): the setup the search picks, our "
            "per-GPU total, its model-state part and DeepSpeed's figure for the same strategy "
            "(DeepSpeed has no estimator for ZeRO-1: its ZeRO-2 figure is shown, which shards "
            "gradients that ZeRO-1 keeps whole; none for DDP or LoRA).",
            "",
            "| case | chosen | micro x accumulation | our total GB | our model states GB | DeepSpeed GB |",
            "|---|---|---|---|---|---|",
        ]
        for r in sec["planner_cases"]["cases"]:
            ds = r["deepspeed_model_states_gb"]
            lines.append(
                f"| {r['case']} | {r['chosen']} | {r['micro_batch']} x {r['accumulation']} | "
                f"{r['per_gpu_total_gb']} | {r['model_states_gb']} | {ds if ds is not None else '-'} |"
            )
    if "memory_smoke" in sec:
        s = sec["memory_smoke"]
        lines += [
            "",
            "### (b) Predicted vs measured peak, CPU smoke runs",
            "",
            s["what"] + ".",
            "",
            "| model | strategy | status | measured MiB | predicted MiB | error | run wall |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in s["cases"]:
            meas = c.get("measured_bytes")
            pred = c.get("predicted_bytes")
            head = f"| {c.get('model', 'gpt2')} | {c['strategy']} | {c['status']} | "
            lines.append(
                head + f"{meas / 2**20:.1f} | {pred / 2**20:.1f} | {_pct(c.get('error'))} | "
                f"{_s(c.get('wall_s'))} |"
                if meas and pred
                else head + f"- | - | - | {c.get('reason', '')[:120]} |"
            )
    if "memory_gpu" in sec:
        s = sec["memory_gpu"]
        lines += [
            "",
            f"### (c) GPU runs ({', '.join(s['gpu'])}), measured on "
            f"{', '.join(s['measured_on'])} by bench/gpu/gpu_check.sh",
            "",
            s["what"] + f". Median abs error of the DeepSpeed runs: "
            f"{_apct(s['median_abs_error_deepspeed'])}.",
            "",
            "| run | seq x micro | measured GiB | predicted now GiB | error | predicted when run GiB |",
            "|---|---|---|---|---|---|",
        ]
        for r in s["cases"]:
            then = r.get("predicted_when_run_bytes")
            lines.append(
                f"| {r['label']} | {r['seq_len']} x {r['micro_batch_size']} | "
                f"{r['measured_bytes'] / GIB:.2f} | {r['predicted_bytes'] / GIB:.2f} | "
                f"{_pct(r['error'])} | {then / GIB if then else 0:.2f} |"
            )
    if "choice" in sec:
        c = sec["choice"]
        pk = c["planner"]
        lines += [
            "",
            "## 2. Choice quality vs search",
            "",
            c["what"] + f". Model: {c['model_source']} ({c['model']['layers']} layers, hidden "
            f"{c['model']['hidden']}, vocab {c['model']['vocab']}, "
            f"{c['model']['params'] / 1e6:.1f}M params). The grid stands in for DeepSpeed's "
            "autotuner, which needs GPUs.",
            "",
            f"Planner (tools/planning/search.py search_strategy, hardware: {c['ranks']} CPU ranks, "
            f"global batch {c['global_batch']}): **{pk['strategy']}, micro-batch "
            f"{pk['micro_batch']} x accumulation {pk['accumulation']}**, in "
            f"{_s(pk['search_strategy_s'])}; in a fresh process "
            f"{_s(c['planner_cold_wall_s'])} wall, of which importing our tools and searching "
            f"{_s(c.get('planner_cold_import_and_search_s'))}. How it decides on CPU: "
            f"{pk['rule']}.",
            "",
            "| config | tokens/s (median over rounds) | rounds | vs best |",
            "|---|---|---|---|",
        ]
        best = c["best"]["tokens_per_s"]
        for row in sorted(c["configs"], key=lambda r: -(r["tokens_per_s"] or 0)):
            mark = (
                " (planner)"
                if c["pick_measured"] and row["label"] == c["pick_measured"]["label"]
                else ""
            )
            rate = row["tokens_per_s"]
            lines.append(
                f"| {row['label']}{mark} | {f'{rate:,.0f}' if rate else 'failed'} | "
                f"{', '.join(f'{x:,.0f}' for x in row['rounds_tokens_per_s'])} | "
                f"{rate / best:.2f} |"
                if rate
                else f"| {row['label']} | failed | - | - |"
            )
        lines += [
            "",
            f"Grid: {_s(c['grid_wall_s'])} wall for {c['grid_configs']} configurations "
            f"(launcher, imports, every init, warm-up and timed step); planner: "
            f"{_s(c['planner_cold_wall_s'])} ({c['grid_over_planner_wall']:.0f}x less).",
        ]
    if "latency" in sec:
        lat = sec["latency"]
        cs = lat["cold_start"]
        imp = lat["app_imports"]
        lines += [
            "",
            "## 3. Latency",
            "",
            f"- {cs['what']}: {_s(cs['app_help_median_s'])} vs {_s(cs['python_pass_median_s'])}, "
            f"ratio {cs['ratio']:.2f} (median of {cs['repeats']}).",
            f"- {imp['what']}: {imp['modules_imported']} modules; heavy dependencies: "
            f"{', '.join(imp['heavy_imported']) or 'none'}; of ours: "
            f"{', '.join(imp['ours_imported']) or 'none'}; outside the standard library: "
            f"{', '.join(imp['non_stdlib_roots'])}. Slowest top-level imports: "
            + ", ".join(
                f"{r['module']} {r['cumulative_us'] / 1000:.1f} ms" for r in imp["top_level"][:5]
            )
            + ".",
            f"- {lat['plan_no_smoke']['what']}: {_s(lat['plan_no_smoke']['median_s'])} "
            f"(median of {lat['plan_no_smoke']['repeats']}; the first run, which builds the "
            f"knowledge index: {_s(lat['plan_no_smoke']['first_run_with_index_build_s'])}); "
            f"chose {lat['plan_no_smoke']['chosen']}, review {lat['plan_no_smoke']['verdict']}.",
            f"- {lat['batch']['what']}: {_s(lat['batch']['per_brief_s'])} per brief "
            f"({_s(lat['batch']['wall_s'])} total, exit {lat['batch']['exit_code']}, "
            f"{lat['batch']['report_folders']} report folders).",
            "",
            f"{lat['heavy_imports']['what']} (median of {lat['heavy_imports']['repeats']}; the "
            "import statement alone, interpreter start-up excluded):",
            "",
            "| module | import | whole process |",
            "|---|---|---|",
        ]
        lines += [
            f"| {r['module']} | {_s(r['import_median_s'])} | {_s(r['wall_median_s'])} |"
            if r["import_median_s"] is not None
            else f"| {r['module']} | failed: {r['error']} | - |"
            for r in lat["heavy_imports"]["modules"]
        ]
    if "overhead" in sec:
        o = sec["overhead"]
        lines += [
            "",
            "## 4. Smoke-run overhead",
            "",
            f"`{o['command']}`: {o['what']}; our `app.py smoke` vs bench/suite/minimal_ds_train.py "
            "under DeepSpeed's launcher with the same configs, interleaved, one warm-up pair "
            "not counted.",
            "",
            "| | median | runs |",
            "|---|---|---|",
            f"| app.py smoke | {_s(o['smoke_median_s'])} | {', '.join(_s(x) for x in o['smoke_s'])} |",
            f"| minimal DeepSpeed script | {_s(o['minimal_median_s'])} | "
            f"{', '.join(_s(x) for x in o['minimal_s'])} |",
            f"| ratio | {o['ratio']:.2f} | |",
        ]
    if "plan_cold" in sec:
        from bench.suite.plan_cold import render

        lines += ["", "## 3b. Cold plan and `--help`, CPU time", "", *render(sec["plan_cold"])]
    if "sizing_cold" in sec:
        from bench.suite.sizing_cold import render as render_sizing

        lines += ["", "## 3c. Cold sizing of a 70B model", "", *render_sizing(sec["sizing_cold"])]
    if "published" in sec:
        lines += _published_lines(sec["published"])
    if "published_memory" in sec:
        lines += _published_memory_lines(sec["published_memory"])
    if "families" in sec:
        from bench.calibration.families import render as render_families

        f = sec["families"]
        text = render_families(f["groups"], f["oom_called_fits"], f["read"])
        lines += ["", "## 7. Per GPU family and model family, against the targets", ""]
        lines += text.splitlines()[2:]  # without its own title
    lines += [
        "",
        "## Where the bench time goes",
        "",
        "| section | wall |",
        "|---|---|",
    ]
    lines += [f"| {k} | {_s(v)} |" for k, v in results["section_wall_s"].items()]
    return "\n".join(lines) + "\n"


def report_stem(results: dict[str, Any]) -> str:
    """``<YYYY-MM-DD>-suite-<mode>[-<sections>]``: the day the run started, and what it ran."""
    day = str(results["machine"]["date_utc"])[:10]
    only = results.get("only")
    tail = f"-{'-'.join(s.replace('_', '-') for s in only)}" if only else ""
    return f"{day}-suite-{results['mode']}{tail}"


def write_results(results: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` under ``out_dir`` (``report_stem``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{report_stem(results)}.json"
    md_path = out_dir / f"{report_stem(results)}.md"
    json_path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    md_path.write_text(render_markdown(results))
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    """Parse the mode, run, write both files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", action="store_true", help="under 5 minutes on 2 cores")
    mode.add_argument(
        "--full", action="store_true", help="more cases and repeats, roughly 10-20 minutes"
    )
    parser.add_argument("--only", help=f"comma-separated sections of: {', '.join(SECTIONS)}")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.only.split(",")] if args.only else None
    unknown = [s for s in sections or [] if s not in RUNNERS]
    if unknown:
        parser.error(f"unknown section(s): {', '.join(unknown)}")
    results = run(args.quick, sections)
    json_path, md_path = write_results(results, args.out_dir)
    print(f"[bench] wrote {json_path} and {md_path} in {results['wall_s']:.0f} s")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
