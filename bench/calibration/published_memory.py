"""The memory model against published peak memory: ``python bench/calibration/published_memory.py``.

Reads ``memory.tsv`` of the published-measurements folder (``../shared/published``, or
``TRAINWRIGHT_PUBLISHED=DIR``): torchtitan's and torchtune's own runs. Each row becomes the
inputs the planner would have (the catalog model, the row's GPU count and layout, and the
recipe: framework, precision, optimizer, recompute, loss, compile, LoRA/QLoRA, offload) and
``tools.planning.memory.estimate_strategy`` predicts the quantity the row measured: torch's
max reserved for torchtitan (its memory log reports max_reserved), peak active/allocated for
torchtune (its log_memory_stats). Nothing of the data is stored: ``--json`` writes aggregates.

Split: ``fit`` when sha256(row_id) % 4 == 0 (bench/calibration/published.py ``split_of``), else
``held-out``. The one constant fitted on memory rows, the caching allocator's slack
(tools/planning/overheads.py ``FRAGMENTATION_MARGIN``), may use fit rows only; errors are quoted
on held-out rows. ``--baseline DIR`` imports the planner from another checkout (the code
before this model) to print its errors on the same rows and mapping.

The fit verdict: a row "fits" when the predicted device memory leaves ``MIN_HEADROOM`` of the
GPU free (tools/core/strategies.py); every published row ran, so a row called "does not fit"
is a false alarm, and a run that ran out of memory called "fits" would be the error that
matters (bench/results/2026-11-30-gpu-limits-h200.json's capped H200 run is one; none here).

Exit codes: 0 (also when the folder is absent: one line says so), 2 for bad input.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TSV = "memory.tsv"
GIB = 2**30
WITHIN = (0.08, 0.15)

Row = dict[str, str]

# Catalog ids of the rows' models (the architectures the sources name).
MODELS = (
    ("llama 3.1 405b", "llama-3.1-405b"),
    ("llama 3.1 70b", "llama-3.1-70b"),
    ("llama 3.2 3b", "llama-3.2-3b"),
    ("qwen3 8b", "qwen3-8b"),
    ("llama 3.1 8b", "llama-3.1-8b"),
    ("llama 3 8b", "llama-3.1-8b"),
)
# (substring of the gpu cell, catalog id or None, memory GB when the catalog has no such part)
GPUS = (
    ("h100 sxm 96", "H100-80GB", 96.0),
    ("h200", "H200", None),
    ("b200", "B200", None),
    ("blackwell", "B200", None),
    ("4090", "RTX4090", None),
    ("a6000", None, 48.0),
    ("a100", "A100-80GB", None),
)
# torchtune's cumulative "Optimization flags" table (README), each row adding one flag.
TORCHTUNE_FLAGS = (
    "baseline",
    "packed",
    "compile",
    "chunked cross entropy",
    "activation checkpointing",
    "fuse optimizer step",
    "activation offloading",
    "8-bit adamw",
)


@dataclass
class Case:
    """One row as the memory model's inputs, and what it measured."""

    row_id: str
    source: str
    split: str
    recipe_group: str
    quantity: str  # allocated | reserved
    measured: float
    capacity: float
    kwargs: dict[str, Any]
    predicted: float | None = None
    device_used: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        assert self.predicted is not None
        return (self.predicted - self.measured) / self.measured


from bench.calibration.memory_linked import linked, linked_inputs  # noqa: E402
from bench.calibration.published import Skip, _Skipped  # noqa: E402  (after the path set-up above)


def _first_int(cell: str) -> int | None:
    m = re.search(r"\d[\d,]*", cell or "")
    return int(m[0].replace(",", "")) if m else None


def _source(row: Row) -> str:
    return "torchtune" if "torchtune" in row["source"] else "torchtitan"


