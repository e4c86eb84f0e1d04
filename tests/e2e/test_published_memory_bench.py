"""bench/calibration/published_memory.py on made-up rows in memory.tsv's layout (no published row is used)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.calibration import published_memory as pm

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = [
    "row_id", "source", "locator", "framework", "model", "params", "n_layers", "hidden",
    "n_heads", "n_kv_heads", "vocab", "seq_len", "gpu", "gpu_mem_capacity", "n_gpus", "dp",
    "dp_sharding", "tp", "pp", "cp", "act_ckpt", "micro_batch", "grad_accum", "precision",
    "optimizer", "offload", "other_opts", "memory_value", "memory_unit", "memory_metric", "kind",
    "tokens_per_s_per_gpu", "status", "notes",
]  # fmt: skip
TITAN = "pytorch/torchtitan@0000000:benchmarks/made_up_202412.md"


def titan_row(row_id: str, **over: str) -> dict[str, str]:
    """A made-up torchtitan FSDP2 row for Llama 3.1 8B on 8 H100s."""
    row = dict.fromkeys(COLUMNS, "")
    row.update({
        "row_id": row_id, "source": TITAN, "locator": "Table X", "framework": "torchtitan (FSDP2)",
        "model": "Llama 3.1 8B", "seq_len": "8192", "gpu": "H100 SXM 96GB HBM2e",
        "gpu_mem_capacity": "96GB", "n_gpus": "8", "dp": "8", "dp_sharding": "FSDP2", "tp": "1",
        "pp": "1", "cp": "1", "act_ckpt": "full", "micro_batch": "1", "grad_accum": "1",
        "precision": "BF16", "optimizer": "AdamW", "offload": "none", "other_opts": "FSDP",
        "memory_value": "40.0", "memory_unit": "GiB", "memory_metric": "max reserved",
        "kind": "measured", "status": "published",
    })  # fmt: skip
    row.update(over)
    return row


def write(folder: Path, rows: list[dict[str, str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "memory.tsv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)
    return folder


def test_rows_map_to_recipes_and_predictions_follow_the_model(tmp_path: Path) -> None:
    rows = [
        titan_row("R1"),
        titan_row("R2", act_ckpt="selective", memory_value="60.0"),
        titan_row("R3", precision="NVFP4"),
        titan_row("R4", act_ckpt=""),
        titan_row("R5", model="Mystery 9B"),
    ]
    result = pm.evaluate(write(tmp_path, rows))
    cases = {c.row_id: c for c in result["_cases"]}
    assert set(cases) == {"R1", "R2"}
    assert cases["R1"].kwargs["recipe"]["checkpointing"] == "full"
    assert cases["R2"].kwargs["recipe"]["checkpointing"] == "selective-op"
    # Per-op selective keeps more than full recompute.
    assert cases["R2"].predicted > cases["R1"].predicted  # type: ignore[operator]
    assert cases["R1"].quantity == "reserved"
    reasons = {s["row"]: s["reason"] for s in result["skipped_rows"]}
    assert "fp4" in reasons["R3"] and "not stated" in reasons["R4"]
    assert "catalog" in reasons["R5"]
    assert result["splits"]["all"]["rows"] == 2
    assert result["verdict"]["ran"] == 2


def test_cli_writes_aggregates_only_and_exits_0_without_data(tmp_path: Path) -> None:
    folder = write(tmp_path / "pub", [titan_row("R1"), titan_row("R2", memory_value="55")])
    out = tmp_path / "agg.json"
    env = {**os.environ, "TRAINWRIGHT_PUBLISHED": str(folder)}
    proc = subprocess.run(
        [sys.executable, "bench/calibration/published_memory.py", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "R1" in proc.stdout and "median abs error" in proc.stdout
    data = json.loads(out.read_text())
    assert "R1" not in json.dumps(data["splits"]) and "_cases" not in data
    env["TRAINWRIGHT_PUBLISHED"] = str(tmp_path / "absent")
    proc = subprocess.run(
        [sys.executable, "bench/calibration/published_memory.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and "no memory.tsv" in proc.stderr
