"""Write the launch artifacts: ds_config.json, the training script, a hostfile and launch.sh.

A plan with a DeepSpeed config starts with the DeepSpeed launcher (``deepspeed``, a hostfile
for several nodes); a plan without one (plain PyTorch DDP) starts with ``torchrun``, which
train.py (tools/smoke_train.py) then runs in its DDP mode.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

from tools.files import write_atomic
from tools.memory import resolve_precision
from tools.schemas import FrameworkChoice, HardwareSpec, LaunchSpec, ModelSpec, TrainingBrief

TRAIN_SCRIPT = Path(__file__).with_name("smoke_train.py")


def emit_launch(
    out_dir: Path,
    brief: TrainingBrief,
    hardware: HardwareSpec,
    model: ModelSpec,
    framework: FrameworkChoice,
    deepspeed_config: dict[str, Any] | None,
    *,
    steps: int = 1000,
) -> LaunchSpec:
    """Write the files needed to start training on the target hardware and return the command.

    The command is an argument list (never a shell string); ``launch.sh`` quotes it for people.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    model_cfg = model.hf_config or {}
    write_atomic(out_dir / "model_config.json", json.dumps(model_cfg, indent=2) + "\n")
    files["model_config.json"] = str(out_dir / "model_config.json")
    script = out_dir / "train.py"
    shutil.copyfile(TRAIN_SCRIPT, script)
    files["train.py"] = str(script)
    micro = (deepspeed_config or {}).get("train_micro_batch_size_per_gpu", 1)
    script_args = [
        "train.py",
        "--model-config",
        "model_config.json",
        "--steps",
        str(steps),
        "--seq-len",
        str(brief.seq_len),
        "--micro-batch",
        str(micro),
        "--metrics-dir",
        "metrics",
    ]
    gpus = hardware.gpus_per_node if hardware.gpus_per_node > 0 else 1
    how_to_run = "# Run from this directory on the first node; edit hostfile with your node names."
    if deepspeed_config is not None:
        write_atomic(out_dir / "ds_config.json", json.dumps(deepspeed_config, indent=2) + "\n")
        files["ds_config.json"] = str(out_dir / "ds_config.json")
        command = ["deepspeed"]
        if hardware.nodes > 1:
            hostfile = "".join(f"node{i} slots={gpus}\n" for i in range(hardware.nodes))
            write_atomic(out_dir / "hostfile", hostfile)
            files["hostfile"] = str(out_dir / "hostfile")
            command += ["--hostfile", "hostfile", "--num_nodes", str(hardware.nodes)]
        # The config's batch arithmetic is for hardware.world_size ranks; launch exactly that many.
        command += ["--num_gpus", str(gpus)]
        command += [*script_args, "--deepspeed_config", "ds_config.json"]
    else:
        command = ["torchrun", "--nnodes", str(hardware.nodes), "--nproc_per_node", str(gpus)]
        if hardware.nodes > 1:
            command += ["--rdzv_backend", "c10d", "--rdzv_endpoint", "node0:29500"]
            how_to_run = (
                f"# Run this same script from this directory on each of the {hardware.nodes} "
                "nodes; node0 must resolve to the first node (rendezvous at node0:29500)."
            )
        else:
            how_to_run = "# Run it on the training machine."
        command += script_args
        # Without a DeepSpeed config the script trains with plain DDP; mixed precision is its
        # autocast flag (the DeepSpeed mode reads it from ds_config.json instead).
        precision = resolve_precision(brief.precision, hardware)
        if precision in ("bf16", "fp16"):
            command.append(f"--{precision}")
    # Re-emitting into the same directory: files this launch does not use must not linger and
    # suggest otherwise (a ds_config.json next to a torchrun launch, a stale hostfile).
    for stale in ("ds_config.json", "hostfile"):
        if stale not in files:
            (out_dir / stale).unlink(missing_ok=True)
    lines = [
        "#!/usr/bin/env bash",
        f"# Launch for: {brief.goal or model.name} ({framework.primary})",
        how_to_run,
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        shlex.join(command),
        "",
    ]
    write_atomic(out_dir / "launch.sh", "\n".join(lines))
    (out_dir / "launch.sh").chmod(0o755)
    files["launch.sh"] = str(out_dir / "launch.sh")
    return LaunchSpec(command=command, files=files)
