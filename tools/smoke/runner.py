"""Smoke-test a training setup with a short, real DeepSpeed or PyTorch DDP run on this machine.

The run uses a scaled-down copy of the planned model (same family), the planned DeepSpeed
config adapted to the local world (CPU ranks over gloo, or the local GPUs) or, for a plan
without DeepSpeed, plain PyTorch DDP started with torchrun, and synthetic but learnable data
(tools/smoke/train.py). It proves the setup starts, steps and learns; the memory it reports
is that of the scaled model, so the caller compares it with a prediction for the same shape.

Notes from checking DeepSpeed 0.19 on the CPU accelerator (2 ranks, gloo):

- ZeRO stages 0-3 all train; so do ``offload_optimizer``/``offload_param`` with device
  ``cpu`` (a no-op for memory on CPU, but it exercises DeepSpeedCPUAdam and the offload code).
  ``nvme`` offload needs the async_io op (libaio), which is not there, so it becomes ``cpu``.
- The CPU accelerator JIT-builds C++ ops with gcc + ninja into ``TORCH_EXTENSIONS_DIR``
  (default ``~/.cache/torch_extensions``, which we keep so builds are reused across runs;
  never a per-run directory): ``deepspeed_shm_comm`` whenever the process group starts,
  ``fused_adam`` for a config-built Adam(W), ``cpu_adam`` with optimizer offload. Each costs
  30-60 s the first time. ``shm_comm`` is only used by ``inference_all_reduce``, so the
  training script skips it; ``fused_adam`` is avoided with ``torch_adam`` (same update,
  torch.optim.AdamW); ``cpu_adam`` is needed for offload and is built once, then cached.
  Measured on 2 cores: a ZeRO-2 run takes ~13 s with no build at all; with optimizer offload
  the first run takes ~63 s (cpu_adam build), later ones ~20 s.
- ZeRO-3 with both offloads once (in 8 runs) aborted at interpreter exit after training
  finished ("terminate called without an active exception"); the verdict then says crash,
  because a job that dies at exit is not a setup we would call healthy.
- Peak memory on CPU is each rank's peak RSS, which includes the torch and DeepSpeed
  libraries (~0.5 GB), not only model states.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from tools.core.errors import InputError
from tools.core.files import copy_atomic, write_atomic
from tools.core.schemas import ModelSpec, SmokeResult
from tools.core.settings import TELEMETRY_OFF, Settings
from tools.core.strategies import MIN_HEADROOM, STRATEGY_ORDER, base_strategy, strategy_of

SCRIPT = Path(__file__).with_name("train.py")
# The name the script has in a run directory (and so in the ranks' command lines).
RUN_SCRIPT_NAME = "smoke_train.py"

# Local budgets for the scaled model. On CPU a step must take well under a second on two
# cores; on a GPU a few layers at moderate width still start in seconds.
CPU_BUDGET = {"layers": 2, "hidden": 256, "heads": 4, "vocab": 8192, "seq_len": 64, "experts": 4}
GPU_BUDGET = {
    "layers": 4,
    "hidden": 1024,
    "heads": 16,
    "vocab": 32768,
    "seq_len": 512,
    "experts": 4,
}
# A safety net for families whose extra dimensions (e.g. MLA ranks) we do not scale.
MAX_SCALED_PARAMS = {"cpu": 20_000_000, "cuda": 500_000_000}
# The sequence length a full-size GPU run is capped to (memory, not the model, sets the limit).
FULL_SIZE_MAX_SEQ = 2048

# The plan's learning rate and schedule are sized for the full model over a long run (often
# 1e-5 with hundreds of warm-up steps); a random-init tiny model needs a larger, constant rate
# to show learning within ~30 steps. The smoke run checks the mechanics, not the schedule.
SMOKE_LR = 3e-3
# Above this width the rate shrinks as 1/width: Adam's per-weight step must shrink as fan-in
# grows for the update to stay the same size (Yang et al. 2021, "Tensor Programs V", muP).
SMOKE_LR_WIDTH = 256
WARMUP_STEPS = 3
MIN_LOSS_DROP = 0.10
KILL_GRACE_S = 5.0
# After Ctrl-C (or SystemExit) the user is waiting: the ranks die at SIGTERM at once, and only
# the launchers' own interpreter teardown (seconds) would use a longer grace.
INTERRUPT_GRACE_S = 1.0
POLL_S = 0.2
# The memory cap a run gets by default (Settings.smoke_memory_cap unset): this share of the
# machine's RAM, or of its cgroup's limit when that is lower. The cap bounds the resident
# memory of every process of the run together (launchers and ranks; shared library pages
# count in each process that maps them).
DEFAULT_MEMORY_CAP_FRACTION = 0.5
# On CPU every rank also runs under an address-space limit (RLIMIT_AS) of the cap plus this
# much. torch, OpenMP and glibc's per-thread arenas reserve address space they never touch (a
# CPU rank maps ~1.4 GiB for ~0.5 GiB resident), so this limit is only a backstop for an
# allocation too fast for the watchdog's poll. Never on CUDA, which reserves huge ranges.
ADDRESS_SPACE_HEADROOM = 8 * 2**30
# Starts a launcher under an address-space limit: sets RLIMIT_AS, then execs the launcher (a
# shim rather than preexec_fn, which is unsafe when the caller has other threads).
_RLIMIT_SHIM = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_AS, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"
)

# Sections that need the network (wandb, comet), write outside the run dir, or change the
# batch sizes we set (elasticity, autotuning); none of them bears on whether training works.
_DROPPED_SECTIONS = (
    "scheduler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "flops_profiler",
    "comms_logger",
    "autotuning",
    "elasticity",
    "checkpoint",
    "nebula",
    "data_efficiency",
    "curriculum_learning",
    "compression_training",
    "dump_state",
)
_PROGRESS = re.compile(r"^step \d+/\d+ ")
# What an out-of-memory failure prints: torch's CUDA and CPU allocators, Python, the C++ runtime.
_OOM_MARKERS = (
    "CUDA out of memory",
    "OutOfMemoryError",
    "can't allocate memory",
    "MemoryError",
    "std::bad_alloc",
)
# A rank that died of SIGKILL we did not send: on Linux, almost always the kernel's OOM killer.
_KILLED_MARKERS = ("return code = -9", "Signals.SIGKILL", "exitcode  : -9")
INJECT_KINDS = ("oom", "nan", "hang", "crash", "alloc")
# Errors a rank raises because a peer died, not because of its own fault.
_PEER_FAILURE_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "Socket Timeout",
)
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b")
# Log text that shows the launcher got as far as starting the ranks: DeepSpeed's runner logs
# the first when it starts them; torchrun raises the second when a rank it started fails.
_SPAWNED = ("spawned with command", "ChildFailedError")
# torchrun's own summary exception; the failing rank's exception above it names the cause.
_LAUNCHER_ERRORS = ("ChildFailedError",)
# How families spell the feed-forward width, key/value heads and expert counts.
_FFN_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff")
_MOE_FFN_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size")
_KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
_NOT_CONFIG_KEYS = (
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "quantization_config",
    "auto_map",
)


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
            CPU each rank also gets an address-space limit of the cap plus 8 GiB.

    Returns:
        A ``SmokeResult`` with the measured metrics and the planner's prediction for the shape
        that ran; ``failed`` results carry a reason that starts with ``oom``, ``nan``,
        ``diverged``, ``timeout``, ``crash`` or ``launcher_error``.
    """
    steps = settings.smoke_steps if steps is None else steps
    timeout_s = settings.smoke_timeout_s if timeout_s is None else timeout_s
    if steps < 2:
        raise InputError("steps", f"a smoke run needs at least 2 steps, got {steps}")
    if micro_batch_size < 1:
        raise InputError("micro_batch_size", f"must be at least 1, got {micro_batch_size}")
    if settings.smoke_cpu_ranks < 1:
        raise InputError("smoke_cpu_ranks", f"must be at least 1, got {settings.smoke_cpu_ranks}")
    if nodes < 1:
        raise InputError("nodes", f"must be at least 1, got {nodes}")
    if inject is not None and inject not in INJECT_KINDS:
        raise InputError("inject", f"must be one of {', '.join(INJECT_KINDS)}, got {inject!r}")
    if not 1 <= inject_step <= steps:
        raise InputError("inject_step", f"must be between 1 and steps ({steps}), got {inject_step}")
    if timeout_s <= 0:
        raise InputError("timeout", f"must be positive, got {timeout_s:g}")
    cap = settings.smoke_memory_cap if memory_cap is None else memory_cap
    cap = default_memory_cap() if cap is None else cap
    if cap < 0:
        raise InputError("memory_cap", f"must be positive (or 0 for none), got {cap}")

    started = time.monotonic()
    # Absolute, because the launcher runs with the run directory as its working directory.
    run_dir = (Path(run_dir) if run_dir is not None else _new_run_dir(settings)).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    device, gpu_count = _local_device()
    if device == "cuda":
        ranks = max(1, min(gpu_count, world_size or gpu_count))
    else:
        ranks = settings.smoke_cpu_ranks
    if ranks % nodes:
        raise InputError(
            "nodes", f"{ranks} local rank(s) cannot be split evenly over {nodes} nodes"
        )
    budget = GPU_BUDGET if device == "cuda" else CPU_BUDGET
    strategy = strategy or (strategy_of(ds_config) if ds_config is not None else "ddp")
    base = SmokeResult(
        status="failed",
        device=device,
        world_size=ranks,
        steps=steps,
        run_dir=str(run_dir),
        strategy=strategy,
        nodes=nodes,
        inject=inject,
    )

    want_seq = seq_len if seq_len is not None else model.seq_len
    hf_config = model.hf_config or llama_config_from_shape(model)
    checkpointing = bool(ds_config and "activation_checkpointing" in ds_config)
    full_size = device == "cuda" and _fits_local_gpu(
        model,
        strategy,
        ranks,
        micro_batch_size,
        min(want_seq, FULL_SIZE_MAX_SEQ),
        task,
        activation_checkpointing=checkpointing,
    )
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
        reason = f"launcher_error: cannot build the model: {_first_line(exc)}"
        return _finish(base, run_dir, started, reason=reason)
    shape.update(
        seq_len=smoke_seq,
        micro_batch_size=micro_batch_size,
        activation_checkpointing=checkpointing,
    )
    base.model_shape = shape
    lr = smoke_lr(int(shape["hidden"]))
    run_config: dict[str, Any] | None = None
    if ds_config is not None:
        run_config, notes = adapt_ds_config(
            ds_config,
            device=device,
            ranks=ranks,
            micro_batch_size=micro_batch_size,
            scaled=shape_spec(shape),
            lr=lr,
        )
    else:
        notes = ["plain PyTorch DDP (torchrun)", f"constant lr {lr:g}"]
        if device == "cuda":
            notes.append("bf16 autocast")
    if full_size:
        notes.append("full-size model (fits the local GPU)")
    if nodes > 1:
        notes.append(f"{nodes} nodes x {ranks // nodes} rank(s) on this machine")

    tmp_dir = run_dir / "tmp"
    metrics_dir = run_dir / "metrics"
    for folder in (tmp_dir, metrics_dir):
        folder.mkdir(parents=True, exist_ok=True)
    stale_logs = [*run_dir.glob("smoke*.log"), *run_dir.glob("logs/rank*.log")]
    for stale in [*metrics_dir.glob("rank*.json"), *stale_logs]:
        stale.unlink()
    _write_json(run_dir / "model_config.json", model_config)
    if run_config is not None:
        _write_json(run_dir / "ds_config.json", run_config)
    else:
        # A reused run dir must not suggest that this run used an earlier run's config.
        (run_dir / "ds_config.json").unlink(missing_ok=True)
    # A copy of the script makes the run dir a self-contained reproduction of the run.
    script = run_dir / RUN_SCRIPT_NAME
    copy_atomic(SCRIPT, script)

    train_args = [
        "--steps",
        str(steps),
        "--seq-len",
        str(smoke_seq),
        "--micro-batch",
        str(micro_batch_size),
        "--metrics-dir",
        str(metrics_dir),
        "--log-dir",
        str(run_dir / "logs"),
    ]
    if inject is not None:
        train_args += ["--inject", inject, "--inject-step", str(inject_step)]
    if attn_implementation:
        train_args += ["--attn-implementation", attn_implementation]
    commands = launch_commands(
        run_dir=run_dir,
        script=script,
        device=device,
        ranks=ranks,
        nodes=nodes,
        deepspeed=run_config is not None,
        train_args=train_args,
        lr=lr,
    )
    # Every "node" runs on this machine, so the cores are split over all the ranks.
    env = _child_env(tmp_dir, device, ranks)
    if on_progress is not None:
        on_progress(
            f"launching {ranks} {device} rank(s) on {nodes} node(s): {shape['family']} "
            f"{shape['layers']}x{shape['hidden']}, {shape['params']:,} params, {strategy}, "
            f"{steps} steps" + (f", injecting {inject} at step {inject_step}" if inject else "")
        )

    outcome = _launch_and_wait(
        commands,
        env,
        run_dir,
        timeout_s,
        on_progress,
        memory_cap=cap,
        # CUDA reserves far more address space than any limit we could set here.
        address_space=cap + ADDRESS_SPACE_HEADROOM if cap and device != "cuda" else 0,
    )
    result = _verdict(base, outcome, metrics_dir, ranks, steps, notes)
    result = with_prediction(result, task=task)
    return _finish(result, run_dir, started)


