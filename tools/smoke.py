"""Smoke-test a training setup with a short, real DeepSpeed or PyTorch DDP run on this machine.

The run uses a scaled-down copy of the planned model (same family), the planned DeepSpeed
config adapted to the local world (CPU ranks over gloo, or the local GPUs) or, for a plan
without DeepSpeed, plain PyTorch DDP started with torchrun, and synthetic but learnable data
(tools/smoke_train.py). It proves the setup starts, steps and learns; the memory it reports
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
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.errors import InputError
from tools.files import write_atomic
from tools.schemas import ModelSpec, SmokeResult
from tools.settings import TELEMETRY_OFF, Settings

SCRIPT = Path(__file__).with_name("smoke_train.py")

# Local budgets for the scaled model. On CPU a step must take well under a second on two
# cores; on a GPU a few layers at moderate width still start in seconds.
CPU_BUDGET = {"layers": 2, "hidden": 128, "heads": 4, "vocab": 512, "seq_len": 64, "experts": 4}
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

# The plan's learning rate and schedule are sized for the full model over a long run (often
# 1e-5 with hundreds of warm-up steps); a random-init tiny model needs a larger, constant rate
# to show learning within ~30 steps. The smoke run checks the mechanics, not the schedule.
SMOKE_LR = 3e-3
WARMUP_STEPS = 3
MIN_LOSS_DROP = 0.10
KILL_GRACE_S = 5.0
POLL_S = 0.2

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
) -> SmokeResult:
    """Run a short real training of a scaled-down model and report whether it learns.

    Args:
        model: The planned model; its ``hf_config`` (or its shape) is scaled down to fit locally.
        ds_config: The planned DeepSpeed config; it is adapted to the local ranks and device and
            run with DeepSpeed's launcher. ``None`` (a plan without DeepSpeed) runs plain
            PyTorch DDP (AdamW at a constant ``SMOKE_LR``; bf16 autocast on CUDA) with torchrun.
        settings: Run settings (``smoke_steps``, ``smoke_timeout_s``, ``smoke_cpu_ranks``, paths).
        steps: Optimizer steps to run; defaults to ``settings.smoke_steps``.
        micro_batch_size: Sequences per rank per step.
        seq_len: Tokens per sequence; defaults to the model's, capped to the local budget.
        world_size: The plan's world size; caps the number of local GPUs used (CPU runs always
            use ``settings.smoke_cpu_ranks`` ranks, to exercise the distributed code paths).
        strategy: The strategy name to record; derived from ``ds_config`` when omitted
            (``ddp`` when it is ``None``).
        run_dir: Where the configs, log, metrics and temporary files go; defaults to
            ``settings.runs_dir / <timestamp>-<id>``.
        on_progress: Called with one line per training step (and a launch line).

    Returns:
        A ``SmokeResult``; ``failed`` results carry a reason that starts with ``nan``,
        ``diverged``, ``timeout``, ``crash`` or ``launcher_error``.
    """
    steps = settings.smoke_steps if steps is None else steps
    if steps < 2:
        raise InputError("steps", f"a smoke run needs at least 2 steps, got {steps}")
    if micro_batch_size < 1:
        raise InputError("micro_batch_size", f"must be at least 1, got {micro_batch_size}")
    if settings.smoke_cpu_ranks < 1:
        raise InputError("smoke_cpu_ranks", f"must be at least 1, got {settings.smoke_cpu_ranks}")

    started = time.monotonic()
    # Absolute, because the launcher runs with the run directory as its working directory.
    run_dir = (Path(run_dir) if run_dir is not None else _new_run_dir(settings)).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    device, gpu_count = _local_device()
    if device == "cuda":
        ranks = max(1, min(gpu_count, world_size or gpu_count))
    else:
        ranks = settings.smoke_cpu_ranks
    budget = GPU_BUDGET if device == "cuda" else CPU_BUDGET
    strategy = strategy or (strategy_of(ds_config) if ds_config is not None else "ddp")
    base = SmokeResult(
        status="failed",
        device=device,
        world_size=ranks,
        steps=steps,
        run_dir=str(run_dir),
        strategy=strategy,
    )

    want_seq = seq_len if seq_len is not None else model.seq_len
    smoke_seq = max(8, min(want_seq, budget["seq_len"]))
    hf_config = model.hf_config or llama_config_from_shape(model)
    try:
        model_config, shape = scale_model_config(hf_config, seq_len=smoke_seq, device=device)
    except Exception as exc:  # whatever transformers rejects is reported as the run's result
        reason = f"launcher_error: cannot build the model: {_first_line(exc)}"
        return _finish(base, run_dir, started, reason=reason)
    shape.update(seq_len=smoke_seq, micro_batch_size=micro_batch_size)
    base.model_shape = shape
    run_config: dict[str, Any] | None = None
    if ds_config is not None:
        run_config, notes = adapt_ds_config(
            ds_config, device=device, ranks=ranks, micro_batch_size=micro_batch_size
        )
    else:
        notes = ["plain PyTorch DDP (torchrun)", f"constant lr {SMOKE_LR:g}"]
        if device == "cuda":
            notes.append("bf16 autocast")

    tmp_dir = run_dir / "tmp"
    metrics_dir = run_dir / "metrics"
    for folder in (tmp_dir, metrics_dir):
        folder.mkdir(parents=True, exist_ok=True)
    for stale in metrics_dir.glob("rank*.json"):
        stale.unlink()
    _write_json(run_dir / "model_config.json", model_config)
    if run_config is not None:
        _write_json(run_dir / "ds_config.json", run_config)
    else:
        # A reused run dir must not suggest that this run used an earlier run's config.
        (run_dir / "ds_config.json").unlink(missing_ok=True)
    # A copy of the script makes the run dir a self-contained reproduction of the run.
    script = run_dir / SCRIPT.name
    shutil.copyfile(SCRIPT, script)

    port = free_port()
    train_args = [
        "--steps",
        str(steps),
        "--seq-len",
        str(smoke_seq),
        "--micro-batch",
        str(micro_batch_size),
        "--metrics-dir",
        str(metrics_dir),
    ]
    if run_config is not None:
        cmd = [
            sys.executable,
            "-m",
            "deepspeed.launcher.runner",
            # A missing hostfile keeps the launcher on this machine even where a cluster image
            # ships /job/hostfile (the runner's default), which would make it ssh to workers.
            "--hostfile",
            str(run_dir / "no-hostfile"),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            *_rank_selection(device, ranks),
            str(script),
            "--model-config",
            str(run_dir / "model_config.json"),
            "--deepspeed_config",
            str(run_dir / "ds_config.json"),
            *train_args,
        ]
    else:
        # torchrun's ranks index the GPUs that CUDA_VISIBLE_DEVICES leaves visible, so a
        # user's selection holds without an --include equivalent.
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc_per_node",
            str(ranks),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            str(script),
            "--model-config",
            str(run_dir / "model_config.json"),
            *train_args,
            "--lr",
            str(SMOKE_LR),
            *(["--bf16"] if device == "cuda" else []),
        ]
    env = _child_env(tmp_dir, device, ranks)
    log_path = run_dir / "smoke.log"
    if on_progress is not None:
        on_progress(
            f"launching {ranks} {device} rank(s): {shape['family']} {shape['layers']}x"
            f"{shape['hidden']}, {shape['params']:,} params, {strategy}, {steps} steps"
        )

    outcome = _launch_and_wait(cmd, env, run_dir, log_path, settings.smoke_timeout_s, on_progress)
    result = _verdict(base, outcome, metrics_dir, ranks, steps, notes)
    return _finish(result, run_dir, started)


def strategy_of(ds_config: dict[str, Any]) -> str:
    """Name the parallelism strategy a DeepSpeed config describes (DESIGN.md strategy names)."""
    zero = ds_config.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0) or 0)
    if stage == 0:
        return "ddp"
    name = f"zero{stage}"
    offload_opt = (zero.get("offload_optimizer") or {}).get("device", "none") != "none"
    offload_param = (zero.get("offload_param") or {}).get("device", "none") != "none"
    if offload_opt and offload_param:
        return f"{name}_offload_all"
    if offload_opt:
        return f"{name}_offload_optimizer"
    if offload_param:
        return f"{name}_offload_param"
    return name


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
    hf_config: dict[str, Any], *, seq_len: int, device: str = "cpu"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Shrink a Hugging Face config to the local budget (same family); return it and its shape."""
    import transformers

    # Default configs of a family warn about special-token ids outside the vocabulary we are
    # about to shrink; those ids are cleared below, so the warnings would only mislead.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return _scale_model_config(hf_config, seq_len=seq_len, device=device)
    finally:
        transformers.logging.set_verbosity(verbosity)


