"""bench/gpu/gpu_recipes.py: the prepared GPU check of issue 18, run end to end as a CPU dry run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bench.common import run_cmd
from bench.gpu import gpu_recipes

ROOT = Path(__file__).resolve().parents[2]
LABELS = ["pure-bf16", "adam8bit", "grad-accum-4", "fsdp2", "lora"]


def test_errors_are_predicted_over_measured_and_only_for_gpu_runs() -> None:
    record = {
        "status": "ok",
        "prediction": {"peak_allocated_bytes": 110, "peak_reserved_bytes": 90},
        "run": {"max_memory_allocated_bytes": 100, "max_memory_reserved_bytes": 100},
    }
    gpu_recipes._compare(record, dry_run=False)
    assert record["error_allocated"] == pytest.approx(0.10)
    assert record["error_reserved"] == pytest.approx(-0.10)
    assert "error_device_used" not in record  # no NVML reading: no error made up
    dry = {**record, "error_allocated": None}
    dry.pop("error_reserved")
    gpu_recipes._compare(dry, dry_run=True)
    assert "error_reserved" not in dry


@pytest.mark.slow
def test_dry_run_predicts_every_case_before_it_runs(tmp_path: Path) -> None:
    out = tmp_path / "gpu_recipes.json"
    done = run_cmd(
        [
            sys.executable,
            "bench/gpu/gpu_recipes.py",
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(out),
        ],
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.output[-3000:]
    data = json.loads(out.read_text())
    assert data["dry_run"] is True and data["what"].startswith("DRY RUN")
    assert "H200" in data["predicted_for"]
    assert [c["label"] for c in data["cases"]] == LABELS
    eight_bit = any(importlib.util.find_spec(m) for m in ("bitsandbytes", "torchao"))
    by_label = {c["label"]: c for c in data["cases"]}
    for case in data["cases"]:
        pred, run = case["prediction"], case["run"]
        assert 0 < pred["peak_allocated_bytes"] <= pred["peak_reserved_bytes"]
        assert pred["peak_reserved_bytes"] <= pred["device_used_bytes"]
        # The case's own process found its prediction on disk when it started.
        assert pred["predicted_at"] < run["started_at"]
        assert run["prediction_on_disk"] == {
            k: pred[k] for k in ("predicted_at", "peak_allocated_bytes", "peak_reserved_bytes")
        }
        assert not any(k.startswith("error_") for k in case)  # a dry run measures nothing
        if case["label"] == "adam8bit" and not eight_bit:
            assert case["status"] == "skipped" and "8-bit Adam" in run["reason"]
            continue
        assert case["status"] == "ok", case
        assert run["micro_steps"] == data["steps"] * run["accumulation"]
        assert all(isinstance(v, float) for v in run["losses"])
        assert run["measured_is"].startswith("DRY RUN") and run["cpu_rss_above_baseline_bytes"] > 0

    assert by_label["pure-bf16"]["run"]["param_dtypes"] == ["torch.bfloat16"]
    assert by_label["fsdp2"]["run"]["param_dtypes"] == ["torch.float32"]  # the sharded master
    lora = by_label["lora"]["run"]
    assert 0 < lora["trainable_params"] < lora["params"] / 2
    accum = by_label["grad-accum-4"]
    assert accum["run"]["accumulation"] == 4
    assert accum["runner"] == ("deepspeed" if importlib.util.find_spec("deepspeed") else "plain")
    assert any("grad accum 4" in note for note in accum["prediction"]["notes"])
    # The recipes are priced differently: 8-bit states are smaller than pure bf16's AdamW.
    terms = {k: by_label[k]["prediction"]["terms_bytes"] for k in ("pure-bf16", "adam8bit")}
    assert terms["adam8bit"]["optimizer"] < terms["pure-bf16"]["optimizer"]
