"""A short, real training run on synthetic data, for smoke-testing a setup.

Standalone on purpose, and so one file (longer than our other modules): it imports torch,
transformers, deepspeed and the standard library only, so it can be copied to any GPU box. Two modes:

- DeepSpeed, when ``--deepspeed_config`` is given; start it with the DeepSpeed launcher:
  ``deepspeed --num_gpus 2 smoke_train.py --model-config model.json --deepspeed_config ds.json
  --metrics-dir metrics/``. The optimizer, precision and ZeRO stage come from the config.
- Plain PyTorch DDP, when it is not; start it with torchrun:
  ``torchrun --nproc_per_node 2 smoke_train.py --model-config model.json --metrics-dir
  metrics/`` (``--lr``, ``--weight-decay``, ``--max-grad-norm``, ``--bf16``/``--fp16``).
  Run as a single process without torchrun's environment, it trains without DDP. DeepSpeed
  need not be installed for this mode.

Both take ``--steps``, ``--seq-len``, ``--micro-batch``, ``--seed`` and ``--lr``. On a machine
without CUDA the ranks run on CPU over gloo, in fp32.

``--inject oom|nan|hang|crash|alloc`` (with ``--inject-step N``) makes the run fail for real at step N,
to test whatever supervises it: ``oom`` caps the memory just above what the process holds (an
address-space limit on CPU, ``torch.cuda.set_per_process_memory_fraction`` on GPU) and gives
that step a 16x batch; ``nan`` turns the input embeddings' output into NaN; ``hang`` makes rank
0 sleep inside the step, so every other rank blocks in its next collective; ``crash`` raises on
the last rank; ``alloc`` makes rank 0 allocate (and touch) memory steadily until something
stops it, for the supervisor's memory cap to catch.

Each rank writes ``metrics-dir/rank{R}.json`` (losses, step times, tokens, peak memory);
rank 0 prints one progress line per step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

# Token patterns are drawn from a small alphabet, so even a tiny random-init model sees a
# large, quick drop from ln(vocab): first by learning which tokens occur at all, then by
# copying the repeated pattern (an induction-style task).
_ALPHABET_SIZE = 16
_NUM_PATTERNS = 8
_PATTERN_LEN = (3, 6)
_METRICS_EVERY = 5
# The DDP mode's default learning rate: the constant rate the smoke runner gives DeepSpeed
# (tools/smoke/ds_adapt.py SMOKE_LR), large enough for a random-init tiny model to learn in ~30 steps.
DEFAULT_LR = 3e-3
# torchrun (and any env:// launcher) sets these for every rank.
_DIST_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
INJECT_KINDS = ("oom", "nan", "hang", "crash", "alloc")
# The oom injection: bytes left above what the process holds, and the batch multiplier.
_OOM_MARGIN_BYTES = 1 << 20
_OOM_BATCH_FACTOR = 16
# The alloc injection: a block of this size every interval (~1 GiB/s), written so it is resident.
_ALLOC_BLOCK_BYTES = 64 << 20
_ALLOC_INTERVAL_S = 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (the DeepSpeed launcher adds ``--local_rank``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-config", required=True, type=Path, help="HF config.json dict")
    parser.add_argument(
        "--deepspeed_config",
        type=Path,
        default=None,
        help="ds_config.json; without it the run is plain PyTorch DDP",
    )
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per rank per step")
    parser.add_argument("--metrics-dir", required=True, type=Path, help="where rank{R}.json go")
    parser.add_argument("--seed", type=int, default=1234, help="seed for model init and data")
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"constant learning rate (DDP default {DEFAULT_LR:g}; DeepSpeed: the config's)",
    )
    parser.add_argument(
        "--inject", choices=INJECT_KINDS, default=None, help="fail for real at --inject-step"
    )
    parser.add_argument("--inject-step", type=int, default=3, help="step of the injected fault")
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="also write each rank's output to rank{R}.log"
    )
    parser.add_argument(
        "--attn-implementation",
        default=None,
        help="transformers attention kernel: eager, sdpa, ... (default: transformers' choice)",
    )
    ddp = parser.add_argument_group("DDP mode (ignored with --deepspeed_config)")
    ddp.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    ddp.add_argument(
        "--max-grad-norm", type=float, default=1.0, help="gradient clipping norm (0: off)"
    )
    half = ddp.add_mutually_exclusive_group()
    half.add_argument(
        "--bf16", action="store_true", help="bf16 autocast on CUDA (fp16 where unsupported)"
    )
    half.add_argument("--fp16", action="store_true", help="fp16 autocast with loss scaling on CUDA")
    parser.add_argument(
        "--local_rank", "--local-rank", type=int, default=None, help="set by the launcher"
    )
    return parser.parse_args(argv)


def build_model(
    config_dict: dict[str, Any], attn_implementation: str | None = None
) -> transformers.PreTrainedModel:
    """Build a random-init causal LM from a Hugging Face config dict (no download)."""
    cfg = dict(config_dict)
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    if attn_implementation:
        return transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=attn_implementation
        )
    return transformers.AutoModelForCausalLM.from_config(config)


class PatternData:
    """Endless batches of sequences that repeat a short token pattern."""

    def __init__(self, vocab_size: int, seq_len: int, batch: int, seed: int, rank: int) -> None:
        # Patterns are shared by all ranks (same seed); the draws differ per rank, as data
        # parallelism would shard a real dataset.
        shared = torch.Generator().manual_seed(seed)
        alphabet_size = min(_ALPHABET_SIZE, vocab_size)
        alphabet = torch.randperm(vocab_size, generator=shared)[:alphabet_size]
        self.patterns: list[torch.Tensor] = []
        for _ in range(_NUM_PATTERNS):
            length = int(
                torch.randint(_PATTERN_LEN[0], _PATTERN_LEN[1] + 1, (1,), generator=shared)
            )
            idx = torch.randint(0, alphabet_size, (length,), generator=shared)
            self.patterns.append(alphabet[idx])
        self.gen = torch.Generator().manual_seed(seed * 1000 + 17 + rank)
        self.seq_len = seq_len
        self.batch = batch

    def next(self) -> torch.Tensor:
        """Return one ``[batch, seq_len]`` LongTensor."""
        rows = []
        for _ in range(self.batch):
            pattern = self.patterns[
                int(torch.randint(0, len(self.patterns), (1,), generator=self.gen))
            ]
            reps = self.seq_len // len(pattern) + 2
            offset = int(torch.randint(0, len(pattern), (1,), generator=self.gen))
            rows.append(pattern.repeat(reps)[offset : offset + self.seq_len])
        return torch.stack(rows)


class CpuPeak:
    """The peak of this process's anonymous resident memory (heap), sampled during training.

    On CPU a rank's tensors live in anonymous memory (``RssAnon`` in /proc/self/status), while
    the libraries' code pages that the first steps touch show up in file-backed RSS; the
    kernel's own high-water mark (``VmHWM``) mixes both. Samples are taken after each forward,
    backward and optimizer step, where parameters, gradients, optimizer states and activations
    peak together. 0 where /proc is unavailable.
    """

    peak = 0
    enabled = False

    @classmethod
    def sample(cls) -> int:
        """Read RssAnon now and keep the maximum."""
        now = anon_rss_bytes()
        cls.peak = max(cls.peak, now)
        return now


def anon_rss_bytes() -> int:
    """This process's anonymous resident memory (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cpu_baseline_bytes(model_config: dict[str, Any]) -> int:
    """Anonymous memory before the model exists, with the model's code already imported.

    Building the model once on the meta device imports its modeling code (for a small model
    that import holds more memory than the weights), so the baseline leaves it out.
    """
    with torch.device("meta"):
        build_model(model_config)
    CpuPeak.peak = 0
    CpuPeak.enabled = True
    return anon_rss_bytes()