# Tables that head a GiB figure "GB": (substring of the row's source, why it is GiB). Their
# numbers are copied from training logs that print GiB, so reading them as 10^9 bytes
# understated each measurement by 7% (issue 30).
GIB_HEADED_GB = (
    (
        "torchtitan/components/quantization/mxfp8.md",
        "torchao's table (pytorch/ao@d8bb51f63 torchao/prototype/mx_formats/README.md, reproduced "
        "by benchmarks/float8/training/llama3.sh): parse_torchtitan_logs.py takes the largest "
        "'memory: X GiB' of torchtitan's log (max reserved, torchtitan/components/metrics.py "
        "_to_gib: 1024^3) and prints 'Max Memory Usage: X GiB'",
    ),
    (
        "pytorch/torchtune@bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1:README.md 'Memory and",
        "torchtune's 'Memory and training speed' table: its other rows say GiB, and "
        "torchtune/training/memory.py log_memory_stats prints x / 1024**3 as GiB",
    ),
)


def _measured(row: Row) -> float:
    value = float(row["memory_value"])
    unit = row["memory_unit"].strip()
    if unit == "GB" and any(src in row["source"] for src, _ in GIB_HEADED_GB):
        unit = "GiB"
    if unit == "GiB":
        return value * GIB
    if unit == "GB":
        return value * 1e9
    raise _Skipped(f"memory unit {unit!r} not known")


