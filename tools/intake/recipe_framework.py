"""A brief's recipe framework as the framework the plan launches: the numbers and the launch agree.

``recipe.framework`` says how memory is priced (tools/planning/recipe.py); the brief's
``framework`` says what the plan launches. A brief that names only the recipe's plans on the
launch that runs it (``RECIPE_LAUNCH``): DeepSpeed, PyTorch FSDP (train.py under torchrun),
Megatron-DeepSpeed, or torchtitan, which the torchtitan wish then runs where one of its flavors
builds the model and the job trains every weight, else FSDP in its place, priced as FSDP, with
its one line (tools/research/titan_wish.py). Two recipe frameworks have no launch here: a
torchtune recipe runs on PyTorch FSDP and is priced as FSDP, a nanotron recipe is priced as the
plan's own framework runs, and so is a Megatron recipe of a LoRA job (Megatron-DeepSpeed's launch
trains every weight); each says so in one line. A brief naming both that disagree is
refused when it is read (tools/core/brief_types.py ``recipe_contradiction``).
"""

from __future__ import annotations

from tools.core.schemas import RECIPE_LAUNCH, RECIPE_PRECISION_BASE, TRAINING_TASKS, TrainingBrief

TORCHTUNE_NOT_USED = (
    "recipe.framework torchtune not used: trainwright writes no torchtune launch, so the plan "
    "runs PyTorch FSDP (FSDP2: train.py under torchrun, without torchtune's chunked loss) and "
    "prices memory as it runs (the fsdp recipe)"
)


def _nanotron_not_used(framework: str | None) -> str:
    priced = (
        f"memory is priced as {framework} runs it"
        if framework is not None
        else "the framework is chosen as for a recipe that names none, and memory is priced as "
        "it runs"
    )
    return f"recipe.framework nanotron not used: trainwright writes no nanotron launch, so {priced}"


MEGATRON_LORA_NOT_USED = (
    "recipe.framework megatron not used: Megatron-DeepSpeed's launch (pretrain_gpt.py) trains "
    "every weight, and LoRA adapters train with the Hugging Face job (train.py with peft), so "
    "memory is priced as the plan's launch runs"
)


def recipe_launch(brief: TrainingBrief) -> str | None:
    """The framework the brief's recipe plans on when the brief names none (None: no such).

    None as well for a Megatron recipe of a LoRA job, which no Megatron launch here runs.
    """
    named = brief.recipe.framework if brief.recipe is not None else None
    if brief.framework is not None or named is None or brief.task not in TRAINING_TASKS:
        return None
    if named == "megatron" and brief.task == "lora":
        return None
    return RECIPE_LAUNCH.get(named)


def settle_recipe(brief: TrainingBrief) -> tuple[TrainingBrief, str | None]:
    """The brief whose framework launches what its recipe prices, and the line saying a change.

    The line is None when nothing of the request was dropped (the recipe's own framework
    launches). A recipe precision under a brief precision left ``auto`` becomes the launch's
    (fp16 trains fp16, pure-bf16 and fp8 train bf16 tensors); a brief stating another is refused
    when it is read (tools/core/brief_types.py ``precision_contradiction``). Settling a settled
    brief changes nothing.
    """
    recipe = brief.recipe
    if recipe is None or brief.task not in TRAINING_TASKS:
        return brief, None
    update: dict[str, object] = {}
    if brief.precision == "auto" and recipe.precision is not None:
        update["precision"] = RECIPE_PRECISION_BASE[recipe.precision]
    named = recipe.framework
    if named is None:
        return brief.model_copy(update=update), None
    if (launch := recipe_launch(brief)) is not None:
        update["framework"] = launch
    note = None
    if named == "torchtune":
        update["recipe"] = recipe.model_copy(update={"framework": "fsdp"})
        note = TORCHTUNE_NOT_USED
    elif named == "megatron" and brief.task == "lora":
        update["recipe"] = recipe.model_copy(update={"framework": None})
        # Beside framework: megatron, the framework's own line says it (research/framework.py).
        note = MEGATRON_LORA_NOT_USED if brief.framework is None else None
    elif named == "nanotron":
        update["recipe"] = recipe.model_copy(update={"framework": None})
        note = _nanotron_not_used(brief.framework)
    return brief.model_copy(update=update), note