def sample() -> None:
    """Sample the CPU memory peak (a no-op on GPU, where torch tracks the peak itself)."""
    if CpuPeak.enabled:
        CpuPeak.sample()


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory on CUDA, else this process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if CpuPeak.peak:
        return CpuPeak.peak
    # ru_maxrss is in KiB on Linux (bytes on macOS, where this over-reports harmlessly large).
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def process_gpu_memory_bytes(device: torch.device) -> int | None:
    """This process's memory on its GPU as the driver sees it (NVML), or None where unavailable.

    It includes the CUDA context and the caching allocator's reserved blocks, which
    ``max_memory_allocated`` leaves out. NVML comes with nvidia-ml-py (a DeepSpeed dependency);
    without it, or where the driver does not report per-process use, this returns None.
    """
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            handle = None
            for i in range(pynvml.nvmlDeviceGetCount()):
                candidate = pynvml.nvmlDeviceGetHandleByIndex(i)
                found = pynvml.nvmlDeviceGetUUID(candidate)
                found = found.decode() if isinstance(found, bytes) else str(found)
                if found.replace("GPU-", "") == uuid.replace("GPU-", ""):
                    handle = candidate
                    break
            if handle is None:
                return None
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory:
                    return int(proc.usedGpuMemory)
            return None
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML is an extra reading: any failure just means "not measured"
        return None