def _scale_model_config(
    hf_config: dict[str, Any], *, seq_len: int, device: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    import transformers

    budget = GPU_BUDGET if device == "cuda" else CPU_BUDGET
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
        if params > MAX_SCALED_PARAMS.get(device, MAX_SCALED_PARAMS["cpu"]):
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
    ds_config: dict[str, Any], *, device: str, ranks: int, micro_batch_size: int
) -> tuple[dict[str, Any], list[str]]:
    """Adapt a DeepSpeed config to the local smoke world; return it and notes on what changed."""
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
    params["lr"] = SMOKE_LR
    if on_cpu and not offload_optimizer:
        # Same Adam(W) update without JIT-building DeepSpeed's CPU fused_adam op.
        params["torch_adam"] = True
    optimizer["params"] = params
    cfg["optimizer"] = optimizer
    notes.append(f"constant lr {SMOKE_LR:g}")
    return cfg, notes


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


# --- internals -----------------------------------------------------------------------------


def _new_run_dir(settings: Settings) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return settings.runs_dir / f"{stamp}-{uuid.uuid4().hex[:8]}"


def _local_device() -> tuple[str, int]:
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
    if device != "cuda":
        env["DS_ACCELERATOR"] = "cpu"
        # One OpenMP pool per rank over all cores oversubscribes the CPU and makes steps slow
        # and noisy; split the cores between the ranks instead.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
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
    # tools/models.py counts largest_layer_params the same way).
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


