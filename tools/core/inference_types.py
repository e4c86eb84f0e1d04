"""The inference plan's contract type: what serving a model takes (tools/planning/inference.py).

Part of the plan contract (``TrainingPlan.inference``); kept in its own module so the
training types in ``schemas`` stay as they are. Every byte count is exact arithmetic on the
model's shape; every time is a model of the run, not a measurement.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

ServingEngine = Literal["vllm", "tgi", "deepspeed-inference"]
WeightDtype = Literal["bf16", "fp16", "fp8", "int8", "int4"]


class InferencePlan(BaseModel):
    """How to serve the brief's model on the brief's hardware, and what it costs."""

    engine: ServingEngine
    engine_reason: str
    hf_id: str | None = None
    decoder: bool = Field(description="autoregressive (KV cache, decode) or encoder-only")
    weight_dtype: WeightDtype
    weight_bytes_per_param: float
    kv_dtype: Literal["bf16", "fp16"] = "bf16"
    context_len: int = Field(ge=1)
    concurrency: int = Field(ge=1, description="concurrent sequences the plan is sized for")
    defaults: list[str] = Field(default_factory=list, description="values the brief did not give")
    # Bytes: the whole model, and per GPU under the chosen parallelism.
    weights_bytes: int
    weights_bytes_per_gpu: int
    kv_bytes_per_token: int = Field(description="2 x layers x kv_heads x head_dim x bytes")
    kv_bytes_per_token_per_gpu: int
    kv_cache_bytes: int = Field(description="per token x context x concurrency, whole model")
    kv_cache_bytes_per_gpu: int
    activation_bytes_per_gpu: int = Field(description="activation and workspace allowance")
    gpu_memory_bytes: int = Field(description="one device's memory")
    gpu_memory_utilization: float
    budget_bytes_per_gpu: int = Field(description="gpu_memory_utilization x device memory")
    used_bytes_per_gpu: int
    fits: bool
    tensor_parallel: int = Field(ge=1)
    pipeline_parallel: int = Field(ge=1)
    replicas: int = Field(ge=0, description="engine copies the GPUs hold (data parallel)")
    gpus_used: int
    max_concurrency: int = Field(ge=0, description="sequences of context_len that fit")
    why_not: dict[str, str] = Field(default_factory=dict)
    # When not even one sequence fits: what would (a smaller weight format, more GPUs).
    alternatives: list[str] = Field(default_factory=list)
    # Speed (None without a GPU's datasheet figures).
    decode_step_s: float | None = None
    inter_token_latency_ms: float | None = None
    tokens_per_s_per_sequence: float | None = None
    decode_tokens_per_s: float | None = Field(default=None, description="one replica, all seqs")
    decode_tokens_per_s_total: float | None = Field(default=None, description="all replicas")
    prompt_tokens: int = 0
    time_to_first_token_s: float | None = None
    command: list[str] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