class FaultInjector:
    """Make the run fail for real at one step (``--inject``), to test what supervises it."""

    def __init__(self, kind: str | None, step: int, rank: int, world_size: int) -> None:
        self.kind = kind
        self.step = step
        self.rank = rank
        self.world_size = world_size
        self._cpu_limit: tuple[int, int] | None = None

    def batch(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        """The batch for ``step``: 16 copies of it at the oom step."""
        if self.kind == "oom" and step == self.step:
            return batch.repeat(_OOM_BATCH_FACTOR, 1)
        return batch

    def before_step(self, step: int, model: torch.nn.Module, device: torch.device) -> None:
        """Arm the fault due at ``step``."""
        if self.kind is None or step != self.step:
            return
        print(f"[inject] {self.kind} at step {step} on rank {self.rank}", flush=True)
        if self.kind == "crash" and self.rank == self.world_size - 1:
            raise RuntimeError(f"injected crash on rank {self.rank} at step {step}")
        if self.kind == "hang" and self.rank == 0:
            # The other ranks block in their next collective; only a supervisor's kill ends this.
            time.sleep(10**7)
        if self.kind == "alloc" and self.rank == 0:
            # A leak: memory grows until a cap (or the address-space limit) stops the run.
            held: list[bytearray] = []
            while True:
                held.append(bytearray(b"\x01") * _ALLOC_BLOCK_BYTES)
                time.sleep(_ALLOC_INTERVAL_S)
        if self.kind == "nan":
            embeddings: torch.nn.Module = model.get_input_embeddings()  # type: ignore[operator]
            embeddings.register_forward_hook(lambda _m, _i, out: out * float("nan"))
        if self.kind == "oom":
            self._cap_memory(device)

    def _cap_memory(self, device: torch.device) -> None:
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            held = torch.cuda.memory_reserved(device) + _OOM_MARGIN_BYTES
            torch.cuda.set_per_process_memory_fraction(min(1.0, held / total), device)
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as fh:
            vm_bytes = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = vm_bytes + _OOM_MARGIN_BYTES
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)  # under a supervisor's address-space limit
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        self._cpu_limit = (soft, hard)

    def release(self) -> None:
        """Lift the CPU cap again (so the error's traceback can still be printed)."""
        if self._cpu_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, self._cpu_limit)
            self._cpu_limit = None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so that a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def adapt_precision(ds_config: dict[str, Any], on_cuda: bool) -> dict[str, Any]:
    """Drop half precision where the device cannot train in it (fp32 on CPU)."""
    cfg = dict(ds_config)
    if not on_cuda:
        for key in ("bf16", "fp16"):
            cfg.pop(key, None)
    elif cfg.get("bf16", {}).get("enabled") and not torch.cuda.is_bf16_supported():
        # Pre-Ampere GPUs have no bf16 math; fp16 with loss scaling is the usual fallback.
        cfg.pop("bf16")
        cfg["fp16"] = {"enabled": True}
    return cfg


