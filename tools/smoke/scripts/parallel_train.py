"""Smoke-train a Llama-style model under torch-native tensor x pipeline x data parallelism.

The CPU stand-in for the Megatron-style 3D layout trainwright plans for its largest models
(Megatron itself is CUDA-only): the same split of the same model, run by torch's own
``DTensor`` tensor parallelism and ``torch.distributed.pipelining`` on 2-4 gloo ranks. Standalone
on purpose (torch and the standard library only), so it can be copied next to ``train.py`` and
launched by the same supervisor:

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

The model: RMSNorm, rotary position embedding, grouped-query causal attention and a SwiGLU MLP
from a Hugging Face Llama config.json (``--model-config``; ``hidden_size``,
``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
``vocab_size``, ``rms_norm_eps``, ``rope_theta``), untied embeddings, no biases, fp32, random
init (normal, ``initializer_range``). Data: synthetic repeated-pattern sequences, as ``train.py``
draws them. Optimizer: AdamW at a constant ``--lr``, no gradient clipping.

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
its own process group (137 in a shell).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

_ALPHABET_SIZE = 16
_NUM_PATTERNS = 8
_PATTERN_LEN = (3, 6)
_METRICS_EVERY = 5
DEFAULT_LR = 3e-3
INJECT_KINDS = ("crash", "nan", "hang", "oom", "alloc")
# alloc: rank 0 leaks this much every interval until something stops the run (train.py's).
_ALLOC_BLOCK_BYTES = 64 << 20
_ALLOC_INTERVAL_S = 0.05
# oom: the address space each rank may still reserve before its oversized allocation.
_OOM_MARGIN_BYTES = 256 << 20
SCHEDULES = ("gpipe", "1f1b")
EXIT_USAGE = 2
EXIT_NAN = 3
EXIT_PARAM_SHARE = 4
_DIST_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class UsageError(Exception):
    """A bad argument or config: one line, exit code 2."""


# ---- command line and config ------------------------------------------------------------------


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


class ModelShape:
    """The dimensions of a Llama-style model, read from a Hugging Face config dict."""

    def __init__(self, config: dict[str, Any]) -> None:
        try:
            self.hidden = int(config["hidden_size"])
            self.intermediate = int(config["intermediate_size"])
            self.layers = int(config["num_hidden_layers"])
            self.heads = int(config["num_attention_heads"])
            self.vocab = int(config["vocab_size"])
        except KeyError as exc:
            raise UsageError(f"model config lacks {exc.args[0]}") from exc
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or self.hidden // self.heads)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        rope = config.get("rope_parameters") or {}
        self.rope_theta = float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        self.init_std = float(config.get("initializer_range", 0.02))
        if config.get("tie_word_embeddings"):
            raise UsageError("tied embeddings are not supported: set tie_word_embeddings false")
        if config.get("attention_bias") or config.get("mlp_bias"):
            raise UsageError("biases are not supported: set attention_bias and mlp_bias false")
        if self.heads % self.kv_heads:
            raise UsageError("num_attention_heads must be a multiple of num_key_value_heads")

    def check_layout(self, tp: int, pp: int) -> None:
        """Raise UsageError when the model cannot be split ``tp`` x ``pp`` ways."""
        for name, value in (
            ("num_attention_heads", self.heads),
            ("num_key_value_heads", self.kv_heads),
            ("intermediate_size", self.intermediate),
            ("vocab_size", self.vocab),
        ):
            if value % tp:
                raise UsageError(f"{name} ({value}) is not divisible by --tp {tp}")
        if self.layers < pp:
            raise UsageError(f"{self.layers} layers cannot fill {pp} pipeline stages")


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """The decoder layers of pipeline stage ``stage``: contiguous, the first ones one longer."""
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def expected_local_params(shape: ModelShape, tp: int, pp: int, stage: int) -> int:
    """Parameters one rank holds under the layout, from the config's dimensions alone.

    Per layer: q, k, v, o, gate, up and down are sharded ``tp`` ways (column- or row-parallel),
    the two RMSNorm weights are replicated. Stage 0 adds the vocab-parallel embedding, the last
    stage the replicated final norm and the column-parallel output head.
    """
    h, q_out, kv_out = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    sharded_per_layer = h * q_out + 2 * h * kv_out + q_out * h + 3 * h * shape.intermediate
    per_layer = sharded_per_layer // tp + 2 * h
    total = per_layer * len(stage_layers(shape.layers, pp, stage))
    if stage == 0:
        total += shape.vocab * h // tp
    if stage == pp - 1:
        total += h + shape.vocab * h // tp
    return total


# ---- the model --------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize the last dimension."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Apply rotary position embedding to ``[batch, heads, seq, head_dim]`` (half-split pairs)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query causal self-attention; under TP each rank runs its share of the heads."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        h, d = shape.hidden, shape.head_dim
        self.q_proj = nn.Linear(h, shape.heads * d, bias=False)
        self.k_proj = nn.Linear(h, shape.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, shape.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(shape.heads * d, h, bias=False)
        self.head_dim = d
        self.group = shape.heads // shape.kv_heads
        self.theta = shape.rope_theta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend causally over the sequence."""
        b, s, _ = x.shape
        # -1 heads: the local head count, which column-parallel q/k/v divide by the TP degree.
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = rotary(q, self.theta), rotary(k, self.theta)
        k = k.repeat_interleave(self.group, dim=1)
        v = v.repeat_interleave(self.group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward block."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.up_proj = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """down(silu(gate(x)) * up(x))."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP with residual connections."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden, shape.eps)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.eps)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One decoder layer."""
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class StageModel(nn.Module):
    """The part of the causal LM one pipeline stage runs (the whole model with one stage).

    Stage 0 maps token ids to hidden states; the last stage maps hidden states to logits.
    """

    def __init__(self, shape: ModelShape, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden) if first else None
        # Keys are the global layer indices, so every stage names a layer as the whole model does.
        self.layers = nn.ModuleDict({str(i): DecoderLayer(shape) for i in layers})
        self.norm = RMSNorm(shape.hidden, shape.eps) if last else None
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids or hidden states in; hidden states or logits out."""
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None and self.lm_head is not None:
            x = self.lm_head(self.norm(x))
        return x


