"""Measured vs predicted GPU memory of the GPU-check runs, with the memory model as it is now.

``python bench/gpu/gpu_check_table.py [FILES...]`` (default: the recorded H200 runs,
bench/results/2026-11-29-gpu-check-h200.json and -gpu-check-validation-h200.json) prints one Markdown row per smoke run: measured
``max_memory_allocated``, the planner's prediction for the same shape recomputed now (pure
arithmetic, so a changed model can be judged against the same measurements), the gap, the NVML
per-process reading, step time, tokens/s, MFU and the loss. ``gpu_rows`` gives the same
records to bench/run.py.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import GPU_CHECK_RUNS  # noqa: E402  (after the path set-up above)

DEFAULT = GPU_CHECK_RUNS


def gpu_rows(paths: list[Path] | None = None) -> list[dict[str, Any]]:
    """One record per GPU-check smoke run: measured peak, prediction now and when run, gap."""
    from tools.smoke import predict_peak_bytes

    rows: list[dict[str, Any]] = []
    for path in paths or DEFAULT:
        report = json.loads(Path(path).read_text())
        for case in report["cases"]:
            if "result" not in case:
                continue
            res = case["result"]
            shape = res["model_shape"]
            predicted = predict_peak_bytes(shape, res["strategy"], "cuda", res["world_size"])
            measured = res["peak_memory_bytes"]
            rows.append(
                {
                    "file": Path(path).name,
                    "when": report.get("when"),
                    "gpu": (report.get("machine") or {}).get("gpu"),
                    "label": case["label"],
                    "status": res["status"],
                    "strategy": res["strategy"],
                    "world_size": res["world_size"],
                    "seq_len": shape["seq_len"],
                    "micro_batch_size": shape["micro_batch_size"],
                    "measured_bytes": measured,
                    "predicted_bytes": predicted,
                    "predicted_when_run_bytes": res.get("predicted_peak_memory_bytes"),
                    "gap": measured / predicted - 1,
                    "error": predicted / measured - 1,
                    "process_gpu_memory_bytes": res.get("process_gpu_memory_bytes"),
                    "step_time_s": res["step_time_s"],
                    "tokens_per_s": res["tokens_per_s"],
                    "mfu": res.get("mfu"),
                    "loss_first": res["losses"][0],
                    "loss_last": res["losses"][-1],
                }
            )
    return rows


def main(argv: list[str]) -> int:
    """Print the table and the median absolute gap of the DeepSpeed runs."""
    gib = 2**30
    print(
        "| run | status | seq x micro | measured GiB | predicted GiB | gap | NVML GiB | step s "
        "| tokens/s | MFU | loss |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    gaps = []
    for row in gpu_rows([Path(p) for p in argv] or None):
        if row["strategy"] != "ddp":
            gaps.append(abs(row["gap"]))
        mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "-"
        print(
            f"| {row['label']} | {row['status']} | {row['seq_len']} x "
            f"{row['micro_batch_size']} | {row['measured_bytes'] / gib:.2f} | "
            f"{row['predicted_bytes'] / gib:.2f} | {row['gap']:+.1%} | "
            f"{(row['process_gpu_memory_bytes'] or 0) / gib:.2f} | "
            f"{row['step_time_s']:.3f} | {row['tokens_per_s']:,.0f} | {mfu} | "
            f"{row['loss_first']:.2f} -> {row['loss_last']:.2f} |"
        )
    if gaps:
        print(f"\nDeepSpeed runs: median |gap| {statistics.median(gaps):.1%}, max {max(gaps):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