def skip_shm_comm_build() -> bool:
    """Stop DeepSpeed JIT-building its CPU shared-memory all-reduce op (training never uses it)."""
    # On the CPU accelerator, deepspeed.comm's TorchBackend builds the "deepspeed_shm_comm" op
    # (gcc + ninja, ~30-60 s the first time, cached under TORCH_EXTENSIONS_DIR) whenever the
    # process group starts. Its only caller is inference_all_reduce (tensor-parallel inference,
    # deepspeed/comm/torch.py); training collectives go through torch.distributed/gloo.
    # build_shm_op() returns None when deepspeed.ops.__compatible_ops__ marks the op
    # incompatible; that dict is probed once per process and, as deepspeed/ops/__init__.py
    # notes, edits to it persist. If a later DeepSpeed drops the dict, nothing breaks: the op
    # is built (and cached) as before. SMOKE_BUILD_SHM_COMM=1 restores the build.
    if torch.cuda.is_available() or os.environ.get("SMOKE_BUILD_SHM_COMM") == "1":
        return False
    try:
        import deepspeed
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    except (ImportError, AttributeError, TypeError):
        return False
    return True


def dist_env_present() -> bool:
    """Whether a launcher (torchrun) set up this process as one rank of a process group."""
    return all(os.environ.get(key) for key in _DIST_ENV)


def has_experts(model: torch.nn.Module) -> bool:
    """Whether the model routes tokens to experts (so a step may leave some weights unused)."""
    config = getattr(model, "config", None)
    for key in _EXPERT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return True
    return False


class _Tee:
    """A text stream that writes to the console stream and to a per-rank log file."""

    def __init__(self, stream: Any, log: Any) -> None:
        self.stream = stream
        self.log = log

    def write(self, text: str) -> int:
        self.log.write(text)
        self.log.flush()
        return int(self.stream.write(text))

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def tee_rank_log(log_dir: Path) -> None:
    """Copy this rank's Python-level stdout and stderr into ``log_dir/rank{RANK}.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("RANK", "0")
    log = open(log_dir / f"rank{rank}.log", "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    sys.stdout = _Tee(sys.stdout, log)
    sys.stderr = _Tee(sys.stderr, log)


# ---- supervision: a run must not outlive the process that started it --------------------------
# The smoke runner (tools/smoke/runner.py) puts its own pid here. It starts each launcher in a new
# session so it can stop the run with one killpg; if the runner itself dies by SIGKILL, nothing
# would stop the ranks, so each rank watches the runner and ends its process group when it goes.
SUPERVISOR_ENV = "TRAINWRIGHT_SMOKE_SUPERVISOR_PID"
_SUPERVISOR_POLL_S = 1.0


def _start_ticks(pid: int) -> str | None:
    """A live process's start time (/proc/PID/stat field 22); None when gone or a zombie."""
    if not os.path.exists("/proc/self/stat"):  # not Linux: liveness only
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def watch_supervisor() -> None:
    """If ``$TRAINWRIGHT_SMOKE_SUPERVISOR_PID`` is set, end this process group when that process dies."""
    import signal
    import threading

    value = os.environ.get(SUPERVISOR_ENV, "")
    if not value.isdigit():
        return
    pid = int(value)
    # Comparing start times guards against the pid being reused by another process.
    started = _start_ticks(pid)

    def watch() -> None:
        while True:
            if started is None or _start_ticks(pid) != started:
                print(
                    f"smoke_train: supervising process {pid} is gone; stopping the run",
                    file=sys.stderr,
                    flush=True,
                )
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                os._exit(137)
            time.sleep(_SUPERVISOR_POLL_S)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Run the smoke training and write this rank's metrics; returns the exit code."""
    watch_supervisor()
    args = parse_args(argv)
    if args.log_dir is not None:
        tee_rank_log(args.log_dir)
    if args.deepspeed_config is None:
        return run_ddp(args)
    return run_deepspeed(args)