def stop_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that ``finally`` blocks stop the launched groups.

    Smoke runs start their launchers in new sessions (so one killpg reaches every rank); a
    process killed by SIGTERM's default action would leave them running. Call it in a
    program's main thread (the CLI, the GPU check) before starting runs.
    """

    def _exit(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def smoke_lr(hidden: int) -> float:
    """The smoke run's constant learning rate for a model of width ``hidden``."""
    return SMOKE_LR * min(1.0, SMOKE_LR_WIDTH / max(1, hidden))


def launch_commands(
    *,
    run_dir: Path,
    script: Path,
    device: str,
    ranks: int,
    nodes: int,
    deepspeed: bool,
    train_args: list[str],
    lr: float,
) -> list[list[str]]:
    """One launcher command per node, as argument lists (no shell), for the local smoke world.

    One node: ``deepspeed`` (its runner) or ``torchrun`` on this machine. Several nodes: the
    commands the planner emits for a cluster without ssh (tools/artifacts/cluster.py launch_node{R}.sh),
    every "node" being this machine: DeepSpeed's runner with a hostfile of ``nodes`` hosts,
    ``--no_ssh --node_rank R``; torchrun with ``--nnodes N --node_rank R`` and a static
    rendezvous at 127.0.0.1.
    """
    port = free_port()
    per_node = ranks // nodes
    model_args = ["--model-config", str(run_dir / "model_config.json")]
    commands: list[list[str]] = []
    if deepspeed:
        if nodes > 1:
            hostfile = run_dir / "hostfile"
            write_atomic(hostfile, "".join(f"node{i} slots={per_node}\n" for i in range(nodes)))
        for node in range(nodes):
            if nodes > 1:
                where = ["--hostfile", str(run_dir / "hostfile"), "--no_ssh"]
                where += ["--node_rank", str(node)]
            else:
                # A missing hostfile keeps the launcher on this machine even where a cluster
                # image ships /job/hostfile (the runner's default), which would make it ssh.
                where = [
                    "--hostfile",
                    str(run_dir / "no-hostfile"),
                    *_rank_selection(device, ranks),
                ]
            commands.append(
                [
                    sys.executable,
                    "-m",
                    "deepspeed.launcher.runner",
                    *where,
                    "--master_addr",
                    "127.0.0.1",
                    "--master_port",
                    str(port),
                    str(script),
                    *model_args,
                    "--deepspeed_config",
                    str(run_dir / "ds_config.json"),
                    *train_args,
                    "--lr",
                    f"{lr:g}",
                ]
            )
        return commands
    # torchrun's ranks index the GPUs that CUDA_VISIBLE_DEVICES leaves visible, so a user's
    # selection holds without an --include equivalent.
    for node in range(nodes):
        commands.append(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(nodes),
                "--node_rank",
                str(node),
                "--nproc_per_node",
                str(per_node),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                str(script),
                *model_args,
                *train_args,
                "--lr",
                f"{lr:g}",
                *(["--bf16"] if device == "cuda" else []),
            ]
        )
    return commands


