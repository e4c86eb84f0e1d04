"""Which plans get a smoke run, and why the others do not."""

from __future__ import annotations

from tools.core.schemas import FrameworkChoice, MemoryPlan, ModelSpec, SmokeResult, TrainingBrief
from tools.core.strategies import train_py_fsdp
from tools.research.framework import DEEPSPEED_FRAMEWORKS
from tools.smoke.spec import LayoutRun

# Frameworks the standalone training script (tools/smoke/scripts/train.py) runs: DeepSpeed, DDP, FSDP2.
SMOKE_TESTABLE = frozenset({*DEEPSPEED_FRAMEWORKS, "pytorch", "pytorch_ddp", "pytorch_fsdp"})
# Horovod no longer builds against current PyTorch (HOROVOD.md): a Horovod plan's smoke run is
# its maintained equivalent, DDP under torchrun (a Keras team's: TensorFlow's own strategy).
HOROVOD_STAND_IN = (
    "Horovod 0.28.1 does not build against torch >= 2.1 (C++14 extension, PR #3998 unreleased): "
    "ran its maintained equivalent, {equivalent}"
)
AGENT_APP_SMOKE = "an agent application trains nothing, so there is no training run to smoke-test"
SMOKE_OFF = "the brief turns smoke runs off"
INFERENCE_SMOKE = "inference plan: no training smoke run"


def not_smoke_testable(framework: str) -> str:
    """Why a plan for ``framework`` gets launch files and a guide but no smoke run."""
    return (
        f"trainwright's training script covers PyTorch DDP, FSDP and DeepSpeed; the {framework} plan gets "
        "launch files and a guide, but no smoke run"
    )


def skip_reason(brief: TrainingBrief, framework: FrameworkChoice | None) -> str | None:
    """Why this plan gets no smoke run, or None when it gets one."""
    if brief.task == "agent-app":
        return AGENT_APP_SMOKE
    if brief.task == "inference":
        return INFERENCE_SMOKE
    if not brief.smoke:
        return SMOKE_OFF
    if framework is not None and framework.primary not in SMOKE_TESTABLE:
        if framework.primary == "horovod" or runs_tensorflow(framework):
            return None  # DDP or TensorFlow workers stand in (with_horovod_note, runs_tensorflow)
        return not_smoke_testable(framework.primary)
    return None


def runs_tensorflow(framework: FrameworkChoice | None) -> bool:
    """Whether the smoke run is TensorFlow's: a TensorFlow plan, or Horovod for a Keras team."""
    if framework is None:
        return False
    return framework.primary == "tensorflow" or (
        framework.primary == "horovod" and "tensorflow" in framework.stack
    )


def horovod_note(tensorflow: bool) -> str:
    """Why a Horovod smoke run ran its maintained equivalent, and which one."""
    equivalent = "TensorFlow MultiWorkerMirroredStrategy" if tensorflow else "PyTorch DDP"
    return HOROVOD_STAND_IN.format(equivalent=equivalent)


def with_horovod_note(result: SmokeResult, framework: FrameworkChoice | None) -> SmokeResult:
    """``result``, its reason saying so when a Horovod plan's run was its equivalent's."""
    if framework is None or framework.primary != "horovod" or result.status == "skipped":
        return result
    note = horovod_note(runs_tensorflow(framework))
    return result.model_copy(update={"reason": f"{result.reason}; {note}"})


def runs_deepspeed(framework: FrameworkChoice | None) -> bool:
    """Whether the smoke run uses a DeepSpeed config (else plain DDP under torchrun)."""
    return framework is None or framework.primary in DEEPSPEED_FRAMEWORKS


def fsdp_smoke(
    framework: FrameworkChoice | None, strategy: str, nodes: int
) -> tuple[str | None, bool]:
    """train.py's FSDP2 sharding for an FSDP plan's smoke run (None: not FSDP, or DDP), offload.

    The plan's own launch files' choice (tools/core/strategies.py ``train_py_fsdp``), so the
    smoke run proves the setup they start.
    """
    if framework is None or framework.primary != "pytorch_fsdp":
        return None, False
    return train_py_fsdp(strategy, nodes)


# Families whose Hugging Face config parallel_train.py's Llama-style model reads as it is.
LAYOUT_FAMILIES = frozenset({"llama", "mistral", "qwen2"})
# The most ranks a layout's stand-in runs on this machine, per dimension and in all.
_MAX_SPLIT, _MAX_RANKS = 2, 4


def smoke_layout(memory: MemoryPlan, model: ModelSpec) -> LayoutRun | None:
    """The layout run a plan with tensor/pipeline parallelism smoke-tests, scaled to CPU ranks.

    Each degree above 1 becomes 2 (the split, not its width, is what can break), and a ZeRO-1
    plan gets 2 data-parallel ranks where that stays within 4 ranks. None for a data-parallel
    plan, or a model family the stand-in does not build (its smoke run is then the ZeRO part).
    """
    tp, pp = memory.tensor_parallel, memory.pipeline_parallel
    if tp * pp == 1:
        return None
    family = (model.hf_config or {}).get("model_type", "llama")
    if family not in LAYOUT_FAMILIES:
        return None
    tp, pp = min(tp, _MAX_SPLIT), min(pp, _MAX_SPLIT)
    dp = _MAX_SPLIT if memory.chosen == "zero1" and tp * pp * _MAX_SPLIT <= _MAX_RANKS else 1
    return LayoutRun.of(tp, pp, dp)
