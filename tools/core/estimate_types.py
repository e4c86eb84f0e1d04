"""The planner's estimates: memory per strategy, the setups searched, speed, the memory plan.

Part of the plan contract (tools/core/schemas.py re-exports every name here).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, computed_field

from tools.core.brief_types import Bottleneck, ResolvedPrecision
from tools.core.setup import Setup
from tools.core.strategies import Recompute, StrategyName


class MemoryBreakdown(BaseModel):
    """Bytes per GPU by term."""

    params: int
    gradients: int
    optimizer: int
    activations: int
    buffers: int
    total: int
    # Bytes of the terms above never live at the same time (activations are freed in backward
    # as gradients appear): total = the sum of the terms minus this, min(activations, gradients).
    not_concurrent: int = 0
    # The allocator slack included in buffers (and so in total): reserved - allocated.
    margin: int = 0
    # The three quantities people measure (tools/planning/memory.py): torch's
    # max_memory_allocated, max_memory_reserved (allocator slack added) and the device memory
    # used as nvidia-smi shows it (CUDA context and NCCL buffers added; ``total``, which the
    # fit check compares with the GPU's memory).
    peak_allocated: int = 0
    peak_reserved: int = 0
    device_used: int = 0


def _setup_of(strategy: str, row: StrategyEstimate | SetupCandidate) -> Setup:
    """The ``Setup`` of a plan row or candidate (their degree fields share names)."""
    return Setup(
        strategy,
        tp=row.tensor_parallel,
        pp=row.pipeline_parallel,
        vpp=row.virtual_stages,
        cp=row.context_parallel,
        dp=row.data_parallel,
        micro_batch=row.micro_batch_size,
        accumulation=row.gradient_accumulation_steps,
        recompute=row.checkpointing,
        stage_layers=tuple(row.stage_layers),
        ep=row.expert_parallel,
    )


class StrategyEstimate(BaseModel):
    """One parallelism strategy's memory estimate."""

    name: StrategyName
    per_gpu_bytes: MemoryBreakdown
    cpu_bytes_per_node: int = 0
    fits: bool
    micro_batch_size: int = 1
    activation_checkpointing: bool = False
    # The speed model's throughput for this row's setup (tools/planning/speed.py); None without a GPU.
    tokens_per_s: float | None = None
    notes: list[str] = Field(default_factory=list)
    # Megatron-style model parallelism (searched only when no data-parallel setup fits):
    # tensor- and pipeline-parallel degrees; data parallel is world / (tensor x pipeline).
    tensor_parallel: int = Field(default=1, ge=1)
    pipeline_parallel: int = Field(default=1, ge=1)
    # The recompute policy (activation_checkpointing is True for selective and full), the
    # interleaved pipeline stages per GPU and the context-parallel degree (the search's axes).
    checkpointing: Recompute = "none"
    virtual_stages: int = Field(default=1, ge=1)
    context_parallel: int = Field(default=1, ge=1)
    # The data-parallel degree (world / (t x p x c)) and the micro-batches per optimizer step
    # the estimate was made for.
    data_parallel: int = Field(default=1, ge=1)
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    # Transformer layers on each pipeline stage, first to last, where the pipeline degree does
    # not divide the layers (the heaviest stage is the one priced); [] for equal stages.
    stage_layers: list[int] = Field(default_factory=list)
    # Ranks a mixture of experts' routed experts are split over (within data parallel).
    expert_parallel: int = Field(default=1, ge=1)

    @property
    def setup(self) -> Setup:
        """The setup this row estimates."""
        return _setup_of(self.name, self)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def label(self) -> str:
        """The row's setup as ``Setup.label`` spells it; unique among a plan's rows."""
        return self.setup.label()


