"""Smoke-test a training setup with a short, real DeepSpeed or PyTorch DDP run on this machine.

The run uses a scaled-down copy of the planned model (same family), the planned DeepSpeed
config adapted to the local world (CPU ranks over gloo, or the local GPUs) or, for a plan
without DeepSpeed, plain PyTorch DDP started with torchrun, and synthetic but learnable data
(tools/smoke/train.py). It proves the setup starts, steps and learns; the memory it reports
is that of the scaled model, so the caller compares it with a prediction for the same shape.

The steps have their own modules: scale.py (the model), ds_adapt.py (the config), commands.py
(the launchers), supervise.py (the process groups), verdict.py (the result) and predict.py
(the prediction). On CPU, DeepSpeed JIT-builds each C++ op it uses (a minute the first time),
so the runs avoid the ones they need not build (bench/profile_smoke.md has the measurements).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tools.core.errors import InputError, shown
from tools.core.outputs import (
    OutputRefused,
    check_files,
    claim,
    copy_file,
    keep_reserved,
    listed,
    record,
    remove_file,
    reserve,
    subfolder,
    write_file,
)
from tools.core.schemas import ModelSpec, SmokeResult
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
from tools.core.strategies import strategy_of
from tools.planning.states import DEFAULT_LORA_RANK
from tools.smoke.commands import NO_HOSTFILE, _child_env, launch_commands
from tools.smoke.ds_adapt import adapt_ds_config, smoke_lr
from tools.smoke.predict import (
    FSDP_SHARDINGS,
    _fits_local_gpu,
    layout_mode,
    shape_spec,
    with_prediction,
)
from tools.smoke.scale import (
    CPU_BUDGET,
    FULL_SIZE_MAX_SEQ,
    GPU_BUDGET,
    _first_line,
    _scale_model_config_cached,
    llama_config_from_shape,
)
from tools.smoke.schedule import plan_torchrun_schedule
from tools.smoke.supervise import (
    _launch_and_wait,
    default_memory_cap,
    rank_address_space,
)
from tools.smoke.verdict import _verdict

SCRIPT = Path(__file__).with_name("train.py")
# The torch-native stand-in for tensor/pipeline-parallel layouts (Megatron is CUDA-only).
PARALLEL_SCRIPT = Path(__file__).with_name("parallel_train.py")
# Faults parallel_train.py can inject.
PARALLEL_INJECT_KINDS = ("crash", "nan", "hang", "oom", "alloc")
PP_SCHEDULES = ("gpipe", "1f1b")
# The name the script has in a run directory (and so in the ranks' command lines).
RUN_SCRIPT_NAME = "smoke_train.py"
INJECT_KINDS = ("oom", "nan", "hang", "crash", "alloc")
# The folder in a run dir that holds each run's own temporary folder (the ranks' TMPDIR).
TMP_DIR = "tmp"


def run_smoke_test(
    model: ModelSpec,
    ds_config: dict[str, Any] | None,
    settings: Settings,
    *,
    steps: int | None = None,
    micro_batch_size: int = 1,
    seq_len: int | None = None,
    world_size: int | None = None,
    strategy: str | None = None,
    run_dir: Path | None = None,
    on_progress: Callable[[str], None] | None = None,
    nodes: int = 1,
    inject: str | None = None,
    inject_step: int = 3,
    timeout_s: float | None = None,
    task: str = "pretrain",
    attn_implementation: str | None = None,
    memory_cap: int | None = None,
    force: bool = False,
    fsdp: str | None = None,
    fsdp_offload: bool = False,
    activation_checkpointing: bool | None = None,
    plan_command: list[str] | None = None,
    layout: tuple[int, int, int] | None = None,
    pp_schedule: str = "1f1b",
) -> SmokeResult:
    """Run a short real training of the planned model (scaled down to fit) and report whether it learns.

    Args:
        model: The planned model. On a GPU it runs at full size when the planner says it fits
            the local GPU with 10% headroom; otherwise (and always on CPU) its ``hf_config``
            (or its shape) is scaled down to the local budget, keeping the family.
        ds_config: The planned DeepSpeed config; it is adapted to the local ranks and device and
            run with DeepSpeed's launcher. ``None`` (a plan without DeepSpeed) runs plain
            PyTorch DDP (AdamW; bf16 autocast on CUDA) with torchrun.
        settings: Run settings (``smoke_steps``, ``smoke_timeout_s``, ``smoke_cpu_ranks``, paths).
        steps: Optimizer steps to run; defaults to ``settings.smoke_steps``.
        micro_batch_size: Sequences per rank per step.
        seq_len: Tokens per sequence; defaults to the model's, capped to the local budget.
        world_size: The plan's world size; caps the number of local GPUs used (CPU runs always
            use ``settings.smoke_cpu_ranks`` ranks, to exercise the distributed code paths).
        strategy: The strategy name to record; derived from ``ds_config`` when omitted
            (``ddp`` when it is ``None``).
        run_dir: Where the configs, logs, metrics and temporary files go; defaults to
            ``settings.runs_dir / <timestamp>-<id>``.
        on_progress: Called with one line per training step (and a launch line).
        nodes: Run as this many "nodes" on this machine through the real multi-node mechanism:
            one DeepSpeed launcher per node with ``--no_ssh --node_rank R`` and a hostfile, or
            one torchrun per node with a static rendezvous on 127.0.0.1. The ranks are split
            evenly between the nodes.
        inject: ``oom``, ``nan``, ``hang``, ``crash`` or ``alloc`` (allocate memory until
            stopped): make the run fail that way for real at ``inject_step``
            (tools/smoke/train.py), to test the supervision and the verdict.
        inject_step: The step at which the injected fault happens.
        timeout_s: Wall-clock limit; defaults to ``settings.smoke_timeout_s``.
        task: The planned task, for the memory prediction (the run itself always trains).
        attn_implementation: The transformers attention kernel (eager, sdpa, ...); default:
            transformers' own choice for the model.
        memory_cap: The most resident memory (bytes) the run's processes may hold together;
            over it the run is killed with verdict ``oom``. Defaults to
            ``settings.smoke_memory_cap``, else ``default_memory_cap()``; 0 turns it off. On
            CPU each rank also gets an address-space limit of its share of the cap plus a
            fixed allowance (``rank_address_space``).
        force: Run in a ``run_dir`` that holds files trainwright did not write (they are never
            touched; one of them under a name the run writes is refused). Without it such a
            folder is refused (tools/core/outputs.py).
        fsdp: With ``ds_config`` None, run train.py's FSDP2 mode under torchrun with this
            sharding: ``full`` (ZeRO-3-like), ``grad-op`` (ZeRO-2-like) or ``hybrid`` (shard
            within a node, replicate across ``nodes``); None: plain DDP.
        fsdp_offload: FSDP2's CPUOffloadPolicy (parameters, gradients and the optimizer step
            on the CPU).
        activation_checkpointing: Recompute every layer in backward (the plan's policy) in a
            torchrun run; a DeepSpeed run takes it from ``ds_config``.
        plan_command: The plan's launch command: a torchrun run uses its ``--lr-schedule`` and
            ``--warmup-steps``, scaled to ``steps`` (schedule.py); without one the rate is
            constant. A DeepSpeed run uses the config's ``scheduler`` section, also scaled.
        layout: ``(tp, pp, dp)``: run the tensor x pipeline x data-parallel layout with the
            torch-native stand-in (parallel_train.py: DTensor tensor parallelism,
            ``torch.distributed.pipelining`` with ``pp_schedule``, ZeRO-1 over ``dp`` > 1) on
            tp x pp x dp CPU ranks under torchrun; each rank checks it holds the parameter share
            the layout gives it. Needs ``ds_config`` None and a Llama-style model.
        pp_schedule: The pipeline schedule of a ``layout`` run: ``1f1b`` or ``gpipe``.

    Returns:
        A ``SmokeResult`` with the measured metrics and the planner's prediction for the shape
        that ran; ``failed`` results carry a reason that starts with ``oom``, ``nan``,
        ``diverged``, ``timeout``, ``crash`` or ``launcher_error``.
    """
    steps, timeout_s, cap = _checked_arguments(
        settings, steps, micro_batch_size, nodes, inject, inject_step, timeout_s, memory_cap
    )
    if layout is not None:
        _check_layout(layout, ds_config, fsdp, inject, pp_schedule, nodes)
    if fsdp is not None and (ds_config is not None or fsdp not in FSDP_SHARDINGS):
        raise InputError(
            "fsdp", f"choose one of {', '.join(FSDP_SHARDINGS)}, without a DeepSpeed config"
        )
    started = time.monotonic()
    run_dir = _make_run_dir(run_dir, settings, force)
    if layout is not None:  # CPU ranks, one per shard of the layout
        device, ranks = "cpu", layout[0] * layout[1] * layout[2]
    else:
        device, ranks = _local_world(settings, world_size, nodes)
    # Every file the run writes, checked before anything is written: none may be the user's.
    written = _run_files(ranks, nodes)
    check_files(run_dir, written, field="--run-dir")
    check_run_paths(run_dir)
    strategy = strategy or (strategy_of(ds_config) if ds_config is not None else "ddp")
    mode = "deepspeed" if ds_config is not None else "ddp"
    if fsdp is not None:
        mode = f"fsdp:{fsdp}" + ("+offload" if fsdp_offload else "")
    if layout is not None:
        mode = layout_mode(layout)
    base = SmokeResult(
        status="failed",
        device=device,
        world_size=ranks,
        steps=steps,
        run_dir=str(run_dir),
        strategy=strategy,
        nodes=nodes,
        inject=inject,
        mode=mode,
    )
    if ds_config is not None:  # DeepSpeed's runs recompute as the config says
        checkpointing = "activation_checkpointing" in ds_config
    else:
        checkpointing = bool(activation_checkpointing)
    if layout is not None:
        model = _splittable(model)
    scaled = _scaled_model(
        model, settings, base, strategy, micro_batch_size, seq_len, task, checkpointing
    )
    if isinstance(scaled, str):
        return _finish(base, run_dir, started, reason=scaled)
    model_config, shape, full_size = scaled
    base.model_shape = shape
    lr = smoke_lr(int(shape["hidden"]))
    run_config, notes = _run_config(ds_config, base, shape, micro_batch_size, lr, full_size)
    mode_args: list[str] = []
    if layout is not None:
        mode_args, notes[0] = _layout_args(layout, pp_schedule)
        notes.append(f"constant lr {lr:g}")
    elif run_config is None:  # torchrun: the schedule, recompute and sharding are flags
        mode_args, note = _torchrun_args(plan_command, steps, lr, checkpointing, fsdp, fsdp_offload)
        notes.append(note)
    _prepare_run_dir(
        run_dir, model_config, run_config, PARALLEL_SCRIPT if layout is not None else SCRIPT
    )
    commands = _commands(
        run_dir,
        base,
        shape,
        run_config is not None,
        lr,
        inject_step,
        None if layout is not None else attn_implementation,
        "pretrain" if layout is not None else task,
        mode_args,
    )
    _announce(on_progress, base, shape, inject_step)
    # CUDA reserves far more address space than any limit we could set here.
    address_space = rank_address_space(cap, ranks) if device != "cuda" else 0
    # What the launchers and ranks will write stays ours if this process is killed before
    # ``record``, as far as it was written while the run was alive (tools/core/outputs.py).
    children = _child_files(written)
    reserve(run_dir, children)
    try:
        with fresh_tmp_dir(run_dir) as tmp_dir:
            # Every "node" runs on this machine, so the cores are split over all the ranks.
            env = _child_env(tmp_dir, device, ranks)
            outcome = _launch_and_wait(
                commands,
                env,
                run_dir,
                timeout_s,
                on_progress,
                memory_cap=cap,
                address_space=address_space,
                keep_alive=lambda: keep_reserved(run_dir, children),
            )
    finally:
        # What the launchers and ranks wrote is ours: a rerun in this folder may replace it.
        record(run_dir, children)
    result = _verdict(base, outcome, run_dir / "metrics", ranks, steps, notes)
    return _finish(with_prediction(result, task=task), run_dir, started)


def _checked_arguments(
    settings: Settings,
    steps: int | None,
    micro_batch_size: int,
    nodes: int,
    inject: str | None,
    inject_step: int,
    timeout_s: float | None,
    memory_cap: int | None,
) -> tuple[int, float, int]:
    """The steps, timeout and memory cap the run uses; InputError for an argument out of range."""
    steps = settings.smoke_steps if steps is None else steps
    timeout_s = settings.smoke_timeout_s if timeout_s is None else timeout_s
    check_count("steps", steps, SMOKE_STEPS_MIN, SMOKE_STEPS_MAX)
    check_count("micro_batch_size", micro_batch_size, 1, SMOKE_MICRO_BATCH_MAX)
    check_count("smoke_cpu_ranks", settings.smoke_cpu_ranks, 1, SMOKE_LOCAL_RANKS_MAX)
    check_count("nodes", nodes, 1, SMOKE_LOCAL_RANKS_MAX)
    if inject is not None and inject not in INJECT_KINDS:
        raise InputError("inject", f"must be one of {', '.join(INJECT_KINDS)}, got {inject!r}")
    if inject is not None and not 1 <= inject_step <= steps:
        raise InputError("inject_step", f"must be between 1 and steps ({steps}), got {inject_step}")
    check_seconds("timeout", timeout_s, SMOKE_TIMEOUT_MAX_S)  # nan and inf too
    cap = settings.smoke_memory_cap if memory_cap is None else memory_cap
    cap = default_memory_cap() if cap is None else cap
    if cap < 0:
        raise InputError("memory_cap", f"must be positive (or 0 for none), got {cap}")
    return steps, timeout_s, cap


def _layout_args(layout: tuple[int, int, int], pp_schedule: str) -> tuple[list[str], str]:
    """parallel_train.py's arguments for ``layout`` (tp, pp, dp), and the note saying what ran."""
    tp, pp, dp = layout
    micro = 2 * pp if pp > 1 else 1  # enough micro-batches to fill the pipeline
    args = ["--tp", str(tp), "--pp", str(pp), "--pp-schedule", pp_schedule]
    args += ["--microbatches", str(micro), *(["--zero1"] if dp > 1 else [])]
    note = (
        f"torch-native stand-in for the plan's layout: DTensor TP {tp} x pipelining PP {pp}"
        + (f" ({pp_schedule}, {micro} micro-batches)" if pp > 1 else "")
        + (f" x ZeRO-1 DP {dp}" if dp > 1 else "")
        + f" on {tp * pp * dp} CPU ranks under torchrun; each rank's parameter share checked; "
        "key-value heads = attention heads, untied embeddings"
    )
    return args, note


def _torchrun_args(
    plan_command: list[str] | None,
    steps: int,
    lr: float,
    checkpointing: bool,
    fsdp: str | None,
    fsdp_offload: bool,
) -> tuple[list[str], str]:
    """train.py's schedule, recompute and FSDP flags for a torchrun run, and the schedule note."""
    planned = plan_torchrun_schedule(plan_command or [], steps)
    args, note = planned or ([], f"constant lr {lr:g}")
    args += ["--gradient-checkpointing"] if checkpointing else []
    if fsdp is not None:
        args += ["--fsdp", "--fsdp-sharding", fsdp, *(["--fsdp-offload"] if fsdp_offload else [])]
    return args, note


def _splittable(model: ModelSpec) -> ModelSpec:
    """The model with as many key-value heads as attention heads and untied embeddings.

    Scaled to the CPU budget (4 heads), grouped-query attention keeps as few as one key-value
    head, which no tensor-parallel degree above 1 can split (Megatron, too, needs the degree to
    divide them); the stand-in's output head is its own column-parallel matrix.
    """
    config = dict(model.hf_config or llama_config_from_shape(model))
    heads = config.get("num_attention_heads")
    if heads:
        config["num_key_value_heads"] = heads
    config["tie_word_embeddings"] = False
    return model.model_copy(update={"hf_config": config})


def _check_layout(
    layout: tuple[int, int, int],
    ds_config: dict[str, Any] | None,
    fsdp: str | None,
    inject: str | None,
    pp_schedule: str,
    nodes: int,
) -> None:
    """InputError for a tensor/pipeline layout the torch-native stand-in cannot run."""
    if any(n < 1 for n in layout) or layout[0] * layout[1] * layout[2] > SMOKE_LOCAL_RANKS_MAX:
        raise InputError(
            "layout",
            f"tp, pp and dp must be at least 1 and start at most {SMOKE_LOCAL_RANKS_MAX} ranks "
            f"together, got {layout}",
        )
    if ds_config is not None or fsdp is not None:
        raise InputError(
            "layout", "a tp/pp layout runs the torch-native stand-in, not DeepSpeed or FSDP"
        )
    if pp_schedule not in PP_SCHEDULES:
        raise InputError("pp_schedule", f"must be one of {', '.join(PP_SCHEDULES)}")
    if inject is not None and inject not in PARALLEL_INJECT_KINDS:
        raise InputError(
            "inject", f"a tp/pp run injects {', '.join(PARALLEL_INJECT_KINDS)}, not {inject}"
        )
    if nodes != 1:
        raise InputError("nodes", "a tp/pp run is one node of CPU ranks")


def _local_world(settings: Settings, world_size: int | None, nodes: int) -> tuple[str, int]:
    """The device and the number of local ranks: the GPUs (up to ``world_size``), else CPU ranks."""
    device, gpu_count = _local_device()
    if device == "cuda":
        ranks = max(1, min(gpu_count, world_size or gpu_count))
    else:
        ranks = settings.smoke_cpu_ranks
    if ranks % nodes:
        raise InputError(
            "nodes", f"{ranks} local rank(s) cannot be split evenly over {nodes} nodes"
        )
    return device, ranks


def _scaled_model(
    model: ModelSpec,
    settings: Settings,
    base: SmokeResult,
    strategy: str,
    micro_batch_size: int,
    seq_len: int | None,
    task: str,
    checkpointing: bool,
) -> tuple[dict[str, Any], dict[str, Any], bool] | str:
    """The model config the run builds, its shape and whether it is full size; or why it cannot.

    Full size only on a GPU the planner says it fits; otherwise scaled to the local budget.
    """
    device, ranks = base.device, base.world_size
    want_seq = seq_len if seq_len is not None else model.seq_len
    hf_config = model.hf_config or llama_config_from_shape(model)
    full_size = device == "cuda" and _fits_local_gpu(
        model,
        strategy,
        ranks,
        micro_batch_size,
        min(want_seq, FULL_SIZE_MAX_SEQ),
        task,
        activation_checkpointing=checkpointing,
    )
    budget = GPU_BUDGET if device == "cuda" else CPU_BUDGET
    smoke_seq = max(8, min(want_seq, FULL_SIZE_MAX_SEQ if full_size else budget["seq_len"]))
    try:
        model_config, shape = _scale_model_config_cached(
            hf_config,
            seq_len=smoke_seq,
            device=device,
            full_size=full_size,
            cache_dir=settings.home / "cache" / "smoke-shapes",
        )
    except Exception as exc:  # whatever transformers rejects is reported as the run's result
        return f"launcher_error: cannot build the model: {_first_line(exc)}"
    shape.update(
        seq_len=smoke_seq,
        micro_batch_size=micro_batch_size,
        activation_checkpointing=checkpointing,
    )
    return model_config, shape, full_size


def _run_config(
    ds_config: dict[str, Any] | None,
    base: SmokeResult,
    shape: dict[str, Any],
    micro_batch_size: int,
    lr: float,
    full_size: bool,
) -> tuple[dict[str, Any] | None, list[str]]:
    """The DeepSpeed config the run uses (None: plain DDP) and the notes on how it differs."""
    run_config: dict[str, Any] | None = None
    if ds_config is not None:
        run_config, notes = adapt_ds_config(
            ds_config,
            device=base.device,
            ranks=base.world_size,
            micro_batch_size=micro_batch_size,
            scaled=shape_spec(shape),
            lr=lr,
            steps=base.steps,
        )
    else:
        fsdp = (base.mode or "").partition("fsdp:")[2]
        notes = [
            f"PyTorch FSDP2 (fully_shard, {fsdp} sharding) under torchrun"
            if fsdp
            else "plain PyTorch DDP (torchrun)"
        ]
        if base.device == "cuda":
            notes.append("bf16 autocast")
    if full_size:
        notes.append("full-size model (fits the local GPU)")
    if base.nodes > 1:
        notes.append(
            f"{base.nodes} nodes x {base.world_size // base.nodes} rank(s) on this machine"
        )
    return run_config, notes


def _prepare_run_dir(
    run_dir: Path,
    model_config: dict[str, Any],
    run_config: dict[str, Any] | None,
    script: Path = SCRIPT,
) -> None:
    """Write the run's configs and script into ``run_dir``, clearing what an earlier run left.

    Only files an earlier run wrote and nobody changed since are removed or replaced.
    """
    for name in ("tmp", "metrics"):  # never a link out of the run dir
        subfolder(run_dir, name, "--run-dir")
    for stale in listed(run_dir):
        if stale.startswith(("metrics/rank", "logs/rank", "smoke")) or stale == "hostfile":
            remove_file(run_dir, stale)
    _write_json(run_dir / "model_config.json", model_config)
    if run_config is not None:
        _write_json(run_dir / "ds_config.json", run_config)
    else:
        # A reused run dir must not suggest that this run used an earlier run's config.
        remove_file(run_dir, "ds_config.json")
    # A copy of the script makes the run dir a self-contained reproduction of the run.
    copy_file(run_dir, RUN_SCRIPT_NAME, script, field="--run-dir")


def _run_files(ranks: int, nodes: int) -> list[str]:
    """Every file a run writes in its run dir (the ranks' and launchers' included)."""
    names = ["model_config.json", "ds_config.json", RUN_SCRIPT_NAME, "launch.json", "result.json"]
    names += ["memory.json"]  # the watchdog's record (supervise.py)
    names += ["smoke.log", *(f"smoke-node{i}.log" for i in range(1, nodes))]
    names += ["hostfile"] if nodes > 1 else []
    names += [f"metrics/rank{r}.json" for r in range(ranks)]
    names += [f"logs/rank{r}.log" for r in range(ranks)]
    return names


def _child_files(written: list[str]) -> list[str]:
    """Of ``_run_files``, those the launchers and ranks write (the rest go through write_file)."""
    return [n for n in written if n.startswith(("smoke", "metrics/", "logs/"))]


def _commands(
    run_dir: Path,
    base: SmokeResult,
    shape: dict[str, Any],
    deepspeed: bool,
    lr: float,
    inject_step: int,
    attn_implementation: str | None,
    task: str = "pretrain",
    mode_args: list[str] | None = None,
) -> list[list[str]]:
    """The launcher commands (one per node).

    A LoRA plan's run trains adapters of the rank its memory prediction prices
    (tools/smoke/predict.py), with the base frozen, as the job does.
    """
    train_args = [
        "--steps",
        str(base.steps),
        "--seq-len",
        str(shape["seq_len"]),
        "--micro-batch",
        str(shape["micro_batch_size"]),
        "--metrics-dir",
        str(run_dir / "metrics"),
        "--log-dir",
        str(run_dir / "logs"),
    ]
    if base.inject is not None:
        train_args += ["--inject", base.inject, "--inject-step", str(inject_step)]
    if attn_implementation:
        train_args += ["--attn-implementation", attn_implementation]
    if task == "lora":
        train_args += ["--lora-rank", str(DEFAULT_LORA_RANK)]
    train_args += mode_args or []
    return launch_commands(
        run_dir=run_dir,
        script=run_dir / RUN_SCRIPT_NAME,
        device=base.device,
        ranks=base.world_size,
        nodes=base.nodes,
        deepspeed=deepspeed,
        train_args=train_args,
        lr=lr,
    )


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
    """A temporary folder made now for this run alone (``tmp/run-XXXXXXXX``), removed after.

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


def _announce(
    on_progress: Callable[[str], None] | None,
    base: SmokeResult,
    shape: dict[str, Any],
    inject_step: int,
) -> None:
    if on_progress is None:
        return
    inject = base.inject
    on_progress(
        f"launching {base.world_size} {base.device} rank(s) on {base.nodes} node(s): "
        f"{shape['family']} {shape['layers']}x{shape['hidden']}, {shape['params']:,} params, "
        f"{base.strategy}, {base.steps} steps"
        + (f", injecting {inject} at step {inject_step}" if inject else "")
    )


def _make_run_dir(run_dir: Path | None, settings: Settings, force: bool = False) -> Path:
    if run_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = settings.runs_dir / f"{stamp}-{uuid.uuid4().hex[:8]}"
    if not str(run_dir).strip():
        raise InputError("--run-dir", "give a folder name, not an empty string")
    # Absolute, because the launcher runs with the run directory as its working directory.
    run_dir = Path(run_dir).resolve()
    # A folder of the user's is refused before anything runs (unless force).
    return claim(run_dir, force=force, field="--run-dir", create=True)


def _local_device() -> tuple[str, int]:
    from tools.research.gpu_probe import torch_may_see_gpus

    if not torch_may_see_gpus():
        return "cpu", 0  # a CPU-only torch build; importing torch to ask would take seconds
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.device_count()
    return "cpu", 0


def _finish(
    result: SmokeResult, run_dir: Path, started: float, *, reason: str | None = None
) -> SmokeResult:
    if reason is not None:
        result = result.model_copy(update={"reason": reason})
    result = result.model_copy(update={"wall_time_s": time.monotonic() - started})
    _write_json(run_dir / "result.json", result.model_dump(mode="json"))
    return result


def _write_json(path: Path, data: Any) -> None:
    write_file(path.parent, path.name, json.dumps(data, indent=2), field="--run-dir")
