"""GPU check of the smoke runner's resource limits (issue 8), into one JSON file.

On one CUDA GPU, with the same setup as bench/gpu/gpu_check.sh (DeepSpeed from .whl/ wheels):

1. ``default cap``: gpt2-medium ZeRO-2, 30 steps, under the default memory cap (half the RAM):
   the watchdog must not stop a healthy CUDA run, and no address-space limit is set with CUDA
   (CUDA reserves far more virtual memory than it uses).
2. ``cap``: the same run with ``inject="alloc"`` (rank 0 allocates host memory from step 3)
   under a 6 GiB cap: the verdict must be ``oom`` naming the cap, and nothing may be left.
3. ``ctrl-c``: a supervisor process (stop_runs_on_interrupt + run_smoke_test, as the CLI does)
   gets SIGINT on its process group once the run has reached step 3: how long it takes to
   exit, and whether any process of the run or any GPU compute process is left.

    bash bench/gpu/gpu_check.sh is the setup; run this one as
    PYTHONPATH=<site> python3 bench/gpu/gpu_limits.py --out DIR/gpu_limits.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GIB = 2**30
SUPERVISOR = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from tools.research.model_catalog import lookup_model
from tools.core.settings import Settings, disable_telemetry
from tools.smoke import DeepSpeedRun, SmokeSpec, run_smoke_test, stop_runs_on_interrupt
from tools.artifacts.deepspeed_config import smoke_ds_config
from tools.research.hardware import profile_local
disable_telemetry()
stop_runs_on_interrupt()
model = lookup_model("gpt2-medium", 1024)
gpu = profile_local().gpu
config = smoke_ds_config(model, "zero2", world_size=1, micro_batch_size=8, gpu=gpu)
try:
    spec = SmokeSpec(mode=DeepSpeedRun(config), steps=400, micro_batch_size=8, seq_len=1024,
                     world_size=1, strategy="zero2", run_dir=Path({run_dir!r}), timeout_s=240)
    r = run_smoke_test(model, spec, Settings.load(),
                       on_progress=lambda line: print(line, flush=True))
    print("RESULT", r.status, r.reason, flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    sys.exit(130)
"""


def leftovers(marker: str) -> list[str]:
    """Live processes whose command line or environment names ``marker``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            if "\nState:\tZ" in status:
                continue
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd or marker.encode() in env:
            shown = cmd.replace(b"\0", b" ").decode(errors="replace")[:120]
            found.append(f"{pid}: {shown}")
    return found


def gpu_apps() -> list[str]:
    """Compute processes nvidia-smi sees on the GPU."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [line for line in out.stdout.splitlines() if line.strip()]


def main() -> int:
    """Run the three checks and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "gpu_out" / "gpu_limits.json")
    args = parser.parse_args()

    import torch

    from tools.artifacts.deepspeed_config import smoke_ds_config
    from tools.core.settings import Settings, disable_telemetry
    from tools.research.hardware import profile_local
    from tools.research.model_catalog import lookup_model
    from tools.smoke import DeepSpeedRun, SmokeSpec, default_memory_cap, run_smoke_test

    disable_telemetry()
    if not torch.cuda.is_available():
        print("gpu_limits: no CUDA device; nothing to check", file=sys.stderr)
        return 2
    settings = Settings.load()
    gpu = profile_local().gpu
    model = lookup_model("gpt2-medium", 1024)
    config = smoke_ds_config(model, "zero2", world_size=1, micro_batch_size=8, gpu=gpu)
    runs = args.out.parent / "gpu_limits_runs"
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "gpu": torch.cuda.get_device_name(0),
        "default_memory_cap_bytes": default_memory_cap(),
        "checks": {},
    }

    def write() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    for label, extra in (
        ("default cap", {}),
        ("cap", {"inject": "alloc", "memory_cap": 6 * GIB}),
    ):
        print(f"== {label}", flush=True)
        run_dir = runs / label.replace(" ", "-")
        start = time.monotonic()
        spec = SmokeSpec(
            mode=DeepSpeedRun(config),
            steps=30,
            micro_batch_size=8,
            seq_len=1024,
            world_size=1,
            strategy="zero2",
            run_dir=run_dir,
            timeout_s=150,
            **extra,
        )
        result = run_smoke_test(
            model, spec, settings, on_progress=lambda line: print("  " + line, flush=True)
        )
        wall = time.monotonic() - start
        time.sleep(1.0)
        launch = json.loads((run_dir / "launch.json").read_text())
        report["checks"][label] = {
            "status": result.status,
            "reason": result.reason,
            "wall_s": round(wall, 1),
            "memory_gap": result.memory_gap,
            "peak_memory_bytes": result.peak_memory_bytes,
            "memory_cap_bytes": launch.get("memory_cap_bytes"),
            "address_space_limit_bytes": launch.get("address_space_limit_bytes"),
            "left_running": leftovers(str(run_dir)),
            "gpu_apps_after": gpu_apps(),
        }
        print(f"   {report['checks'][label]}", flush=True)
        write()

    print("== ctrl-c", flush=True)
    run_dir = runs / "ctrl-c"
    code = SUPERVISOR.format(root=str(ROOT), run_dir=str(run_dir))
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    seen = []
    reached = False
    guard = time.monotonic() + 200
    for line in proc.stdout:
        seen.append(line.rstrip())
        if "step 3/" in line:
            reached = True
            break
        if time.monotonic() > guard:
            break
    apps_before = gpu_apps()
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        rest, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
    exit_s = time.monotonic() - sent
    time.sleep(1.0)
    report["checks"]["ctrl-c"] = {
        "reached_step_3": reached,
        "gpu_apps_before": apps_before,
        "returncode": proc.returncode,
        "exit_s_after_sigint": round(exit_s, 2),
        "last_lines": (seen + (rest or "").splitlines())[-4:],
        "left_running": leftovers(str(run_dir)),
        "gpu_apps_after": gpu_apps(),
    }
    print(f"   {report['checks']['ctrl-c']}", flush=True)
    write()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
