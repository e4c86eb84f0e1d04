"""Any model folder name reaches the launcher exactly, from every script that runs train.py.

launch.sh, launch_node{R}.sh and train.sbatch run here with stand-in launchers (``torchrun``,
``deepspeed``, ``srun``, ``scontrol`` on PATH) that record the argv they got, their parent and
``$TRAINWRIGHT_JOB_PID``: a folder named with ``}``, ``;``, ``$``, backticks, quotes, spaces,
a newline or a tab is the one ``--model-path`` names, with ``$MODEL_PATH`` unset or set to
such a name; and each script exports its own pid and host for the ranks to watch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from specs import GPT2_TINY

from tools.artifacts.launch import emit_launch
from tools.core.schemas import FrameworkChoice, HardwareSpec, TrainingBrief
from tools.research.model_catalog import lookup_model
from tools.review.launch_script import runs_command

HOSTILE_FOLDERS = [
    "m}odel",
    "m;odel",
    "price $HOME ${X:-y}",
    "tick `id` $(id)",
    'say "hi"',
    "it's",
    "two  spaces",
    "new\nline",
    "tab\tand \\ back",
    "ünïcode ✓",
    "all }{;$(x)`'\"\n\\ of them",
]
RECORD_ARGV = """#!/usr/bin/env bash
printf '%s\\0' "$(basename "$0")" "$PPID" "${TRAINWRIGHT_JOB_PID:-}" "$@" \\
    > "$ARGV_DIR/$(basename "$0").$$.argv"
"""
FRAMEWORKS = {
    "deepspeed": FrameworkChoice(
        primary="deepspeed", stack=["pytorch", "deepspeed"], rationale="x"
    ),
    "ddp": FrameworkChoice(primary="pytorch_ddp", stack=["pytorch", "pytorch_ddp"], rationale="x"),
    "fsdp": FrameworkChoice(
        primary="pytorch_fsdp", stack=["pytorch", "pytorch_fsdp"], rationale="x"
    ),
}
ZERO2 = {
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2},
}


def _stand_ins(tmp_path: Path) -> dict[str, str]:
    """PATH with launchers that record their argv, parent pid and $TRAINWRIGHT_JOB_PID."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {
        "deepspeed": RECORD_ARGV,
        "torchrun": RECORD_ARGV,
        "srun": '#!/usr/bin/env bash\nshift\nexec "$@"\n',
        "scontrol": "#!/usr/bin/env bash\nprintf 'node0\\nnode1\\n'\n",
    }.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "argv").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA")}
    return env | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ARGV_DIR": str(tmp_path / "argv"),
        "SLURM_JOB_NODELIST": "node[0-1]",
        "SLURM_JOB_ID": "7",
        "SLURM_NODEID": "1",
    }


def _launched(script: Path, env: dict[str, str]) -> tuple[int, list[str]]:
    """Run a generated script with the stand-ins: its pid and what the launcher recorded."""
    argv_dir = Path(env["ARGV_DIR"])
    for old in argv_dir.iterdir():
        old.unlink()
    proc = subprocess.Popen(
        ["bash", str(script)],
        env={**env, "SLURM_SUBMIT_DIR": str(script.parent)},
        cwd=script.parent,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    (record,) = list(argv_dir.iterdir())
    return proc.pid, record.read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]


@pytest.mark.parametrize("plan", ["ddp-1x8", "fsdp-1x8", "deepspeed-2x8"])
@pytest.mark.parametrize("name", HOSTILE_FOLDERS)
def test_any_model_folder_name_reaches_the_launcher_exactly(
    tmp_path: Path, plan: str, name: str
) -> None:
    folder = tmp_path / "models" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(GPT2_TINY))
    framework, hardware = plan.split("-")
    nodes, gpus = (int(n) for n in hardware.split("x"))
    model = lookup_model(str(folder), 64)
    brief = TrainingBrief(goal="x", model=str(folder), task="finetune", seq_len=64)
    out = tmp_path / "plan"
    hw = HardwareSpec(source="described", nodes=nodes, gpus_per_node=gpus)
    config = ZERO2 if framework == "deepspeed" else None
    spec = emit_launch(out, brief, hw, model, FRAMEWORKS[framework], config, steps=10)
    assert spec.command[spec.command.index("--model-path") + 1] == str(folder)
    scripts = [out / "launch.sh", out / "train.sbatch", *sorted(out.glob("launch_node*.sh"))]
    assert runs_command((out / "launch.sh").read_text(), spec.command)  # the review reads it so too
    env = _stand_ins(tmp_path)
    host = socket.gethostname()
    for script in scripts:
        for override in (None, f"/elsewhere/{name}"):
            run_env = env if override is None else {**env, "MODEL_PATH": override}
            pid, (launcher, parent, watched, *argv) = _launched(script, run_env)
            assert launcher == spec.command[0]
            weights = argv[argv.index("--model-path") + 1]
            assert weights == (override or str(folder)), (script.name, weights)
            # The ranks will watch the script (the launcher's parent): its pid, on this host.
            assert watched == f"{pid}@{host}" == f"{parent}@{host}", script.name
