"""The smoke run's contract type: what a short real training run showed, as typed fields.

Part of the plan contract (``TrainingPlan.smoke_test``; ``tools.core.schemas`` re-exports it).
The ``reason`` stays prose for people; how a run failed (``failure_kind``) and how it ran
(``run_mode``) are fields, so no reader parses the prose back.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, model_validator

from tools.core.setup import Setup

# What a failed run's verdict names (tools/smoke/verdict.py); the reason starts with it.
FailureKind = Literal["oom", "nan", "diverged", "timeout", "crash", "launcher_error"]
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)
# The launchers a smoke run uses: DeepSpeed's, torchrun (train.py's DDP or FSDP2 mode), the
# torch-native stand-in for a tensor/pipeline layout (parallel_train.py), TensorFlow's workers.
Launcher = Literal["deepspeed", "ddp", "fsdp", "layout", "tensorflow"]
FsdpSharding = Literal["full", "grad-op", "hybrid"]
PipelineSchedule = Literal["1f1b", "gpipe"]


class RunMode(BaseModel):
    """How a smoke run ran: its launcher, and what that launcher was given."""

    launcher: Launcher
    # fsdp: train.py's FSDP2 sharding, and whether parameters and the optimizer step are on
    # the CPU (CPUOffloadPolicy).
    fsdp_sharding: FsdpSharding | None = None
    offload: bool = False
    # layout: the tensor x pipeline x data-parallel ranks and the pipeline schedule.
    tensor_parallel: int = Field(default=1, ge=1)
    pipeline_parallel: int = Field(default=1, ge=1)
    data_parallel: int = Field(default=1, ge=1)
    pp_schedule: PipelineSchedule | None = None
    # tensorflow: the Keras model the workers trained (the brief's kind, not its architecture).
    model_kind: Literal["image", "text"] | None = None

    @property
    def setup(self) -> Setup:
        """The setup a layout run ran: ZeRO-1 over its data-parallel ranks, else DDP."""
        dp = self.data_parallel
        strategy = "zero1" if self.launcher == "layout" and dp > 1 else "ddp"
        return Setup(strategy, tp=self.tensor_parallel, pp=self.pipeline_parallel, dp=dp)

    @property
    def stands_in(self) -> bool:
        """Whether the run is a stand-in, not the planned framework (layout, TensorFlow model)."""
        return self.launcher in ("layout", "tensorflow")

    def text(self) -> str:
        """The ``mode`` string earlier plans carry: ``deepspeed``, ``fsdp:full+offload``, ...

        Written for ``SmokeResult.mode`` only; readers use the fields.
        """
        if self.launcher == "fsdp":
            return f"fsdp:{self.fsdp_sharding}" + ("+offload" if self.offload else "")
        if self.launcher == "layout":
            tp, pp, dp = self.tensor_parallel, self.pipeline_parallel, self.data_parallel
            return f"native-3d:tp{tp}xpp{pp}xdp{dp}"
        if self.launcher == "tensorflow":
            return f"tensorflow:{self.model_kind}"
        return self.launcher


class SmokeResult(BaseModel):
    """What a real short training run showed."""

    status: Literal["passed", "failed", "skipped"]
    reason: str = ""
    device: str = "cpu"
    world_size: int = 0
    steps: int = 0
    losses: list[float] = Field(default_factory=list)
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    # CPU runs: RSS before the model was built (runtime libraries); 0 on GPU, where the
    # peak counts tensors only.
    baseline_memory_bytes: int = 0
    predicted_peak_memory_bytes: int | None = None
    run_dir: str | None = None
    wall_time_s: float | None = None
    model_shape: dict[str, Any] | None = None
    strategy: str | None = None
    # The GPU torch reported ("cpu" on CPU ranks), and on a GPU the driver's (NVML) view of the
    # process's memory, which includes the CUDA context and the allocator's cache.
    device_name: str | None = None
    process_gpu_memory_bytes: int | None = None
    # measured / predicted - 1, for the shape that ran (tools/smoke/predict.py with_prediction).
    memory_gap: float | None = None
    # Model FLOPs utilisation of a GPU run (6N + 12·L·h·s per token over the catalog's peak).
    mfu: float | None = None
    nodes: int = 1
    # The fault a test injected on purpose (oom, nan, hang, crash, alloc), if any.
    inject: str | None = None
    # How it ran, as earlier plans spell it (``RunMode.text``): deepspeed, ddp, fsdp:<sharding>
    # [+offload], native-3d:tpTxppPxdpD, tensorflow:<kind>. Readers use ``run_mode``.
    mode: str | None = None
    # How it ran, typed (None: a skipped run, or a result from before this field).
    run_mode: RunMode | None = None
    # How a failed run failed (None unless ``status`` is failed).
    failure_kind: FailureKind | None = None

    @model_validator(mode="after")
    def _mode_text(self) -> SmokeResult:
        if self.run_mode is not None and self.mode is None:
            self.mode = self.run_mode.text()
        return self

    def failed(self, kind: FailureKind, detail: str) -> SmokeResult:
        """This result as a failure of ``kind``; the reason reads ``kind: detail``."""
        return self.model_copy(
            update={"status": "failed", "failure_kind": kind, "reason": f"{kind}: {detail}"}
        )

    @property
    def measured_memory_bytes(self) -> int | None:
        """Peak memory the run itself added: GPU tensors, or CPU RSS above the baseline."""
        if not self.peak_memory_bytes:
            return None
        return max(0, self.peak_memory_bytes - self.baseline_memory_bytes)