def run_deepspeed(args: argparse.Namespace) -> int:
    """DeepSpeed mode: the engine that ``deepspeed.initialize`` builds from the config."""
    # Imported here so the DDP mode runs where DeepSpeed is not installed.
    import deepspeed

    on_cuda = torch.cuda.is_available()
    local_rank = (
        args.local_rank if args.local_rank is not None else int(os.environ.get("LOCAL_RANK", 0))
    )
    if on_cuda:
        torch.cuda.set_device(local_rank)

    model_config = json.loads(args.model_config.read_text())
    ds_config = adapt_precision(json.loads(args.deepspeed_config.read_text()), on_cuda)
    if args.lr is not None and isinstance(ds_config.get("optimizer"), dict):
        ds_config["optimizer"].setdefault("params", {})["lr"] = args.lr

    skip_shm_comm_build()
    # The process group first, so that its buffers are in the CPU baseline, not the model's.
    deepspeed.init_distributed()

    # Same seed on every rank: the replicas must start identical for data parallelism.
    torch.manual_seed(args.seed)
    # On CPU the peak is anonymous RSS; what the run itself adds is the peak minus what the
    # interpreter, torch, DeepSpeed and the model's code already hold.
    baseline_bytes = 0 if on_cuda else cpu_baseline_bytes(model_config)
    # fp32 master weights whatever dtype the config names; DeepSpeed casts for bf16/fp16.
    # On a GPU the weights are initialised there: a billion-parameter init on CPU takes long.
    with torch.device(f"cuda:{local_rank}" if on_cuda else "cpu"):
        model = build_model(model_config, args.attn_implementation).float()
    if "activation_checkpointing" in ds_config:
        model.gradient_checkpointing_enable()

    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config,
    )
    device = (
        engine.device if isinstance(engine.device, torch.device) else torch.device(engine.device)
    )

    def train_step(batch: torch.Tensor) -> torch.Tensor:
        loss = engine(input_ids=batch, labels=batch).loss
        sample()
        engine.backward(loss)
        sample()
        engine.step()
        return loss

    engine.train()
    code = train_loop(
        args,
        model,
        device,
        train_step,
        baseline_bytes=baseline_bytes,
        extra={"mode": "deepspeed", "deepspeed": deepspeed.__version__},
        tensor_parallel=int((ds_config.get("tensor_parallel") or {}).get("autotp_size") or 1),
    )
    if code == 0 and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return code


