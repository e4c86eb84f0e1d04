"""The sizing against published runs: ``python bench/calibration/published_sizing.py``.

Every run of ``memory.tsv`` (``../shared/published``, or ``TRAINWRIGHT_PUBLISHED=DIR``) ran on
its GPU type and count, so the sizing (tools/planning/sizing.py) should call that type and
count fitting. Each row is mapped as bench/calibration/published_memory.py maps it (model,
GPU with the row's memory, recipe), but nothing is pinned: the sizing's own search at the
row's count, with the row's sequence length and global batch (micro-batch x accumulation x
data-parallel ranks). Rows whose GPU memory is not stated ("A100" alone) are left out, and
so are rows published_memory.py cannot map (it says why).

Rows published_memory.py leaves out only because it pins one setup and their recompute policy
(or fp4 recipe) is not stated are asked about too: the sizing searches the policy itself, and
prices fp4 as fp8 (an upper bound: fp4 linears store less).

Two kinds of row cannot be confirmed by design, and are classed, not hidden:
- ``edge``: the run itself left less than ``MIN_HEADROOM`` of the GPU free (measured), so
  the sizing, which demands that margin, cannot call it fitting; it must at least predict
  the setup past the safe margin (tight or over);
- ``host RAM``: the sizing's setup there fits the GPU only with offload, and the row does not
  state its node's host RAM; the sizing must then name host RAM as what binds.

Printed per row: the run, the sizing's verdict and setup at its count, and the least count of
that GPU the sizing calls fitting. Nothing of the data is stored. Exit 0 (also without the
folder: one line says so), 2 for bad input.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# A GPU cell that names a part sold in several memory sizes without saying which.
UNSTATED = re.compile(r"^\s*a100\b(?!.*\d+\s*gb)", re.I)


@dataclass
class SizingCase:
    """One published run as a sizing question at its own GPU type and count."""

    row_id: str
    model: Any  # ModelSpec
    brief: Any  # TrainingBrief
    gpu: Any  # GPUSpec, with the row's memory
    count: int
    measured_share: float  # the row's measured memory over its GPU's
    label: str


def states_memory(row: dict[str, str]) -> bool:
    """Whether the row's GPU memory is known: stated, or the part comes in one size."""
    return bool(row.get("gpu_mem_capacity")) or not UNSTATED.match(row["gpu"])


def sizing_cases(folder: Path | None = None) -> tuple[list[SizingCase], list[tuple[str, str]]]:
    """The rows as sizing questions, and (row id, why) for every row left out."""
    from bench.calibration import published_memory as pm
    from bench.calibration.published import Skip
    from tools.core.schemas import MemoryRecipe, TrainingBrief

    cases, left = [], []
    for row in pm.read_rows(folder):
        if not states_memory(row):
            left.append((row["row_id"], "GPU memory not stated"))
            continue
        case = pm.map_row(row)
        if isinstance(case, Skip):
            opened = _unpinned(row) if case.reason in _SEARCHED else None
            if opened is None:
                left.append((row["row_id"], case.reason))
            else:
                cases.append(opened)
            continue
        kw = case.kwargs
        hw, model = kw["hardware"], kw["model"]
        recipe = dict(kw["recipe"])
        cp = recipe.pop("context_parallel", 1)
        recipe.pop("gradient_accumulation_steps", None)
        dp = hw.world_size // (kw["tensor_parallel"] * kw["pipeline_parallel"] * cp)
        batch = kw["micro_batch_size"] * kw["gradient_accumulation_steps"] * dp
        brief = TrainingBrief(
            model=model.name,
            task=kw["task"],
            seq_len=kw["seq_len"],
            global_batch_size=batch,
            recipe=MemoryRecipe(**recipe),
        )
        label = f"{row['model']}, {kw['task']}, seq {kw['seq_len']}, {case.recipe_group}"
        cases.append(
            SizingCase(
                row["row_id"], model, brief, hw.gpu, hw.world_size,
                case.measured / case.capacity, label,
            )
        )  # fmt: skip
    return cases, left


# Rows published_memory.py cannot pin (it predicts one setup) that a sizing still can ask
# about: the sizing searches the recompute policy itself, and an fp4 run is priced as fp8
# (fp4 linears store less, so a fit at fp8 is a fit at fp4).
_SEARCHED = ("activation checkpointing not stated", "fp4 precision: not modelled")
_CAPACITY = re.compile(r"(\d+(?:\.\d+)?)\s*(GiB|GB)", re.I)
_INT = re.compile(r"\d+")


