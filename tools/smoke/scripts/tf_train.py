"""Smoke-train a TensorFlow MultiWorkerMirroredStrategy setup on synthetic, learnable data.

Standalone on purpose: it imports TensorFlow (and Keras, which ships with it), the standard
library and the modules beside it (harness.py, tf_models.py) only, and runs in its own venv (``.venv-tf``, ``make tf-venv``): TensorFlow's protobuf
and numpy pins clash with the main venv's. Start one process per worker, each with its own
``TF_CONFIG`` (``{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": I}}``;
tools/smoke/tf_launch.py builds the commands). Without ``TF_CONFIG`` it trains as one worker.

``--kind image``: a small CNN on noisy textures; ``--kind text``: a small causal transformer
(``--layers`` attention blocks) on repeated token patterns (tf_models.py). Both start at a loss
near ln(classes) and fall within a few dozen steps.

A step is one optimizer step over ``--batch`` examples per worker; Keras' optimizer all-reduces
the gradients across the workers. Worker 0 prints one progress line per logged step, in the
format of train.py (``step N/M loss X lr Y T tokens/s S s/step peak memory G GiB``;
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
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import tensorflow as tf
from harness import (
    EXIT_NAN,
    Faults,
    cap_address_space,
    lift_cap,
    peak_rss_bytes,
    supervisor,
    tee_rank_log,
    watch,
    whole_lines,
    write_json_atomic,
)
from tf_models import SEQ_LEN, ImageData, ImageModel, PatternData, TextModel

KINDS = ("image", "text")
INJECT_KINDS = ("nan", "crash", "hang", "oom", "alloc")
# Adam learning rates that make each kind learn within ~20 steps (measured on 2 CPU workers).
DEFAULT_LR = {"image": 1e-2, "text": 3e-3}
_METRICS_EVERY = 5
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


# ---- faults and signals ------------------------------------------------------------------------


class TFFaults(Faults):
    """The shared faults, plus nan (the inputs times NaN, on every worker) and oom."""

    def __init__(self, kind: str | None, step: int, rank: int, world_size: int) -> None:
        super().__init__(kind, step, rank, world_size, who="worker")
        self._limits: tuple[int, int] | None = None

    def poison(self, step: int) -> float:
        """The factor the step's inputs are multiplied by: NaN at the nan step, else 1."""
        return float("nan") if self.kind == "nan" and step == self.step else 1.0

    def before_step(self, step: int) -> None:
        """Fire the fault due at ``step`` (crash, hang, alloc, oom; nan acts through ``poison``)."""
        if not self.due(step):
            return
        self.fire(step)
        if self.kind == "oom":
            self._limits = cap_address_space(_OOM_MARGIN_BYTES)
            held = tf.ones([_OOM_ALLOC_FLOATS], tf.float32)
            print(f"allocated {held.shape[0] * 4} bytes under the cap", flush=True)

    def release(self) -> None:
        """Lift the oom fault's cap again (so the error can still be reported)."""
        if self._limits is not None:
            lift_cap(self._limits)
            self._limits = None


def restore_sigterm() -> None:
    """Let SIGTERM end this worker again, wherever it is.

    Building a MultiWorkerMirroredStrategy starts TensorFlow's coordination service, whose
    preemption notifier installs a C-level SIGTERM handler that only records the signal: a
    worker would then ignore SIGTERM, and one hung in a collective or a sleep would never end.
    The default action ends the process in the kernel, without needing Python to run.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# ---- the loop ----------------------------------------------------------------------------------


def weights_checksum(model: tf.keras.Model) -> float:
    """The sum of every weight: equal on all workers while their replicas stay in sync."""
    return float(sum(float(tf.reduce_sum(tf.cast(w, tf.float64))) for w in model.weights))


def train(args: argparse.Namespace) -> int:
    """Build the strategy, model and data; run the steps; write this worker's metrics."""
    rank, world_size = worker_identity()
    if args.log_dir is not None:
        tee_rank_log(args.log_dir, rank)
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
        data, seq_len = ImageData(args.batch, args.seed, rank), 1
    else:
        data, seq_len = PatternData(args.batch, args.seed, rank), SEQ_LEN
    model, train_step = _build(args, strategy, data, args.batch * world_size)
    record = WorkerMetrics(args, model, rank, world_size, seq_len, baseline_bytes)
    if rank == 0:
        args.metrics_dir.mkdir(parents=True, exist_ok=True)
        what = "texture-plus-noise images" if args.kind == "image" else "repeated-pattern tokens"
        print(
            f"tensorflow {tf.__version__}: {world_size} worker(s), {args.kind} model "
            f"({record.params:,} params), synthetic {what}",
            flush=True,
        )
    return _loop(args, data, train_step, record)


