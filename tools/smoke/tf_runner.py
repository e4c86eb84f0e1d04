"""A TensorFlow smoke run: MultiWorkerMirroredStrategy workers on this machine, supervised.

The workers run tools/smoke/tf_train.py in ``.venv-tf`` (``make tf-venv``), one process per
worker with its own ``TF_CONFIG`` (tools/smoke/tf_launch.py), under the same supervisor and
verdicts as the PyTorch runs (tools/smoke/supervise.py, verdict.py): passed, oom, nan,
diverged, timeout, crash. The model is of the brief's kind, not its architecture: a small CNN on
synthetic class patterns for an image model, a small transformer on repeated token patterns
otherwise; the run proves the multi-worker setup starts, all-reduces and learns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from tools.core.errors import InputError
from tools.core.outputs import check_files, keep_reserved, record, reserve
from tools.core.schemas import ModelSpec, SmokeResult
from tools.core.settings import Settings
from tools.smoke.commands import free_port
from tools.smoke.runner import (
    _checked_arguments,
    _child_files,
    _finish,
    _make_run_dir,
    _run_files,
    check_run_paths,
    fresh_tmp_dir,
)
from tools.smoke.supervise import _launch_and_wait
from tools.smoke.tf_launch import TF_PYTHON, base_env, supervised_commands
from tools.smoke.verdict import _verdict

# Model families trained as images (the catalog's vision models).
IMAGE_FAMILIES = frozenset({"resnet", "vit", "convnext"})
TF_INJECT_KINDS = ("nan", "crash", "hang", "oom", "alloc")


def tf_kind(model: ModelSpec) -> str:
    """``image`` for a vision model, else ``text``: the Keras model the workers train."""
    family = str((model.hf_config or {}).get("model_type", ""))
    return "image" if family in IMAGE_FAMILIES else "text"


def run_tf_smoke(
    model: ModelSpec,
    settings: Settings,
    *,
    steps: int | None = None,
    workers: int | None = None,
    run_dir: Path | None = None,
    on_progress: Callable[[str], None] | None = None,
    inject: str | None = None,
    inject_step: int = 3,
    timeout_s: float | None = None,
    memory_cap: int | None = None,
    force: bool = False,
) -> SmokeResult:
    """Train a small Keras model of ``model``'s kind on CPU workers (MultiWorkerMirrored).

    ``workers`` defaults to the smoke CPU ranks; the result reads as the PyTorch runs' does.
    """
    if inject is not None and inject not in TF_INJECT_KINDS:
        raise InputError("inject", f"a TensorFlow run injects {', '.join(TF_INJECT_KINDS)}")
    steps, timeout_s, cap = _checked_arguments(
        settings, steps, 1, 1, None, inject_step, timeout_s, memory_cap
    )
    if not TF_PYTHON.exists():
        raise InputError(
            "framework", f"TensorFlow runs need {TF_PYTHON}: build it with `make tf-venv`"
        )
    started = time.monotonic()
    run_dir = _make_run_dir(run_dir, settings, force)
    ranks = workers or settings.smoke_cpu_ranks
    # One command per worker: the supervisor names their logs as it names nodes' logs.
    written = _run_files(ranks, ranks)
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
        mode=f"tensorflow:{kind}",
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
    children = _child_files(written)
    reserve(run_dir, children)
    try:
        with fresh_tmp_dir(run_dir) as tmp_dir:
            env = {**base_env(), "TMPDIR": str(tmp_dir)}
            # No address-space limit: TensorFlow reserves far more than it touches.
            outcome = _launch_and_wait(
                commands,
                env,
                run_dir,
                timeout_s,
                on_progress,
                memory_cap=cap,
                keep_alive=lambda: keep_reserved(run_dir, children),
            )
    finally:
        record(run_dir, children)
    notes = [
        f"TensorFlow MultiWorkerMirroredStrategy, {ranks} CPU workers with their own TF_CONFIG",
        f"a small Keras {'CNN' if kind == 'image' else 'transformer'} of the brief's kind on "
        "synthetic learnable data, not the planned architecture",
    ]
    result = _verdict(base, outcome, run_dir / "metrics", ranks, steps, notes)
    return _finish(result, run_dir, started)
