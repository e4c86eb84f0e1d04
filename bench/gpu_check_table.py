"""Measured vs predicted GPU memory of the GPU-check runs, with the memory model as it is now.

``python bench/gpu_check_table.py [FILES...]`` (default: bench/gpu_check.json and
bench/gpu_check_validation.json) prints one Markdown row per smoke run: measured
``max_memory_allocated``, the planner's prediction for the same shape recomputed now (pure
arithmetic, so a changed model can be judged against the same measurements), the gap, the NVML
per-process reading, step time, tokens/s, MFU and the loss.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT = [ROOT / "bench" / "gpu_check.json", ROOT / "bench" / "gpu_check_validation.json"]


def main(argv: list[str]) -> int:
    """Print the table and the median absolute gap of the DeepSpeed runs."""
    from tools.smoke import predict_peak_bytes

    gib = 2**30
    print(
        "| run | status | seq x micro | measured GiB | predicted GiB | gap | NVML GiB | step s "
        "| tokens/s | MFU | loss |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    gaps = []
    for path in [Path(p) for p in argv] or DEFAULT:
        report = json.loads(path.read_text())
        for case in report["cases"]:
            if "result" not in case:
                continue
            res = case["result"]
            shape = res["model_shape"]
            predicted = predict_peak_bytes(shape, res["strategy"], "cuda", res["world_size"])
            measured = res["peak_memory_bytes"]
            gap = measured / predicted - 1
            if res["strategy"] != "ddp":
                gaps.append(abs(gap))
            mfu = f"{res['mfu']:.1%}" if res.get("mfu") is not None else "-"
            print(
                f"| {case['label']} | {res['status']} | {shape['seq_len']} x "
                f"{shape['micro_batch_size']} | {measured / gib:.2f} | {predicted / gib:.2f} | "
                f"{gap:+.1%} | {(res.get('process_gpu_memory_bytes') or 0) / gib:.2f} | "
                f"{res['step_time_s']:.3f} | {res['tokens_per_s']:,.0f} | {mfu} | "
                f"{res['losses'][0]:.2f} -> {res['losses'][-1]:.2f} |"
            )
    if gaps:
        print(f"\nDeepSpeed runs: median |gap| {statistics.median(gaps):.1%}, max {max(gaps):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
