"""What the plan could not do as the request asked, said first: the headline's notes.

From the plan's own fields (the plan contract JSON): the framework the request named when the
plan runs on another (``framework.not_honoured``), a pin or framework the search could not
honour (``memory.not_honoured``), fp8 linears a launcher cannot apply and a model the Megatron
launch cannot build as it is (``launch.notes``), a
technique the planner refused (``request.wishes``: fp8 without FP8 tensor cores), and the
request's ``objective`` where it changes what a plan
means: RL with rollouts is not planned (the plan is the policy's supervised fine-tune, and the
tools that do RL are named), continued pretraining starts from the weights, and DPO and
distillation keep a second model in memory that the memory model does not price.
"""

from __future__ import annotations

from typing import Any

from tools.core.request_account import reference_free
from tools.core.schemas import SetupCandidate
from tools.core.units import gb_text

# The tools that train with rollouts, and why trainwright does not plan it: an RL step
# generates with the policy (an inference engine) and scores with reward and reference models
# that live in memory beside it; none of that is in the memory or speed model.
RL_TOOLS = "TRL, OpenRLHF, verl or NeMo-Aligner"
RL_WHY = (
    "rollouts need an inference engine (vLLM or SGLang) beside the trainer, and the reward and "
    "reference models in GPU memory beside the policy, none of which trainwright's memory and "
    "speed models price"
)
_BYTES_16BIT = 2
# The launch note of a launcher with no fp8 path (tools/artifacts/launch.py): not as asked.
FP8_NOT_APPLIED = "fp8 linears are not applied"
# A launch note for something the request named that the launch does not pass ("seed 7 not
# applied: the megatron launch sets no seed"; tools/artifacts/launch.py): "Not as asked" too.
NOT_APPLIED = " not applied: "
# The Megatron launch note for a model its GPT cannot build as it is, or whose weights its
# convert step cannot load (tools/research/megatron_arch.py ``megatron_differs``).
NOT_AS_IS = "the launch does not train the model as it is"


def _setup(plan: dict[str, Any]) -> str:
    """The chosen setup with its memory and speed: ``zero3, 61.2 GB per GPU, 9,800 tokens/s``."""
    chosen = (plan.get("memory") or {}).get("setup")
    if not chosen:
        return "nothing to train"
    setup = SetupCandidate.model_validate(chosen)
    parts = [setup.label, f"{gb_text(setup.per_gpu_bytes['total'])} per GPU"]
    speed = (plan.get("speed") or {}).get("tokens_per_s")
    if speed:
        parts.append(f"{speed:,.0f} tokens/s")
    if images := (plan.get("speed") or {}).get("images_per_s"):
        parts.append(f"{images:,.0f} images/s")
    return ", ".join(parts)


# What the launch files do not compute for these objectives (train.py's loss is next-token
# cross-entropy), and what does.
_LOSS = {"dpo": "DPO loss", "distill": "distillation loss"}
_OBJECTIVE_TOOLS = {
    "dpo": "run the preference step with TRL's DPOTrainer or OpenRLHF on this setup.",
    "distill": "run it with a trainer that computes it (TRL's GKDTrainer, torchtune's "
    "knowledge-distillation recipe) on this setup.",
}
# Objectives the launch files do not train as asked: said under "Not as asked".
NOT_LAUNCHED = ("rl", "dpo", "distill")


