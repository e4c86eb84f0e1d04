"""Batch semantics in one place: global = micro x accumulation x data parallel.

The planner (tools/planning/search.py) chooses a micro-batch (sequences one data-parallel rank
runs through the model at once; one pipeline micro-batch under pipeline parallelism) and an
accumulation count (micro-batches per optimizer step: gradient accumulation, or the pipeline's
micro-batches); the data-parallel degree is the world over tensor x pipeline x context
(``data_parallel_size``). Every launcher writes its own fields from one ``BatchLayout``:

- DeepSpeed: ``train_batch_size`` = global, ``train_micro_batch_size_per_gpu`` = micro,
  ``gradient_accumulation_steps`` = accumulation (DeepSpeedConfig checks the identity itself);
  under AutoTP ``train_batch_size`` = global x the tensor degree (``deepspeed_batch_ranks``);
- Megatron: ``--micro-batch-size`` = micro, ``--global-batch-size`` = global (Megatron derives
  the micro-batches per step as global / (micro x data parallel));
- torchtitan (``local_batch_size`` is what one data-parallel rank loads per forward-backward;
  its train.py derives gradient accumulation as global / (local x dp), and with a pipeline
  splits the local batch into local / ``pipeline_parallel_microbatch_size`` micro-batches):
  without a pipeline local = micro and global = the global batch, so the accumulation is
  torchtitan's; with one local = micro x accumulation, pipeline micro-batch = micro;
- train.py (DDP, FSDP): ``--micro-batch`` = micro, ``--grad-accum`` = accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.core.schemas import HardwareSpec, MemoryPlan
from tools.planning.parallel import data_parallel_size


@dataclass(frozen=True)
class BatchLayout:
    """Sequences per optimizer step as the plan splits them."""

    micro: int  # per data-parallel rank and forward-backward (one pipeline micro-batch)
    accumulation: int  # micro-batches per optimizer step and data-parallel rank
    data_parallel: int
    pipeline: int = 1  # pipeline degree: the accumulation is the pipeline's micro-batches

    def __post_init__(self) -> None:
        if min(self.micro, self.accumulation, self.data_parallel, self.pipeline) < 1:
            raise ValueError(f"a batch layout needs every factor >= 1: {self}")

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro x accumulation x data parallel."""
        return self.micro * self.accumulation * self.data_parallel

    @classmethod
    def of_plan(cls, memory: MemoryPlan, hardware: HardwareSpec) -> BatchLayout:
        """The memory plan's split on the hardware (data parallel = world / (t x p x c))."""
        dp = data_parallel_size(
            hardware, memory.tensor_parallel, memory.pipeline_parallel, memory.context_parallel
        )
        return cls(
            micro=memory.micro_batch_size,
            accumulation=memory.gradient_accumulation_steps,
            data_parallel=dp,
            pipeline=memory.pipeline_parallel,
        )

    @classmethod
    def of_deepspeed(cls, config: dict[str, Any], pipeline: int = 1) -> BatchLayout:
        """The layout a ds_config.json's three batch keys state (data parallel = their ratio)."""
        micro = int(config.get("train_micro_batch_size_per_gpu", 1))
        accumulation = int(config.get("gradient_accumulation_steps", 1))
        total = int(config.get("train_batch_size", micro * accumulation))
        ranks = max(1, total // (micro * accumulation))
        return cls(micro, accumulation, max(1, ranks // autotp_degree(config)), pipeline)

    def describe(self) -> str:
        """One line for notes: ``64 sequences per step = micro 2 x accumulation 4 x dp 8``."""
        return (
            f"{self.global_batch} sequences per step = micro-batch {self.micro} x accumulation "
            f"{self.accumulation} x data parallel {self.data_parallel}"
        )

    def deepspeed_fields(self, autotp: int = 1) -> dict[str, int]:
        """ds_config.json's three batch keys (``autotp``: AutoTP's tensor degree, 1 without)."""
        return {
            "train_batch_size": self.global_batch * autotp,
            "train_micro_batch_size_per_gpu": self.micro,
            "gradient_accumulation_steps": self.accumulation,
        }

    def megatron_flags(self) -> list[str]:
        """Megatron's ``--micro-batch-size`` and ``--global-batch-size``."""
        return [
            "--micro-batch-size",
            str(self.micro),
            "--global-batch-size",
            str(self.global_batch),
        ]

    def torchtitan_fields(self) -> tuple[dict[str, int], dict[str, int]]:
        """The ``[training]`` batch keys of torchtitan and its ``[parallelism]`` micro-batch key."""
        if self.pipeline > 1:
            local = self.micro * self.accumulation
        else:
            local = self.micro
        training = {"local_batch_size": local, "global_batch_size": self.global_batch}
        return training, {"pipeline_parallel_microbatch_size": self.micro}

    def train_py_args(self) -> list[str]:
        """train.py's ``--micro-batch`` and ``--grad-accum``."""
        return ["--micro-batch", str(self.micro), "--grad-accum", str(self.accumulation)]


def autotp_degree(config: dict[str, Any]) -> int:
    """A ds_config.json's AutoTP tensor degree (``tensor_parallel.autotp_size``); 1 without."""
    return max(1, int((config.get("tensor_parallel") or {}).get("autotp_size") or 1))


def deepspeed_batch_ranks(config: dict[str, Any], data_parallel: int) -> int:
    """The ranks DeepSpeed multiplies micro x accumulation by to check ``train_batch_size``.

    Megatron-DeepSpeed hands ``deepspeed.initialize`` its ``mpu`` (or a PipelineModule's grid),
    and DeepSpeedConfig counts the data-parallel group. AutoTP gets no ``mpu``: deepspeed.initialize
    builds the tensor groups itself (runtime/tensor_parallel/init_utils.py) and DeepSpeedConfig
    counts ``dist.get_world_size()``, the whole world = data parallel x autotp_size
    (DeepSpeed 0.19.8, runtime/config.py ``DeepSpeedConfig.__init__``; run on 2 gloo ranks with
    autotp_size 2: train_batch_size = micro x accumulation x 1 stopped in initialize, x 2 ran;
    bench/results/2026-12-06-launch-parsers.md). The tensor ranks see the same sequences, so
    the sequences per step stay micro x accumulation x data parallel.
    """
    return data_parallel * autotp_degree(config)


def torchtitan_layout(
    local_batch_size: int, global_batch_size: int, microbatch_size: int, dp: int, pipeline: int
) -> BatchLayout:
    """The layout torchtitan runs for those keys (its train.py and pipeline arithmetic).

    The inverse of ``BatchLayout.torchtitan_fields``, for the tests and the reviewer: torchtitan
    accumulates global / (local x dp) times, and a pipeline splits each local batch into
    local / microbatch_size micro-batches; a forward-backward holds ``microbatch_size``
    sequences with a pipeline, ``local_batch_size`` without.
    """
    if global_batch_size % (local_batch_size * dp):
        raise ValueError(
            f"torchtitan refuses global_batch_size {global_batch_size}: not a multiple of "
            f"local {local_batch_size} x data parallel {dp}"
        )
    accumulation = global_batch_size // (local_batch_size * dp)
    if pipeline > 1:
        if local_batch_size % microbatch_size:
            raise ValueError(
                f"local_batch_size {local_batch_size} is not a multiple of the pipeline "
                f"micro-batch {microbatch_size}"
            )
        return BatchLayout(
            micro=microbatch_size,
            accumulation=accumulation * (local_batch_size // microbatch_size),
            data_parallel=dp,
            pipeline=pipeline,
        )
    return BatchLayout(local_batch_size, accumulation, dp, pipeline)