def shape_spec(shape: dict[str, Any]) -> ModelSpec:
    """The ModelSpec of the model a smoke run builds (its ``model_shape``)."""
    return ModelSpec(
        name="smoke-scaled",
        params=int(shape["params"]),
        layers=int(shape["layers"]),
        hidden=int(shape["hidden"]),
        heads=int(shape["heads"]),
        kv_heads=shape.get("kv_heads"),
        intermediate=shape.get("intermediate"),
        vocab=int(shape["vocab"]),
        seq_len=int(shape.get("seq_len") or 64),
        largest_layer_params=int(
            shape.get("largest_layer_params", shape["vocab"] * shape["hidden"])
        ),
        # The family picks the activation model's per-layer coefficient (tools/planning/memory.py).
        hf_config={"model_type": shape["family"]} if shape.get("family") else None,
    )


def predict_peak_bytes(
    shape: dict[str, Any], strategy: str, device: str, ranks: int, *, task: str = "pretrain"
) -> int:
    """The planner's prediction of what a smoke run of ``shape`` measures, per rank.

    Like for like: the measurement is ``max_memory_allocated`` on a GPU (tensors only) and the
    peak RSS above the pre-model baseline on CPU, so the prediction is the memory model's total
    for the same shape, ranks, strategy and micro-batch without the two terms neither reading
    contains: the CUDA context and the 10% fragmentation margin (tools/planning/memory.py).
    """
    from tools.core.schemas import GPUSpec, HardwareSpec
    from tools.planning.memory import CUDA_CONTEXT_BYTES, estimate_strategy

    name: str = strategy if strategy in STRATEGY_ORDER else "ddp"
    gpu = GPUSpec(name="local", memory_gb=1e6) if device == "cuda" else None
    if gpu is None and "offload" in name:
        # On CPU ranks "offload" moves states from RAM to RAM: the footprint is the base stage's.
        name = base_strategy(name)
    hardware = HardwareSpec(source="local", nodes=1, gpus_per_node=max(1, ranks), gpu=gpu)
    est = estimate_strategy(
        shape_spec(shape),
        hardware,
        name,  # type: ignore[arg-type]
        task="lora" if task == "lora" else "pretrain",
        precision="bf16" if device == "cuda" else "fp32",
        micro_batch_size=int(shape.get("micro_batch_size", 1)),
        seq_len=int(shape.get("seq_len") or 64),
        attention="eager" if shape.get("attn_implementation") == "eager" else "sdpa",
        activation_checkpointing=bool(shape.get("activation_checkpointing")),
    )
    subtotal = est.per_gpu_bytes.total - est.per_gpu_bytes.margin
    if gpu is not None:
        subtotal -= CUDA_CONTEXT_BYTES
    return int(subtotal)


def with_prediction(result: SmokeResult, *, task: str = "pretrain") -> SmokeResult:
    """Attach the predicted peak for the shape that ran, the gap to the measurement, and MFU."""
    shape = result.model_shape
    if not shape or result.status == "skipped" or not result.strategy:
        return result
    update: dict[str, Any] = {
        "predicted_peak_memory_bytes": predict_peak_bytes(
            shape, result.strategy, result.device, result.world_size, task=task
        )
    }
    measured = result.measured_memory_bytes
    if measured and update["predicted_peak_memory_bytes"] > 0:
        update["memory_gap"] = measured / update["predicted_peak_memory_bytes"] - 1
    if result.device == "cuda" and result.tokens_per_s and result.device_name:
        update["mfu"] = smoke_mfu(shape, result.tokens_per_s, result.device_name, result.world_size)
    return result.model_copy(update=update)


def smoke_mfu(
    shape: dict[str, Any], tokens_per_s: float, device_name: str, ranks: int
) -> float | None:
    """Model FLOPs utilisation of a GPU smoke run: 6N + 12·L·h·s per token over the bf16 peak.

    The FLOPs are tools/planning/speed.py's ``training_flops_per_token`` (PaLM appendix B, without
    recompute: the smoke configs do not checkpoint activations); the peak is the GPU catalog's
    dense bf16 figure for the device torch reports. None when the catalog lacks the device.
    """
    from tools.core.errors import InputError as _InputError
    from tools.planning.speed import training_flops_per_token
    from tools.research.hardware import find_gpu

    try:
        gpu = find_gpu(device_name)
    except _InputError:
        return None
    if not gpu.bf16_tflops:
        return None
    flops = training_flops_per_token(
        shape_spec(shape), int(shape.get("seq_len") or 64), activation_checkpointing=False
    )
    return float(tokens_per_s * flops / (gpu.bf16_tflops * 1e12 * max(1, ranks)))


def _fits_local_gpu(
    model: ModelSpec,
    strategy: str,
    ranks: int,
    micro_batch: int,
    seq_len: int,
    task: str,
    *,
    activation_checkpointing: bool = False,
) -> bool:
    """Whether the full-size model fits the local GPU under ``strategy`` with 10% free."""
    import torch

    from tools.core.schemas import GPUSpec, HardwareSpec
    from tools.planning.memory import estimate_strategy

    if strategy not in STRATEGY_ORDER:
        return False
    props = torch.cuda.get_device_properties(0)
    capacity = int(props.total_memory)
    gpu = GPUSpec(name=str(props.name), memory_gb=capacity / 1e9)
    hardware = HardwareSpec(source="local", nodes=1, gpus_per_node=ranks, gpu=gpu)
    try:
        est = estimate_strategy(
            model,
            hardware,
            strategy,  # type: ignore[arg-type]
            task="lora" if task == "lora" else "pretrain",
            precision="bf16",
            micro_batch_size=micro_batch,
            seq_len=seq_len,
            activation_checkpointing=activation_checkpointing,
        )
    except InputError:
        return False
    return est.per_gpu_bytes.total <= (1 - MIN_HEADROOM) * capacity


