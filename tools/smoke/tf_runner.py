"""A TensorFlow smoke run: MultiWorkerMirroredStrategy workers on this machine, supervised.

The workers run tools/smoke/scripts/tf_train.py in ``.venv-tf`` (``make tf-venv``), one process per
worker with its own ``TF_CONFIG`` (tools/smoke/tf_launch.py), under the same supervisor and
verdicts as the PyTorch runs (tools/smoke/supervise.py, verdict.py): passed, oom, nan,
diverged, timeout, crash. The model is of the brief's kind, not its architecture: a small CNN on
synthetic class patterns for an image model, a small transformer on repeated token patterns
otherwise; the run proves the multi-worker setup starts, all-reduces and learns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from tools.core.errors import InputError
from tools.core.outputs import check_files, keep_reserved, record, reserve
from tools.core.schemas import ModelSpec, SmokeResult
from tools.core.settings import Settings
from tools.core.smoke_types import RunMode
from tools.smoke.commands import free_port
from tools.smoke.rundir import (
    check_arguments,
    check_run_paths,
    child_files,
    finish_run,
    fresh_tmp_dir,
    make_run_dir,
    run_files,
    stall_limit,
)
from tools.smoke.spec import SmokeSpec, TensorFlowRun
from tools.smoke.supervise import launch_and_wait
from tools.smoke.tf_launch import TF_PYTHON, base_env, supervised_commands
from tools.smoke.verdict import run_verdict

# Model families trained as images (the catalog's vision models).
IMAGE_FAMILIES = frozenset({"resnet", "vit", "convnext"})


def tf_kind(model: ModelSpec) -> Literal["image", "text"]:
    """``image`` for a vision model, else ``text``: the Keras model the workers train."""
    family = str((model.hf_config or {}).get("model_type", ""))
    return "image" if family in IMAGE_FAMILIES else "text"


def run_tf_smoke(
    model: ModelSpec,
    spec: SmokeSpec,
    settings: Settings,
    on_progress: Callable[[str], None] | None = None,
) -> SmokeResult:
    """Train a small Keras model of ``model``'s kind on CPU workers (MultiWorkerMirrored).

    ``spec.mode`` is a ``TensorFlowRun`` (its ``workers`` default to the smoke CPU ranks); the
    micro-batch, sequence, world size and nodes of ``spec`` do not apply. The result reads as
    the PyTorch runs' does.
    """
    mode = spec.mode
    if not isinstance(mode, TensorFlowRun):
        raise InputError("framework", "run_tf_smoke runs a TensorFlowRun spec")
    steps, timeout_s, cap = check_arguments(settings, spec)
    stall_s = stall_limit(settings, spec)
    inject, inject_step = spec.inject, spec.inject_step
    if not TF_PYTHON.exists():
        raise InputError(
            "framework", f"TensorFlow runs need {TF_PYTHON}: build it with `make tf-venv`"
        )
    started = time.monotonic()
    run_dir = make_run_dir(spec.run_dir, settings, spec.force)
    ranks = mode.workers or settings.smoke_cpu_ranks
    # One command per worker: the supervisor names their logs as it names nodes' logs.
    written = run_files(ranks, ranks)
    check_files(run_dir, written, field="--run-dir")
    check_run_paths(run_dir)
    kind = tf_kind(model)
    base = SmokeResult(
        status="failed",
        device="cpu",
        world_size=ranks,
        steps=steps,
        run_dir=str(run_dir),
        strategy="multi_worker_mirrored",
        inject=inject,
        run_mode=RunMode(launcher="tensorflow", model_kind=kind),
    )
    args = ["--kind", kind, "--steps", str(steps)]
    if inject is not None:
        args += ["--inject", inject, "--inject-step", str(inject_step)]
    ports = [free_port() for _ in range(ranks)]
    commands = supervised_commands(ranks, ports, run_dir, args)
    if on_progress is not None:
        on_progress(
            f"launching {ranks} TensorFlow worker(s): MultiWorkerMirroredStrategy, {kind} "
            f"model, {steps} steps"
            + (f", injecting {inject} at step {inject_step}" if inject else "")
        )
    children = child_files(written)
    reserve(run_dir, children)
    try:
        with fresh_tmp_dir(run_dir) as tmp_dir:
            env = {**base_env(), "TMPDIR": str(tmp_dir)}
            # No address-space limit: TensorFlow reserves far more than it touches.
            outcome = launch_and_wait(
                commands,
                env,
                run_dir,
                timeout_s,
                on_progress,
                memory_cap=cap,
                keep_alive=lambda: keep_reserved(run_dir, children),
                stall_s=stall_s,
            )
    finally:
        record(run_dir, children)
    notes = [
        f"TensorFlow MultiWorkerMirroredStrategy, {ranks} CPU workers with their own TF_CONFIG",
        f"a small Keras {'CNN' if kind == 'image' else 'transformer'} of the brief's kind on "
        "synthetic learnable data, not the planned architecture",
    ]
    result = run_verdict(base, outcome, run_dir / "metrics", ranks, steps, notes)
    return finish_run(result, run_dir, started)
