"""Smoke-train a TensorFlow MultiWorkerMirroredStrategy setup on synthetic, learnable data.

Standalone on purpose: it imports TensorFlow (and Keras, which ships with it) and the standard
library only, and runs in its own venv (``.venv-tf``, ``make tf-venv``): TensorFlow's protobuf
and numpy pins clash with the main venv's. Start one process per worker, each with its own
``TF_CONFIG`` (``{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": I}}``;
tools/smoke/tf_launch.py builds the commands). Without ``TF_CONFIG`` it trains as one worker.

``--kind image``: a small CNN classifies images whose class is one of four fixed textures
(stripes, checks) under Gaussian noise. ``--kind text``: a small causal transformer (embedding, ``--layers`` MultiHeadAttention
blocks) predicts the next token of sequences that repeat one of a few short token patterns.
Both start at a loss near ln(classes) and fall within a few dozen steps.

A step is one optimizer step over ``--batch`` examples per worker; Keras' optimizer all-reduces
the gradients across the workers. Worker 0 prints one progress line per logged step, in the
format of tools/smoke/scripts/train.py (``step N/M loss X lr Y T tokens/s S s/step peak memory G GiB``;
for images a "token" is one image). Each worker writes ``metrics-dir/rank{R}.json`` (losses,
step times, peak RSS, as train.py does) every few steps and at the end.

``--inject nan|crash|hang|oom|alloc`` (at ``--inject-step``; alloc: worker 0 leaks memory
until the supervisor's memory cap stops the run) makes the run fail for real: ``nan``
multiplies the inputs (the pixels, the token embeddings) by NaN on every worker; ``crash``
raises on the last worker; ``hang`` makes worker 0 sleep inside the step, so the others block
in the gradient all-reduce; ``oom`` caps this process's address space just above what it maps
(RLIMIT_AS) and then allocates a 16 GiB tensor. A NaN loss ends the run with exit code 3.

When the supervisor named by ``$TRAINWRIGHT_SMOKE_SUPERVISOR_PID`` dies, a worker says so and
SIGKILLs its own process group (137 in a shell); SIGTERM ends it wherever it is (TensorFlow's
own SIGTERM handler is taken off).
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
from typing import Any, TextIO

import tensorflow as tf

KINDS = ("image", "text")
INJECT_KINDS = ("nan", "crash", "hang", "oom", "alloc")
# alloc: worker 0 leaks this much every interval until the supervisor's cap stops it.
_ALLOC_BLOCK_BYTES = 64 << 20
_ALLOC_INTERVAL_S = 0.05
# Adam learning rates that make each kind learn within ~20 steps (measured on 2 CPU workers).
DEFAULT_LR = {"image": 1e-2, "text": 3e-3}
# Exit code of a run stopped by a non-finite loss (tools/smoke/scripts/train.py's).
EXIT_NAN = 3
_METRICS_EVERY = 5
# Images: square, one channel, one fixed template per class, then Gaussian noise.
_IMAGE_SIZE = 16
_IMAGE_CLASSES = 4
_IMAGE_NOISE = 1.0
# Text: a small alphabet and a few patterns of 3-6 tokens (tools/smoke/scripts/train.py's task).
_VOCAB = 16
_NUM_PATTERNS = 8
_PATTERN_LEN = (3, 6)
_SEQ_LEN = 32
_D_MODEL = 64
_HEADS = 4
# The oom injection: bytes left above what the process maps, and the allocation that fails.
_OOM_MARGIN_BYTES = 1 << 20
_OOM_ALLOC_FLOATS = 4 << 30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=KINDS, default="image", help="model and data")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps to run")
    parser.add_argument("--batch", type=int, default=32, help="examples per worker per step")
    parser.add_argument(
        "--lr", type=float, default=None, help="Adam learning rate (default: image 1e-2, text 3e-3)"
    )
    parser.add_argument("--layers", type=int, default=2, help="attention blocks (text)")
    parser.add_argument("--seed", type=int, default=1234, help="seed for init and data")
    parser.add_argument("--log-every", type=int, default=1, help="print every N steps")
    parser.add_argument("--metrics-dir", required=True, type=Path, help="where rank{R}.json go")
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="also write each worker's output to rank{R}.log"
    )
    parser.add_argument(
        "--inject", choices=INJECT_KINDS, default=None, help="fail for real at --inject-step"
    )
    parser.add_argument("--inject-step", type=int, default=3, help="step of the injected fault")
    args = parser.parse_args(argv)
    for name in ("steps", "batch", "layers", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.lr is None:
        args.lr = DEFAULT_LR[args.kind]
    if not (args.lr > 0 and math.isfinite(args.lr)):
        parser.error("--lr must be a positive number")
    return args


def worker_identity() -> tuple[int, int]:
    """This worker's index and the number of workers, from ``TF_CONFIG`` (0 and 1 without)."""
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return 0, 1
    config = json.loads(raw)
    workers = config.get("cluster", {}).get("worker", [])
    task = config.get("task", {})
    if task.get("type", "worker") != "worker":
        raise SystemExit(f"TF_CONFIG task type {task.get('type')!r}: only workers are supported")
    return int(task.get("index", 0)), max(1, len(workers))


