"""The tools' argument schemas: what the model reads and may set, and nothing else.

The brief, settings and output directory reach the tools through the ``Workspace`` they close
over (agents/toolkit.py), never through these arguments.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tools.core.schemas import ModelParams, ModelShape, StrategyName


class ProfileHardwareArgs(BaseModel):
    """Arguments of profile_hardware."""

    spec: str = Field(
        description="'local' for this machine, or NODESxGPUSxTYPE such as '1x8xA100-80GB'"
    )
    interconnect: str | None = Field(
        default=None,
        description="between nodes: ib400, ib200, roce100, eth25 or nvlink; omit if unknown",
    )


class LookupModelArgs(BaseModel):
    """Arguments of lookup_model."""

    model: str | ModelParams | ModelShape = Field(
        description="catalog id (e.g. 'llama-3-8b'), a path to a config.json, {params: N} or a shape"
    )
    seq_len: int = Field(gt=0, description="training sequence length in tokens")


class SearchKnowledgeArgs(BaseModel):
    """Arguments of search_knowledge."""

    query: str = Field(
        min_length=3,
        max_length=500,
        description="the question, e.g. 'when to choose ZeRO-3 over FSDP'",
    )
    k: int = Field(default=3, ge=1, le=8, description="how many passages to return, best first")


class NoArgs(BaseModel):
    """This tool takes no arguments."""


class PlanParallelismArgs(BaseModel):
    """Arguments of plan_parallelism."""

    micro_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="sequences per GPU per step; omit to let the planner choose",
    )
    activation_checkpointing: bool | None = Field(
        default=None,
        description="recompute activations to save memory; omit to let the planner decide",
    )
    min_strategy: StrategyName | None = Field(
        default=None, description="consider only this strategy and heavier ones (after an OOM)"
    )


class EmitLaunchArgs(BaseModel):
    """Arguments of emit_launch."""

    steps: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="optimizer steps the real run should take; omit for the plan's (the "
        "request's dataset tokens over the tokens per step, else 1000)",
    )


class SmokeArgs(BaseModel):
    """Arguments of run_smoke_test."""

    steps: int | None = Field(
        default=None, ge=10, le=500, description="training steps; omit for the default"
    )
