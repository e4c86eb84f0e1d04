"""Which plans get a smoke run, and why the others do not."""

from __future__ import annotations

from tools.core.schemas import FrameworkChoice, TrainingBrief
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


def skip_reason(brief: TrainingBrief, framework: FrameworkChoice | None) -> str | None:
    """Why this plan gets no smoke run, or None when it gets one."""
    if brief.task == "agent-app":
        return AGENT_APP_SMOKE
    if not brief.smoke:
        return SMOKE_OFF
    if framework is not None and framework.primary not in SMOKE_TESTABLE:
        return not_smoke_testable(framework.primary)
    return None


def runs_deepspeed(framework: FrameworkChoice | None) -> bool:
    """Whether the smoke run uses a DeepSpeed config (else plain DDP under torchrun)."""
    return framework is None or framework.primary in DEEPSPEED_FRAMEWORKS
