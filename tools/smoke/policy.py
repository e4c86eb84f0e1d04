"""Which plans get a smoke run, and why the others do not."""

from __future__ import annotations

from tools.core.schemas import FrameworkChoice, ModelSpec, TrainingBrief
from tools.research.architectures import trains_as_causal_lm
from tools.research.framework import DEEPSPEED_FRAMEWORKS

# Frameworks the standalone training script (tools/smoke/train.py) runs: DeepSpeed or DDP.
SMOKE_TESTABLE = frozenset({*DEEPSPEED_FRAMEWORKS, "pytorch", "pytorch_ddp"})
AGENT_APP_SMOKE = "an agent application trains nothing, so there is no training run to smoke-test"
SMOKE_OFF = "the brief turns smoke runs off"


def not_smoke_testable(framework: str) -> str:
    """Why a plan for ``framework`` gets launch files and a guide but no smoke run."""
    return (
        f"trainwright's training script covers PyTorch DDP and DeepSpeed; the {framework} plan gets "
        "launch files and a guide, but no smoke run"
    )


def not_causal_lm(model: ModelSpec) -> str:
    """Why a model the training script cannot build gets no smoke run."""
    return (
        f"trainwright's training script trains causal language models on token batches; "
        f"{model.name} ({model.family}) is not one, so the plan has no smoke run and its "
        "train.py is a template to replace with this model's own training loop"
    )


def skip_reason(
    brief: TrainingBrief, framework: FrameworkChoice | None, model: ModelSpec | None = None
) -> str | None:
    """Why this plan gets no smoke run, or None when it gets one."""
    if brief.task == "agent-app":
        return AGENT_APP_SMOKE
    if not brief.smoke:
        return SMOKE_OFF
    if framework is not None and framework.primary not in SMOKE_TESTABLE:
        return not_smoke_testable(framework.primary)
    if model is not None and not trains_as_causal_lm(model.hf_config or {}):
        return not_causal_lm(model)
    return None


def runs_deepspeed(framework: FrameworkChoice | None) -> bool:
    """Whether the smoke run uses a DeepSpeed config (else plain DDP under torchrun)."""
    return framework is None or framework.primary in DEEPSPEED_FRAMEWORKS
