"""Smoke-test a training setup with a short, real DeepSpeed or PyTorch DDP run on this machine.

The run uses a scaled-down copy of the planned model (same family), the planned DeepSpeed
config adapted to the local world (CPU ranks over gloo, or the local GPUs) or, for a plan
without DeepSpeed, plain PyTorch DDP started with torchrun, and synthetic but learnable data
(tools/smoke/scripts/train.py). It proves the setup starts, steps and learns; the memory it reports
is that of the scaled model, so the caller compares it with a prediction for the same shape.

The steps have their own modules: scale.py (the model), ds_adapt.py (the config), commands.py
(the launchers), supervise.py (the watch; groups.py, memory_cap.py and stopping.py beside
it), verdict.py (the result) and predict.py (the prediction). On CPU, DeepSpeed JIT-builds each C++ op it uses (a minute the first time),
so the runs avoid the ones they need not build (bench/results/2026-11-30-profile-smoke-path.md has the measurements).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.core.errors import InputError
from tools.core.outputs import (
    check_files,
    copy_file,
    keep_reserved,
    listed,
    record,
    remove_file,
    reserve,
    subfolder,
)
from tools.core.schemas import ModelSpec, SmokeResult
from tools.core.settings import Settings
from tools.core.strategies import strategy_of
from tools.planning.states import DEFAULT_LORA_RANK
from tools.smoke.commands import child_env, launch_commands
from tools.smoke.ds_adapt import adapt_ds_config, smoke_lr
from tools.smoke.memory_cap import rank_address_space
from tools.smoke.predict import fits_local_gpu, shape_spec, with_prediction
from tools.smoke.rundir import (
    RUN_SCRIPTS,
    check_arguments,
    check_run_paths,
    child_files,
    finish_run,
    fresh_tmp_dir,
    make_run_dir,
    run_files,
    stall_limit,
    write_run_json,
)
from tools.smoke.scale import (
    CPU_BUDGET,
    FULL_SIZE_MAX_SEQ,
    GPU_BUDGET,
    first_line,
    llama_config_from_shape,
    scale_model_config_cached,
)
from tools.smoke.schedule import plan_recipe_flags, plan_torchrun_schedule
from tools.smoke.spec import DeepSpeedRun, LayoutRun, SmokeSpec, TensorFlowRun, TorchrunRun
from tools.smoke.standalone import PARALLEL_SCRIPT, TRAIN_SCRIPT, script_files
from tools.smoke.supervise import launch_and_wait
from tools.smoke.verdict import run_verdict


def run_smoke_test(
    model: ModelSpec,
    spec: SmokeSpec,
    settings: Settings,
    on_progress: Callable[[str], None] | None = None,
) -> SmokeResult:
    """Run a short real training of the planned model (scaled down to fit) and report whether it learns.

    Args:
        model: The planned model. On a GPU it runs at full size when the planner says it fits
            the local GPU with 10% headroom; otherwise (and always on CPU) its ``hf_config``
            (or its shape) is scaled down to the local budget, keeping the family.
        spec: What runs (tools/smoke/spec.py): the mode (DeepSpeed with the plan's config,
            torchrun DDP/FSDP2, the tensor/pipeline layout stand-in, or TensorFlow workers) and
            the steps, micro-batch, sequence, ranks, nodes, fault, timeout, memory cap and run
            folder. On CPU each rank also gets an address-space limit of its share of the
            memory cap plus a fixed allowance (``rank_address_space``).
        settings: Run settings (``smoke_steps``, ``smoke_timeout_s``, ``smoke_cpu_ranks``, paths).
        on_progress: Called with one line per training step (and a launch line).

    Returns:
        A ``SmokeResult`` with the measured metrics, how it ran (``run_mode``) and the planner's
        prediction for the shape that ran; a failed result names its ``failure_kind`` (``oom``,
        ``nan``, ``diverged``, ``timeout``, ``crash`` or ``launcher_error``), which its reason
        starts with.
    """
    if isinstance(spec.mode, TensorFlowRun):
        from tools.smoke.tf_runner import run_tf_smoke

        return run_tf_smoke(model, spec, settings, on_progress)
    mode = spec.mode
    steps, timeout_s, cap = check_arguments(settings, spec)
    stall_s = stall_limit(settings, spec)
    started = time.monotonic()
    run_dir = make_run_dir(spec.run_dir, settings, spec.force)
    if isinstance(mode, LayoutRun):  # CPU ranks, one per shard of the layout
        device, ranks = "cpu", mode.setup.world
        model = _splittable(model)
    else:
        device, ranks = _local_world(settings, spec.world_size, spec.nodes)
    # Every file the run writes, checked before anything is written: none may be the user's.
    written = run_files(ranks, spec.nodes)
    check_files(run_dir, written, field="--run-dir")
    check_run_paths(run_dir)
    base = SmokeResult(
        status="failed",
        device=device,
        world_size=ranks,
        steps=steps,
        run_dir=str(run_dir),
        strategy=spec.strategy or _strategy(mode),
        nodes=spec.nodes,
        inject=spec.inject,
        run_mode=mode.run_mode(),
    )
    checkpointing = (
        "activation_checkpointing" in mode.config  # DeepSpeed recomputes as its config says
        if isinstance(mode, DeepSpeedRun)
        else isinstance(mode, TorchrunRun) and mode.recompute
    )
    scaled = _scaled_model(model, settings, base, spec, checkpointing)
    if isinstance(scaled, str):
        return finish_run(base.failed("launcher_error", scaled), run_dir, started)
    model_config, shape, full_size = scaled
    base.model_shape = shape
    lr = smoke_lr(int(shape["hidden"]))
    run_config, notes = _run_config(spec, base, shape, lr, full_size)
    notes += scaled_sequence_note(spec, model, shape)
    mode_args = _mode_args(mode, steps, lr, notes)
    script = PARALLEL_SCRIPT if isinstance(mode, LayoutRun) else TRAIN_SCRIPT
    run_script = _prepare_run_dir(run_dir, model_config, run_config, script)
    commands = _commands(
        run_dir, base, shape, spec, lr, run_config is not None, mode_args, script=run_script
    )
    _announce(on_progress, base, shape, spec.inject_step)
    # CUDA reserves far more address space than any limit we could set here.
    address_space = rank_address_space(cap, ranks) if device != "cuda" else 0
    # What the launchers and ranks will write stays ours if this process is killed before
    # ``record``, as far as it was written while the run was alive (tools/core/outputs.py).
    children = child_files(written)
    reserve(run_dir, children)
    try:
        with fresh_tmp_dir(run_dir) as tmp_dir:
            # Every "node" runs on this machine, so the cores are split over all the ranks.
            env = child_env(tmp_dir, device, ranks)
            outcome = launch_and_wait(
                commands,
                env,
                run_dir,
                timeout_s,
                on_progress,
                memory_cap=cap,
                address_space=address_space,
                keep_alive=lambda: keep_reserved(run_dir, children),
                stall_s=stall_s,
            )
    finally:
        # What the launchers and ranks wrote is ours: a rerun in this folder may replace it.
        record(run_dir, children)
    result = run_verdict(base, outcome, run_dir / "metrics", ranks, steps, notes)
    return finish_run(with_prediction(result, task=spec.task), run_dir, started)


def _strategy(mode: DeepSpeedRun | TorchrunRun | LayoutRun) -> str:
    """The strategy a run records when the spec names none."""
    if isinstance(mode, DeepSpeedRun):
        return strategy_of(mode.config)
    if isinstance(mode, LayoutRun):  # its data-parallel part: ZeRO-1 over dp > 1, else none
        return mode.setup.strategy
    return "ddp"


def _mode_args(
    mode: DeepSpeedRun | TorchrunRun | LayoutRun, steps: int, lr: float, notes: list[str]
) -> list[str]:
    """The training script's flags for ``mode`` (none for DeepSpeed); ``notes`` say what ran."""
    if isinstance(mode, LayoutRun):
        args, notes[0] = _layout_args(mode)
        notes.append(f"constant lr {lr:g}")
        return args
    if isinstance(mode, TorchrunRun):  # the schedule, recompute and sharding are flags
        args, note = _torchrun_args(mode, steps, lr)
        notes.append(note)
        return args
    return []


