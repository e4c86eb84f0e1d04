"""bench/gpu/gpu_job.py: the prepared GPU check of issue 19, run end to end as a CPU dry run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import run_cmd
from bench.gpu import gpu_job

ROOT = Path(__file__).resolve().parents[2]


def test_the_script_parses() -> None:
    done = subprocess.run(
        ["bash", "-n", str(ROOT / "bench" / "gpu" / "gpu_job.sh")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_measured_is_the_median_after_warm_up(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    rank0 = {
        "status": "ok",
        "device": "cuda",
        "step_times_s": [9.0, 3.0, 1.0, 2.0, 1.5],
        "tokens_per_step": 3000,
        "peak_memory_bytes": 100,
        "micro_batch": 4,
        "grad_accum": 2,
    }
    (metrics / "rank0.json").write_text(json.dumps(rank0))
    (metrics / "metrics.jsonl").write_text('{"step": 1, "tokens_per_s": 333.3}\n')
    got = gpu_job._measured(tmp_path, warmup=2)
    assert got["status"] == "ok" and got["steady_steps"] == 3
    assert got["step_time_median_s"] == 1.5 and got["tokens_per_s"] == 2000.0
    assert got["logged_tokens_per_s"] == [333.3]
    assert gpu_job._measured(tmp_path / "none", warmup=2)["status"] == "failed"


def test_errors_are_predicted_over_measured_and_only_for_gpu_runs() -> None:
    record = {
        "status": "ok",
        "prediction": {
            "peak_allocated_bytes": 110, "step_time_s": 0.9, "tokens_per_s": 1100.0,
            "micro_batch_size": 4, "gradient_accumulation_steps": 2,
        },
        "measured": {
            "peak_memory_bytes": 100, "step_time_median_s": 1.0, "tokens_per_s": 1000.0,
            "micro_batch": 4, "grad_accum": 1,
        },
    }  # fmt: skip
    gpu_job._compare(record, dry_run=False)
    assert record["error_peak_allocated"] == pytest.approx(0.10)
    assert record["error_step_time"] == pytest.approx(-0.10)
    assert record["error_tokens_per_s"] == pytest.approx(0.10)
    assert "error_device_used" not in record  # no NVML reading: no error made up
    assert record["same_batch"] is False
    dry = {k: v for k, v in record.items() if not k.startswith("error_")}
    gpu_job._compare(dry, dry_run=True)
    assert not any(k.startswith("error_") for k in dry)


@pytest.mark.slow
def test_dry_run_runs_the_generated_launch_for_full_and_lora(tmp_path: Path) -> None:
    env_py = str(Path(sys.executable))
    done = run_cmd(
        ["bash", "bench/gpu/gpu_job.sh", str(tmp_path)],
        timeout=300,
        env={**os.environ, "PYTHON": env_py, "DEVICE": "cpu", "TINY": "1"},
        check=False,
    )
    assert done.returncode == 0, done.output[-3000:]
    data = json.loads((tmp_path / "gpu_job.json").read_text())
    assert data["dry_run"] is True and data["what"].startswith("DRY RUN")
    assert data["predicted_for"] == "1xH200"
    saved = data["saved"]
    assert saved["status"] == "ok" and saved["data_tokens"] > 0
    assert saved["tokenizer_vocab"] <= saved["model_vocab"]
    assert [c["label"] for c in data["cases"]] == ["full", "lora"]
    by_label = {c["label"]: c for c in data["cases"]}
    for case in data["cases"]:
        pred, run = case["prediction"], case["measured"]
        assert case["status"] == "ok", case.get("output_tail")
        assert 0 < pred["peak_allocated_bytes"] <= pred["peak_reserved_bytes"]
        assert pred["step_time_s"] > 0 and pred["tokens_per_s"] > 0
        assert case["command"][:2] == ["bash", "launch.sh"]
        assert "--model-path" in pred["launch_sh"]
        assert run["steps"] == data["steps"] == len(run["step_times_s"])
        assert run["step_time_median_s"] > 0 and run["tokens_per_s"] > 0
        assert run["logged_rows"] == data["steps"]  # --log-every 1 reached train.py
        assert run["peak_memory_bytes"] > 0 and run["local_param_bytes"] > 0
        assert run["measured_is"].startswith("DRY RUN")
        assert not any(k.startswith("error_") for k in case)  # a dry run measures nothing
    full, lora = by_label["full"]["measured"], by_label["lora"]["measured"]
    assert full["trainable_params"] == full["params"] == saved["params"]
    assert full["lora_rank"] == 0 and lora["lora_rank"] == gpu_job.LORA_RANK
    assert 0 < lora["trainable_params"] < lora["params"] / 2
    for case in data["cases"]:  # the plan priced the parameters the job trained
        assert case["measured"]["trainable_params"] == case["prediction"]["trainable_params"]
    # The model that trained is the saved one: the same first-step loss for both jobs.
    assert full["losses"][0] == pytest.approx(lora["losses"][0], rel=1e-4)