def run_ddp(args: argparse.Namespace) -> int:
    """Plain PyTorch mode: DistributedDataParallel over torchrun's ranks, AdamW, optional autocast."""
    on_cuda = torch.cuda.is_available()
    local_rank = (
        args.local_rank if args.local_rank is not None else int(os.environ.get("LOCAL_RANK", 0))
    )
    device = torch.device("cuda", local_rank) if on_cuda else torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(device)
    distributed = dist_env_present()
    if distributed:
        # env:// reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun sets them.
        torch.distributed.init_process_group(backend="nccl" if on_cuda else "gloo")
    try:
        model_config = json.loads(args.model_config.read_text())
        # Same seed on every rank: the replicas must start identical (DDP also broadcasts
        # rank 0's weights when it wraps the model).
        torch.manual_seed(args.seed)
        baseline_bytes = 0 if on_cuda else cpu_baseline_bytes(model_config)
        with torch.device(device):
            model = build_model(model_config, args.attn_implementation).float()
        train_model: torch.nn.Module = model
        if distributed:
            train_model = torch.nn.parallel.DistributedDataParallel(
                model,
                device_ids=[device.index] if on_cuda else None,
                # Routed experts that get no token in a step have no gradient; DDP must be told.
                find_unused_parameters=has_experts(model),
            )

        # Autocast on CUDA only; CPU runs stay fp32, as the DeepSpeed mode does.
        amp_dtype: torch.dtype | None = None
        if on_cuda and args.bf16:
            # Pre-Ampere GPUs have no bf16 math; fp16 with loss scaling is the usual fallback.
            amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        elif on_cuda and args.fp16:
            amp_dtype = torch.float16
        scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
        params = [p for p in model.parameters() if p.requires_grad]
        lr = args.lr if args.lr is not None else DEFAULT_LR
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=args.weight_decay)

        def autocast() -> contextlib.AbstractContextManager[Any]:
            if amp_dtype is None:
                return contextlib.nullcontext()
            return torch.autocast(device_type=device.type, dtype=amp_dtype)

        def train_step(batch: torch.Tensor) -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = train_model(input_ids=batch, labels=batch).loss
            sample()
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            sample()
            if args.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            return loss

        names: dict[torch.dtype | None, str] = {torch.bfloat16: "bf16", torch.float16: "fp16"}
        precision = names.get(amp_dtype, "fp32")
        train_model.train()
        code = train_loop(
            args,
            model,
            device,
            train_step,
            baseline_bytes=baseline_bytes,
            extra={"mode": "ddp", "deepspeed": None, "precision": precision},
        )
        if code == 0 and distributed:
            torch.distributed.barrier()
        return code
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def train_loop(
    args: argparse.Namespace,
    model: transformers.PreTrainedModel,
    device: torch.device,
    train_step: Callable[[torch.Tensor], torch.Tensor],
    *,
    baseline_bytes: int,
    extra: dict[str, Any],
    tensor_parallel: int = 1,
) -> int:
    """Run ``args.steps`` steps on synthetic data, print progress and write this rank's metrics.

    The ranks of one tensor-parallel group (``tensor_parallel`` consecutive ranks, as DeepSpeed
    AutoTP groups them) draw the same batches: they hold shards of one replica. Returns 0 after
    all steps, 3 at the first non-finite loss.
    """
    on_cuda = device.type == "cuda"
    rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
    world_size = (
        int(torch.distributed.get_world_size()) if torch.distributed.is_initialized() else 1
    )
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    # On a GPU: what the model states hold before the first step, and after it (when the
    # optimizer has created its states), to split the peak into states and activations.
    memory_marks: dict[str, int] = {}
    if on_cuda:
        memory_marks["allocated_at_start_bytes"] = int(torch.cuda.memory_allocated(device))

    vocab_size = int(model.config.vocab_size)
    data = PatternData(
        vocab_size, args.seq_len, args.micro_batch, args.seed, rank // tensor_parallel
    )
    losses: list[float] = []
    step_times_s: list[float] = []
    tokens_per_step = args.micro_batch * args.seq_len
    metrics_path = args.metrics_dir / f"rank{rank}.json"
    injector = FaultInjector(args.inject, args.inject_step, rank, world_size)

    def metrics(status: str) -> dict[str, Any]:
        return {
            "rank": rank,
            "world_size": world_size,
            "device": str(device.type),
            "device_name": torch.cuda.get_device_name(device) if on_cuda else "cpu",
            "status": status,
            "steps": len(losses),
            "losses": losses,
            "step_times_s": step_times_s,
            "tokens_per_step": tokens_per_step,
            "tokens_processed": tokens_per_step * len(losses),
            "peak_memory_bytes": peak_memory_bytes(device),
            "process_gpu_memory_bytes": process_gpu_memory_bytes(device),
            "baseline_memory_bytes": baseline_bytes,
            "seq_len": args.seq_len,
            "micro_batch": args.micro_batch,
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            **memory_marks,
            "params": sum(p.numel() for p in model.parameters()),
            "torch": torch.__version__,
            **extra,
        }

    for step in range(1, args.steps + 1):
        batch = injector.batch(step, data.next()).to(device)
        if on_cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        try:
            injector.before_step(step, model, device)
            loss = train_step(batch)
            sample()
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
            injector.release()
            if _is_oom(exc):
                write_json_atomic(metrics_path, metrics("oom"))
            raise
        injector.release()
        if on_cuda:
            torch.cuda.synchronize(device)
            if step == 1:
                memory_marks["allocated_after_step1_bytes"] = int(
                    torch.cuda.memory_allocated(device)
                )
        elapsed_s = time.perf_counter() - start
        value = float(loss.detach().float().item())
        losses.append(value if math.isfinite(value) else float("nan"))
        step_times_s.append(elapsed_s)
        if rank == 0:
            print(f"step {step}/{args.steps} loss {value:.4f} {elapsed_s:.2f}s", flush=True)
        if step % _METRICS_EVERY == 0:
            # Partial metrics let a run that is stopped (timeout, Ctrl-C) still report progress.
            write_json_atomic(metrics_path, metrics("running"))
        if not math.isfinite(value):
            # Nothing after a NaN loss tells us more; stop early so the verdict comes fast.
            write_json_atomic(metrics_path, metrics("nan"))
            return 3

    write_json_atomic(metrics_path, metrics("ok"))
    return 0


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return "out of memory" in text or "can't allocate memory" in text


if __name__ == "__main__":
    sys.exit(main())