def _layout_args(mode: LayoutRun) -> tuple[list[str], str]:
    """parallel_train.py's arguments for the layout, and the note saying what ran."""
    tp, pp, dp = mode.setup.tp, mode.setup.pp, mode.setup.dp
    micro = 2 * pp if pp > 1 else 1  # enough micro-batches to fill the pipeline
    args = ["--tp", str(tp), "--pp", str(pp), "--pp-schedule", mode.schedule]
    args += ["--microbatches", str(micro), *(["--zero1"] if dp > 1 else [])]
    note = (
        f"torch-native stand-in for the plan's layout: DTensor TP {tp} x pipelining PP {pp}"
        + (f" ({mode.schedule}, {micro} micro-batches)" if pp > 1 else "")
        + (f" x ZeRO-1 DP {dp}" if dp > 1 else "")
        + f" on {tp * pp * dp} CPU ranks under torchrun; each rank's parameter share checked; "
        "key-value heads = attention heads, untied embeddings"
    )
    return args, note


def _torchrun_args(mode: TorchrunRun, steps: int, lr: float) -> tuple[list[str], str]:
    """train.py's schedule, recompute and FSDP flags for a torchrun run, and the schedule note."""
    command = list(mode.plan_command or [])  # its schedule scaled, its AdamW flags as given
    args, note = plan_torchrun_schedule(command, steps) or ([], f"constant lr {lr:g}")
    args += plan_recipe_flags(command) + (["--gradient-checkpointing"] if mode.recompute else [])
    if mode.fsdp is not None:
        args += ["--fsdp", "--fsdp-sharding", mode.fsdp]
        args += ["--fsdp-offload"] if mode.offload else []
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
    spec: SmokeSpec,
    checkpointing: bool,
) -> tuple[dict[str, Any], dict[str, Any], bool] | str:
    """The model config the run builds, its shape and whether it is full size; or why it cannot.

    Full size only on a GPU the planner says it fits; otherwise scaled to the local budget.
    """
    device, ranks, micro_batch_size = base.device, base.world_size, spec.micro_batch_size
    want_seq = spec.seq_len if spec.seq_len is not None else model.seq_len
    hf_config = model.hf_config or llama_config_from_shape(model)
    full_size = device == "cuda" and fits_local_gpu(
        model,
        base.strategy or "ddp",
        ranks,
        micro_batch_size,
        min(want_seq, FULL_SIZE_MAX_SEQ),
        spec.task,
        activation_checkpointing=checkpointing,
    )
    budget = GPU_BUDGET if device == "cuda" else CPU_BUDGET
    smoke_seq = max(8, min(want_seq, FULL_SIZE_MAX_SEQ if full_size else budget["seq_len"]))
    try:
        model_config, shape = scale_model_config_cached(
            hf_config,
            seq_len=smoke_seq,
            device=device,
            full_size=full_size,
            cache_dir=settings.home / "cache" / "smoke-shapes",
        )
    except Exception as exc:  # whatever transformers rejects is reported as the run's result
        return f"cannot build the model: {first_line(exc)}"
    shape.update(
        seq_len=smoke_seq,
        micro_batch_size=micro_batch_size,
        activation_checkpointing=checkpointing,
    )
    return model_config, shape, full_size


