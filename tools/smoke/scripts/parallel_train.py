"""Smoke-train a Llama-style model under torch-native tensor x pipeline x data parallelism.

The CPU stand-in for the Megatron-style 3D layout trainwright plans for its largest models
(Megatron itself is CUDA-only): the same split of the same model, run by torch's own
``DTensor`` tensor parallelism and ``torch.distributed.pipelining`` on 2-4 gloo ranks. Standalone
on purpose, in the same folder as ``train.py``, and launched by the same supervisor:

    torchrun --nproc_per_node 4 parallel_train.py --model-config config.json --tp 2 --pp 2 \
        --metrics-dir run/metrics --log-dir run/logs

Layout: the world is a ``(dp, pp, tp)`` device mesh, ``dp = world / (tp * pp)``, tp innermost
(the ranks of one tensor-parallel group are consecutive, as Megatron places them).

- Tensor parallel (``--tp T``), the Megatron plan: q/k/v and gate/up are column-parallel
  (``ColwiseParallel``: each rank holds ``heads / T`` attention heads and ``intermediate / T`` MLP
  columns), o and down are row-parallel (``RowwiseParallel``, one all-reduce each). The input
  embedding is vocab-parallel (rows sharded, output all-reduced) and the output head is
  column-parallel over the vocabulary with its logits gathered before the loss. RMSNorm weights
  are replicated on every tensor-parallel rank.
- Pipeline parallel (``--pp P``): the decoder layers are split into P contiguous stages (the
  first ``layers % P`` stages take one layer more); stage 0 also holds the embedding, the last
  stage the final norm and the output head. ``--pp-schedule gpipe|1f1b`` with
  ``--microbatches M`` micro-batches of ``--micro-batch`` sequences per step.
- Data parallel over the remaining ``dp`` dimension: gradients all-reduced (averaged) over the
  dp group after backward. ``--zero1`` also shards the optimizer states over the dp group
  (ZeRO stage 1): each parameter tensor (a TP shard) is owned by one dp rank, chosen greedily by
  size, which alone keeps its AdamW moments and updates it, then broadcasts it to the other dp
  ranks. Without it every dp rank keeps full AdamW states (plain DP).

Every rank checks that the parameters it holds (its DTensor shards of its stage's layers) are
the share the layout gives it, computed from the config alone (``expected_local_params``), and
exits with code 4 if they differ. ``--reference`` trains the same model from the same seed on
one process, unsplit, on the same global batches (``--data-parallel D`` draws D data-parallel
ranks' batches), for comparing losses step by step.

The model, its split and one step of it (parallel_layout.py): a Llama-style causal LM from a Hugging Face config.json
(``--model-config``), untied embeddings, no biases, fp32, random init. Data: synthetic
repeated-pattern sequences, as ``train.py`` draws them. Optimizer: AdamW at a constant ``--lr``,
no gradient clipping.

Output follows ``train.py``: rank 0 prints ``step N/M loss X lr Y R tokens/s Ts/step peak memory
G GiB`` per step; each rank writes ``metrics-dir/rank{R}.json`` (losses: the global mean loss,
the same on every rank; step times; peak anonymous RSS; ``local_param_count`` and
``expected_local_param_count``; ``optimizer_state_params``, the parameters whose AdamW states
it keeps). ``--inject crash|nan|hang|oom|alloc`` at ``--inject-step N`` fails for
real: ``crash`` raises on the last rank, ``nan`` turns the embedding output into NaN on the first
stage, ``hang`` makes rank 0 sleep so the others block in their next collective, ``oom`` gives
every rank an address-space limit just above what it holds and then an allocation over it
(status ``oom``), ``alloc`` makes rank 0 leak memory until the supervisor's cap stops it. Exit codes:
0 done, 3 non-finite loss, 4 parameter share differs from the layout, 2 bad arguments. When the
supervisor named by ``$TRAINWRIGHT_SMOKE_SUPERVISOR_PID`` dies, each rank says so and SIGKILLs
its own process group (137 in a shell). Standalone on purpose: torch and the standard library,
and the modules beside it (harness.py, parallel_layout.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from harness import (
    EXIT_NAN,
    EXIT_USAGE,
    Faults,
    UsageError,
    anon_rss_bytes,
    cap_address_space,
    dist_env_present,
    peak_rss_bytes,
    supervisor,
    tee_rank_log,
    watch,
    whole_lines,
    write_json_atomic,
)
from parallel_layout import (
    Layout,
    ModelShape,
    StageModel,
    Step,
    expected_local_params,
    local_param_count,
    stage_layers,
)

_ALPHABET_SIZE = 16
_NUM_PATTERNS = 8
_PATTERN_LEN = (3, 6)
_METRICS_EVERY = 5
DEFAULT_LR = 3e-3
INJECT_KINDS = ("crash", "nan", "hang", "oom", "alloc")
# oom: the address space each rank may still reserve before its oversized allocation.
_OOM_MARGIN_BYTES = 256 << 20
SCHEDULES = ("gpipe", "1f1b")
EXIT_PARAM_SHARE = 4


# ---- command line ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-config", type=Path, required=True, help="HF Llama config.json")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree (stages)")
    parser.add_argument(
        "--pp-schedule", choices=SCHEDULES, default="1f1b", help="pipeline schedule"
    )
    parser.add_argument("--microbatches", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=1,
        help="sequences per micro-batch per data-parallel rank",
    )
    parser.add_argument("--metrics-dir", type=Path, required=True, help="where rank{R}.json go")
    parser.add_argument("--log-dir", type=Path, default=None, help="also write rank{R}.log here")
    parser.add_argument("--seed", type=int, default=1234, help="seed for model init and data")
    parser.add_argument("--lr", type=float, default=DEFAULT_LR, help="constant AdamW learning rate")
    parser.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    parser.add_argument(
        "--zero1", action="store_true", help="shard optimizer states over the dp group (ZeRO-1)"
    )
    parser.add_argument(
        "--reference", action="store_true", help="one process, unsplit model, same global batches"
    )
    parser.add_argument(
        "--data-parallel",
        type=int,
        default=1,
        help="with --reference: the data-parallel ranks whose batches each step draws",
    )
    parser.add_argument(
        "--inject", choices=INJECT_KINDS, default=None, help="fail for real at --inject-step"
    )
    parser.add_argument("--inject-step", type=int, default=3, help="step of the injected fault")
    args = parser.parse_args(argv)
    for name in ("tp", "pp", "microbatches", "steps", "seq_len", "micro_batch", "data_parallel"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.reference and (args.tp != 1 or args.pp != 1):
        parser.error("--reference runs the unsplit model: leave --tp and --pp at 1")
    return args


# ---- data and faults --------------------------------------------------------------------------


class PatternData:
    """Endless global batches of sequences that repeat a short token pattern (as train.py)."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int) -> None:
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
        # One stream for all ranks: each data-parallel rank takes its slice of a global batch.
        self.gen = torch.Generator().manual_seed(seed * 1000 + 17)
        self.seq_len = seq_len

    def next(self, rows: int) -> torch.Tensor:
        """Return one ``[rows, seq_len]`` LongTensor."""
        out = []
        for _ in range(rows):
            pick = int(torch.randint(0, len(self.patterns), (1,), generator=self.gen))
            pattern = self.patterns[pick]
            reps = self.seq_len // len(pattern) + 2
            offset = int(torch.randint(0, len(pattern), (1,), generator=self.gen))
            out.append(pattern.repeat(reps)[offset : offset + self.seq_len])
        return torch.stack(out)


