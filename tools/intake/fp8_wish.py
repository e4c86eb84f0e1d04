"""A request's fp8 wish ("with fp8", "float8", "transformer engine") as the brief's recipe precision.

The wish becomes ``recipe.precision: fp8`` when the GPU has FP8 tensor cores (an FP8 peak in
knowledge/gpus.yaml: Hopper, Ada, Blackwell, MI300X); on any other GPU, or none, the plan stays
16-bit and the wish is refused in one line naming the GPU, as the request's other wishes are
refused out loud. A brief file that states ``recipe.precision: fp8`` is no wish: the planner
refuses it on such a GPU (exit 2). Whether a launch then applies fp8 is the planner's (the
reporter marks the wish from the plan it made).
"""

from __future__ import annotations

from tools.core.request_account import ReadFact, RequestAccount
from tools.core.schemas import TRAINING_TASKS, HardwareSpec, MemoryRecipe, TrainingBrief

FP8_WISH = "technique:fp8"
NEEDS_FP8_CORES = "fp8 not planned: it needs FP8 tensor cores (Hopper, Ada, Blackwell)"


def fp8_refusal(brief: TrainingBrief, hardware: HardwareSpec) -> str | None:
    """Why the fp8 wish cannot be planned on ``hardware`` (None: it can), in one line."""
    gpu = hardware.gpu
    if gpu is None:
        return f"{NEEDS_FP8_CORES} and this machine has no GPU; the plan trains fp32"
    if not gpu.fp8_tflops:
        sixteen = "bf16" if gpu.bf16_tflops else "fp16"
        return (
            f"{NEEDS_FP8_CORES} and the {gpu.name} has none; the plan trains "
            f"{sixteen} mixed precision"
        )
    if brief.recipe is not None and brief.recipe.qlora:
        return (
            "fp8 not planned: QLoRA trains 16-bit adapters over a 4-bit base; the plan trains bf16"
        )
    return None


def apply_fp8_wish(
    brief: TrainingBrief, account: RequestAccount, hardware: HardwareSpec
) -> tuple[TrainingBrief, RequestAccount]:
    """The brief with the request's fp8 wish applied, and the account saying what was done.

    Only an undecided ``technique:fp8`` wish of a training request whose brief names no recipe
    precision acts: on a GPU with FP8 tensor cores the recipe precision becomes fp8 (read, with
    the wish's words); otherwise the wish is refused with ``fp8_refusal``'s line.
    """
    wish = account.wish(FP8_WISH)
    stated = brief.recipe is not None and brief.recipe.precision is not None
    if wish is None or wish.honoured is not None or brief.task not in TRAINING_TASKS or stated:
        return brief, account
    account = account.model_copy(deep=True)
    wish = account.wish(FP8_WISH)
    assert wish is not None  # copied with the account
    if (refusal := fp8_refusal(brief, hardware)) is not None:
        wish.honoured, wish.how = False, refusal
        return brief, account
    recipe = (brief.recipe or MemoryRecipe()).model_copy(update={"precision": "fp8"})
    account.read.append(ReadFact(field="recipe.precision", value="fp8", quote=wish.quote))
    # The linears' precision is read now; the rest of the step stays bf16 mixed precision.
    account.assumed = [a for a in account.assumed if a.field != "precision"]
    return brief.model_copy(update={"recipe": recipe}), account