def llama_config_from_shape(model: ModelSpec) -> dict[str, Any]:
    """Build a llama-style Hugging Face config dict from a model's layers/hidden/heads/vocab."""
    config: dict[str, Any] = {
        "model_type": "llama",
        "num_hidden_layers": model.layers,
        "hidden_size": model.hidden,
        "num_attention_heads": model.heads,
        "num_key_value_heads": model.kv_heads or model.heads,
        "vocab_size": model.vocab,
        "max_position_embeddings": model.seq_len,
    }
    if model.intermediate:
        config["intermediate_size"] = model.intermediate
    return config


def scale_model_config(
    hf_config: dict[str, Any], *, seq_len: int, device: str = "cpu", full_size: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Shrink a Hugging Face config to the local budget (same family); return it and its shape.

    With ``full_size`` the dimensions stay as they are (only the position table follows
    ``seq_len``), for a GPU on which the planner says the whole model fits.
    """
    import transformers

    # Default configs of a family warn about special-token ids outside the vocabulary we are
    # about to shrink; those ids are cleared below, so the warnings would only mislead.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return _scale_model_config(hf_config, seq_len=seq_len, device=device, full_size=full_size)
    finally:
        transformers.logging.set_verbosity(verbosity)


def _scale_model_config_cached(
    hf_config: dict[str, Any], *, seq_len: int, device: str, full_size: bool, cache_dir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``scale_model_config``, remembered on disk: the same inputs give the same result.

    Scaling imports transformers and torch and builds the model on the meta device to count
    its parameters: seconds before every launch, for a result that only depends on the
    inputs, the installed transformers and torch, and this file (the budgets and the scaling
    code). The cache key covers all of them; a missing or unreadable entry is recomputed.
    """
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for package in ("transformers", "torch"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    key = hashlib.sha256(
        json.dumps(
            [hf_config, seq_len, device, full_size, versions, _source_digest()],
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()[:32]
    path = cache_dir / f"{key}.json"
    try:
        cached = json.loads(path.read_text())
        return dict(cached["model_config"]), dict(cached["shape"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    model_config, shape = scale_model_config(
        hf_config, seq_len=seq_len, device=device, full_size=full_size
    )
    with contextlib.suppress(OSError):
        cache_dir.mkdir(parents=True, exist_ok=True)
        _write_json(path, {"model_config": model_config, "shape": shape})
    # What the caller gets is what a later cache hit returns: the JSON form.
    return json.loads(json.dumps(model_config)), json.loads(json.dumps(shape))


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _scale_model_config(
    hf_config: dict[str, Any], *, seq_len: int, device: str, full_size: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    import transformers

    budget = GPU_BUDGET if device == "cuda" else CPU_BUDGET
    if full_size:
        budget = {key: 10**12 for key in budget}
        budget["seq_len"] = seq_len
    source = {k: v for k, v in hf_config.items() if k not in _NOT_CONFIG_KEYS}
    family = str(source.pop("model_type", None) or "llama")
    orig: dict[str, Any] | None = None
    out: dict[str, Any] | None = None
    fallback = ""
    try:
        config = transformers.AutoConfig.for_model(family, **source)
        orig = _dims(config)
        scaled = _scale_dims(orig, budget, seq_len)
        if scaled != orig:
            _apply_dims(config, orig, scaled)
        _clear_out_of_range_token_ids(config, scaled["vocab"])
        out = {"model_type": family, **_config_dict(config)}
        params, largest = _count_params(out)
        if not full_size and params > MAX_SCALED_PARAMS.get(device, MAX_SCALED_PARAMS["cpu"]):
            fallback = f"{family} scaled to {params:,} params, over budget; used llama"
            out = None
    except Exception as exc:  # a family that cannot be built or scaled here falls back to llama
        fallback = f"{family} not buildable here ({_first_line(exc)}); used llama"
        out = None
    if orig is None:
        orig = _dims_from_dict(source)
    if out is None:
        # A llama-style decoder of the same shape still exercises the parallelism setup.
        scaled = _scale_dims(orig, budget, seq_len)
        family = "llama"
        llama = transformers.AutoConfig.for_model("llama", **_llama_kwargs(scaled))
        out = {"model_type": "llama", **_config_dict(llama)}
        params, largest = _count_params(out)
    changed = scaled != orig

    shape: dict[str, Any] = {
        "family": family,
        "params": params,
        "largest_layer_params": largest,
        "layers": scaled["layers"],
        "hidden": scaled["hidden"],
        "heads": scaled["heads"],
        "kv_heads": scaled["kv_heads"],
        "intermediate": scaled["intermediate"],
        "vocab": scaled["vocab"],
        "scaled": changed,
        "original": {k: orig[k] for k in ("layers", "hidden", "heads", "vocab")},
    }
    if fallback:
        shape["fallback"] = fallback
    return out, shape


def adapt_ds_config(
    ds_config: dict[str, Any],
    *,
    device: str,
    ranks: int,
    micro_batch_size: int,
    scaled: ModelSpec | None = None,
    lr: float = SMOKE_LR,
) -> tuple[dict[str, Any], list[str]]:
    """Adapt a DeepSpeed config to the local smoke world; return it and notes on what changed.

    With ``scaled`` (the model the run builds), the ZeRO bucket sizes become the ones the
    planner gives that model (tools/planning/memory.py ``zero_settings``): the planned sizes are sized
    for the full model and would make the scaled run's buffers, and so its memory, unlike
    both the target's and the prediction's.
    """
    cfg = _drop_auto(copy.deepcopy(ds_config))
    notes: list[str] = []
    for key in _DROPPED_SECTIONS:
        if cfg.pop(key, None) is not None:
            notes.append(f"dropped {key}")
    cfg["train_micro_batch_size_per_gpu"] = micro_batch_size
    cfg["gradient_accumulation_steps"] = 1
    cfg["train_batch_size"] = micro_batch_size * ranks
    cfg["steps_per_print"] = 10**9
    cfg["wall_clock_breakdown"] = False

    on_cpu = device != "cuda"
    if on_cpu:
        for key in ("bf16", "fp16", "amp", "torch_autocast"):
            section = cfg.pop(key, None)
            if isinstance(section, dict) and section.get("enabled"):
                notes.append(f"{key} -> fp32 (CPU)")
        # Half-precision communication and quantized ZeRO collectives have no CPU kernels.
        cfg.pop("communication_data_type", None)

    zero = cfg.get("zero_optimization")
    offload_optimizer = False
    if isinstance(zero, dict):
        if on_cpu:
            for key in (
                "zero_quantized_weights",
                "zero_quantized_gradients",
                "zero_hpz_partition_size",
            ):
                if zero.pop(key, None):
                    notes.append(f"dropped zero_optimization.{key} (CUDA kernels)")
        for key in ("offload_optimizer", "offload_param"):
            section = zero.get(key)
            if not isinstance(section, dict):
                continue
            where = section.get("device", "none")
            if where == "nvme":
                # The target's nvme_path does not exist here, and async_io needs libaio.
                zero[key] = {"device": "cpu", "pin_memory": bool(section.get("pin_memory"))}
                notes.append(f"{key} nvme -> cpu")
            if key == "offload_optimizer" and zero[key].get("device", "none") != "none":
                offload_optimizer = True
        if scaled is not None and zero.get("stage"):
            _rescale_buckets(zero, scaled, notes)

    optimizer = cfg.get("optimizer")
    if not isinstance(optimizer, dict) or not optimizer.get("type"):
        optimizer = {"type": "AdamW", "params": {}}
        notes.append("added AdamW")
    params = dict(optimizer.get("params") or {})
    if on_cpu and str(optimizer["type"]).lower() not in ("adam", "adamw"):
        # Other config-built optimizers (Lamb, Lion, 1-bit Adam) have no CPU kernel without offload.
        notes.append(f"optimizer {optimizer['type']} -> AdamW (CPU)")
        optimizer = {"type": "AdamW"}
        params = {k: v for k, v in params.items() if k in ("betas", "eps", "weight_decay")}
    params["lr"] = lr
    if not offload_optimizer and str(optimizer["type"]).lower() in ("adam", "adamw"):
        # Same Adam(W) update (torch.optim.AdamW) without JIT-building DeepSpeed's fused_adam
        # op (gcc on CPU, nvcc on GPU: a minute or more the first time, and a CUDA toolkit that
        # must match torch's). The optimizer states, and so the memory, are the same.
        params["torch_adam"] = True
    optimizer["params"] = params
    cfg["optimizer"] = optimizer
    notes.append(f"constant lr {lr:g}")
    return cfg, notes


def _rescale_buckets(zero: dict[str, Any], scaled: ModelSpec, notes: list[str]) -> None:
    from tools.planning.memory import zero_settings

    stage = int(zero["stage"])
    sizes = zero_settings(scaled, "zero3" if stage == 3 else "zero2")  # type: ignore[arg-type]
    wanted = {
        "reduce_bucket_size": sizes.reduce_bucket_size,
        "allgather_bucket_size": sizes.allgather_bucket_size,
        "stage3_prefetch_bucket_size": sizes.prefetch_bucket_size,
        "stage3_param_persistence_threshold": sizes.param_persistence_threshold,
    }
    changed = False
    for key, value in wanted.items():
        if key in zero and zero[key] != value:
            zero[key] = value
            changed = True
    if changed:
        notes.append("ZeRO bucket sizes scaled to the smoke model")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def group_alive(pgid: int) -> list[int]:
    """Return the pids of live (non-zombie) processes in process group ``pgid``."""
    import psutil

    alive = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return alive


def group_rss_bytes(pgids: Collection[int]) -> int:
    """The resident memory of every process in the process groups ``pgids``, summed (bytes).

    One read of ``/proc/PID/stat`` per process gives both its group and its RSS (zombies hold
    none); psutil stands in where there is no /proc.
    """
    wanted = set(pgids)
    total = 0
    if not os.path.exists("/proc/self/stat"):
        import psutil

        for proc in psutil.process_iter():
            with contextlib.suppress(OSError, psutil.Error):
                if os.getpgid(proc.pid) in wanted:
                    total += int(proc.memory_info().rss)
        return total
    page = os.sysconf("SC_PAGE_SIZE")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            # Fields 5 (pgrp) and 24 (rss, in pages) of proc(5), counted after the name.
            if int(fields[2]) in wanted:
                total += int(fields[21]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def default_memory_cap() -> int:
    """The default memory cap of a smoke run: half of this machine's RAM (or cgroup limit)."""
    return int(DEFAULT_MEMORY_CAP_FRACTION * _usable_memory())


def format_bytes(n: int) -> str:
    """``n`` bytes as MiB below 1 GiB (``512 MiB``), else GiB with one decimal (``8.0 GiB``)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


# --- internals -----------------------------------------------------------------------------


def _usable_memory() -> int:
    total = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    # A container's memory limit (cgroup v2, then v1) is what the run can really use.
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(path).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and 0 < int(limit) < total:
            total = int(limit)
        break
    return total


def _new_run_dir(settings: Settings) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return settings.runs_dir / f"{stamp}-{uuid.uuid4().hex[:8]}"


def _local_device() -> tuple[str, int]:
    from tools.research.gpu_probe import torch_may_see_gpus

    if not torch_may_see_gpus():
        return "cpu", 0  # a CPU-only torch build; importing torch to ask would take seconds
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.device_count()
    return "cpu", 0


def _rank_selection(device: str, ranks: int) -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if device == "cuda" and visible:
        # The runner ignores CUDA_VISIBLE_DEVICES when --num_gpus is given and renumbers from
        # 0, which would use GPUs the user hid; --include keeps their selection.
        ids = [part for part in visible.split(",") if part.strip()][:ranks]
        return ["--include", "localhost:" + ",".join(ids)]
    return ["--num_gpus", str(ranks)]


def _child_env(tmp_dir: Path, device: str, ranks: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TELEMETRY_OFF)
    env["TMPDIR"] = str(tmp_dir)
    env["PYTHONUNBUFFERED"] = "1"
    # The ranks end the run if this process dies without stopping it (e.g. SIGKILL):
    # tools/smoke/train.py SUPERVISOR_ENV.
    env["TRAINWRIGHT_SMOKE_SUPERVISOR_PID"] = str(os.getpid())
    if device != "cuda":
        env["DS_ACCELERATOR"] = "cpu"
        # One OpenMP pool per rank over all cores oversubscribes the CPU and makes steps slow
        # and noisy; split the cores between the ranks instead.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
        # glibc keeps freed blocks in its arenas and adapts its mmap threshold upwards, so a
        # rank's RSS would hold every size it ever freed. A fixed threshold gives each block of
        # 64 KiB or more (nearly every tensor) its own mapping, returned to the system when
        # freed: the RSS peak then follows live tensors, as a GPU's allocated peak does.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    return env


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


def _llama_kwargs(dims: dict[str, Any]) -> dict[str, Any]:
    return {
        "num_hidden_layers": dims["layers"],
        "hidden_size": dims["hidden"],
        "num_attention_heads": dims["heads"],
        "num_key_value_heads": dims["kv_heads"] or dims["heads"],
        "intermediate_size": dims["intermediate"] or 4 * dims["hidden"],
        "vocab_size": dims["vocab"],
        "max_position_embeddings": dims["max_positions"],
    }


def _dims_from_dict(source: dict[str, Any]) -> dict[str, Any]:
    # For configs transformers cannot load: read the usual spellings of each dimension.
    def first(*keys: str, default: int | None) -> int | None:
        for key in keys:
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value
        return default

    return {
        "layers": first("num_hidden_layers", "n_layer", "num_layers", "n_layers", default=2),
        "hidden": first("hidden_size", "n_embd", "d_model", "dim", default=128),
        "heads": first("num_attention_heads", "n_head", "num_heads", "n_heads", default=4),
        "kv_heads": first("num_key_value_heads", "n_kv_heads", default=None),
        "intermediate": first("intermediate_size", "n_inner", "ffn_dim", "d_ff", default=None),
        "vocab": first("vocab_size", default=512),
        "max_positions": first("max_position_embeddings", "n_positions", default=None),
        "experts": None,
    }


def _dims(config: Any) -> dict[str, Any]:
    return {
        "layers": int(config.num_hidden_layers),
        "hidden": int(config.hidden_size),
        "heads": int(config.num_attention_heads),
        "kv_heads": _first_present(config, _KV_KEYS),
        "intermediate": _first_present(config, _FFN_KEYS),
        "vocab": int(config.vocab_size),
        "max_positions": getattr(config, "max_position_embeddings", None),
        "experts": _first_present(config, _EXPERT_KEYS),
    }


def _scale_dims(orig: dict[str, Any], budget: dict[str, int], seq_len: int) -> dict[str, Any]:
    hidden = min(orig["hidden"], budget["hidden"])
    heads = min(orig["heads"], budget["heads"])
    while hidden % heads:
        heads -= 1
    kv = orig["kv_heads"]
    if kv:
        # Keep grouped-query attention grouped: the same heads-per-kv-head ratio, capped.
        group = max(1, orig["heads"] // kv)
        kv = max(1, heads // group)
        while heads % kv:
            kv -= 1
    intermediate = orig["intermediate"]
    if hidden != orig["hidden"] and intermediate is not None:
        intermediate = 4 * hidden
    # Position tables beyond the smoke sequence only cost memory; keep at least seq_len.
    max_positions = max(seq_len, min(int(orig["max_positions"] or 10**9), 2 * budget["seq_len"]))
    experts = orig["experts"]
    if experts is not None:
        experts = min(experts, budget["experts"])
    return {
        "layers": min(orig["layers"], budget["layers"]),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv,
        "intermediate": intermediate,
        "vocab": min(orig["vocab"], budget["vocab"]),
        "max_positions": max_positions,
        "experts": experts,
    }


def _apply_dims(config: Any, orig: dict[str, Any], dims: dict[str, Any]) -> None:
    # The generic names go through each config's attribute_map (gpt2: n_layer, n_embd, ...).
    config.num_hidden_layers = dims["layers"]
    config.hidden_size = dims["hidden"]
    config.num_attention_heads = dims["heads"]
    config.vocab_size = dims["vocab"]
    if dims["kv_heads"] is not None:
        _set_present(config, _KV_KEYS, dims["kv_heads"])
    if dims["intermediate"] != orig["intermediate"]:
        _set_present(config, _FFN_KEYS, dims["intermediate"])
    if orig["max_positions"] is not None:
        # Long-context RoPE variants (llama3, yarn) scale relative to the pre-training length,
        # which must stay below the position table; shrink it first, as setting the table
        # size re-validates the RoPE parameters.
        for key in ("rope_parameters", "rope_scaling"):
            rope = getattr(config, key, None)
            if not isinstance(rope, dict):
                continue
            original = rope.get("original_max_position_embeddings")
            if isinstance(original, int) and original >= dims["max_positions"]:
                half = max(1, dims["max_positions"] // 2)
                setattr(config, key, {**rope, "original_max_position_embeddings": half})
        config.max_position_embeddings = dims["max_positions"]
    reshaped = (dims["hidden"], dims["heads"]) != (orig["hidden"], orig["heads"])
    if reshaped and getattr(config, "head_dim", None) is not None:
        # Some configs derive head_dim (a read-only property); those follow hidden/heads anyway.
        with contextlib.suppress(AttributeError):
            config.head_dim = dims["hidden"] // dims["heads"]
    if dims["hidden"] != orig["hidden"]:
        _set_present(config, _MOE_FFN_KEYS, 2 * dims["hidden"])
        if isinstance(getattr(config, "word_embed_proj_dim", None), int):
            config.word_embed_proj_dim = dims["hidden"]  # OPT's embedding projection
    if dims["experts"] is not None:
        _set_present(config, _EXPERT_KEYS, dims["experts"])
        per_token = getattr(config, "num_experts_per_tok", None)
        if isinstance(per_token, int):
            config.num_experts_per_tok = min(per_token, dims["experts"])
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list):
        config.layer_types = layer_types[: dims["layers"]]


def _set_present(config: Any, keys: tuple[str, ...], value: int) -> None:
    for key in keys:
        if isinstance(getattr(config, key, None), int):
            with contextlib.suppress(AttributeError):
                setattr(config, key, value)


def _first_present(config: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _clear_out_of_range_token_ids(config: Any, vocab: int) -> None:
    # Special-token ids of the full vocabulary (gpt2's 50256) point outside the scaled one;
    # the synthetic data needs none of them.
    for key in _TOKEN_ID_KEYS:
        value = getattr(config, key, None)
        ids = value if isinstance(value, list) else [value]
        if any(isinstance(i, int) and i >= vocab for i in ids):
            setattr(config, key, None)


def _config_dict(config: Any) -> dict[str, Any]:
    data = config.to_diff_dict()
    for key in (*_NOT_CONFIG_KEYS, "model_type", "architectures"):
        data.pop(key, None)
    return dict(json.loads(json.dumps(data, default=str)))


def _count_params(config_dict: dict[str, Any]) -> tuple[int, int]:
    # Total parameters, and the most owned directly by one module (what ZeRO-3 gathers at once;
    # tools/research/model_catalog.py counts largest_layer_params the same way).
    import torch
    import transformers

    data = dict(config_dict)
    config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    # The meta device gives exact shapes without allocating weights.
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return int(total), int(largest)


def _drop_auto(value: Any) -> Any:
    # "auto" values are filled in by the HF Trainer integration only; DeepSpeed rejects them,
    # and its own defaults are what a plain deepspeed.initialize would use.
    if isinstance(value, dict):
        return {k: _drop_auto(v) for k, v in value.items() if v != "auto"}
    if isinstance(value, list):
        return [_drop_auto(v) for v in value]
    return value


class _Outcome:
    """What happened to the launched process group."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.timed_out = False
        self.start_error = ""
        self.last_progress = ""
        self.log_text = ""
        self.timeout_s = 0.0
        # Set when the run's processes held more than the memory cap: (cap, held) in bytes.
        self.over_cap: tuple[int, int] | None = None
        self.address_space = 0


def _launch_and_wait(
    commands: list[list[str]],
    env: dict[str, str],
    run_dir: Path,
    timeout_s: float,
    on_progress: Callable[[str], None] | None,
    *,
    memory_cap: int = 0,
    address_space: int = 0,
) -> _Outcome:
    """Start one launcher per node, each in its own process group, and supervise them all.

    Node 0 logs to ``smoke.log`` (its progress lines reach ``on_progress``), node R to
    ``smoke-node{R}.log``; the training script also writes ``logs/rank{R}.log`` per rank. The
    run ends when every launcher has exited, when one fails (the others are stopped: their
    ranks would only wait for the missing peers), at the timeout, or when the groups together
    hold more resident memory than ``memory_cap`` (checked every POLL_S; 0: no cap). Every
    group is then sent SIGTERM and, after a grace period, SIGKILL (at once over the cap), also
    on Ctrl-C or any error. ``address_space`` (bytes, 0: none) is the RLIMIT_AS each launcher
    starts under, inherited by its ranks.
    """
    outcome = _Outcome()
    outcome.timeout_s = timeout_s
    outcome.address_space = address_space
    log_paths = [
        run_dir / ("smoke.log" if i == 0 else f"smoke-node{i}.log") for i in range(len(commands))
    ]
    procs: list[subprocess.Popen[bytes]] = []
    grace = KILL_GRACE_S
    run = _ActiveRun()
    with _ACTIVE_LOCK:
        _ACTIVE.add(run)
    try:
        if _INTERRUPTED.is_set():
            raise KeyboardInterrupt  # Ctrl-C came while this run was being prepared
        for cmd, log_path in zip(commands, log_paths, strict=True):
            argv = cmd
            if address_space:
                argv = [sys.executable, "-S", "-c", _RLIMIT_SHIM, str(address_space), *cmd]
            with open(log_path, "wb") as log, _interrupts_deferred():
                # Ctrl-C waits until the launcher is in ``procs``, so the kill below reaches it.
                try:
                    procs.append(
                        subprocess.Popen(
                            argv,
                            cwd=run_dir,
                            env=env,
                            stdin=subprocess.DEVNULL,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            # Its own session and process group, so one killpg reaches the
                            # launcher, its ranks and any compiler it started, and nothing of ours.
                            start_new_session=True,
                        )
                    )
                except OSError as exc:
                    outcome.start_error = str(exc)
                    return outcome
        pgids = [p.pid for p in procs]
        _write_json(
            run_dir / "launch.json",
            {
                "commands": commands,
                "pids": pgids,
                "pgids": pgids,
                "memory_cap_bytes": memory_cap or None,
                "address_space_limit_bytes": address_space or None,
            },
        )
        deadline = time.monotonic() + timeout_s
        next_memory_check = 0.0
        offset = 0
        pending = b""
        while True:
            if run.stop.is_set():
                raise KeyboardInterrupt  # stop_all_runs (the CLI's Ctrl-C, from another thread)
            codes = [proc.poll() for proc in procs]
            offset, pending = _pump_log(log_paths[0], offset, pending, outcome, on_progress)
            failed = [code for code in codes if code not in (None, 0)]
            if failed or all(code is not None for code in codes):
                outcome.returncode = failed[0] if failed else 0
                break
            if memory_cap and time.monotonic() >= next_memory_check:
                checked = time.monotonic()
                held = group_rss_bytes(pgids)
                # Every poll, unless a scan of /proc is slow (thousands of processes): then
                # at most a tenth of a core goes to it.
                next_memory_check = checked + 10 * (time.monotonic() - checked)
                if held > memory_cap:
                    outcome.over_cap = (memory_cap, held)
                    # As the kernel's OOM killer would: the memory is still growing.
                    grace = 0.0
                    break
            if time.monotonic() >= deadline:
                outcome.timed_out = True
                break
            time.sleep(POLL_S)
        _pump_log(log_paths[0], offset, pending + b"\n", outcome, on_progress)
    except (KeyboardInterrupt, SystemExit):
        grace = min(grace, INTERRUPT_GRACE_S)
        raise
    finally:
        # Also on KeyboardInterrupt or any error: nothing of the run may outlive this call. A
        # second Ctrl-C waits until the groups are gone.
        try:
            with _interrupts_deferred():
                _kill_groups(procs, grace)
        finally:
            with _ACTIVE_LOCK:
                _ACTIVE.discard(run)
            run.done.set()
    if outcome.returncode is None and procs:
        outcome.returncode = next(
            (p.returncode for p in procs if p.returncode), procs[0].returncode
        )
    texts = []
    for log_path in log_paths:
        with contextlib.suppress(OSError):
            texts.append(log_path.read_text(errors="replace"))
    outcome.log_text = "\n".join(texts)
    return outcome


class _ActiveRun:
    """A supervised run in progress: ``stop`` asks it to end, ``done`` says it has."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.done = threading.Event()


_ACTIVE: set[_ActiveRun] = set()
_ACTIVE_LOCK = threading.Lock()
# Set by the handler stop_runs_on_interrupt installs: this process was interrupted, so runs
# still being started (in other threads) do not launch anything.
_INTERRUPTED = threading.Event()


def stop_all_runs(wait_s: float = KILL_GRACE_S + 5.0) -> int:
    """Stop every smoke run in progress in this process; return how many there were.

    For a Ctrl-C that reaches the main thread while runs are supervised in other threads (a
    LangGraph node runs in a worker thread): each run kills its process groups and raises
    KeyboardInterrupt in its own thread. Waits up to ``wait_s`` for them to be gone.
    """
    with _ACTIVE_LOCK:
        runs = list(_ACTIVE)
    for run in runs:
        run.stop.set()
    deadline = time.monotonic() + wait_s
    for run in runs:
        run.done.wait(max(0.0, deadline - time.monotonic()))
    return len(runs)


def stop_runs_on_interrupt() -> None:
    """Make Ctrl-C (SIGINT) also stop smoke runs supervised in other threads.

    Python raises KeyboardInterrupt in the main thread only; a run in a worker thread (a
    LangGraph node, a batch job) would go on while the main thread waits for that thread to
    finish. The handler this installs (main thread only; a no-op elsewhere) asks every run to
    stop, keeps new ones from launching, then does what the previous handler did (raise
    KeyboardInterrupt). For programs such as the CLI; call it before starting runs.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        return  # started with Ctrl-C ignored (a background job): keep it that way

    def _interrupt(signum: int, frame: Any) -> None:
        _INTERRUPTED.set()
        with _ACTIVE_LOCK:
            runs = list(_ACTIVE)
        for run in runs:
            run.stop.set()
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _interrupt)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C) for the duration of the block, then raise KeyboardInterrupt.

    Only in the main thread, where Python delivers signals; elsewhere a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and sys.exc_info()[0] is None:
            raise KeyboardInterrupt


def _pump_log(
    log_path: Path,
    offset: int,
    pending: bytes,
    outcome: _Outcome,
    on_progress: Callable[[str], None] | None,
) -> tuple[int, bytes]:
    try:
        with open(log_path, "rb") as log:
            log.seek(offset)
            chunk = log.read()
    except OSError:
        return offset, pending
    offset += len(chunk)
    *lines, pending = (pending + chunk).split(b"\n")
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if _PROGRESS.match(line):
            outcome.last_progress = line
            if on_progress is not None:
                on_progress(line)
    return offset, pending


def _kill_groups(procs: list[subprocess.Popen[bytes]], grace_s: float = KILL_GRACE_S) -> None:
    # SIGTERM first so each launcher (DeepSpeed's runner or torchrun) can stop its ranks
    # cleanly, then SIGKILL for whatever is left after the grace period (at once with no
    # grace). Each launcher leads its own group (start_new_session). Orphaned ranks may
    # linger as zombies when PID 1 does not reap, so liveness ignores zombies.
    def alive(proc: subprocess.Popen[bytes]) -> bool:
        return proc.poll() is None or bool(group_alive(proc.pid))

    live = [proc for proc in procs if alive(proc)]
    for proc in live if grace_s > 0 else []:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        live = [proc for proc in live if alive(proc)]
        if live:
            time.sleep(0.1)
    for proc in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    # A killed process is gone only once the kernel has freed its memory (a large one takes
    # a moment); wait for that, so that nothing of the run is left when this returns.
    deadline = time.monotonic() + KILL_GRACE_S
    while live and time.monotonic() < deadline:
        live = [proc for proc in live if alive(proc)]
        if live:
            time.sleep(0.05)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE_S)


def _tail(text: str, lines: int = 25, max_chars: int = 3000) -> str:
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept)[-max_chars:]


def _read_metrics(metrics_dir: Path, ranks: int) -> tuple[list[dict[str, Any]], list[int]]:
    found, missing = [], []
    for rank in range(ranks):
        path = metrics_dir / f"rank{rank}.json"
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            missing.append(rank)
    return found, missing


def _merge(base: SmokeResult, metrics: list[dict[str, Any]]) -> SmokeResult:
    n_steps = min(len(m.get("losses", [])) for m in metrics)
    losses = [statistics.fmean(float(m["losses"][i]) for m in metrics) for i in range(n_steps)]
    # A data-parallel step lasts as long as its slowest rank.
    times = [max(float(m["step_times_s"][i]) for m in metrics) for i in range(n_steps)]
    skip = min(WARMUP_STEPS, max(0, n_steps - 1))
    step_time_s = statistics.median(times[skip:]) if times else None
    tokens_per_step = sum(int(m.get("tokens_per_step", 0)) for m in metrics)
    result = base.model_copy()
    result.losses = losses
    result.step_time_s = step_time_s
    if step_time_s:
        result.tokens_per_s = tokens_per_step / step_time_s
    result.peak_memory_bytes = max(int(m.get("peak_memory_bytes", 0)) for m in metrics) or None
    result.baseline_memory_bytes = max(int(m.get("baseline_memory_bytes", 0)) for m in metrics)
    result.world_size = int(metrics[0].get("world_size", base.world_size))
    result.device_name = str(metrics[0].get("device_name") or base.device)
    if result.model_shape is not None and metrics[0].get("attn_implementation"):
        result.model_shape = {
            **result.model_shape,
            "attn_implementation": metrics[0]["attn_implementation"],
        }
    for key in ("allocated_at_start_bytes", "allocated_after_step1_bytes"):
        values = [int(m[key]) for m in metrics if m.get(key) is not None]
        if values and result.model_shape is not None:
            result.model_shape = {**result.model_shape, key: max(values)}
    gpu_process = [
        int(m["process_gpu_memory_bytes"]) for m in metrics if m.get("process_gpu_memory_bytes")
    ]
    result.process_gpu_memory_bytes = max(gpu_process) if gpu_process else None
    return result


def _verdict(
    base: SmokeResult,
    outcome: _Outcome,
    metrics_dir: Path,
    ranks: int,
    steps: int,
    notes: list[str],
) -> SmokeResult:
    if outcome.start_error:
        return base.model_copy(update={"reason": f"launcher_error: {outcome.start_error}"})
    metrics, missing = _read_metrics(metrics_dir, ranks)
    result = _merge(base, metrics) if metrics else base.model_copy()

    def failed(reason: str, with_log: bool = False) -> SmokeResult:
        if with_log:
            reason = f"{reason}\n{_tail(outcome.log_text)}"
        return result.model_copy(update={"status": "failed", "reason": reason})

    if outcome.over_cap is not None:
        cap, held = outcome.over_cap
        where = outcome.last_progress or "before the first step"
        return failed(
            f"oom: memory cap {format_bytes(cap)} exceeded (the run's processes held "
            f"{format_bytes(held)}); stopped; last: {where}"
        )
    if outcome.timed_out:
        where = outcome.last_progress or "before the first step"
        return failed(f"timeout: stopped after {outcome.timeout_s:g} s; last: {where}")
    oom_ranks = [m["rank"] for m in metrics if m.get("status") == "oom"]
    killed = any(marker in outcome.log_text for marker in _KILLED_MARKERS)
    if oom_ranks or (outcome.returncode != 0 and (_oom_line(outcome.log_text) or killed)):
        where = f" on rank(s) {oom_ranks}" if oom_ranks else ""
        error = (
            _oom_line(outcome.log_text) or "a rank was killed by SIGKILL (the kernel's OOM killer?)"
        )
        if outcome.address_space and base.inject != "oom":
            error += (
                f" (ranks ran under a {format_bytes(outcome.address_space)} address-space "
                "limit: the memory cap plus headroom)"
            )
        return failed(f"oom: out of memory{where}: {error}", with_log=True)
    nan_ranks = [m["rank"] for m in metrics if not all(map(math.isfinite, m.get("losses", [])))]
    if nan_ranks:
        return failed(f"nan: non-finite loss on rank(s) {nan_ranks} by step {len(result.losses)}")
    if outcome.returncode != 0:
        # Ranks that never spawned point at the launcher (bad arguments, port, no devices).
        if not any(marker in outcome.log_text for marker in _SPAWNED):
            return failed(f"launcher_error: launcher exited {outcome.returncode}", with_log=True)
        rank, error, tail = _failing_rank(metrics_dir.parent / "logs", outcome.log_text)
        where = f" on rank {rank}" if rank is not None else ""
        reason = f"crash: exit code {outcome.returncode}{where}" + (f": {error}" if error else "")
        return result.model_copy(update={"status": "failed", "reason": f"{reason}\n{tail}"})
    if missing:
        return failed(f"crash: rank(s) {missing} wrote no metrics", with_log=True)
    losses = result.losses
    if len(losses) < steps:
        return failed(f"crash: only {len(losses)}/{steps} steps recorded", with_log=True)
    window = max(1, min(5, len(losses) // 2))
    first = statistics.fmean(losses[:window])
    last = statistics.fmean(losses[-window:])
    drop = (first - last) / first if first > 0 else 0.0
    summary = f"loss {first:.3f} -> {last:.3f} ({-drop:+.0%}) over {len(losses)} steps"
    if drop < MIN_LOSS_DROP:
        return failed(f"diverged: {summary}; needs at least {MIN_LOSS_DROP:.0%} lower")
    where = f"on {ranks} {result.device} rank(s)"
    return result.model_copy(
        update={"status": "passed", "reason": "; ".join([f"{summary} {where}", *notes])}
    )


def _failing_rank(logs_dir: Path, launcher_log: str) -> tuple[int | None, str, str]:
    """The rank that failed first, its error line and the tail of its log.

    When one rank dies, its peers fail next in their collectives ("Connection closed by peer",
    NCCL aborts); those errors are consequences, so a rank with any other error is preferred.
    Without per-rank logs, the launcher's log stands in.
    """
    found: list[tuple[int, str, str]] = []
    for path in sorted(logs_dir.glob("rank*.log")):
        try:
            rank = int(path.stem.removeprefix("rank"))
            text = path.read_text(errors="replace")
        except (OSError, ValueError):
            continue
        error = _error_line(text)
        if error:
            found.append((rank, error, text))
    primary = [f for f in found if not any(m in f[1] for m in _PEER_FAILURE_MARKERS)]
    for rank, error, text in primary or found:
        return rank, error, _tail(text)
    return None, _error_line(launcher_log), _tail(launcher_log)


def _oom_line(text: str) -> str:
    for raw in reversed(text.splitlines()):
        line = _RANK_PREFIX.sub("", raw).strip()
        if any(marker in line for marker in _OOM_MARKERS):
            return line[:300]
    return ""


def _error_line(text: str) -> str:
    # The exception line of the last traceback names the cause faster than the whole tail.
    for raw in reversed(text.splitlines()):
        line = _RANK_PREFIX.sub("", raw).strip()
        if _ERROR.match(line) and not any(name in line for name in _LAUNCHER_ERRORS):
            return line[:300]
    return ""


def _finish(
    result: SmokeResult, run_dir: Path, started: float, *, reason: str | None = None
) -> SmokeResult:
    if reason is not None:
        result = result.model_copy(update={"reason": reason})
    result = result.model_copy(update={"wall_time_s": time.monotonic() - started})
    _write_json(run_dir / "result.json", result.model_dump(mode="json"))
    return result


def _write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2))