def build_stage(shape: ModelShape, seed: int, pp: int, stage: int) -> StageModel:
    """Stage ``stage`` of ``pp``, with the weights the whole model drawn from ``seed`` would have.

    Every rank draws the full model's weights in the same order and keeps its stage's, so any
    layout starts from exactly the reference's initial model.
    """
    gen = torch.Generator().manual_seed(seed)
    full = StageModel(shape, range(shape.layers), first=True, last=True)
    with torch.no_grad():
        for name, param in full.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                param.fill_(1.0)
            else:
                param.normal_(0.0, shape.init_std, generator=gen)
    part = StageModel(
        shape, stage_layers(shape.layers, pp, stage), first=stage == 0, last=stage == pp - 1
    )
    part.load_state_dict({k: v for k, v in full.state_dict().items() if k in part.state_dict()})
    return part


def apply_tensor_parallel(model: StageModel, tp_mesh: Any) -> None:
    """Shard ``model`` over ``tp_mesh`` with the Megatron plan (see the module docstring)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan: dict[str, Any] = {}
    for key in model.layers:
        prefix = f"layers.{key}"
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            plan[f"{prefix}.{name}"] = ColwiseParallel()
        plan[f"{prefix}.self_attn.o_proj"] = RowwiseParallel()
        plan[f"{prefix}.mlp.gate_proj"] = ColwiseParallel()
        plan[f"{prefix}.mlp.up_proj"] = ColwiseParallel()
        plan[f"{prefix}.mlp.down_proj"] = RowwiseParallel()
    if model.embed_tokens is not None:
        plan["embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
    if model.lm_head is not None:
        plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    parallelize_module(model, tp_mesh, plan)


def local_param_count(model: nn.Module) -> int:
    """Parameters this rank holds: a DTensor's local shard, a plain tensor whole."""
    total = 0
    for param in model.parameters():
        to_local = getattr(param, "to_local", None)
        total += int((to_local() if callable(to_local) else param).numel())
    return total


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view sharing its storage), or a plain tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def zero1_owners(params: list[nn.Parameter], ranks: int) -> list[tuple[int, nn.Parameter]]:
    """Assign each parameter to one of ``ranks`` data-parallel ranks (the same on every rank).

    Largest first, each to the least loaded rank, so the optimizer states split about evenly.
    """
    load = [0] * ranks
    owners: dict[int, int] = {}
    order = sorted(range(len(params)), key=lambda i: (-_local(params[i]).numel(), i))
    for i in order:
        owner = min(range(ranks), key=lambda r: (load[r], r))
        owners[i] = owner
        load[owner] += int(_local(params[i]).numel())
    return [(owners[i], p) for i, p in enumerate(params)]


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, mean over the batch's predicted positions."""
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1)
    )


