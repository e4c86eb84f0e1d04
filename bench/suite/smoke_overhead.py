"""Smoke-run overhead: our 30-step smoke run vs a minimal hand-written DeepSpeed script.

Run ``python bench/suite/smoke_overhead.py [--repeats 3]`` from the repository root. Each repeat
runs, interleaved, (a) ``app.py smoke --model gpt2 --strategy zero2`` (2 CPU ranks, 30 steps)
and (b) ``deepspeed`` with bench/suite/minimal_ds_train.py on the same model config and DeepSpeed
config that run (a) wrote, same steps, batch and sequence length, same environment (CPU
accelerator, threads per rank, the shared-memory op build skipped in both). Wall time of each
whole command (launcher, imports, model build, 30 steps, exit) is measured; the JSON and the
printed table give the medians and the ratio. Writes bench/results/<date>-smoke-overhead.json.

``--profile DIR`` instead runs one smoke run with every Python process of it (the CLI, the
DeepSpeed runner and launcher, each rank) under pyinstrument, through a ``sitecustomize``
hook on PYTHONPATH, and writes one text profile per process into DIR.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / f"{datetime.date.today().isoformat()}-smoke-overhead.json"


def _time(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - start


# Started in every Python process whose PYTHONPATH holds it (the CLI, the launchers, the
# ranks): a pyinstrument profile of the whole process, written at exit.
PROFILE_HOOK = """\
import atexit, os, sys
_out = os.environ.get("SMOKE_PROFILE_OUT")
if _out and "-S" not in sys.orig_argv[1:2]:
    from pyinstrument import Profiler

    _profiler = Profiler(interval=0.001)
    _profiler.start()

    def _save():
        _profiler.stop()
        name = os.path.basename(sys.argv[0]) or "python"
        if name == "__main__.py" or name.startswith("-"):
            name = "python"
        name = name.removesuffix(".py")
        rank = os.environ.get("RANK")
        tag = f"{name}-rank{rank}" if rank and name in ("train", "parallel_train") else name
        path = os.path.join(_out, f"{tag}-{os.getpid()}.txt")
        with open(path, "w") as fh:
            fh.write(_profiler.output_text(unicode=True, color=False))

    atexit.register(_save)
"""


def profile(out_dir: Path, work: Path, env: dict[str, str]) -> int:
    """One smoke run with every Python process of it under pyinstrument; profiles in out_dir."""
    hook = work / "hook"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(PROFILE_HOOK)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(
        env,
        PYTHONPATH=os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")])),
        SMOKE_PROFILE_OUT=str(out_dir.resolve()),
    )
    for i in range(2):  # the first fills the caches a user's second run would find
        seconds = _time(
            [sys.executable, "app.py", "smoke", "--model", "gpt2", "--strategy", "zero2",
             "--run-dir", str(work / f"profiled{i}")],
            env if i == 1 else {k: v for k, v in env.items() if k != "SMOKE_PROFILE_OUT"},
            ROOT,
        )  # fmt: skip
        print(f"{'profiled' if i else 'warm-up'} run: {seconds:.1f} s", flush=True)
    for path in sorted(out_dir.glob("*.txt")):
        print(f"wrote {path}")
    return 0


def main() -> int:
    """Run the interleaved pairs and write the medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="profile one run instead (pyinstrument)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="smoke-overhead-"))
    env = dict(os.environ, TRAINWRIGHT_HOME=str(work / "home"), PYTHONUNBUFFERED="1")
    if args.profile is not None:
        return profile(args.profile, work, env)
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
        # The environment the smoke runner gives its ranks (tools/smoke/commands.py _child_env).
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
                 "--master_port", str(29600 + i), str(ROOT / "bench" / "suite" / "minimal_ds_train.py"),
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