def _launch_and_wait(
    cmd: list[str],
    env: dict[str, str],
    run_dir: Path,
    log_path: Path,
    timeout_s: float,
    on_progress: Callable[[str], None] | None,
) -> _Outcome:
    outcome = _Outcome()
    outcome.timeout_s = timeout_s
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=run_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session and process group, so one killpg reaches the launcher, the
                # per-rank processes and any compiler it started, and nothing of ours.
                start_new_session=True,
            )
        except OSError as exc:
            outcome.start_error = str(exc)
            return outcome
    pgid = proc.pid  # start_new_session makes the launcher its group's leader
    deadline = time.monotonic() + timeout_s
    offset = 0
    pending = b""
    try:
        _write_json(run_dir / "launch.json", {"cmd": cmd, "pid": proc.pid, "pgid": pgid})
        while True:
            returncode = proc.poll()
            offset, pending = _pump_log(log_path, offset, pending, outcome, on_progress)
            if returncode is not None:
                outcome.returncode = returncode
                break
            if time.monotonic() >= deadline:
                outcome.timed_out = True
                break
            time.sleep(POLL_S)
    finally:
        # Also on KeyboardInterrupt or any error: nothing of the run may outlive this call.
        _kill_group(proc, pgid)
    if outcome.returncode is None:
        outcome.returncode = proc.returncode
    _pump_log(log_path, offset, pending + b"\n", outcome, on_progress)
    with contextlib.suppress(OSError):
        outcome.log_text = log_path.read_text(errors="replace")
    return outcome


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


def _kill_group(proc: subprocess.Popen[bytes], pgid: int) -> None:
    # SIGTERM first so the launcher (DeepSpeed's runner or torchrun) can stop its ranks
    # cleanly, then SIGKILL for whatever is left after the grace period. Orphaned ranks may
    # linger as zombies when PID 1 does not reap, so liveness ignores zombies.
    if proc.poll() is None or group_alive(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline:
            proc.poll()
            if proc.returncode is not None and not group_alive(pgid):
                break
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group_alive(pgid) or proc.poll() is None:
                os.killpg(pgid, signal.SIGKILL)
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

    if outcome.timed_out:
        where = outcome.last_progress or "before the first step"
        return failed(f"timeout: stopped after {outcome.timeout_s:g} s; last: {where}")
    nan_ranks = [m["rank"] for m in metrics if not all(map(math.isfinite, m.get("losses", [])))]
    if nan_ranks:
        return failed(f"nan: non-finite loss on rank(s) {nan_ranks} by step {len(result.losses)}")
    if outcome.returncode != 0:
        # Ranks that never spawned point at the launcher (bad arguments, port, no devices).
        if not any(marker in outcome.log_text for marker in _SPAWNED):
            return failed(f"launcher_error: launcher exited {outcome.returncode}", with_log=True)
        error = _error_line(outcome.log_text)
        reason = f"crash: exit code {outcome.returncode}" + (f": {error}" if error else "")
        return failed(reason, with_log=True)
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
