"""The plan contract: TrainingBrief in, TrainingPlan out (README.md, "Planning" and "Embedding").

These types sit at the bottom of the import graph so that agents and graphs can use them
without an import running back up. The keys the README documents are stable; more are welcome.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    computed_field,
    field_validator,
    model_validator,
)

from tools.core.inference_types import InferencePlan, ServingEngine, WeightDtype
from tools.core.request_account import RequestAccount
from tools.core.setup import Setup
from tools.core.smoke_types import FailureKind, SmokeResult
from tools.core.strategies import Recompute, StrategyName

Task = Literal["pretrain", "finetune", "lora", "inference", "agent-app"]
Precision = Literal["bf16", "fp16", "fp32", "auto"]
# What training really runs in once "auto" and CPU-only machines are resolved.
ResolvedPrecision = Literal["bf16", "fp16", "fp32"]
Bottleneck = Literal["compute", "communication", "offload", "unknown"]
Experience = Literal["beginner", "intermediate", "expert"]
Stack = Literal["pytorch", "tensorflow", "none"]
Deployment = Literal["none", "research", "production-serving", "mobile"]
FrameworkId = Literal[
    "pytorch",
    "pytorch_ddp",
    "pytorch_fsdp",
    "deepspeed",
    "horovod",
    "tensorflow",
    "megatron",
    "torchtitan",
    "langchain",
    "langgraph",
    "crewai",
    "autogen",
]


def _not_a_bool(value: Any) -> Any:
    # YAML reads `true` as a boolean and pydantic would take it as 1: a count is a number.
    if isinstance(value, bool):
        raise ValueError(f"must be a number, not the boolean {str(value).lower()}")
    return value


# An integer or float field of a brief: the numbers pydantic accepts, but never true/false.
Count = Annotated[int, BeforeValidator(_not_a_bool)]
Amount = Annotated[float, BeforeValidator(_not_a_bool)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The largest model a brief may describe, by shape or by size; a config.json gets the same
# bounds (tools/research/model_catalog.py), checked before anything is built.
MAX_LAYERS = 1000
MAX_HIDDEN = 1_000_000
MAX_HEADS = 10_000
MAX_VOCAB = 10_000_000
MAX_INTERMEDIATE = 10_000_000
MAX_EXPERTS = 1024
MAX_PARAMS = 1e14
# The bounds of a brief's counts (and of the CLI flags that set them, app.py NUMBER_FLAGS).
MAX_SEQ_LEN = 1_048_576
MAX_GLOBAL_BATCH = 1_000_000
MAX_LORA_RANK = 4096
MAX_TENSOR_PARALLEL = 64
MAX_PIPELINE_PARALLEL = 1024


class Team(_Strict):
    """Who will run the training."""

    experience: Experience = "intermediate"
    existing_stack: Stack = "pytorch"


class ModelShape(_Strict):
    """A model given by its dimensions instead of a catalog id or config file."""

    layers: Count = Field(gt=0, le=MAX_LAYERS)
    hidden: Count = Field(gt=0, le=MAX_HIDDEN)
    heads: Count = Field(gt=0, le=MAX_HEADS)
    vocab: Count = Field(gt=0, le=MAX_VOCAB)
    intermediate: Count | None = Field(default=None, gt=0, le=MAX_INTERMEDIATE)
    # Grouped-query attention: the KV heads (None: as many as heads).
    kv_heads: Count | None = Field(default=None, gt=0, le=MAX_HEADS)
    # A catalog id whose config gives everything but these sizes (norms, activation, RoPE,
    # tied embeddings): "a 20B llama" is a llama-2-13b config at 20B's sizes. None: llama-style.
    like: str | None = Field(default=None, min_length=1, max_length=100)


class ModelParams(_Strict):
    """A model given only by its parameter count."""

    params: Amount = Field(gt=0, le=MAX_PARAMS)


class Pins(_Strict):
    """Setup dimensions the request fixed ("ZeRO-2", "TP 4", "no offload"); None: searched."""

    zero_stage: Count | None = Field(default=None, ge=0, le=3)
    tensor_parallel: Count | None = Field(default=None, ge=1, le=MAX_TENSOR_PARALLEL)
    pipeline_parallel: Count | None = Field(default=None, ge=1, le=MAX_PIPELINE_PARALLEL)
    offload: bool | None = None
    # ZeRO stages the request refuses ("do not use ZeRO-3"); the search offers none of them.
    avoid_zero_stages: list[Annotated[int, Field(ge=0, le=3)]] = Field(
        default_factory=list, max_length=4
    )

    def stated(self) -> list[str]:
        """The pins as words, e.g. ``["ZeRO stage 2", "no offload"]``."""
        words = []
        if self.zero_stage is not None:
            words.append(f"ZeRO stage {self.zero_stage}")
        words += [f"no ZeRO stage {stage}" for stage in self.avoid_zero_stages]
        if self.tensor_parallel is not None:
            words.append(f"tensor parallel {self.tensor_parallel}")
        if self.pipeline_parallel is not None:
            words.append(f"pipeline parallel {self.pipeline_parallel}")
        if self.offload is not None:
            words.append("offload" if self.offload else "no offload")
        return words


class MemoryRecipe(_Strict):
    """How the training runs, for the memory model (tools/planning/recipe.py); None: defaults.

    ``framework`` None follows the brief's framework (pytorch_fsdp -> fsdp, megatron ->
    megatron, plain PyTorch -> fsdp's unsharded path), else DeepSpeed.
    """

    framework: (
        Literal["deepspeed", "fsdp", "torchtitan", "torchtune", "megatron", "nanotron"] | None
    ) = None
    precision: Literal["bf16", "fp16", "fp32", "pure-bf16", "fp8"] | None = None
    optimizer: Literal["adamw", "adam8bit", "paged-adam8bit", "adafactor", "sgd"] | None = None
    checkpointing: Literal["none", "selective", "selective-op", "full"] | None = None
    loss: Literal["standard", "chunked", "fused"] | None = None
    lora_rank: Count | None = Field(default=None, ge=1, le=MAX_LORA_RANK)
    qlora: bool = False
    activation_offload: bool = False
    sequence_parallel: bool | None = None
    distributed_optimizer: bool | None = None
    optimizer_in_backward: bool = False
    compile: bool = False
    # Encoder-decoder models (T5, BART): decoder tokens per sequence; None: seq_len.
    target_len: Count | None = Field(default=None, ge=1, le=1_048_576)


class TrainingBrief(_Strict):
    """What the user wants to train, on what (the README's brief format)."""

    goal: str = ""
    # None only for an agent application, which trains nothing.
    model: str | ModelParams | ModelShape | None = None
    task: Task = "finetune"
    # Inference plans only (task inference; None: the plan's stated defaults).
    context_len: Count | None = Field(default=None, gt=0, le=1_048_576)
    concurrency: Count | None = Field(default=None, gt=0, le=100_000)
    engine: ServingEngine | None = None
    weight_dtype: WeightDtype | None = None
    seq_len: Count = Field(default=2048, gt=0, le=MAX_SEQ_LEN)
    # None: not given; the planner picks one the data-parallel degree divides, for the model's
    # size (tools/planning/batch.py), and the plan says so.
    global_batch_size: Count | None = Field(default=None, gt=0, le=MAX_GLOBAL_BATCH)
    hardware: str = "local"
    # Between nodes: ib400 | ib200 | roce100 | eth25 | nvlink; None when unknown.
    interconnect: str | None = None
    # What a node has besides its GPUs, when known: host RAM (bounds CPU offload) and its
    # network cards (the comm model's inter-node bandwidth: NICs x Gb/s / 8).
    host_ram_gb: Amount | None = Field(default=None, gt=0, le=1_000_000)
    nics_per_node: Count | None = Field(default=None, ge=1, le=64)
    nic_gbps: Amount | None = Field(default=None, gt=0, le=10_000)
    precision: Precision = "auto"
    team: Team = Field(default_factory=Team)
    deployment: Deployment = "none"
    smoke: bool = True
    # Tokens the run trains on (all epochs); sets the scheduler's step count and time to train.
    dataset_tokens: Amount | None = Field(default=None, gt=0, le=1e16)
    # What one GPU-hour costs (any currency); with a time to train, the report states the cost.
    price_per_gpu_hour: Amount | None = Field(default=None, gt=0, le=100_000)
    # The framework the request asks for, and the ones it refuses (tools/intake/wishes.py).
    framework: FrameworkId | None = None
    avoid_frameworks: list[FrameworkId] = Field(default_factory=list, max_length=20)
    pins: Pins = Field(default_factory=Pins)
    # The training recipe memory is priced for (None: DeepSpeed with ``precision``).
    recipe: MemoryRecipe | None = None
    # What the run optimises when the request names it (tools/intake/wishes.py reads it from text):
    # "rl" (PPO/GRPO/RLHF with rollouts) is not planned; "continued-pretraining" loads weights.
    objective: Literal["sft", "dpo", "rl", "distill", "continued-pretraining"] | None = None

    @property
    def batch(self) -> int:
        """The global batch once planned (the planner fills ``global_batch_size`` when unset)."""
        if self.global_batch_size is None:
            raise ValueError("global_batch_size is not planned yet (tools/planning/batch.py)")
        return self.global_batch_size

    @property
    def loads_weights(self) -> bool:
        """Whether the job starts from pretrained weights (all but pretraining from scratch)."""
        return self.task != "pretrain" or self.objective == "continued-pretraining"

    @field_validator("model")
    @classmethod
    def _model_not_blank(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must name a catalog model, a config.json path or give params")
        return value

    @model_validator(mode="after")
    def _model_needed_for_training(self) -> TrainingBrief:
        if self.model is None and self.task != "agent-app":
            raise ValueError("model is required (only an agent-app brief may omit it)")
        if self.framework is not None and self.framework in self.avoid_frameworks:
            raise ValueError(f"framework {self.framework} is also in avoid_frameworks")
        if self.objective == "continued-pretraining" and self.task == "finetune":
            # Continued pretraining is pretraining (its batch and optimizer recipe) from the
            # weights; the plan's headline says so (tools/artifacts/text.py objective_note).
            self.task = "pretrain"
        return self


class GPUSpec(BaseModel):
    """One GPU type's datasheet numbers."""

    name: str
    memory_gb: float
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    fp32_tflops: float | None = None
    memory_bandwidth_gbs: float | None = None
    source: str = ""


class HardwareSpec(BaseModel):
    """The machine or cluster the plan targets."""

    source: Literal["local", "described"]
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=0)
    gpu: GPUSpec | None = None
    cpu_cores: int | None = None
    ram_gb: float | None = None
    interconnect: str | None = None
    # Network cards per node and each one's line rate, when the brief states them.
    nics_per_node: int | None = None
    nic_gbps: float | None = None
    cuda_available: bool = False

    @property
    def world_size(self) -> int:
        """Data-parallel ranks the plan targets (GPUs, or 1 for a CPU-only machine)."""
        return max(1, self.nodes * self.gpus_per_node)


class ModelSpec(BaseModel):
    """A model architecture with exact sizes."""

    name: str
    params: int
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    largest_layer_params: int
    # Mixture of experts: parameters each token passes through (top-k experts); = params otherwise.
    active_params: int | None = None
    intermediate: int | None = None
    kv_heads: int | None = None
    family: str | None = None
    hf_config: dict[str, Any] | None = None
    source: str = ""


class Alternative(BaseModel):
    """A framework we did not pick, and why."""

    name: FrameworkId
    reason: str


class FrameworkChoice(BaseModel):
    """The framework decision."""

    primary: FrameworkId
    stack: list[FrameworkId]
    alternatives: list[Alternative] = Field(default_factory=list)
    rationale: str
    citations: list[str] = Field(default_factory=list)
    # What the plan did with the request's framework wishes, one sentence each (also the end of
    # ``rationale``), rewritten whenever the primary changes (tools/research/framework.py).
    wish_notes: list[str] = Field(default_factory=list)
    # The framework the request named, when the plan does not run on it, and why not: the
    # report's headline says it (None: none named, or honoured).
    not_honoured: str | None = None


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
    time_to_train_s: float | None = None
    bottleneck: Bottleneck
    assumptions: list[str] = Field(default_factory=list)


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
    # The speed model's estimate for the chosen setup, as the search computed it (None without
    # a GPU). Carried with the result, not dumped: the plan JSON holds it once, as "speed".
    speed: SpeedEstimate | None = Field(default=None, exclude=True)

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


class LaunchSpec(BaseModel):
    """How to start the training, and the files written for it."""

    command: list[str]
    files: dict[str, str] = Field(default_factory=dict)
    # What the launch assumed or derived (run length, batch split, schedule and its sources).
    notes: list[str] = Field(default_factory=list)


class Finding(BaseModel):
    """One reviewer finding."""

    severity: Literal["info", "warning", "error"]
    message: str
    check: str = ""
    fix: str = ""
    # The cheapest change the fix names, as plan_parallelism arguments (e.g. {"min_strategy":
    # "zero2"}), for the engineer to act on without reading the prose back.
    suggested_args: dict[str, Any] | None = None
    # A failed smoke run's kind (SmokeResult.failure_kind), on its smoke_verdict finding.
    failure_kind: FailureKind | None = None


class Review(BaseModel):
    """The reviewer's verdict."""

    verdict: Literal["approved", "changes_requested", "rejected"]
    rounds: int = 1
    findings: list[Finding] = Field(default_factory=list)
    # The setup this round judged (strategy, zero_stage, micro_batch, ...): the next round
    # compares its own with it.
    setup: dict[str, str] = Field(default_factory=dict)


with warnings.catch_warnings():
    # The contract names this key "json"; it shadows only BaseModel's deprecated .json().
    warnings.simplefilter("ignore", UserWarning)

    class ReportPaths(BaseModel):
        """Where the report files were written."""

        markdown: str | None = None
        html: str | None = None
        json: str | None = None  # type: ignore[assignment]


class ScalingRow(BaseModel):
    """One cluster size of the same GPU: the setup the search picks there, its speed and cost."""

    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    gpus: int = Field(ge=1)
    # The global batch searched at this size: the plan's, rounded up to a multiple of the GPUs.
    global_batch_size: int = Field(ge=1)
    fits: bool
    # The plan's own size: its setup and speed are the plan's, not searched again.
    chosen: bool = False
    setup: str = ""  # e.g. "zero1" or "zero1+tp8+pp4"; empty when nothing fits
    strategy: StrategyName | None = None
    tensor_parallel: int = Field(default=1, ge=1)
    pipeline_parallel: int = Field(default=1, ge=1)
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    activation_checkpointing: bool = False
    tokens_per_s: float | None = None
    mfu: float | None = None
    # With the brief's dataset_tokens: hours to train them; with a price: what that costs.
    hours: float | None = None
    cost: float | None = None
    cost_per_billion_tokens: float | None = None


class ScalingPlan(BaseModel):
    """Time and cost at other cluster sizes of the plan's GPU (tools/planning/scaling.py).

    Empty (no rows) when there is nothing to scale (a CPU-only machine, nothing trained, or a
    plan from before this section), with a note saying why.
    """

    rows: list[ScalingRow] = Field(default_factory=list)
    price_per_gpu_hour: float | None = None
    currency: str | None = None
    price_source: str = ""
    dataset_tokens: float | None = None
    # GPU counts of the smallest size that fits and of the fastest (highest tokens/s).
    smallest_gpus: int | None = None
    fastest_gpus: int | None = None
    notes: list[str] = Field(default_factory=list)


class TrainingPlan(BaseModel):
    """The full plan: the plan JSON the CLI writes and the graph returns."""

    brief: TrainingBrief
    hardware: HardwareSpec
    model: ModelSpec | None  # None for an agent application (nothing is trained)
    framework: FrameworkChoice
    memory: MemoryPlan | None
    deepspeed_config: dict[str, Any] | None
    launch: LaunchSpec
    smoke_test: SmokeResult
    review: Review
    report: ReportPaths = Field(default_factory=ReportPaths)
    # The speed model's estimate for the chosen setup (tools/planning/speed.py); None without a GPU.
    speed: SpeedEstimate | None = None
    # An inference plan (task inference, tools/planning/inference.py); None for training plans.
    inference: InferencePlan | None = None
    # Time and cost at other cluster sizes of the same GPU; empty for old plans and CPU machines.
    scaling: ScalingPlan = Field(default_factory=ScalingPlan)
    narrative: dict[str, str] = Field(default_factory=dict)
    # The request's words accounted for: read, assumed, wished, not understood (plan JSON ``request``).
    request: RequestAccount = Field(default_factory=RequestAccount)