def objective_note(plan: dict[str, Any]) -> str | None:
    """The sentence the request's objective needs in the headline (None: nothing to say)."""
    brief, model = plan.get("brief") or {}, plan.get("model") or {}
    objective, name = brief.get("objective"), model.get("name") or "the model"
    if objective == "rl":
        return (
            "Not planned: RL with rollouts and reward models (PPO, GRPO, RLHF). Planned instead: "
            f"the supervised fine-tune of the policy {name} ({_setup(plan)}), the memory and "
            f"speed of its training step alone. For RL use {RL_TOOLS}: {RL_WHY}."
        )
    if objective == "continued-pretraining":
        return (
            f"Continued pretraining: planned as pretraining (its batch and optimizer recipe) "
            f"that starts from {name}'s pretrained weights, which the launch files load (not "
            "a random init)."
        )
    method = next(
        (
            reference_free(str(w.get("quote") or ""))
            for w in (plan.get("request") or {}).get("wishes") or []
            if w.get("wish") == "objective:dpo"
        ),
        None,
    )
    if objective == "dpo" and method is not None:
        return (
            f"{method[0]}: needs no reference model, so the memory figures price all it trains. "
            f"The launch files train the next-token loss, not {method[0]}'s loss: run it with "
            f"{method[1]} on this setup."
        )
    if objective in ("dpo", "distill"):
        other = "the frozen reference model" if objective == "dpo" else "the teacher model"
        size = (
            f" (a 16-bit copy of {name} is {model['params'] * _BYTES_16BIT / 1e9:.1f} GB, "
            "sharded or not as the setup shards weights)"
            if objective == "dpo" and model.get("params")
            else " (the request does not size it)"
        )
        return (
            f"{'DPO' if objective == 'dpo' else 'Distillation'}: the memory figures price the "
            f"trained model alone; {other}{size} is not priced and must fit beside it"
            + (", or precompute the reference log-probabilities." if objective == "dpo" else ".")
            + f" The launch files train the next-token loss, not the {_LOSS[objective]}: "
            + _OBJECTIVE_TOOLS[objective]
        )
    return None


def headline_notes(plan: dict[str, Any]) -> list[str]:
    """What the plan did not do as the request asked, and why: the headline's "Not as asked"."""
    notes: list[str] = []
    if missed := (plan.get("framework") or {}).get("not_honoured"):
        notes.append(str(missed))
    notes += [_sentence(str(n)) for n in (plan.get("memory") or {}).get("not_honoured") or []]
    launch = (plan.get("launch") or {}).get("notes") or []
    notes += [
        _sentence(str(n))
        for n in launch
        if str(n).startswith(FP8_NOT_APPLIED) or NOT_APPLIED in str(n) or NOT_AS_IS in str(n)
    ]
    for wish in (plan.get("request") or {}).get("wishes") or []:
        # A technique the planner refused (fp8 without FP8 tensor cores): its one line.
        line = _sentence(str(wish.get("how")))
        limit = wish["wish"] in ("deadline", "money-budget")  # a plan's time or cost over it
        named = wish["wish"].startswith(("technique:", "checkpoint:"))
        if (named or limit) and wish.get("honoured") is False:
            notes += [line] if line not in notes else []
        # A framework named after the brief's ("with fsdp, with megatron"): its own line (the
        # brief's framework wish is the framework section's not_honoured, above).
        kind, _, name = str(wish["wish"]).partition(":")
        brief_framework = (plan.get("brief") or {}).get("framework")
        if kind == "framework" and name != brief_framework and wish.get("honoured") is False:
            notes.append(_sentence(f"{name} {wish.get('how')}"))
    if (plan.get("brief") or {}).get("objective") in NOT_LAUNCHED and (
        objective := objective_note(plan)
    ):
        notes.append(objective)
    return notes


def headline_caveats(plan: dict[str, Any]) -> list[str]:
    """The headline's "Note": model config changes for this job, and what the objective means.

    What the lookup changed in the model's config (a from-scratch run's position table), then
    what the request's objective means for a plan that honours it.
    """
    notes = [_sentence(str(n)) for n in (plan.get("model") or {}).get("notes") or []]
    if (plan.get("brief") or {}).get("objective") in NOT_LAUNCHED:
        return notes  # the objective is said under "Not as asked"
    note = objective_note(plan)
    return [*notes, *([note] if note else [])]


def _sentence(text: str) -> str:
    """A search note (a lower-case clause) as a sentence."""
    first = text.split(" ", 1)[0]
    text = text[:1].upper() + text[1:] if first.isalpha() else text
    return text if text.endswith(".") else text + "."
