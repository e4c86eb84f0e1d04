"""The framework an fp8 recipe runs on: the one whose launch applies fp8 linears.

tools/artifacts/fp8_launch.py puts an fp8 recipe on torchtitan (its float8 converter) or
Megatron-DeepSpeed (Transformer Engine) when the request names no framework; the framework
choice (tools/research/framework.py) then makes that the plan's primary, saying why.
"""

from __future__ import annotations

import re

from tools.core.schemas import FrameworkChoice, FrameworkId, TrainingBrief

# How each fp8 launcher applies fp8 linears.
FP8_HOW: dict[str, str] = {
    "torchtitan": "torchtitan's float8 converter (torchao Float8Linear) applies them",
    "megatron": "Megatron-DeepSpeed applies them through Transformer Engine (--fp8-hybrid)",
}


def fp8_framework(brief: TrainingBrief) -> FrameworkId | None:
    """The framework an fp8 recipe runs on when the request names none (None: no such recipe)."""
    recipe = brief.recipe
    if brief.framework is not None or recipe is None or recipe.precision != "fp8":
        return None
    if recipe.framework == "torchtitan":
        return "torchtitan"
    return "megatron" if recipe.framework == "megatron" else None


def fp8_rationale(primary: str, scored: str) -> str:
    """The sentence that opens the choice's rationale when fp8 moved it off ``scored`` ("": not)."""
    if primary == scored:
        return ""
    return (
        f"{primary}: the recipe trains fp8 linears, and {FP8_HOW[primary]}; the {scored} "
        "launch has no fp8 path, so it is not the primary. "
    )


def fp8_dropped(choice: FrameworkChoice) -> FrameworkChoice:
    """The choice once its setup rules its fp8 out: ``fp8_rationale``'s sentence says so.

    The framework stays (the memory and the split are priced for it); the rationale no longer
    says it applies fp8 linears the plan does not train.
    """
    primary = re.escape(choice.primary)
    shape = rf"^{primary}: the recipe trains fp8 linears, and .*?, so it is not the primary\. "
    said = (
        f"{choice.primary}: chosen for the recipe's fp8 linears, which the setup that fits rules "
        "out there (said under not as asked), so the plan trains and is priced bf16 on it. "
    )
    rationale, found = re.subn(shape, said, choice.rationale, count=1)
    return choice.model_copy(update={"rationale": rationale}) if found else choice