def _build(
    args: argparse.Namespace, strategy: Any, data: ImageData | PatternData, global_batch: int
) -> tuple[tf.keras.Model, Any]:
    """The model (its weights built) and the compiled step that trains it on every worker."""
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

    return model, train_step


class WorkerMetrics:
    """This worker's ``metrics-dir/rank{R}.json``, in train.py's fields."""

    def __init__(
        self,
        args: argparse.Namespace,
        model: tf.keras.Model,
        rank: int,
        world_size: int,
        seq_len: int,
        baseline_bytes: int,
    ) -> None:
        self.args, self.model = args, model
        self.rank, self.world_size = rank, world_size
        self.seq_len, self.baseline_bytes = seq_len, baseline_bytes
        self.tokens_per_step = args.batch * seq_len  # for images a "token" is one image
        self.params = int(sum(int(tf.size(w)) for w in model.weights))
        self.trainable = int(sum(int(tf.size(w)) for w in model.trainable_weights))
        self.losses: list[float] = []
        self.step_times_s: list[float] = []
        self.path = args.metrics_dir / f"rank{rank}.json"

    def write(self, status: str) -> None:
        """Write the file with ``status``."""
        write_json_atomic(self.path, self.fields(status))

    def fields(self, status: str) -> dict[str, Any]:
        """The file's contents."""
        args = self.args
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "device": "cpu",
            "device_name": "cpu",
            "status": status,
            "steps": len(self.losses),
            "first_step": 1,
            "resumed_from": None,
            "losses": self.losses,
            "step_times_s": self.step_times_s,
            "tokens_per_step": self.tokens_per_step,
            "tokens_processed": self.tokens_per_step * len(self.losses),
            "peak_memory_bytes": peak_rss_bytes(),
            "process_gpu_memory_bytes": None,
            "baseline_memory_bytes": self.baseline_bytes,
            "seq_len": self.seq_len,
            "micro_batch": args.batch,
            "grad_accum": 1,
            "params": self.params,
            "trainable_params": self.trainable,
            "kind": args.kind,
            "lr": args.lr,
            "strategy": "MultiWorkerMirroredStrategy",
            "weights_checksum": weights_checksum(self.model),
            "tensorflow": tf.__version__,
        }


def _loop(
    args: argparse.Namespace, data: ImageData | PatternData, train_step: Any, record: WorkerMetrics
) -> int:
    """Run the steps, logging on worker 0; the exit code (3 at a non-finite loss)."""
    injector = TFFaults(args.inject, args.inject_step, record.rank, record.world_size)
    interval_start, interval_steps = time.perf_counter(), 0
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        x, y = data.next()
        try:
            injector.before_step(step)
        except (tf.errors.ResourceExhaustedError, MemoryError):
            injector.release()
            record.write("oom")
            raise
        mean_t, local_t = train_step(x, y, tf.constant(injector.poison(step), tf.float32))
        mean_loss, step_loss = float(mean_t), float(local_t)
        elapsed_s = time.perf_counter() - start
        record.losses.append(step_loss if math.isfinite(step_loss) else float("nan"))
        record.step_times_s.append(elapsed_s)
        interval_steps += 1
        if record.rank == 0 and (step % args.log_every == 0 or step == args.steps):
            span = time.perf_counter() - interval_start
            rate = (
                record.tokens_per_step * record.world_size * interval_steps / span
                if span > 0
                else 0.0
            )
            memory = peak_rss_bytes() - record.baseline_bytes
            print(
                f"step {step}/{args.steps} loss {mean_loss:.4f} lr {args.lr:.3g} "
                f"{rate:,.0f} tokens/s {elapsed_s:.2f}s/step peak memory {memory / 2**30:.2f} GiB",
                flush=True,
            )
            interval_start, interval_steps = time.perf_counter(), 0
        if step % _METRICS_EVERY == 0:
            # Partial metrics let a run that is stopped (timeout, Ctrl-C) still report progress.
            record.write("running")
        if not (math.isfinite(step_loss) and math.isfinite(mean_loss)):
            # The all-reduced mean is NaN on every worker when any worker's loss is.
            record.write("nan")
            print(f"non-finite loss at step {step}: stopping", file=sys.stderr, flush=True)
            return EXIT_NAN
    record.write("ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and train; the exit code."""
    whole_lines()
    watch("tf_train.py", supervisor())
    return train(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
