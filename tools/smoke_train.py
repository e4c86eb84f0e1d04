"""A short, real DeepSpeed training run on synthetic data, for smoke-testing a setup.

Standalone on purpose (DESIGN.md): it imports torch, transformers, deepspeed and the standard
library only, so it can be copied to any GPU box and started with the DeepSpeed launcher:
``deepspeed --num_gpus 2 smoke_train.py --model-config model.json --deepspeed_config ds.json
--metrics-dir metrics/`` (plus ``--steps``, ``--seq-len``, ``--micro-batch``, ``--seed``).
On a machine without CUDA the ranks run on CPU over gloo, in fp32.

Each rank writes ``metrics-dir/rank{R}.json`` (losses, step times, tokens, peak memory);
rank 0 prints one progress line per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import deepspeed
import torch
import transformers

# Token patterns are drawn from a small alphabet, so even a tiny random-init model sees a
# large, quick drop from ln(vocab): first by learning which tokens occur at all, then by
# copying the repeated pattern (an induction-style task).
_ALPHABET_SIZE = 16
_NUM_PATTERNS = 8
_PATTERN_LEN = (3, 6)
_METRICS_EVERY = 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (the DeepSpeed launcher adds ``--local_rank``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-config", required=True, type=Path, help="HF config.json dict")
    parser.add_argument("--deepspeed_config", required=True, type=Path, help="ds_config.json")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per rank per step")
    parser.add_argument("--metrics-dir", required=True, type=Path, help="where rank{R}.json go")
    parser.add_argument("--seed", type=int, default=1234, help="seed for model init and data")
    parser.add_argument(
        "--local_rank", "--local-rank", type=int, default=None, help="set by the launcher"
    )
    return parser.parse_args(argv)


def build_model(config_dict: dict[str, Any]) -> transformers.PreTrainedModel:
    """Build a random-init causal LM from a Hugging Face config dict (no download)."""
    cfg = dict(config_dict)
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
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


def current_rss_bytes() -> int:
    """This process's resident memory now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory on CUDA, else this process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in KiB on Linux (bytes on macOS, where this over-reports harmlessly large).
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


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
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    except (ImportError, AttributeError, TypeError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Run the smoke training and write this rank's metrics; returns the exit code."""
    args = parse_args(argv)
    on_cuda = torch.cuda.is_available()
    local_rank = (
        args.local_rank if args.local_rank is not None else int(os.environ.get("LOCAL_RANK", 0))
    )
    if on_cuda:
        torch.cuda.set_device(local_rank)

    model_config = json.loads(args.model_config.read_text())
    ds_config = adapt_precision(json.loads(args.deepspeed_config.read_text()), on_cuda)

    skip_shm_comm_build()

    # Same seed on every rank: the replicas must start identical for data parallelism.
    torch.manual_seed(args.seed)
    # On CPU the peak is process RSS; what the run itself adds is the peak minus what the
    # interpreter, torch and DeepSpeed already hold before the model exists.
    baseline_bytes = 0 if on_cuda else current_rss_bytes()
    # fp32 master weights whatever dtype the config names; DeepSpeed casts for bf16/fp16.
    model = build_model(model_config).float()
    vocab_size = int(model.config.vocab_size)

    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config,
    )
    rank = int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0
    world_size = (
        int(torch.distributed.get_world_size()) if torch.distributed.is_initialized() else 1
    )
    device = (
        engine.device if isinstance(engine.device, torch.device) else torch.device(engine.device)
    )
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)

    data = PatternData(vocab_size, args.seq_len, args.micro_batch, args.seed, rank)
    losses: list[float] = []
    step_times_s: list[float] = []
    tokens_per_step = args.micro_batch * args.seq_len
    metrics_path = args.metrics_dir / f"rank{rank}.json"

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
            "baseline_memory_bytes": baseline_bytes,
            "seq_len": args.seq_len,
            "micro_batch": args.micro_batch,
            "params": sum(p.numel() for p in model.parameters()),
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
        }

    engine.train()
    for step in range(1, args.steps + 1):
        batch = data.next().to(device)
        if on_cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
        if on_cuda:
            torch.cuda.synchronize(device)
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
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