class ParallelFaults(Faults):
    """The shared faults, plus nan (the first stage's embedding output) and oom on every rank."""

    def before_step(self, step: int, model: StageModel) -> None:
        """Arm the fault due at ``step``."""
        if not self.due(step):
            return
        self.fire(step)
        if self.kind == "nan" and model.embed_tokens is not None:
            model.embed_tokens.register_forward_hook(lambda _m, _i, out: out * float("nan"))
        if self.kind == "oom":
            # Every rank: an address-space limit just above what it holds, then a step-sized
            # allocation well over it, as a GPU's out-of-memory error ends a step.
            cap_address_space(_OOM_MARGIN_BYTES, held_bytes=peak_rss_bytes())
            torch.ones(2 * _OOM_MARGIN_BYTES // 4, dtype=torch.float32)


# ---- the run ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the smoke training; see the module docstring for the exit codes."""
    whole_lines()
    watch("parallel_train.py", supervisor())
    args = parse_args(argv)
    try:
        return run(args)
    except UsageError as exc:
        print(f"parallel_train.py: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    """Set up the layout (or the reference), check the parameter share, train and report."""
    shape = ModelShape(json.loads(args.model_config.read_text()))
    shape.check_layout(args.tp, args.pp)
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    layout = _start(args)
    rank = layout.rank if layout is not None else 0
    if args.log_dir is not None:
        tee_rank_log(args.log_dir, rank)
    baseline = anon_rss_bytes()
    step_fn = Step(args, shape, layout)
    record = LayoutMetrics(args, shape, layout, step_fn, baseline)
    if rank == 0:
        where = (
            "reference (1 process)"
            if layout is None
            else f"dp {record.dp} x pp {args.pp} x tp {args.tp}"
        )
        print(f"layout: {where}; data: synthetic repeated-pattern sequences", flush=True)
    if record.held != record.expected:
        print(
            f"rank {rank}: holds {record.held:,} parameters, the layout gives it "
            f"{record.expected:,}",
            file=sys.stderr,
            flush=True,
        )
        record.write("param_share_mismatch")
        return EXIT_PARAM_SHARE
    code = _train(args, layout, step_fn, record, shape.vocab)
    if code == 0 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return code


def _start(args: argparse.Namespace) -> Layout | None:
    """The process group and this rank's layout; None for the one-process reference."""
    if args.reference:
        if dist_env_present() and int(os.environ["WORLD_SIZE"]) > 1:
            raise UsageError("--reference runs on one process: start it without torchrun")
        return None
    if not dist_env_present():
        raise UsageError("start the parallel run with torchrun (or pass --reference)")
    dist.init_process_group("gloo")
    return Layout(args.tp, args.pp)


class LayoutMetrics:
    """This rank's ``metrics-dir/rank{R}.json``: train.py's fields, plus its place in the layout."""

    def __init__(
        self,
        args: argparse.Namespace,
        shape: ModelShape,
        layout: Layout | None,
        step_fn: Step,
        baseline: int,
    ) -> None:
        self.args, self.shape, self.step_fn = args, shape, step_fn
        if layout is None:
            self.rank, self.world, self.dp, self.stage = 0, 1, args.data_parallel, 0
            self.tp_rank = self.dp_rank = 0
        else:
            self.rank, self.world, self.dp, self.stage = (
                layout.rank,
                layout.world,
                layout.dp,
                layout.stage,
            )
            self.tp_rank, self.dp_rank = layout.tp_rank, layout.dp_rank
        self.held = local_param_count(step_fn.model)
        self.expected = expected_local_params(shape, args.tp, args.pp, self.stage)
        self.tokens_per_step = args.micro_batch * args.microbatches * args.seq_len  # per replica
        self.losses: list[float] = []
        self.step_times_s: list[float] = []
        self.baseline = baseline
        self.peak = anon_rss_bytes()
        self.path = args.metrics_dir / f"rank{self.rank}.json"

    def write(self, status: str) -> None:
        """Write the file with ``status``."""
        write_json_atomic(self.path, self.fields(status))

    def fields(self, status: str) -> dict[str, Any]:
        """The file's contents."""
        args = self.args
        return {
            "rank": self.rank,
            "world_size": self.world,
            "device": "cpu",
            "device_name": "cpu",
            "status": status,
            "mode": "reference" if args.reference else "parallel",
            "tp": args.tp,
            "pp": args.pp,
            "dp": self.dp,
            "tp_rank": self.tp_rank,
            "pp_stage": self.stage,
            "dp_rank": self.dp_rank,
            "stage_layers": list(stage_layers(self.shape.layers, args.pp, self.stage)),
            "pp_schedule": args.pp_schedule if args.pp > 1 else None,
            "microbatches": args.microbatches,
            "zero1": bool(self.step_fn.owners),
            "optimizer_state_params": self.step_fn.state_params,
            "embedding": "vocab-parallel",
            "local_param_count": self.held,
            "expected_local_param_count": self.expected,
            "steps": len(self.losses),
            "first_step": 1,
            "losses": self.losses,
            "step_times_s": self.step_times_s,
            "tokens_per_step": self.tokens_per_step,
            "tokens_processed": self.tokens_per_step * len(self.losses),
            "peak_memory_bytes": self.peak,
            "baseline_memory_bytes": self.baseline,
            "max_rss_bytes": peak_rss_bytes(),
            "seq_len": args.seq_len,
            "micro_batch": args.micro_batch,
            "grad_accum": args.microbatches,
            "lr": args.lr,
            "seed": args.seed,
            "torch": torch.__version__,
        }


def _train(
    args: argparse.Namespace,
    layout: Layout | None,
    step_fn: Step,
    record: LayoutMetrics,
    vocab: int,
) -> int:
    """Run the steps on this rank's slice of each global batch; the exit code."""
    rows_per_rank = args.micro_batch * args.microbatches
    data = PatternData(vocab, args.seq_len, args.seed)
    faults = ParallelFaults(args.inject, args.inject_step, record.rank, record.world)
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        try:
            faults.before_step(step, step_fn.model)
        except (MemoryError, RuntimeError) as exc:
            if isinstance(exc, MemoryError) or "can't allocate memory" in str(exc):
                record.write("oom")
            raise
        batch = data.next(rows_per_rank * record.dp)
        if layout is not None:
            batch = batch[record.dp_rank * rows_per_rank : (record.dp_rank + 1) * rows_per_rank]
        loss = step_fn.run(batch)
        record.peak = max(record.peak, anon_rss_bytes())
        elapsed = time.perf_counter() - start
        record.losses.append(loss if math.isfinite(loss) else float("nan"))
        record.step_times_s.append(elapsed)
        if record.rank == 0:
            rate = record.tokens_per_step * record.dp / elapsed if elapsed > 0 else 0.0
            memory = record.peak - record.baseline
            print(
                f"step {step}/{args.steps} loss {loss:.4f} lr {args.lr:.3g} "
                f"{rate:,.0f} tokens/s {elapsed:.2f}s/step peak memory {memory / 2**30:.2f} GiB",
                flush=True,
            )
        if step % _METRICS_EVERY == 0:
            record.write("running")
        if not math.isfinite(loss):
            record.write("nan")
            return EXIT_NAN
    record.write("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