def _unpinned(row: dict[str, str]) -> SizingCase | None:
    """A torchtitan row with its recompute (or fp4) unstated, as a sizing question, or None."""
    from bench.calibration.published_memory import GPUS, MODELS
    from tools.core.schemas import MemoryRecipe, TrainingBrief
    from tools.research.hardware import find_gpu
    from tools.research.model_catalog import lookup_model

    name, cell = row["model"].lower(), row["gpu"].lower()
    model_id = next((m for key, m in MODELS if name.startswith(key)), None)
    rule = next((g for g in GPUS if g[0] in cell), None)
    capacity = _CAPACITY.search(row.get("gpu_mem_capacity", ""))
    numbers = [_INT.search(row[k]) for k in ("seq_len", "micro_batch", "n_gpus", "memory_value")]
    if model_id is None or rule is None or rule[1] is None or capacity is None or None in numbers:
        return None
    seq, micro, n = (int(m[0]) for m in numbers[:3] if m is not None)
    gib = capacity[2].lower() == "gib"
    memory_gb = float(capacity[1]) * (2**30 / 1e9 if gib else 1.0)
    low = any(p in row["precision"].lower() for p in ("fp8", "fp4"))
    unit = 2**30 if row["memory_unit"].strip() == "GiB" else 1e9
    measured = float(row["memory_value"]) * unit / (memory_gb * 1e9)
    model = lookup_model(model_id, seq)
    brief = TrainingBrief(
        model=model.name,
        task="finetune",
        seq_len=seq,
        global_batch_size=micro * n,
        recipe=MemoryRecipe(framework="torchtitan", precision="fp8" if low else "bf16"),
    )
    label = (
        f"{row['model']}, finetune, seq {seq}, torchtitan {row['precision']} "
        "(recompute not stated: searched"
        + ("; fp4 priced as fp8)" if "fp4" in row["precision"].lower() else ")")
    )
    gpu = find_gpu(rule[1]).model_copy(update={"memory_gb": round(memory_gb, 1)})
    return SizingCase(row["row_id"], model, brief, gpu, n, measured, label)


def verdict(case: SizingCase) -> tuple[str, Any]:
    """The sizing's row at the run's count, and its class: fits, edge, host RAM or miss."""
    from tools.core.strategies import MIN_HEADROOM, SAFE_HEADROOM
    from tools.planning.sizing import size_count

    row = size_count(case.model, case.brief, case.gpu, case.count)
    if row.fit != "does not fit":
        return "fits", row
    if case.measured_share > 1 - MIN_HEADROOM:
        over = row.memory_share is not None and row.memory_share > 1 - SAFE_HEADROOM
        return ("edge" if over else "miss"), row
    if row.note.startswith("host RAM for offload"):
        return "host RAM", row
    return "miss", row


def least_count(case: SizingCase) -> int | None:
    """The least count of the run's GPU that the sizing calls fitting, up to the run's count."""
    from tools.planning.sizing import counts_for, size_count

    for count in counts_for(8, case.count, False):
        if size_count(case.model, case.brief, case.gpu, count).fit != "does not fit":
            return count
    return None


def main() -> int:
    """Print the comparison, one line per row."""
    from tools.core.errors import InputError

    try:
        cases, left = sizing_cases()
    except InputError as exc:
        print(f"published sizing: {exc}", file=sys.stderr)
        return 0 if "no memory.tsv" in str(exc) else 2
    tally: dict[str, int] = {}
    for case in cases:
        kind, row = verdict(case)
        tally[kind] = tally.get(kind, 0) + 1
        least = least_count(case)
        gpu = getattr(case.gpu, "name", "")
        print(
            f"{case.row_id} {case.count} x {gpu} ({case.gpu.memory_gb:g} GB), {case.label}: "
            f"measured {case.measured_share:.0%} of the GPU; sizing at {case.count}: {kind} "
            f"({row.setup or row.note[:80]}, predicted "
            f"{(row.memory_share or 0):.0%}); least count that fits: {least}"
        )
    for row_id, why in left:
        print(f"{row_id} left out: {why}")
    print(f"{len(cases)} runs: " + ", ".join(f"{n} {k}" for k, n in sorted(tally.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
