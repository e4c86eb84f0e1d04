"""The plan contract: TrainingBrief in, TrainingPlan out (README.md, "Planning" and "Embedding").

These types sit at the bottom of the import graph so that agents and graphs can use them
without an import running back up. The keys the README documents are stable; more are welcome.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import BaseModel, Field

from tools.core.brief_types import (
    MAX_CONTEXT_PARALLEL,
    MAX_EXPERT_PARALLEL,
    MAX_EXPERTS,
    MAX_GLOBAL_BATCH,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_LORA_RANK,
    MAX_PARAMS,
    MAX_PIPELINE_PARALLEL,
    MAX_SEQ_LEN,
    MAX_TENSOR_PARALLEL,
    MAX_VOCAB,
    RECIPE_LAUNCH,
    RECIPE_PRECISION_BASE,
    RECIPES_OF,
    TRAINING_TASKS,
    Amount,
    Bottleneck,
    Count,
    Deployment,
    Experience,
    FrameworkId,
    MemoryRecipe,
    ModelParams,
    ModelShape,
    Pins,
    Precision,
    ResolvedPrecision,
    Stack,
    Task,
    Team,
    TrainingBrief,
    precision_contradiction,
    recipe_contradiction,
)
from tools.core.estimate_types import (
    ErrorBand,
    FitOption,
    MemoryBreakdown,
    MemoryPlan,
    SetupCandidate,
    SpeedEstimate,
    StrategyEstimate,
)
from tools.core.inference_types import InferencePlan
from tools.core.request_account import RequestAccount
from tools.core.sizing_types import FitLevel, SizingAnswer, SizingBinding, SizingPlan, SizingRow
from tools.core.smoke_types import FailureKind, SmokeResult
from tools.core.strategies import StrategyName

# The contract's names, wherever they are defined: callers import them from here.
__all__ = [
    "ErrorBand",
    "Alternative",
    "Amount",
    "Bottleneck",
    "Count",
    "Deployment",
    "Experience",
    "Finding",
    "FitLevel",
    "FitOption",
    "FrameworkChoice",
    "FrameworkId",
    "GPUSpec",
    "HardwareSpec",
    "LaunchSpec",
    "MAX_CONTEXT_PARALLEL",
    "MAX_EXPERT_PARALLEL",
    "MAX_EXPERTS",
    "MAX_GLOBAL_BATCH",
    "MAX_HEADS",
    "MAX_HIDDEN",
    "MAX_INTERMEDIATE",
    "MAX_LAYERS",
    "MAX_LORA_RANK",
    "MAX_PARAMS",
    "MAX_PIPELINE_PARALLEL",
    "MAX_SEQ_LEN",
    "MAX_TENSOR_PARALLEL",
    "MAX_VOCAB",
    "MemoryBreakdown",
    "MemoryPlan",
    "MemoryRecipe",
    "RECIPE_LAUNCH",
    "RECIPES_OF",
    "TRAINING_TASKS",
    "RECIPE_PRECISION_BASE",
    "precision_contradiction",
    "recipe_contradiction",
    "ModelParams",
    "ModelShape",
    "ModelSpec",
    "Pins",
    "Precision",
    "ReportPaths",
    "ResolvedPrecision",
    "Review",
    "ScalingPlan",
    "ScalingRow",
    "SetupCandidate",
    "SizingAnswer",
    "SizingBinding",
    "SizingPlan",
    "SizingRow",
    "SmokeResult",
    "SpeedEstimate",
    "Stack",
    "StrategyEstimate",
    "StrategyName",
    "Task",
    "Team",
    "TrainingBrief",
    "TrainingPlan",
]


class GPUSpec(BaseModel):
    """One GPU type's datasheet numbers."""

    name: str
    memory_gb: float
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    fp32_tflops: float | None = None
    # Dense FP8 tensor-core peak (FP32 accumulate); None: no FP8 tensor cores (or no figure).
    fp8_tflops: float | None = None
    # Dense TF32 tensor-core peak (fp32 tensors, TF32 matmuls); None: no TF32 mode (or no figure).
    tf32_tflops: float | None = None
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
    # What the lookup changed in the model's config for this job, one sentence each, said in
    # the plan (a from-scratch run's learned position table sized to its seq_len).
    notes: list[str] = Field(default_factory=list)


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
    # A sizing question's answer (which GPUs, how many; tools/planning/sizing.py); None otherwise.
    sizing: SizingPlan | None = None
    narrative: dict[str, str] = Field(default_factory=dict)
    # The request's words accounted for: read, assumed, wished, not understood (plan JSON ``request``).
    request: RequestAccount = Field(default_factory=RequestAccount)