def _hardware(row: Row) -> Any:
    from tools.core.schemas import GPUSpec
    from tools.research.hardware import parse_hardware

    cell = row["gpu"].lower()
    rule = next((g for g in GPUS if g[0] in cell), None)
    if rule is None:
        raise _Skipped("GPU not mapped")
    n = _first_int(row["n_gpus"]) or 1
    nodes, per_node = (n // 8, 8) if n >= 8 else (1, n)
    if rule[1] is None:
        hw = parse_hardware(f"{nodes}x{per_node}xRTX3090")
        assert hw.gpu is not None
        gpu = GPUSpec(**{**hw.gpu.model_dump(), "name": rule[0], "memory_gb": rule[2]})
        return hw.model_copy(update={"gpu": gpu})
    hw = parse_hardware(f"{nodes}x{per_node}x{rule[1]}")
    if rule[2] and hw.gpu is not None:
        hw = hw.model_copy(update={"gpu": hw.gpu.model_copy(update={"memory_gb": rule[2]})})
    return hw


def _torchtune_flags(row: Row) -> set[str]:
    """The cumulative flags of a torchtune optimization-table row (LoRA/QLoRA rows: all)."""
    opts = _flag_text(row)
    if opts.startswith(("lora", "qlora")):
        return set(TORCHTUNE_FLAGS)
    for i, flag in enumerate(TORCHTUNE_FLAGS):
        if flag in opts:
            return set(TORCHTUNE_FLAGS[: i + 1])
    raise _Skipped("torchtune flag row not recognised")


def _recipe_torchtitan(row: Row, kwargs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    precision = row["precision"].lower()
    if any(p in precision for p in ("nvfp4", "fp4")):
        raise _Skipped("fp4 precision: not modelled")
    fp8 = any(p in precision for p in ("float8", "fp8", "mxfp8"))
    ckpt = row["act_ckpt"].lower()
    if not ckpt:
        raise _Skipped("activation checkpointing not stated")
    policy = "full" if ckpt.startswith("full") else "selective-op"  # torchtitan's llama3 tomls
    compiled = "compile" in row["other_opts"].lower()
    # torchtitan compiles the loss with the model (compile.components = ["model", "loss"])
    # in its 2025 code, which the 2025 write-ups (H200 benchmark of 2025-06, the mxfp8 notes)
    # ran; the 2024-12 benchmarks compiled the blocks only.
    fused = compiled and "202412" not in row["source"]
    recipe = {
        "framework": "torchtitan",
        "loss": "fused" if fused else "standard",
        "precision": "fp8" if fp8 else "bf16",
        "optimizer": "adamw",
        "checkpointing": policy,
        "compile": compiled,
        "context_parallel": _first_int(row["cp"]) or 1,
    }
    group = f"torchtitan {policy}" + (" +compile" if compiled else "") + (" fp8" if fp8 else "")
    return recipe, group


def _flag_text(row: Row) -> str:
    """other_opts without the table's shared remark in parentheses."""
    return row["other_opts"].lower().split(" (each")[0].strip()


def _recipe_torchtune(row: Row, kwargs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    opts = _flag_text(row)
    notes = row["notes"].lower()
    recipe: dict[str, Any] = {"framework": "torchtune", "precision": "pure-bf16"}
    if "optimization flags" in row["locator"].lower():
        flags = _torchtune_flags(row)
        if "packed" not in flags:
            raise _Skipped("unpacked data: sequence lengths not fixed")
        recipe.update(
            compile="compile" in flags,
            loss="chunked" if "chunked cross entropy" in flags else "standard",
            checkpointing="full" if "activation checkpointing" in flags else "none",
            optimizer_in_backward="fuse optimizer step" in flags,
            activation_offload="activation offloading" in flags,
            optimizer="adam8bit" if "8-bit adamw" in flags else "adamw",
        )
        group = "torchtune " + (
            "qlora" if "qlora" in opts else "lora" if "lora" in opts else "full"
        )
    else:
        recipe.update(compile="compile" in opts, checkpointing="full")
        if "full finetune" in opts:
            if "pagedadamw8bit" in notes:
                recipe.update(optimizer="paged-adam8bit", optimizer_in_backward=True)
            elif "cpu offload" in notes:
                recipe.update(optimizer="adamw")
                kwargs["strategy"] = "zero3_offload_all"
            else:
                raise _Skipped("full fine-tune recipe (optimizer) not stated")
        group = "torchtune " + (
            "qlora" if "qlora" in opts else "lora" if "lora" in opts else "full"
        )
    if "qlora" in opts:
        recipe.update(qlora=True, lora_rank=8)
    elif "lora" in opts:
        recipe.update(lora_rank=8)
    return recipe, group


def _linked_case(row: Row, folder: Path | None) -> Case | Skip:
    """A memory row of the project's own folder, priced from its throughput row's setup."""
    from bench.calibration.published import split_of

    source, split = row["framework"].split(" ")[0], split_of(row["row_id"])
    try:
        kwargs, group, measured = linked_inputs(row, folder)
    except _Skipped as exc:
        return Skip(row["row_id"], source, split, str(exc))
    gpu = kwargs["hardware"].gpu
    return Case(row["row_id"], source, split, group, "used", measured, gpu.memory_gb * 1e9, kwargs)


def map_row(row: Row, folder: Path | None = None) -> Case | Skip:
    """A row as estimate_strategy's arguments, or why it cannot be compared."""
    from bench.calibration.published import split_of
    from tools.research.model_catalog import lookup_model

    source, split = _source(row), split_of(row["row_id"])
    if linked(row):
        return _linked_case(row, folder)
    try:
        name = row["model"].lower()
        model_id = next((m for key, m in MODELS if name.startswith(key)), None)
        if model_id is None:
            raise _Skipped("model not in the catalog")
        seq = _first_int(row["seq_len"])
        if not seq:
            raise _Skipped("sequence length not stated")
        hw = _hardware(row)
        tp = _first_int(row["tp"]) or 1
        pp = _first_int(row["pp"]) or 1
        mb_cell = row["micro_batch"].lower()
        micro = _first_int(mb_cell) or 1
        micro_batches = _first_int(row["grad_accum"]) or 1
        if "local bs" in mb_cell and pp > 1:
            # torchtitan's pipeline splits the local batch into micro-batches: as many as
            # there are stages in its 2024 code (experimental.pipeline_parallel_microbatches
            # defaulted to the PP degree), of one sequence each later (pp_microbatch_size 1).
            count = pp if "202412" in row["source"] else micro
            if micro % count:
                raise _Skipped("local batch does not split into the pipeline's micro-batches")
            micro_batches, micro = count, micro // count
        kwargs: dict[str, Any] = {
            "strategy": "zero3" if row["dp_sharding"].upper().startswith("FSDP") else "ddp",
            "seq_len": seq,
            "micro_batch_size": micro,
            "tensor_parallel": tp,
            "pipeline_parallel": pp,
            "gradient_accumulation_steps": micro_batches,
        }
        if source == "torchtitan":
            recipe, group = _recipe_torchtitan(row, kwargs)
        else:
            recipe, group = _recipe_torchtune(row, kwargs)
        recipe["gradient_accumulation_steps"] = micro_batches
        kwargs["recipe"] = recipe
        kwargs["task"] = "lora" if recipe.get("lora_rank") else "finetune"
        metric = row["memory_metric"].lower()
        quantity = "reserved" if source == "torchtitan" or "reserved" in metric else "allocated"
        assert hw.gpu is not None
        case = Case(
            row_id=row["row_id"],
            source=source,
            split=split,
            recipe_group=group,
            quantity=quantity,
            measured=_measured(row),
            capacity=hw.gpu.memory_gb * 1e9,
            kwargs={**kwargs, "model": lookup_model(model_id, seq), "hardware": hw},
        )
        return case
    except _Skipped as exc:
        return Skip(row["row_id"], source, split, str(exc))


def predict(case: Case, *, legacy: bool = False) -> Case:
    """The prediction of the row's quantity (``legacy``: a checkout without recipes)."""
    from tools.planning.memory import estimate_strategy

    kw = dict(case.kwargs)
    model, hw, strategy = kw.pop("model"), kw.pop("hardware"), kw.pop("strategy")
    recipe = kw.pop("recipe")
    if legacy:
        policy = recipe.get("checkpointing", "none")
        kw["activation_checkpointing"] = policy == "full"
        kw["selective_recompute"] = policy.startswith("selective")
        kw["precision"] = "bf16"
        if recipe.get("lora_rank"):
            kw["lora_rank"] = recipe["lora_rank"]
        if recipe.get("context_parallel", 1) > 1:
            kw["seq_len"] //= recipe["context_parallel"]
        est = estimate_strategy(model, hw, strategy, **kw)
        b = est.per_gpu_bytes
        # The old model's total held a 10% margin and the CUDA context: its allocated figure
        # is the rest, its reserved figure the total less the context.
        context = 750_000_000
        allocated = b.total - b.margin - context
        case.predicted = float(allocated if case.quantity == "allocated" else b.total - context)
        case.device_used = float(b.total)
        return case
    from tools.planning.recipe import Recipe

    est = estimate_strategy(model, hw, strategy, recipe=Recipe(**recipe), **kw)
    b = est.per_gpu_bytes
    quantity = {"allocated": b.peak_allocated, "used": b.device_used}
    case.predicted = float(quantity.get(case.quantity, b.peak_reserved))
    case.device_used = float(b.device_used)
    case.notes = est.notes
    return case


def fit_slack(folder: Path | None = None) -> float | None:
    """The allocator slack the fit rows imply: median of measured reserved / predicted allocated.

    Fit split only. tools/planning/overheads.py ``FRAGMENTATION_MARGIN`` is this value, rounded.
    """
    ratios = []
    for case in (map_row(r) for r in read_rows(folder)):
        if isinstance(case, Case) and case.split == "fit" and case.quantity == "reserved":
            case.quantity = "allocated"
            predict(case)
            ratios.append(case.measured / (case.predicted or 1) - 1)
    return statistics.median(ratios) if ratios else None


def read_rows(folder: Path | None = None) -> list[Row]:
    """The rows of ``memory.tsv``; InputError when the file is missing."""
    from bench.calibration.published import ENV_VAR, published_dir
    from tools.core.errors import InputError

    path = (folder or published_dir()) / TSV
    if not path.is_file():
        raise InputError(ENV_VAR, f"no {TSV} in {path.parent}")
    with path.open(newline="", encoding="utf-8") as fh:
        return [
            {k: (v or "").strip() for k, v in r.items() if k is not None}
            for r in csv.DictReader(fh, delimiter="\t")
        ]


def stats(cases: list[Case]) -> dict[str, Any]:
    """Median |error|, shares within 8% and 15%, worst over and under."""
    if not cases:
        return {"rows": 0}
    errs = [c.error for c in cases]
    return {
        "rows": len(cases),
        "median_abs_error": statistics.median(abs(e) for e in errs),
        "within_8": sum(abs(e) <= WITHIN[0] for e in errs) / len(errs),
        "within_15": sum(abs(e) <= WITHIN[1] for e in errs) / len(errs),
        "worst_over": max(errs),
        "worst_under": min(errs),
    }


def verdicts(cases: list[Case]) -> dict[str, Any]:
    """The fit check on rows that ran (all of them ran), and the margin the errors call for.

    Each row is classed as the plan's fit check would class it (tools/planning/outcome.py
    ``fit_verdict``): fits (``SAFE_HEADROOM`` free), tight (``MIN_HEADROOM`` free), does not
    fit. ``margin_needed`` is the headroom that would have covered every under-prediction:
    1 - predicted / measured at its worst, and the row it comes from.
    """
    from tools.core.strategies import MIN_HEADROOM, SAFE_HEADROOM

    called = [c for c in cases if c.device_used is not None and c.predicted]
    share = {c.row_id: (c.device_used or 0) / c.capacity for c in called}
    fits = [c.row_id for c in called if share[c.row_id] <= 1 - SAFE_HEADROOM]
    tight = [c.row_id for c in called if 1 - SAFE_HEADROOM < share[c.row_id] <= 1 - MIN_HEADROOM]
    needs = sorted(((1 - (c.predicted or 0) / c.measured, c.row_id) for c in called), reverse=True)
    return {
        "headroom": MIN_HEADROOM,
        "safe_headroom": SAFE_HEADROOM,
        "ran": len(called),
        "called_fits": len(fits) + len(tight),
        "called_fits_safe": len(fits),
        "called_tight": len(tight),
        "false_alarms": [c.row_id for c in called if c.row_id not in fits + tight],
        "margin_needed": [{"row": r, "margin": round(m, 4)} for m, r in needs[:3]],
    }


def evaluate(folder: Path | None = None, *, legacy: bool = False) -> dict[str, Any]:
    """Every row mapped and predicted; aggregates per split, source and recipe."""
    from tools.core.errors import InputError

    mapped = [map_row(r, folder) for r in read_rows(folder)]
    cases: list[Case] = []
    skips = [s for s in mapped if isinstance(s, Skip)]
    for case in mapped:
        if isinstance(case, Case):
            try:
                cases.append(predict(case, legacy=legacy))
            except InputError as exc:  # e.g. a layout the (older) model refuses
                skips.append(Skip(case.row_id, case.source, case.split, f"refused: {exc}"))
    out: dict[str, Any] = {"splits": {}, "by_source": {}, "by_recipe": {}}
    for split in ("fit", "held-out", "all"):
        chosen = [c for c in cases if split == "all" or c.split == split]
        out["splits"][split] = stats(chosen)
    groups: dict[str, list[Case]] = defaultdict(list)
    recipes: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        if c.split == "held-out":
            groups[c.source].append(c)
            recipes[c.recipe_group].append(c)
    out["by_source"] = {k: stats(v) for k, v in sorted(groups.items())}
    out["by_recipe"] = {k: stats(v) for k, v in sorted(recipes.items())}
    out["verdict"] = verdicts(cases)
    out["skipped_rows"] = [{"row": s.row_id, "reason": s.reason} for s in skips]
    out["_cases"] = cases
    return out


def _p(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def measure(folder: Path | None = None) -> dict[str, Any]:
    """The aggregates for bench/run.py (no per-row values); skipped without the folder."""
    from tools.core.errors import InputError

    try:
        result = evaluate(folder)
    except InputError as exc:
        if "no memory.tsv" in str(exc):
            return {"skipped": str(exc)}
        raise
    return {k: v for k, v in result.items() if k != "_cases"}


def render(result: dict[str, Any]) -> str:
    """The tables, then every row's prediction (stdout only)."""
    lines = render_tables(result)
    lines.append("")
    for c in result["_cases"]:
        lines.append(
            f"{c.row_id} {c.split:8} {c.recipe_group:32} {c.quantity:9} measured "
            f"{c.measured / GIB:6.1f} GiB predicted {(c.predicted or 0) / GIB:6.1f} GiB "
            f"({100 * c.error:+.1f}%)"
        )
    for s in result["skipped_rows"]:
        lines.append(f"{s['row']} skipped: {s['reason']}")
    return "\n".join(lines)


def render_tables(result: dict[str, Any]) -> list[str]:
    """Markdown tables: per split, per source and per recipe (held-out), and the verdict."""
    lines = ["| rows | n | median abs error | within 8% | within 15% | worst over | worst under |"]
    lines.append("|---|---|---|---|---|---|---|")

    def row(name: str, s: dict[str, Any]) -> str:
        if not s.get("rows"):
            return f"| {name} | 0 | - | - | - | - | - |"
        return (
            f"| {name} | {s['rows']} | {_p(s['median_abs_error'])} | {_p(s['within_8'])} | "
            f"{_p(s['within_15'])} | {_p(s['worst_over'])} | {_p(s['worst_under'])} |"
        )

    for split, s in result["splits"].items():
        lines.append(row(split, s))
    for name, s in result["by_source"].items():
        lines.append(row(f"held-out {name}", s))
    for name, s in result["by_recipe"].items():
        lines.append(row(f"held-out {name}", s))
    v = result["verdict"]
    lines.append("")
    worst = ", ".join(f"{m['row']} {m['margin']:.1%}" for m in v["margin_needed"])
    lines.append(
        f"Fit check on the {v['ran']} rows that ran: {v['called_fits_safe']} fit with the "
        f"{v['safe_headroom']:.0%} margin, {v['called_tight']} tight (between "
        f"{v['headroom']:.0%} and {v['safe_headroom']:.0%} free), {len(v['false_alarms'])} "
        f"called does not fit ({', '.join(v['false_alarms']) or 'none'}). No row ran out of "
        f"memory, so none could be wrongly called fits. Headroom that would have covered each "
        f"under-prediction, worst first: {worst}."
    )
    skipped = [f"{s['row']} ({s['reason']})" for s in result["skipped_rows"]]
    lines.append("")
    lines.append(f"Skipped: {'; '.join(skipped) or 'none'}.")
    return lines


def _explain_row(row_id: str, folder: Path | None = None) -> int:
    """One row's mapping, terms and notes (what a reader checks a miss with)."""
    from tools.core.errors import InputError

    rows = [r for r in read_rows(folder) if r["row_id"] == row_id]
    if not rows:
        raise InputError("--row", f"no row {row_id!r} in {TSV}")
    case = map_row(rows[0], folder)
    if isinstance(case, Skip):
        print(f"{row_id} skipped: {case.reason}")
        return 0
    predict(case)
    shown = {k: v for k, v in case.kwargs.items() if k not in ("model", "hardware")}
    print(f"{row_id} {case.recipe_group}: {shown}")
    print(f"measured {case.measured / GIB:.2f} GiB {case.quantity}, predicted "
          f"{(case.predicted or 0) / GIB:.2f} GiB ({100 * case.error:+.1f}%)")  # fmt: skip
    for note in case.notes:
        print(f"  {note}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The CLI: tables and rows on stdout, aggregates to ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the aggregates here")
    parser.add_argument(
        "--fit", action="store_true", help="print the allocator slack the fit rows imply"
    )
    parser.add_argument("--row", help="print one row's terms and the model's notes")
    parser.add_argument(
        "--folder", type=Path, help="the published folder (default: published.py's)"
    )
    parser.add_argument(
        "--baseline", type=Path, help="a checkout of the planner before recipes, to compare"
    )
    args = parser.parse_args(argv)
    from tools.core.errors import InputError

    if args.baseline:
        sys.path.insert(0, str(args.baseline.resolve()))
        for mod in [m for m in sys.modules if m.startswith("tools")]:
            del sys.modules[mod]
    try:
        if args.fit:
            slack = fit_slack()
            print(f"allocator slack (fit rows, median reserved/allocated - 1): {slack}")
            return 0
        if args.row:
            return _explain_row(args.row, args.folder)
        result = evaluate(args.folder, legacy=bool(args.baseline))
    except InputError as exc:
        print(f"published memory: {exc}", file=sys.stderr)
        return 0 if "no memory.tsv" in str(exc) else 2
    print(render(result))
    if args.json:
        args.json.write_text(
            json.dumps({k: v for k, v in result.items() if k != "_cases"}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
