"""A smoke run's folder, shared by every mode: the checked knobs, the files, the result.

The PyTorch runs (runner.py) and the TensorFlow runs (tf_runner.py) make, check and finish
their run folder alike: every file a run writes is named before anything is written, none may
be the user's (tools/core/outputs.py), and the result ends in ``result.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.core.errors import InputError, shown
from tools.core.outputs import OutputRefused, claim, write_file
from tools.core.schemas import SmokeResult
from tools.core.settings import (
    SMOKE_LOCAL_RANKS_MAX,
    SMOKE_MICRO_BATCH_MAX,
    SMOKE_STEPS_MAX,
    SMOKE_STEPS_MIN,
    SMOKE_TIMEOUT_MAX_S,
    Settings,
    check_count,
    check_seconds,
)
from tools.smoke.commands import NO_HOSTFILE
from tools.smoke.memory_cap import default_memory_cap
from tools.smoke.spec import SmokeSpec
from tools.smoke.standalone import script_files

# The folder of a run directory that holds its copy of the standalone scripts (the ranks'
# command lines name the script in it).
RUN_SCRIPTS = "scripts"
# The folder in a run dir that holds each run's own temporary folder (the ranks' TMPDIR).
TMP_DIR = "tmp"


def check_arguments(settings: Settings, spec: SmokeSpec) -> tuple[int, float, int]:
    """The steps, timeout and memory cap the run uses; InputError for a knob out of range."""
    steps = settings.smoke_steps if spec.steps is None else spec.steps
    timeout_s = settings.smoke_timeout_s if spec.timeout_s is None else spec.timeout_s
    check_count("steps", steps, SMOKE_STEPS_MIN, SMOKE_STEPS_MAX)
    check_count("micro_batch_size", spec.micro_batch_size, 1, SMOKE_MICRO_BATCH_MAX)
    check_count("smoke_cpu_ranks", settings.smoke_cpu_ranks, 1, SMOKE_LOCAL_RANKS_MAX)
    check_count("nodes", spec.nodes, 1, SMOKE_LOCAL_RANKS_MAX)
    if spec.inject is not None and not 1 <= spec.inject_step <= steps:
        raise InputError(
            "inject_step", f"must be between 1 and steps ({steps}), got {spec.inject_step}"
        )
    check_seconds("timeout", timeout_s, SMOKE_TIMEOUT_MAX_S)  # nan and inf too
    cap = settings.smoke_memory_cap if spec.memory_cap is None else spec.memory_cap
    cap = default_memory_cap() if cap is None else cap
    if cap < 0:
        raise InputError("memory_cap", f"must be positive (or 0 for none), got {cap}")
    return steps, timeout_s, cap


def stall_limit(settings: Settings, spec: SmokeSpec) -> float:
    """The seconds without a new step after which the run counts as stalled (0: off)."""
    stall_s = settings.smoke_stall_s if spec.stall_s is None else spec.stall_s
    check_seconds("stall", stall_s, SMOKE_TIMEOUT_MAX_S)
    return stall_s


def run_files(ranks: int, nodes: int) -> list[str]:
    """Every file a run writes in its run dir (the ranks' and launchers' included)."""
    names = ["model_config.json", "ds_config.json", "launch.json", "result.json"]
    names += [f"{RUN_SCRIPTS}/{source.name}" for source in script_files()]
    names += ["memory.json"]  # the watchdog's record (supervise.py)
    names += ["smoke.log", *(f"smoke-node{i}.log" for i in range(1, nodes))]
    names += ["hostfile"] if nodes > 1 else []
    names += [f"metrics/rank{r}.json" for r in range(ranks)]
    names += [f"logs/rank{r}.log" for r in range(ranks)]
    return names


def child_files(written: list[str]) -> list[str]:
    """Of ``run_files``, those the launchers and ranks write (the rest go through write_file)."""
    return [n for n in written if n.startswith(("smoke", "metrics/", "logs/"))]


def make_run_dir(run_dir: Path | None, settings: Settings, force: bool = False) -> Path:
    """The run's folder, claimed: ``run_dir``, or a new one under the settings' runs folder.

    A folder of the user's is refused before anything runs (unless ``force``).
    """
    if run_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = settings.runs_dir / f"{stamp}-{uuid.uuid4().hex[:8]}"
    if not str(run_dir).strip():
        raise InputError("--run-dir", "give a folder name, not an empty string")
    # Absolute, because the launcher runs with the run directory as its working directory.
    run_dir = Path(run_dir).resolve()
    return claim(run_dir, force=force, field="--run-dir", create=True)


def check_run_paths(run_dir: Path) -> None:
    """Refuse (one line, exit 2) a run dir where a path the run uses would lead out of it.

    ``tmp`` must be a real folder or absent: the run makes its temporary folder inside it, and
    a symlink there (trainwright never makes one) would take the ranks' temporary files
    elsewhere. ``no-hostfile`` must be absent: a one-node DeepSpeed run names it so that the
    launcher finds no hostfile, and one there would send the ranks to the machines it lists.
    The run's other files are checked by ``check_files`` (a symlink among them, or as a
    folder on their way, is refused).
    """
    tmp = run_dir / TMP_DIR
    if tmp.is_symlink() or (os.path.lexists(tmp) and not tmp.is_dir()):
        what = "a symlink" if tmp.is_symlink() else "not a folder"
        raise OutputRefused(
            "--run-dir",
            f"{shown(str(tmp), 160)} is {what}; a smoke run keeps its temporary files in a "
            "folder it makes there itself and never writes through a link (remove it or "
            "choose another folder)",
        )
    hostfile = run_dir / NO_HOSTFILE
    if os.path.lexists(hostfile):
        raise OutputRefused(
            "--run-dir",
            f"{shown(str(hostfile), 160)} exists; a smoke run names it as the hostfile that "
            "must not exist, so DeepSpeed's launcher stays on this machine (remove it or "
            "choose another folder)",
        )


@contextlib.contextmanager
def fresh_tmp_dir(run_dir: Path) -> Iterator[Path]:
    """A temporary folder made now for this run alone (``tmp/run-`` plus mkdtemp's random suffix), removed after.

    What the run's processes leave there (torch's and DeepSpeed's temporary files) is theirs
    and goes with it; ``check_run_paths`` is applied again first.
    """
    check_run_paths(run_dir)
    (run_dir / TMP_DIR).mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="run-", dir=run_dir / TMP_DIR))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def finish_run(result: SmokeResult, run_dir: Path, started: float) -> SmokeResult:
    """``result`` with its wall time, written to the run's ``result.json``."""
    result = result.model_copy(update={"wall_time_s": time.monotonic() - started})
    write_run_json(run_dir / "result.json", result.model_dump(mode="json"))
    return result


def write_run_json(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path`` in a run folder (never the user's file)."""
    write_file(path.parent, path.name, json.dumps(data, indent=2), field="--run-dir")