# ---- data ---------------------------------------------------------------------------------------


class ImageData:
    """Endless batches of (image, label): the label's texture plus noise."""

    def __init__(self, batch: int, seed: int, rank: int) -> None:
        # The templates are fixed local textures a small convolution can detect anywhere;
        # the draws (labels, noise) differ per worker.
        self.templates = class_templates()
        self.batch = batch
        self.seed = seed * 1000 + 17 + rank
        self.position = 0

    def next(self) -> tuple[tf.Tensor, tf.Tensor]:
        """One ``[batch, H, W, 1]`` float batch and its ``[batch]`` int labels."""
        self.position += 1
        seed = [self.seed, self.position]
        labels = tf.random.stateless_uniform(
            [self.batch], seed=seed, maxval=_IMAGE_CLASSES, dtype=tf.int32
        )
        noise = tf.random.stateless_normal(
            [self.batch, _IMAGE_SIZE, _IMAGE_SIZE, 1], seed=[seed[0], seed[1] + (1 << 20)]
        )
        return tf.gather(self.templates, labels) + _IMAGE_NOISE * noise, labels


def class_templates() -> tf.Tensor:
    """One ``[H, W, 1]`` texture per class: horizontal, vertical and diagonal stripes, checks."""
    rows = tf.range(_IMAGE_SIZE, dtype=tf.float32)[:, None] * tf.ones([1, _IMAGE_SIZE])
    cols = tf.transpose(rows)
    textures = [
        tf.math.cos(math.pi * rows),
        tf.math.cos(math.pi * cols),
        tf.math.cos(math.pi * (rows + cols) / 2),
        tf.math.cos(math.pi * rows) * tf.math.cos(math.pi * cols / 2),
    ]
    return tf.stack(textures[:_IMAGE_CLASSES])[..., None]


class PatternData:
    """Endless batches of (tokens, next tokens) from sequences repeating a short pattern."""

    def __init__(self, batch: int, seed: int, rank: int) -> None:
        lengths = tf.random.stateless_uniform(
            [_NUM_PATTERNS],
            seed=[seed, 1],
            minval=_PATTERN_LEN[0],
            maxval=_PATTERN_LEN[1] + 1,
            dtype=tf.int32,
        )
        tokens = tf.random.stateless_uniform(
            [_NUM_PATTERNS, _PATTERN_LEN[1]], seed=[seed, 2], maxval=_VOCAB, dtype=tf.int32
        )
        # Each pattern written out to a full sequence (plus one token for the shifted target).
        steps = tf.range(_SEQ_LEN + _PATTERN_LEN[1] + 1)
        index = steps[None, :] % lengths[:, None]
        self.rows = tf.gather(tokens, index, batch_dims=1)
        self.batch = batch
        self.seed = seed * 1000 + 17 + rank
        self.position = 0

    def next(self) -> tuple[tf.Tensor, tf.Tensor]:
        """One ``[batch, seq_len]`` int batch and its targets, the same shifted by one token."""
        self.position += 1
        seed = [self.seed, self.position]
        which = tf.random.stateless_uniform(
            [self.batch], seed=seed, maxval=_NUM_PATTERNS, dtype=tf.int32
        )
        offsets = tf.random.stateless_uniform(
            [self.batch, 1],
            seed=[seed[0], seed[1] + (1 << 20)],
            maxval=_PATTERN_LEN[1],
            dtype=tf.int32,
        )
        columns = offsets + tf.range(_SEQ_LEN + 1)[None, :]
        seqs = tf.gather(tf.gather(self.rows, which), columns, batch_dims=1)
        return seqs[:, :-1], seqs[:, 1:]