class SetupCandidate(BaseModel):
    """One searched setup as the plan and ``estimate --json`` show it (the chosen or a runner-up)."""

    strategy: StrategyName
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    virtual_stages: int = 1
    context_parallel: int = 1
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    checkpointing: Recompute = "none"
    # Transformer layers on each pipeline stage, first to last, where the pipeline degree does
    # not divide the layers; [] for equal stages (and without a pipeline).
    stage_layers: list[int] = Field(default_factory=list)
    # Ranks a mixture of experts' routed experts are split over (within data parallel).
    expert_parallel: int = 1
    # params, gradients, optimizer, activations, buffers, total: bytes per GPU.
    per_gpu_bytes: dict[str, int]
    # torch's max_memory_allocated, max_memory_reserved, and the device memory used (CUDA
    # context and NCCL buffers added; the fit check compares this one, ``total``).
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    device_used_bytes: int = 0
    # Fits with the search's headroom (MIN_HEADROOM of the GPU free; host RAM for offload).
    fits: bool
    step_time_s: float | None = None
    # Tokens per second of the whole cluster.
    tokens_per_s: float | None = None
    mfu: float | None = None

    @property
    def setup(self) -> Setup:
        """This candidate as a ``Setup``."""
        return _setup_of(self.strategy, self)

    @property
    def label(self) -> str:
        """The candidate's setup as ``Setup.label`` spells it.

        A property, not a key: the estimate contract's candidate keys are fixed.
        """
        return self.setup.label()


class ErrorBand(BaseModel):
    """How far a prediction of this kind was off on published runs (knowledge/error_bands.yaml).

    ``band``: the quantile of |predicted / measured - 1| on ``n`` published rows the model was
    not fitted on; None (and n 0) when no published run is of this kind: uncalibrated.
    ``kind``: the prediction's GPU family/framework; ``matched``: the kind whose rows gave the
    band (``family/*`` when the framework had none), None when uncalibrated.
    """

    quantity: str  # tokens_per_s, images_per_s or peak_memory
    kind: str
    matched: str | None = None
    band: float | None = None
    n: int = 0
    text: str = ""


class SpeedEstimate(BaseModel):
    """Predicted time and throughput of one optimizer step for one strategy.

    Times are per optimizer step (``gradient_accumulation_steps`` micro batches on every GPU);
    ``None`` where the machine has no known peak FLOP/s (CPU-only, or a GPU without figures).
    """

    strategy: StrategyName
    precision: ResolvedPrecision
    seq_len: int
    tokens_per_step: int
    flops_per_token: float = Field(description="executed FLOPs per token, recomputation included")
    model_flops_per_token: float = Field(description="6N + 12·L·h·s, the MFU numerator")
    peak_tflops: float | None = None
    efficiency: float | None = None
    compute_time_s: float | None = None
    comm_bytes_per_step: int = Field(description="bytes each GPU sends per optimizer step")
    comm_time_s: float = 0.0
    exposed_comm_time_s: float = 0.0
    offload_bytes_per_step: int = Field(default=0, description="PCIe bytes per GPU per step")
    offload_time_s: float = 0.0
    # Megatron-style model parallelism; all zero/one for a data-parallel-only setup.
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    context_parallel: int = 1
    virtual_stages: int = 1
    recompute: str = Field(default="none", description="none, selective or full recomputation")
    tp_comm_time_s: float = Field(default=0.0, description="tensor-parallel collectives, exposed")
    pp_comm_time_s: float = Field(default=0.0, description="pipeline sends and receives, exposed")
    bubble_fraction: float = Field(default=0.0, description="(p-1)/(m+p-1) of the step idle")
    bubble_time_s: float = 0.0
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    # fp8 linears (precision fp8): the linear layers' GEMMs ran at the FP8 peak; ``mfu`` stays
    # against the 16-bit peak (as torchtitan and llm-foundry report fp8 runs), ``fp8_mfu`` is
    # the same FLOPs against the FP8 dense peak. None for a 16/32-bit run. tf32 (precision
    # tf32): fp32 tensors whose matmuls and convolutions ran at the TF32 tensor-core peak,
    # which ``peak_tflops`` and ``mfu`` then use.
    gemm_precision: Literal["fp8", "tf32"] | None = None
    fp8_peak_tflops: float | None = None
    fp8_mfu: float | None = None
    # An image model's images per second (cluster), and the host input pipeline's assumed
    # ceiling on it where the host's cores are known (tools/planning/vision.py).
    images_per_s: float | None = None
    input_images_per_s: float | None = None
    time_to_train_s: float | None = None
    bottleneck: Bottleneck
    assumptions: list[str] = Field(default_factory=list)
    # The published comparison's band for tokens/s (images/s for image models), by GPU family
    # and framework (tools/planning/bands.py); None where no band was looked up.
    error_band: ErrorBand | None = None


