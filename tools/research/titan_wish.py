"""A request that names torchtitan: planned on torchtitan where it runs the job, said otherwise.

"with torchtitan" (or a brief's ``framework: torchtitan``) plans on torchtitan's own launch
(torchtitan.toml, ``torchrun -m torchtitan.train``) and prices its recipe (per-op selective
recompute, FSDP2) where torchtitan can run the job: one of its llama3 flavors builds the model
exactly (tools/research/titan_flavors.py) and the job trains every weight. Otherwise the plan
runs PyTorch FSDP in its place (FSDP2, the sharding torchtitan builds on: train.py under
torchrun) and says in one line why, with the reason titan_flavors gives (the fp8 launcher
choice, tools/artifacts/fp8_launch.py, gives the same one).
"""

from __future__ import annotations

from tools.core.schemas import TRAINING_TASKS, FrameworkId, ModelSpec, TrainingBrief
from tools.research.titan_flavors import titan_refusal, torchtitan_flavor

# What runs a torchtitan wish torchtitan cannot run: FSDP2, the sharding it builds on.
IN_ITS_PLACE: FrameworkId = "pytorch_fsdp"


def titan_wish_refusal(brief: TrainingBrief, model: ModelSpec | None) -> str | None:
    """Why the brief's torchtitan wish is not planned on torchtitan (None: no wish, or it is)."""
    if brief.framework != "torchtitan" or brief.task not in TRAINING_TASKS:
        return None
    return titan_refusal(model, brief.task)


def titan_runs(brief: TrainingBrief, model: ModelSpec | None) -> bool:
    """Whether the brief asks for torchtitan and torchtitan runs the job."""
    return brief.framework == "torchtitan" and titan_refusal(model, brief.task) is None


def titan_score(brief: TrainingBrief, model: ModelSpec | None) -> tuple[FrameworkId, str] | None:
    """The candidate a torchtitan wish scores for, and why: torchtitan, else FSDP in its place."""
    if brief.framework != "torchtitan" or model is None:
        return None
    if titan_runs(brief, model):
        flavor = torchtitan_flavor(model)
        return (
            "torchtitan",
            f"the request asks for it, and its llama3 flavor {flavor} builds {model.name}",
        )
    return IN_ITS_PLACE, (
        "the request asks for torchtitan, which cannot run this job; FSDP2, the sharding "
        "torchtitan builds on, runs in its place"
    )


def titan_not_honoured(brief: TrainingBrief, chosen: str, model: ModelSpec | None) -> str | None:
    """The one line saying why a torchtitan wish runs on ``chosen`` instead (None: it does not)."""
    if chosen == "torchtitan" or (why := titan_wish_refusal(brief, model)) is None:
        return None
    instead = (
        " (FSDP2, the sharding torchtitan builds on: train.py under torchrun)"
        if chosen == IN_ITS_PLACE
        else ""
    )
    return f"Wish not honoured: torchtitan was asked for, but {why}; the plan runs on {chosen}{instead}."


def recipe_framework(brief: TrainingBrief, model: ModelSpec | None) -> str:
    """The recipe framework (tools/planning/recipe.py) a torchtitan wish is priced with."""
    return "torchtitan" if titan_runs(brief, model) else "fsdp"