# ---- data, memory, faults ---------------------------------------------------------------------


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


class Faults:
    """Make the run fail for real at one step (``--inject``), for the supervisor's verdicts."""

    def __init__(self, kind: str | None, step: int, rank: int, world: int) -> None:
        self.kind, self.step, self.rank, self.world = kind, step, rank, world

    def before_step(self, step: int, model: StageModel) -> None:
        """Arm the fault due at ``step``."""
        if self.kind is None or step != self.step:
            return
        print(f"[inject] {self.kind} at step {step} on rank {self.rank}", flush=True)
        if self.kind == "crash" and self.rank == self.world - 1:
            raise RuntimeError(f"injected crash on rank {self.rank} at step {step}")
        if self.kind == "hang" and self.rank == 0:
            time.sleep(10**7)
        if self.kind == "nan" and model.embed_tokens is not None:
            model.embed_tokens.register_forward_hook(lambda _m, _i, out: out * float("nan"))
        if self.kind == "alloc" and self.rank == 0:
            held: list[bytearray] = []
            while True:  # a leak: memory grows until the supervisor's cap stops the run
                held.append(bytearray(b"\x01") * _ALLOC_BLOCK_BYTES)
                time.sleep(_ALLOC_INTERVAL_S)
        if self.kind == "oom":
            # Every rank: an address-space limit just above what it holds, then a step-sized
            # allocation well over it, as a GPU's out-of-memory error ends a step.
            used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            with open("/proc/self/statm") as fh:
                used = max(used, int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE"))
            hard = resource.getrlimit(resource.RLIMIT_AS)[1]
            soft = used + _OOM_MARGIN_BYTES
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
            torch.ones(2 * _OOM_MARGIN_BYTES // 4, dtype=torch.float32)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so that a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


class _Tee:
    """A stream that also writes to a log file."""

    def __init__(self, stream: Any, log: Any) -> None:
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.log.write(text)
        self.log.flush()
        return int(self.stream.write(text))

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def tee_rank_log(log_dir: Path, rank: int) -> None:
    """Copy this rank's stdout and stderr into ``log_dir/rank{R}.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"rank{rank}.log", "a", buffering=1)  # noqa: SIM115 - lives with the process
    sys.stdout = _Tee(sys.stdout, log)
    sys.stderr = _Tee(sys.stderr, log)


# ---- supervision: a run must not outlive the process that started it --------------------------
# The smoke supervisor (tools/smoke/supervise.py) puts its own pid here. torchrun starts every
# rank in a session of its own, so no kill of the launcher's group reaches the ranks; each rank
# therefore watches the supervisor and ends itself (and its own group) within a poll of its
# death, SIGKILL included. A copy of train.py's watcher: this script imports nothing of ours.
SUPERVISOR_ENV = "TRAINWRIGHT_SMOKE_SUPERVISOR_PID"
_SUPERVISOR_POLL_S = 0.5


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
    """If ``$TRAINWRIGHT_SMOKE_SUPERVISOR_PID`` is set, end this process group when it dies."""
    value = os.environ.get(SUPERVISOR_ENV, "")
    if not value.isdigit():
        return
    pid = int(value)
    started = _start_ticks(pid)  # a start time, so a reused pid is not taken for the supervisor

    def watch() -> None:
        while True:
            if started is None or _start_ticks(pid) != started:
                print(
                    f"parallel_train: supervising process {pid} is gone; stopping the run",
                    file=sys.stderr,
                    flush=True,
                )
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                os._exit(137)
            time.sleep(_SUPERVISOR_POLL_S)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


# ---- the run ----------------------------------------------------------------------------------


class Layout:
    """This rank's place in the ``(dp, pp, tp)`` mesh and its process groups."""

    def __init__(self, tp: int, pp: int) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.world % (tp * pp):
            raise UsageError(f"world size {self.world} is not divisible by tp x pp = {tp * pp}")
        self.tp, self.pp, self.dp = tp, pp, self.world // (tp * pp)
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh("cpu", (self.dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
        self.tp_mesh = self.mesh["tp"]
        self.pp_group = self.mesh["pp"].get_group()
        self.dp_group = self.mesh["dp"].get_group()
        self.tp_rank = self.mesh["tp"].get_local_rank()
        self.stage = self.mesh["pp"].get_local_rank()
        self.dp_rank = self.mesh["dp"].get_local_rank()


class Step:
    """One optimizer step of the layout (or of the unsplit reference), returning the loss.

    The returned loss is the global one: the mean over micro-batches and data-parallel ranks,
    the same on every rank (rank 0 of each tensor-parallel group of the last stage contributes).
    """

    def __init__(self, args: argparse.Namespace, shape: ModelShape, layout: Layout | None) -> None:
        self.args, self.layout = args, layout
        stage = layout.stage if layout else 0
        pp = layout.pp if layout else 1
        self.model = build_stage(shape, args.seed, pp, stage)
        if layout is not None and layout.tp > 1:
            apply_tensor_parallel(self.model, layout.tp_mesh)
        params = list(self.model.parameters())
        # ZeRO-1: (owning dp rank, parameter) for every parameter; this rank steps its own only.
        self.owners: list[tuple[int, nn.Parameter]] = []
        if args.zero1 and layout is not None and layout.dp > 1:
            self.owners = zero1_owners(params, layout.dp)
            params = [p for owner, p in self.owners if owner == layout.dp_rank]
        self.state_params = sum(_local(p).numel() for p in params)
        # foreach=False: the parameters mix DTensor shards and plain (replicated) tensors.
        self.optimizer = torch.optim.AdamW(
            params, lr=args.lr, weight_decay=args.weight_decay, foreach=False
        )
        self.schedule: Any = None
        if layout is not None and layout.pp > 1:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

            pipe_stage = PipelineStage(
                self.model, layout.stage, layout.pp, torch.device("cpu"), group=layout.pp_group
            )
            kind = ScheduleGPipe if args.pp_schedule == "gpipe" else Schedule1F1B
            self.schedule = kind(pipe_stage, n_microbatches=args.microbatches, loss_fn=lm_loss)

    def run(self, batch: torch.Tensor) -> float:
        """Forward, backward, gradient all-reduce and AdamW on this rank's ``batch``."""
        # The model's, not the optimizer's: under ZeRO-1 it steps only this rank's parameters.
        self.model.zero_grad(set_to_none=True)
        layout, mb = self.layout, self.args.microbatches
        last_stage = layout is None or layout.stage == layout.pp - 1
        if self.schedule is not None:
            assert layout is not None
            losses: list[torch.Tensor] = []
            if layout.stage == 0:
                self.schedule.step(batch)
            elif last_stage:
                self.schedule.step(target=batch, losses=losses)
            else:
                self.schedule.step()
            local = torch.stack(losses).mean().detach() if last_stage else torch.zeros(())
        elif layout is None:
            # The reference: the whole global batch in one forward (micro-batches of equal size
            # average to the same mean loss).
            loss = lm_loss(self.model(batch), batch)
            loss.backward()
            local = loss.detach()
        else:
            # No pipeline: accumulate the micro-batches' gradients, each scaled by 1/M.
            total = torch.zeros(())
            for part in batch.chunk(mb):
                loss = lm_loss(self.model(part), part) / mb
                loss.backward()
                total += loss.detach()
            local = total
        if layout is not None and layout.dp > 1:
            for param in self.model.parameters():
                if param.grad is None:
                    continue
                to_local = getattr(param.grad, "to_local", None)
                grad = to_local() if callable(to_local) else param.grad
                dist.all_reduce(grad, group=layout.dp_group)
                grad.div_(layout.dp)
        self.optimizer.step()
        if self.owners:
            assert layout is not None
            with torch.no_grad():
                for owner, param in self.owners:
                    src = dist.get_global_rank(layout.dp_group, owner)
                    dist.broadcast(_local(param), src=src, group=layout.dp_group)
        if layout is None:
            return float(local)
        owner = last_stage and layout.tp_rank == 0
        value = torch.tensor([float(local) if owner else 0.0], dtype=torch.float64)
        dist.all_reduce(value)
        return float(value[0]) / layout.dp


def main(argv: list[str] | None = None) -> int:
    """Run the smoke training; see the module docstring for the exit codes."""
    watch_supervisor()
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
    layout: Layout | None = None
    if args.reference:
        if all(key in os.environ for key in _DIST_ENV) and int(os.environ["WORLD_SIZE"]) > 1:
            raise UsageError("--reference runs on one process: start it without torchrun")
        rank, world, dp, stage = 0, 1, args.data_parallel, 0
    else:
        if not all(key in os.environ for key in _DIST_ENV):
            raise UsageError("start the parallel run with torchrun (or pass --reference)")
        dist.init_process_group("gloo")
        layout = Layout(args.tp, args.pp)
        rank, world, dp, stage = layout.rank, layout.world, layout.dp, layout.stage
    if args.log_dir is not None:
        tee_rank_log(args.log_dir, rank)
    baseline = anon_rss_bytes()
    step_fn = Step(args, shape, layout)
    held = local_param_count(step_fn.model)
    expected = expected_local_params(shape, args.tp, args.pp, stage)
    rows_per_rank = args.micro_batch * args.microbatches
    tokens_per_step = rows_per_rank * args.seq_len  # per data-parallel replica
    losses: list[float] = []
    step_times_s: list[float] = []
    peak = anon_rss_bytes()
    metrics_path = args.metrics_dir / f"rank{rank}.json"
    tp_rank = layout.tp_rank if layout else 0
    dp_rank = layout.dp_rank if layout else 0

    def metrics(status: str) -> dict[str, Any]:
        return {
            "rank": rank,
            "world_size": world,
            "device": "cpu",
            "device_name": "cpu",
            "status": status,
            "mode": "reference" if args.reference else "parallel",
            "tp": args.tp,
            "pp": args.pp,
            "dp": dp,
            "tp_rank": tp_rank,
            "pp_stage": stage,
            "dp_rank": dp_rank,
            "stage_layers": list(stage_layers(shape.layers, args.pp, stage)),
            "pp_schedule": args.pp_schedule if args.pp > 1 else None,
            "microbatches": args.microbatches,
            "zero1": bool(step_fn.owners),
            "optimizer_state_params": step_fn.state_params,
            "embedding": "vocab-parallel",
            "local_param_count": held,
            "expected_local_param_count": expected,
            "steps": len(losses),
            "first_step": 1,
            "losses": losses,
            "step_times_s": step_times_s,
            "tokens_per_step": tokens_per_step,
            "tokens_processed": tokens_per_step * len(losses),
            "peak_memory_bytes": peak,
            "baseline_memory_bytes": baseline,
            "max_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
            "seq_len": args.seq_len,
            "micro_batch": args.micro_batch,
            "grad_accum": args.microbatches,
            "lr": args.lr,
            "seed": args.seed,
            "torch": torch.__version__,
        }

    if rank == 0:
        where = (
            "reference (1 process)" if layout is None else f"dp {dp} x pp {args.pp} x tp {args.tp}"
        )
        print(f"layout: {where}; data: synthetic repeated-pattern sequences", flush=True)
    if held != expected:
        print(
            f"rank {rank}: holds {held:,} parameters, the layout gives it {expected:,}",
            file=sys.stderr,
            flush=True,
        )
        write_json_atomic(metrics_path, metrics("param_share_mismatch"))
        return EXIT_PARAM_SHARE
    data = PatternData(shape.vocab, args.seq_len, args.seed)
    faults = Faults(args.inject, args.inject_step, rank, world)
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        try:
            faults.before_step(step, step_fn.model)
        except (MemoryError, RuntimeError) as exc:
            if isinstance(exc, MemoryError) or "can't allocate memory" in str(exc):
                write_json_atomic(metrics_path, metrics("oom"))
            raise
        global_batch = data.next(rows_per_rank * dp)
        if layout is None:
            batch = global_batch
        else:
            batch = global_batch[dp_rank * rows_per_rank : (dp_rank + 1) * rows_per_rank]
        loss = step_fn.run(batch)
        peak = max(peak, anon_rss_bytes())
        elapsed = time.perf_counter() - start
        losses.append(loss if math.isfinite(loss) else float("nan"))
        step_times_s.append(elapsed)
        if rank == 0:
            rate = tokens_per_step * dp / elapsed if elapsed > 0 else 0.0
            memory = peak - baseline
            print(
                f"step {step}/{args.steps} loss {loss:.4f} lr {args.lr:.3g} "
                f"{rate:,.0f} tokens/s {elapsed:.2f}s/step peak memory {memory / 2**30:.2f} GiB",
                flush=True,
            )
        if step % _METRICS_EVERY == 0:
            write_json_atomic(metrics_path, metrics("running"))
        if not math.isfinite(loss):
            write_json_atomic(metrics_path, metrics("nan"))
            return EXIT_NAN
    write_json_atomic(metrics_path, metrics("ok"))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