class FitOption(BaseModel):
    """A change that would make the training fit, with its estimate (tools/planning/alternatives.py)."""

    name: str
    fits: bool
    gb_per_gpu: float | None = None
    # Host RAM per node the option needs (offload), in decimal GB.
    host_ram_gb: float | None = None
    # The setup or hardware the figures are for, e.g. "zero2, checkpointing" or "1x8xRTX3090".
    setup: str = ""
    detail: str = ""


class MemoryPlan(BaseModel):
    """All strategies considered and the one chosen."""

    strategies: list[StrategyEstimate]
    chosen: StrategyName
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    activation_checkpointing: bool = False
    capacity_bytes: int | None = None
    assumptions: list[str] = Field(default_factory=list)
    # Why each strategy other than the chosen one lost (strategy search, tools/planning/search.py).
    why_not: dict[str, str] = Field(default_factory=dict)
    # When nothing fits: the smallest cluster of the same GPU on which something would.
    smallest_fitting_hardware: str | None = None
    # When nothing fits: what binds (GPU memory, host RAM for offload, or both) and what would
    # fit instead (tools/planning/alternatives.py; estimates, the search still chooses).
    binding: str | None = None
    fit_options: list[FitOption] = Field(default_factory=list)
    # What the request asked of the setup that the plan does not do, and why (a pin or a named
    # framework with no setup that fits): the report's headline says it.
    not_honoured: list[str] = Field(default_factory=list)
    # The chosen setup's tensor- and pipeline-parallel degrees (1 and 1: data parallel only).
    # Rows in ``strategies`` with the same name are told apart by their ``label``; the chosen
    # setup is the row whose label is ``chosen_label``.
    tensor_parallel: int = Field(default=1, ge=1)
    pipeline_parallel: int = Field(default=1, ge=1)
    # The chosen (or pinned) setup, and, when the search ran, the best setups first (bounded).
    setup: SetupCandidate | None = None
    candidates: list[SetupCandidate] = Field(default_factory=list)
    # An image model's chosen setup: images per second of the whole cluster (one sample is one
    # image), and the host input pipeline's assumed ceiling where the host's cores are known.
    # None for other models (the candidates' keys are the contract's, so they are not there).
    images_per_s: float | None = None
    input_images_per_s: float | None = None
    # The speed model's estimate for the chosen setup, as the search computed it (None without
    # a GPU). Carried with the result, not dumped: the plan JSON holds it once, as "speed".
    speed: SpeedEstimate | None = Field(default=None, exclude=True)
    # The published comparison's band for the chosen setup's speed (tokens/s or images/s) and
    # peak memory, by GPU family and framework (tools/planning/bands.py).
    error_bands: list[ErrorBand] = Field(default_factory=list)

    @property
    def context_parallel(self) -> int:
        """The chosen setup's context-parallel degree (1 without a setup)."""
        return self.setup.context_parallel if self.setup is not None else 1

    @property
    def chosen_setup(self) -> Setup:
        """The chosen setup: the plan's own fields, and what only ``setup`` records.

        Virtual stages, context and data parallel and the recompute policy come from ``setup``
        when the search recorded it.
        """
        extra = self.setup
        recompute: Recompute = "full" if self.activation_checkpointing else "none"
        if extra is not None and (extra.checkpointing != "none") == self.activation_checkpointing:
            recompute = extra.checkpointing
        return Setup(
            self.chosen,
            tp=self.tensor_parallel,
            pp=self.pipeline_parallel,
            vpp=extra.virtual_stages if extra is not None else 1,
            cp=extra.context_parallel if extra is not None else 1,
            dp=extra.data_parallel if extra is not None else 1,
            micro_batch=self.micro_batch_size,
            accumulation=self.gradient_accumulation_steps,
            recompute=recompute,
            ep=extra.expert_parallel if extra is not None else 1,
            stage_layers=(
                tuple(extra.stage_layers)
                if extra is not None and len(extra.stage_layers) == self.pipeline_parallel
                else ()
            ),
        )

    def is_chosen(self, row: StrategyEstimate) -> bool:
        """Whether ``row`` is the chosen setup (its label is the chosen one's)."""
        return row.label == self.chosen_label

    @property
    def chosen_row(self) -> StrategyEstimate | None:
        """The chosen setup's row (None in a plan built without its rows)."""
        return next((row for row in self.strategies if self.is_chosen(row)), None)

    @property
    def chosen_label(self) -> str:
        """The chosen setup's label, e.g. ``zero1`` or ``zero1+tp8+pp4``."""
        return self.chosen_setup.label()