def _run_config(
    spec: SmokeSpec,
    base: SmokeResult,
    shape: dict[str, Any],
    lr: float,
    full_size: bool,
) -> tuple[dict[str, Any] | None, list[str]]:
    """The DeepSpeed config the run uses (None: torchrun) and the notes on how it differs."""
    run_config: dict[str, Any] | None = None
    if spec.ds_config is not None:
        run_config, notes = adapt_ds_config(
            spec.ds_config,
            device=base.device,
            ranks=base.world_size,
            micro_batch_size=spec.micro_batch_size,
            scaled=shape_spec(shape),
            lr=lr,
            steps=base.steps,
        )
    else:
        fsdp = spec.mode.fsdp if isinstance(spec.mode, TorchrunRun) else None
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
    script: Path = TRAIN_SCRIPT,
) -> Path:
    """Write the run's configs and scripts into ``run_dir``, clearing what an earlier run left.

    Only files an earlier run wrote and nobody changed since are removed or replaced. Returns
    the run's copy of ``script``.
    """
    for name in ("tmp", "metrics"):  # never a link out of the run dir
        subfolder(run_dir, name, "--run-dir")
    earlier = ("metrics/rank", "logs/rank", "smoke", f"{RUN_SCRIPTS}/")
    for stale in listed(run_dir):
        if stale.startswith(earlier) or stale == "hostfile":
            remove_file(run_dir, stale)
    write_run_json(run_dir / "model_config.json", model_config)
    if run_config is not None:
        write_run_json(run_dir / "ds_config.json", run_config)
    else:
        # A reused run dir must not suggest that this run used an earlier run's config.
        remove_file(run_dir, "ds_config.json")
    # A copy of the scripts folder makes the run dir a self-contained reproduction of the run.
    for source in script_files():
        copy_file(run_dir, f"{RUN_SCRIPTS}/{source.name}", source, field="--run-dir")
    return run_dir / RUN_SCRIPTS / script.name