# ---- models -------------------------------------------------------------------------------------


class ImageModel(tf.keras.Model):
    """A small CNN: two conv blocks, global pooling, a linear classifier.

    Swish and average pooling rather than ReLU and max pooling: TensorFlow's ReLU and max
    kernels turn NaN into 0, so a NaN input would end as a silently flat loss, not a NaN one.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = tf.keras.layers.Conv2D(16, 3, padding="same", activation="swish")
        self.pool = tf.keras.layers.AveragePooling2D(2)
        self.conv2 = tf.keras.layers.Conv2D(32, 3, padding="same", activation="swish")
        self.gap = tf.keras.layers.GlobalAveragePooling2D()
        self.head = tf.keras.layers.Dense(_IMAGE_CLASSES)

    def call(self, images: tf.Tensor, poison: tf.Tensor | None = None) -> tf.Tensor:
        """Class logits; ``poison`` (a scalar) multiplies the pixels first."""
        x = images if poison is None else images * poison
        return self.head(self.gap(self.conv2(self.pool(self.conv1(x)))))


class Block(tf.keras.layers.Layer):
    """One pre-norm transformer block: causal self-attention, then a feed-forward layer."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = tf.keras.layers.LayerNormalization()
        self.attn = tf.keras.layers.MultiHeadAttention(_HEADS, _D_MODEL // _HEADS)
        self.norm2 = tf.keras.layers.LayerNormalization()
        self.ff1 = tf.keras.layers.Dense(4 * _D_MODEL, activation="gelu")
        self.ff2 = tf.keras.layers.Dense(_D_MODEL)

    def call(self, x: tf.Tensor) -> tf.Tensor:
        """``x`` plus attention, plus feed-forward."""
        h = self.norm1(x)
        x = x + self.attn(h, h, use_causal_mask=True)
        return x + self.ff2(self.ff1(self.norm2(x)))


class TextModel(tf.keras.Model):
    """A small causal transformer LM: token and position embeddings, blocks, an output head."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = tf.keras.layers.Embedding(_VOCAB, _D_MODEL)
        self.position = tf.keras.layers.Embedding(_SEQ_LEN, _D_MODEL)
        self.blocks = [Block() for _ in range(layers)]
        self.norm = tf.keras.layers.LayerNormalization()
        self.head = tf.keras.layers.Dense(_VOCAB)

    def call(self, tokens: tf.Tensor, poison: tf.Tensor | None = None) -> tf.Tensor:
        """Next-token logits; ``poison`` (a scalar) multiplies the token embeddings first."""
        x = self.embed(tokens)
        if poison is not None:
            x = x * poison
        x = x + self.position(tf.range(tf.shape(tokens)[1]))[None, :, :]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# ---- faults, memory, files ----------------------------------------------------------------------


class FaultInjector:
    """Make the run fail for real at one step (``--inject``), to test what supervises it."""

    def __init__(self, kind: str | None, step: int, rank: int, world_size: int) -> None:
        self.kind = kind
        self.step = step
        self.rank = rank
        self.world_size = world_size

    def poison(self, step: int) -> float:
        """The factor the step's inputs are multiplied by: NaN at the nan step, else 1."""
        return float("nan") if self.kind == "nan" and step == self.step else 1.0

    def before_step(self, step: int) -> None:
        """Fire the fault due at ``step`` (crash, hang, oom; nan acts through ``poison``)."""
        if self.kind is None or step != self.step:
            return
        print(f"[inject] {self.kind} at step {step} on worker {self.rank}", flush=True)
        if self.kind == "crash" and self.rank == self.world_size - 1:
            raise RuntimeError(f"injected crash on worker {self.rank} at step {step}")
        if self.kind == "hang" and self.rank == 0:
            # The other workers block in the step's all-reduce; only a supervisor's kill ends this.
            time.sleep(10**7)
        if self.kind == "alloc" and self.rank == 0:
            leak: list[bytearray] = []
            while True:
                leak.append(bytearray(b"\x01") * _ALLOC_BLOCK_BYTES)
                time.sleep(_ALLOC_INTERVAL_S)
        if self.kind == "oom":
            _cap_address_space()
            held = tf.ones([_OOM_ALLOC_FLOATS], tf.float32)
            print(f"allocated {held.shape[0] * 4} bytes under the cap", flush=True)


def _cap_address_space() -> None:
    """RLIMIT_AS just above what this process maps now (within any limit already set)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        vm_bytes = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = vm_bytes + _OOM_MARGIN_BYTES
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def peak_rss_bytes() -> int:
    """This process's peak resident memory (ru_maxrss, KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so that a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


class _Tee:
    """A text stream that also writes to a log file."""

    def __init__(self, stream: TextIO, log: TextIO) -> None:
        self.stream = stream
        self.log = log

    def write(self, text: str) -> int:
        self.log.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.log.flush()
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def tee_worker_log(log_dir: Path, rank: int) -> None:
    """Copy this worker's Python-level stdout and stderr into ``log_dir/rank{R}.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"rank{rank}.log", "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    sys.stdout = _Tee(sys.stdout, log)  # type: ignore[assignment]
    sys.stderr = _Tee(sys.stderr, log)  # type: ignore[assignment]


# ---- supervision: a worker must not outlive the process that started it -------------------------
# The smoke supervisor (tools/smoke/supervise.py) puts its own pid here and starts each worker in
# a session of its own; if the supervisor dies (SIGKILL included), each worker ends itself within
# a poll. A copy of tools/smoke/scripts/train.py's watcher: this script imports nothing of ours.
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
    """If ``$TRAINWRIGHT_SMOKE_SUPERVISOR_PID`` is set, end this process group when it dies.

    A thread: TensorFlow releases the GIL while an op runs, so it also runs while the main
    thread waits in a collective that will never complete.
    """
    value = os.environ.get(SUPERVISOR_ENV, "")
    if not value.isdigit():
        return
    pid = int(value)
    started = _start_ticks(pid)  # a start time, so a reused pid is not taken for the supervisor

    def watch() -> None:
        while True:
            if started is None or _start_ticks(pid) != started:
                print(
                    f"tf_train: supervising process {pid} is gone; stopping the run",
                    file=sys.stderr,
                    flush=True,
                )
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                os._exit(137)
            time.sleep(_SUPERVISOR_POLL_S)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def restore_sigterm() -> None:
    """Let SIGTERM end this worker again, wherever it is.

    Building a MultiWorkerMirroredStrategy starts TensorFlow's coordination service, whose
    preemption notifier installs a C-level SIGTERM handler that only records the signal: a
    worker would then ignore SIGTERM, and one hung in a collective or a sleep would never end.
    The default action ends the process in the kernel, without needing Python to run.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# ---- the loop -----------------------------------------------------------------------------------


def weights_checksum(model: tf.keras.Model) -> float:
    """The sum of every weight: equal on all workers while their replicas stay in sync."""
    return float(sum(float(tf.reduce_sum(tf.cast(w, tf.float64))) for w in model.weights))


def train(args: argparse.Namespace) -> int:
    """Build the strategy, model and data; run the steps; write this worker's metrics."""
    rank, world_size = worker_identity()
    if args.log_dir is not None:
        tee_worker_log(args.log_dir, rank)
    # Two ops at a time per worker: the smoke test shares a small machine.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    baseline_bytes = peak_rss_bytes()
    # MultiWorkerMirroredStrategy reads TF_CONFIG and waits here until every worker is up.
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    restore_sigterm()
    tf.keras.utils.set_random_seed(args.seed)
    data: ImageData | PatternData
    if args.kind == "image":
        data = ImageData(args.batch, args.seed, rank)
        tokens_per_step = args.batch
        seq_len = 1
    else:
        data = PatternData(args.batch, args.seed, rank)
        tokens_per_step = args.batch * _SEQ_LEN
        seq_len = _SEQ_LEN
    global_batch = args.batch * world_size
    with strategy.scope():
        model: tf.keras.Model = ImageModel() if args.kind == "image" else TextModel(args.layers)
        model(data.next()[0])  # build the weights
        data.position = 0
        optimizer = tf.keras.optimizers.Adam(learning_rate=args.lr)
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(x: tf.Tensor, y: tf.Tensor, poison: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, poison=poison, training=True))
            if len(per_example.shape) > 1:
                per_example = tf.reduce_mean(
                    per_example, axis=list(range(1, len(per_example.shape)))
                )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        # Keras' optimizer sums the gradients over the replicas (one per worker here).
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor, poison: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        per_replica = strategy.run(replica_step, args=(x, y, poison))
        # The global mean loss (every worker's share summed) and this worker's own.
        mean = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        local = strategy.experimental_local_results(per_replica)[0] * (global_batch / args.batch)
        return mean, local

    params = int(sum(int(tf.size(w)) for w in model.weights))
    trainable = int(sum(int(tf.size(w)) for w in model.trainable_weights))
    losses: list[float] = []
    step_times_s: list[float] = []
    metrics_path = args.metrics_dir / f"rank{rank}.json"
    injector = FaultInjector(args.inject, args.inject_step, rank, world_size)
    if rank == 0:
        args.metrics_dir.mkdir(parents=True, exist_ok=True)
        what = "texture-plus-noise images" if args.kind == "image" else "repeated-pattern tokens"
        print(
            f"tensorflow {tf.__version__}: {world_size} worker(s), {args.kind} model "
            f"({params:,} params), synthetic {what}",
            flush=True,
        )

    def metrics(status: str) -> dict[str, Any]:
        return {
            "rank": rank,
            "world_size": world_size,
            "device": "cpu",
            "device_name": "cpu",
            "status": status,
            "steps": len(losses),
            "first_step": 1,
            "resumed_from": None,
            "losses": losses,
            "step_times_s": step_times_s,
            "tokens_per_step": tokens_per_step,
            "tokens_processed": tokens_per_step * len(losses),
            "peak_memory_bytes": peak_rss_bytes(),
            "process_gpu_memory_bytes": None,
            "baseline_memory_bytes": baseline_bytes,
            "seq_len": seq_len,
            "micro_batch": args.batch,
            "grad_accum": 1,
            "params": params,
            "trainable_params": trainable,
            "kind": args.kind,
            "lr": args.lr,
            "strategy": "MultiWorkerMirroredStrategy",
            "weights_checksum": weights_checksum(model),
            "tensorflow": tf.__version__,
        }

    interval_start, interval_steps = time.perf_counter(), 0
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        x, y = data.next()
        try:
            injector.before_step(step)
        except (tf.errors.ResourceExhaustedError, MemoryError):
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)
            write_json_atomic(metrics_path, metrics("oom"))
            raise
        mean_t, local_t = train_step(x, y, tf.constant(injector.poison(step), tf.float32))
        mean_loss, step_loss = float(mean_t), float(local_t)
        elapsed_s = time.perf_counter() - start
        losses.append(step_loss if math.isfinite(step_loss) else float("nan"))
        step_times_s.append(elapsed_s)
        interval_steps += 1
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            span = time.perf_counter() - interval_start
            rate = tokens_per_step * world_size * interval_steps / span if span > 0 else 0.0
            memory = peak_rss_bytes() - baseline_bytes
            print(
                f"step {step}/{args.steps} loss {mean_loss:.4f} lr {args.lr:.3g} "
                f"{rate:,.0f} tokens/s {elapsed_s:.2f}s/step peak memory {memory / 2**30:.2f} GiB",
                flush=True,
            )
            interval_start, interval_steps = time.perf_counter(), 0
        if step % _METRICS_EVERY == 0:
            # Partial metrics let a run that is stopped (timeout, Ctrl-C) still report progress.
            write_json_atomic(metrics_path, metrics("running"))
        if not (math.isfinite(step_loss) and math.isfinite(mean_loss)):
            # The all-reduced mean is NaN on every worker when any worker's loss is.
            write_json_atomic(metrics_path, metrics("nan"))
            print(f"non-finite loss at step {step}: stopping", file=sys.stderr, flush=True)
            return EXIT_NAN
    write_json_atomic(metrics_path, metrics("ok"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and train; the exit code."""
    watch_supervisor()
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
