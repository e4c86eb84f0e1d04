"""The sizing answer: which GPUs, how many, how long and how much (``size``, plan JSON ``sizing``).

Part of the plan contract (tools/core/schemas.py re-exports every name here). The search that
fills it is tools/planning/sizing.py; README.md "Sizing" documents the keys.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# The fit check's words (tools/planning/outcome.py ``fit_verdict``): "fits" leaves
# SAFE_HEADROOM of the GPU free, "tight" between that and MIN_HEADROOM, else "does not fit".
FitLevel = Literal["fits", "tight", "does not fit"]
Constraint = Literal["deadline", "budget", "memory", "max_gpus", "one_node"]


class SizingRow(BaseModel):
    """One GPU type at one count: the setup the search picks there, its speed, time and cost."""

    gpu: str  # the catalog id (or the name of a GPU the catalog lacks)
    count: int = Field(ge=1)
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    setup: str = ""  # Setup.label() of the search's pick; "" when nothing fits
    tokens_per_s: float | None = None  # the whole cluster's, predicted; None when nothing fits
    # tokens / tokens_per_s, with a token budget; cost = time_s / 3600 x count x price.
    time_s: float | None = None
    cost_usd: float | None = None
    fit: FitLevel = "does not fit"
    # The GPU memory the setup is predicted to use, as a share of the GPU (None: no setup).
    memory_share: float | None = None
    # The global batch searched at this count: the brief's, rounded up to a multiple of it.
    global_batch_size: int = Field(default=1, ge=1)
    price_per_gpu_hour: float | None = None
    usd_per_billion_tokens: float | None = None
    # The throughput's error band: tokens/s low and high (the speed model's published error).
    tokens_per_s_band: tuple[float, float] | None = None
    # That band as a share (None: no published runs of the row's kind, uncalibrated), and the
    # GPU family/framework whose published runs gave it (tools/planning/bands.py).
    speed_error: float | None = None
    speed_error_kind: str = ""
    # Set when the setup keeps states in host RAM (ZeRO offload, activation offload): what it needs.
    offload: str | None = None
    meets_deadline: bool | None = None
    meets_budget: bool | None = None
    note: str = ""


class SizingAnswer(BaseModel):
    """The "how many X" answer: per GPU type, the least count that fits and the cost-optimal count."""

    gpu: str
    asked: bool = False  # a type the request named
    gpus_per_node: int = Field(ge=1)
    min_count: int | None = None
    min_setup: str = ""
    min_fit: FitLevel = "does not fit"
    # Share of the GPU the least count leaves free (the fit check's margin).
    min_free_share: float | None = None
    cost_optimal_count: int | None = None
    price_per_gpu_hour: float | None = None
    price_source: str = ""
    counts_searched: list[int] = Field(default_factory=list)
    stopped: str = ""  # why the counts stopped where they did


class SizingBinding(BaseModel):
    """The constraint nothing met, and by how much the best row misses it."""

    constraint: Constraint
    limit: float  # the deadline in s, the budget in USD, the GPUs allowed (one node: its GPUs)
    best: float | None = None  # the closest row's value, in the same unit (None: nothing fits)
    by: float | None = None  # best - limit
    text: str


class SizingPlan(BaseModel):
    """The sizing: every row considered, the answers, the pick and the Pareto set."""

    model: str = ""
    task: str = ""
    seq_len: int = 0
    tokens: float | None = None
    deadline_s: float | None = None
    budget_usd: float | None = None
    max_gpus: int = 1024
    one_node: bool = False
    # "cheapest" (a deadline, or nothing given) or "fastest" (a budget alone).
    objective: Literal["cheapest", "fastest"] = "cheapest"
    pick: SizingRow | None = None
    rows: list[SizingRow] = Field(default_factory=list)
    # Rows no other row beats on both time and cost (fitting, priced), fastest first.
    pareto: list[SizingRow] = Field(default_factory=list)
    binding: SizingBinding | None = None
    answers: list[SizingAnswer] = Field(default_factory=list)
    # The pick's throughput error band as a share (0.0: no pick, or uncalibrated; each row
    # carries its own), and where the bands come from.
    speed_error: float = 0.0
    speed_error_source: str = ""
    notes: list[str] = Field(default_factory=list)
