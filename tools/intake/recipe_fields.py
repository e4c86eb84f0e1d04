"""A brief's recipe fields that no launch here applies: priced as the launch runs, and said.

A plan prices memory and speed for the run its files start. Some recipe choices describe runs
that none of trainwright's launches makes: every launch steps AdamW (DeepSpeed's optimizer
block, train.py under torchrun, torchtitan's ``[optimizer]``, Megatron-DeepSpeed's
``--optimizer adam``), computes the standard cross-entropy over the full logits, keeps fp32
master weights (DeepSpeed's bf16 optimizer, FSDP2's fp32 shards, torchtitan, Megatron), keeps
activations on the GPU and steps after backward; only torchtitan's launch compiles the model
(``[compile] enable``). A brief's recipe that states another of these is priced as the launch
runs instead (the field dropped, pure-bf16 read as bf16, tf32 as fp32: no launch turns on TF32
matmuls), with one line under "not as asked"
naming each field and why, as the recipe framework's own line does
(tools/intake/recipe_framework.py). ``estimate`` launches nothing and prices the recipe as named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tools.core.schemas import TRAINING_TASKS, MemoryRecipe, TrainingBrief

# Why a launch here runs no other optimizer, and no compiled model but torchtitan's (also the
# reasons a plan gives for refusing such wishes: tools/artifacts/plan_wishes.py).
STEPS_ADAMW = "every launch here steps AdamW"
COMPILE_WHY = "only torchtitan's launch compiles the model"
# (field, the stated value no launch applies, the value the launch runs, why), in note order.
_UNAPPLIED: tuple[tuple[str, Callable[[Any], bool], Any, str], ...] = (
    (
        "optimizer",
        lambda v: v not in (None, "adamw"),
        None,
        STEPS_ADAMW,
    ),
    (
        "precision",
        lambda v: v == "pure-bf16",
        "bf16",
        "every launch here keeps fp32 master weights",
    ),
    (
        "precision",
        lambda v: v == "tf32",
        "fp32",
        "no launch here turns on TF32 matmuls (torch.backends.cuda.matmul.allow_tf32)",
    ),
    (
        "loss",
        lambda v: v not in (None, "standard"),
        None,
        "every launch here computes the standard cross-entropy over the full logits",
    ),
    (
        "activation_offload",
        bool,
        False,
        "no launch here offloads activations to the CPU",
    ),
    (
        "optimizer_in_backward",
        bool,
        False,
        "no launch here steps the optimizer inside backward",
    ),
)


def _launches_torchtitan(brief: TrainingBrief, recipe: MemoryRecipe) -> bool:
    return "torchtitan" in (brief.framework, recipe.framework)


def settle_recipe_fields(brief: TrainingBrief) -> tuple[TrainingBrief, str | None]:
    """The brief whose recipe keeps only what its launch applies, and the line naming the rest.

    The line is None when every stated field is applied. Settling a settled brief changes
    nothing.
    """
    recipe = brief.recipe
    if recipe is None or brief.task not in TRAINING_TASKS:
        return brief, None
    update: dict[str, Any] = {}
    said: list[str] = []
    for field, unapplied, runs, why in _UNAPPLIED:
        value = getattr(recipe, field)
        if unapplied(value):
            update[field] = runs
            said.append(f"recipe.{field} {_shown(value)} ({why})")
    if recipe.compile and not _launches_torchtitan(brief, recipe):
        update["compile"] = False
        said.append(f"recipe.compile true ({COMPILE_WHY})")
    if not said:
        return brief, None
    note = (
        f"not applied by the launch, so memory and speed are priced as it runs: {'; '.join(said)}"
    )
    return brief.model_copy(update={"recipe": recipe.model_copy(update=update)}), note


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