def _commands(
    run_dir: Path,
    base: SmokeResult,
    shape: dict[str, Any],
    spec: SmokeSpec,
    lr: float,
    deepspeed: bool,
    mode_args: list[str],
    *,
    script: Path,
) -> list[list[str]]:
    """The launcher commands (one per node), running the run dir's copy ``script``.

    A LoRA plan's run trains adapters of the rank its memory prediction prices
    (tools/smoke/predict.py), with the base frozen, as the job does. The layout stand-in
    trains its own model (pretraining, the attention kernel of its choice).
    """
    layout = isinstance(spec.mode, LayoutRun)
    attn_implementation = None if layout else spec.attn_implementation
    task = "pretrain" if layout else spec.task
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
        train_args += ["--inject", base.inject, "--inject-step", str(spec.inject_step)]
    if attn_implementation:
        train_args += ["--attn-implementation", attn_implementation]
    if task == "lora":
        train_args += ["--lora-rank", str(DEFAULT_LORA_RANK)]
    train_args += mode_args
    return launch_commands(
        run_dir=run_dir,
        script=script,
        device=base.device,
        ranks=base.world_size,
        nodes=base.nodes,
        deepspeed=deepspeed,
        train_args=train_args,
        lr=lr,
    )


def scaled_sequence_note(spec: SmokeSpec, model: ModelSpec, shape: dict[str, Any]) -> list[str]:
    """One line when the run's sequence is shorter than the one asked (the local budget)."""
    want = spec.seq_len if spec.seq_len is not None else model.seq_len
    ran = int(shape["seq_len"])
    if ran >= want:
        return []
    return [
        f"sequence length {ran}, not the {want:,} asked: the smoke run scales the model and its "
        "sequence to what this machine runs in seconds (it proves the setup starts and learns; "
        "the plan prices the full length)"
    ]


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
        f"seq {shape['seq_len']}, {base.strategy}, {base.steps} steps"
        + (f", injecting {inject} at step {inject_step}" if inject else "")
    )


def _local_device() -> tuple[str, int]:
    from tools.research.gpu_probe import torch_may_see_gpus

    if not torch_may_see_gpus():
        return "cpu", 0  # a CPU-only torch build; importing torch to ask would take seconds
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.device_count()
    return "cpu", 0
