"""Smoke-run overhead: our 30-step smoke run vs a minimal hand-written DeepSpeed script.

Run ``python bench/smoke_overhead.py [--repeats 3]`` from the repository root. Each repeat
runs, interleaved, (a) ``app.py smoke --model gpt2 --strategy zero2`` (2 CPU ranks, 30 steps)
and (b) ``deepspeed`` with bench/minimal_ds_train.py on the same model config and DeepSpeed
config that run (a) wrote, same steps, batch and sequence length, same environment (CPU
accelerator, threads per rank, the shared-memory op build skipped in both). Wall time of each
whole command (launcher, imports, model build, 30 steps, exit) is measured; the JSON and the
printed table give the medians and the ratio. Writes bench/smoke_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().with_name("smoke_overhead.json")


def _time(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - start


def main() -> int:
    """Run the interleaved pairs and write the medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="smoke-overhead-"))
    env = dict(os.environ, TRAINWRIGHT_HOME=str(work / "home"), PYTHONUNBUFFERED="1")
    ours: list[float] = []
    minimal: list[float] = []
    # Repeat 0 is a warm-up (page cache, DeepSpeed's JIT op cache for the minimal script),
    # left out of the figures.
    for i in range(args.repeats + 1):
        run_dir = work / f"run{i}"
        ours.append(
            _time(
                [sys.executable, "app.py", "smoke", "--model", "gpt2", "--strategy", "zero2",
                 "--run-dir", str(run_dir)],
                env,
                ROOT,
            )
        )  # fmt: skip
        result = json.loads((run_dir / "result.json").read_text())
        assert result["status"] == "passed", result["reason"]
        shape = result["model_shape"]
        # The environment the smoke runner gives its ranks (tools/smoke.py _child_env).
        child = dict(
            env,
            DS_ACCELERATOR="cpu",
            OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // 2)),
            MALLOC_MMAP_THRESHOLD_="65536",
        )
        minimal.append(
            _time(
                [sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile",
                 str(run_dir / "no-hostfile"), "--num_gpus", "2", "--master_addr", "127.0.0.1",
                 "--master_port", str(29600 + i), str(ROOT / "bench" / "minimal_ds_train.py"),
                 "--model-config", str(run_dir / "model_config.json"),
                 "--deepspeed_config", str(run_dir / "ds_config.json"),
                 "--steps", "30", "--seq-len", str(shape["seq_len"]),
                 "--micro-batch", str(shape["micro_batch_size"])],
                child,
                ROOT,
            )
        )  # fmt: skip
        print(f"repeat {i}: smoke {ours[-1]:.1f} s, minimal {minimal[-1]:.1f} s", flush=True)
        if i == 0:
            ours.clear()
            minimal.clear()
    report = {
        "what": "wall time of a 30-step gpt2 ZeRO-2 run on 2 CPU ranks, whole command",
        "repeats": args.repeats,
        "smoke_s": ours,
        "minimal_s": minimal,
        "smoke_median_s": statistics.median(ours),
        "minimal_median_s": statistics.median(minimal),
        "ratio": statistics.median(ours) / statistics.median(minimal),
        "cpus": os.cpu_count(),
    }
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"| smoke run | minimal DeepSpeed script | ratio |\n|---|---|---|\n"
        f"| {report['smoke_median_s']:.1f} s | {report['minimal_median_s']:.1f} s | "
        f"{report['ratio']:.2f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
