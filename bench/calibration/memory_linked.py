"""Memory rows that point at a throughput row of the same run (bench/calibration/published_extra).

The project's own ``memory.tsv`` keeps the shared layout, which has no columns for the MLP width,
the experts or the expert-parallel degree; each of its rows names the ``throughput.tsv`` row of
the same run in its notes ("throughput row X0017"). That row is mapped by
``bench.calibration.published.map_row`` (the model from its architecture columns, the catalog
GPU, the pinned layout), and the memory model prices the same setup with the run's framework
recipe: Megatron-LM (distributed optimizer or DDP, sequence parallelism with TP) or DeepSpeed
(ZeRO stage). The quantity is what nvidia-smi shows (``device_used``: the allocator's reserve
plus the CUDA context), as FlagPerf's monitor records it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench.calibration.published import Case as SpeedCase
from bench.calibration.published import Skip, _Skipped
from bench.calibration.published import map_row as map_throughput
from bench.calibration.published import read_rows as read_throughput

LINK = re.compile(r"throughput row (X\d{4})")
GIB = 2**30


def linked(row: dict[str, str]) -> str | None:
    """The throughput row id a memory row names, or None."""
    match = LINK.search(row.get("notes", ""))
    return match[1] if match else None


def framework_of(row: dict[str, str]) -> str:
    """The memory model's recipe framework for the run's framework cell."""
    cell = row["framework"].lower()
    if "megatron" in cell:
        return "megatron"
    if "deepspeed" in cell:
        return "deepspeed"
    raise _Skipped("framework not mapped to a memory recipe (Megatron-LM, DeepSpeed)")


def linked_inputs(row: dict[str, str], folder: Path | None) -> tuple[dict[str, Any], str, float]:
    """The memory model's inputs for the run the throughput row describes.

    estimate_strategy's keywords (with ``model``, ``hardware``, ``recipe``), the recipe group
    and the measured bytes.
    """
    xid = linked(row)
    rows = {r["row_id"]: r for r in read_throughput(folder)}
    if xid not in rows:
        raise _Skipped(f"throughput row {xid} not in the folder")
    speed = map_throughput(rows[xid])
    if isinstance(speed, Skip):
        raise _Skipped(f"throughput row {xid}: {speed.reason}")
    assert isinstance(speed, SpeedCase)
    if row["memory_unit"].strip() != "GiB":
        raise _Skipped(f"memory unit {row['memory_unit']!r} not known")
    setup = dict(speed.setup)
    framework = framework_of(rows[xid])
    strategy = setup.pop("strategy")
    recipe: dict[str, Any] = {
        "framework": framework,
        "precision": setup["precision"],
        "checkpointing": setup["recompute"],
        "gradient_accumulation_steps": setup["gradient_accumulation_steps"],
    }
    if framework == "megatron":
        recipe["distributed_optimizer"] = strategy == "zero1"
        recipe["sequence_parallel"] = bool(setup.get("sequence_parallel", True))
        # Megatron's DDP is ``ddp``: tools/planning/footprint.py ``megatron_states`` shards the
        # optimizer for the flag or a ZeRO strategy, so ``zero1`` here would shard it anyway.
        strategy = "zero1" if recipe["distributed_optimizer"] else "ddp"
    kwargs: dict[str, Any] = {
        "model": speed.model,
        "hardware": speed.hardware,
        "strategy": strategy,
        "task": "pretrain",
        "seq_len": setup["seq_len"],
        "micro_batch_size": setup["micro_batch_size"],
        "tensor_parallel": setup["tensor_parallel"],
        "pipeline_parallel": setup["pipeline_parallel"],
        "gradient_accumulation_steps": setup["gradient_accumulation_steps"],
        "expert_parallel": setup.get("expert_parallel", 1),
        "recipe": recipe,
    }
    moe = (speed.model.active_params or speed.model.params) < speed.model.params
    group = f"{framework} {strategy}" + (" moe" if moe else "")
    return kwargs, group, float(row["memory_value"]) * GIB
