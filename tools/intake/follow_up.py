"""A chat follow-up: the brief fields it changes, its wish words, and the brief's goal after it.

A follow-up ("what if I only had 4 GPUs?") changes brief fields (``follow_up_fields``); words
that name a wish a follow-up cannot apply are named (``wish_words``); its words join the goal
(``follow_up_goal``), so the report, its title and ``/brief`` say what this plan answers. The
goal keeps the first request and the newest follow-ups within the brief's goal length (older
follow-ups give way first).
"""

from __future__ import annotations

import re
from typing import Any

from tools.core.errors import InputError
from tools.core.schemas import precision_contradiction, recipe_contradiction
from tools.intake.brief import DEFAULT_SEQ_LEN, request_fields
from tools.intake.hardware_text import (
    HARDWARE_ASSUMED,
    HARDWARE_REFUSED,
    HARDWARE_UNCLEAR,
    SPEC_RE,
    HardwareReading,
    read_hardware,
)
from tools.intake.numbers_text import number_reads
from tools.intake.optim_text import optim_fields
from tools.intake.readings import MODEL_ASSUMED, NUMBER_NOTES
from tools.intake.recipe_text import recipe_text_fields
from tools.intake.relative_text import relative_fields
from tools.intake.serving_text import serving_follow_up
from tools.intake.wishes import named_wishes

# Number readings that are wishes of a whole request, not brief fields (a follow-up re-plans
# the last brief, whose fields only change).
_WISH_NUMBERS = ("deadline", "money-budget", "compute-budget")

# The goal's cap when read from a request (tools/intake/brief.py request_fields).
MAX_GOAL_CHARS = 500
_SEPARATOR = "; then: "
_SPACES = re.compile(r"\s+")


def follow_up_goal(goal: str | None, follow_up: str) -> str:
    """``goal`` with ``follow_up`` appended: ``"<request>; then: <follow-up>; then: <newer>"``."""
    said = _SPACES.sub(" ", follow_up).strip()
    parts = [p for p in str(goal or "").split(_SEPARATOR) if p.strip()]
    first, rest = (parts[0], parts[1:]) if parts else ("", [])
    rest.append(said[: MAX_GOAL_CHARS // 2])
    while rest and len(_SEPARATOR.join([first, *rest])) > MAX_GOAL_CHARS and len(rest) > 1:
        rest.pop(0)  # the oldest follow-up gives way to the newest
    text = _SEPARATOR.join(p for p in (first, *rest) if p)
    return text[:MAX_GOAL_CHARS]


def _wish_reads(text: str) -> list[Any]:
    reads = [r for r in named_wishes(text) if not r.field.startswith("objective:")]
    numbers, _ = number_reads(text, DEFAULT_SEQ_LEN)
    reads += [r for r in numbers if r.field in _WISH_NUMBERS]
    return sorted(reads, key=lambda r: r.start)


def wish_words(text: str) -> list[str]:
    """The words of a follow-up that name a wish (fp8, 8-bit Adam, a deadline, a budget).

    A plan reads wishes from a whole request and marks each honoured or refused; a follow-up
    changes the last brief's fields, so the chat names these words instead of saying only
    that nothing changed.
    """
    return [r.quote for r in _wish_reads(text)]


# The wishes a follow-up's changed fields carry ("with gradient checkpointing" is the recipe's).
_CARRIED_BY = {
    "technique:activation-checkpointing": "recipe",
    "avoid:activation-checkpointing": "recipe",
    "technique:fsdp2": "framework",
    "technique:expert-parallelism": "pins",
    "technique:context-parallelism": "pins",
}


def dropped_wish_words(text: str, changes: dict[str, Any]) -> list[str]:
    """The wish words of a follow-up that changes fields, that those changes do not carry.

    Before, "make it 2 A100 in JAX by Friday" re-planned on 2 A100s and dropped the rest
    without a word; the chat names these beside the fields it changes.
    """
    return [
        r.quote
        for r in _wish_reads(text)
        if not (
            _CARRIED_BY.get(r.field) in changes
            or (r.field.startswith("avoid:zero-") and "pins" in changes)
        )
    ]


# A follow-up that counts GPUs or nodes without naming a type: "what if I only had 4 GPUs?".
_GPU_COUNT_RE = re.compile(r"\b(\d+)\s*(?:x\s*)?gpus?\b", re.I)
_NODE_COUNT_RE = re.compile(r"\b(\d+)[\s-]*nodes?\b", re.I)


def _same_counts(text: str, reading: HardwareReading, brief: dict[str, Any]) -> str | None:
    """The brief's node and GPU counts with the GPU a follow-up names without a count.

    "what about H100?" or "make it H100s" on 1x8xA100-80GB is 1x8xH100-80GB: a follow-up
    that names only the part changes the part (a fresh request would read one GPU, or ask).
    None when the follow-up gives a count, names no GPU, or the brief has no cluster spec.
    """
    spec = SPEC_RE.match(str(brief.get("hardware") or ""))
    if spec is None or reading.gpu is None:
        return None
    counted = _NODE_COUNT_RE.search(text) or _GPU_COUNT_RE.search(text)
    no_count = any("without a count" in u for u in reading.unclear) or any(
        "no GPU count given" in a.why for a in reading.assumed
    )
    if counted or not no_count:
        return None
    return f"{int(spec[1] or 1)}x{int(spec[2])}x{reading.gpu}"


def _newer_wins(said: dict[str, Any], brief: dict[str, Any]) -> None:
    """Merge a follow-up's framework and pin words over the brief's, the newer word winning.

    "use fsdp" after "no fsdp" takes FSDP off the avoid list, "no deepspeed" unpins DeepSpeed
    (before, both failed: "framework ... is also in avoid_frameworks"); "use zero3" keeps the
    brief's other pins ("data parallel only": before, every pin was replaced) and drops 3 from
    the stages to avoid, "no zero3" drops a ZeRO-3 pin. The follow-up line lists each change.
    """
    avoided = list(said.get("avoid_frameworks", brief.get("avoid_frameworks")) or [])
    if said.get("framework") in avoided and "avoid_frameworks" not in said:
        said["avoid_frameworks"] = [f for f in avoided if f != said["framework"]]
    if brief.get("framework") in (said.get("avoid_frameworks") or []) and "framework" not in said:
        said["framework"] = None
    old, new = brief.get("pins"), said.get("pins")
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return
    pins = {**old, **{k: v for k, v in new.items() if v is not None and v != []}}
    stage, avoid = new.get("zero_stage"), list(new.get("avoid_zero_stages") or [])
    kept = [s for s in old.get("avoid_zero_stages") or [] if s != stage]
    pins["avoid_zero_stages"] = sorted(set(kept + avoid))
    if pins.get("zero_stage") in pins["avoid_zero_stages"]:
        pins["zero_stage"] = None
    said["pins"] = pins


def follow_up_fields(text: str, brief: dict[str, Any], known_models: list[str]) -> dict[str, Any]:
    """The brief fields a follow-up ("what if I only had 4 GPUs?") changes in ``brief``.

    The follow-up goes through the request parser; a GPU or node count without a GPU type
    keeps the brief's type ("4 GPUs" on 1x8xA100-80GB -> 1x4xA100-80GB; "2 nodes" keeps the
    GPUs per node). The goal stays the brief's. Merge the result over the brief.
    """
    # "double the batch", "halve the sequence length", "double the GPUs": the brief's own values.
    relative = relative_fields(text, brief)
    said = {**relative, **request_fields(text, known_models)}
    said.pop("goal", None)
    said.pop(HARDWARE_ASSUMED, None)
    said.pop(MODEL_ASSUMED, None)
    said.pop(NUMBER_NOTES, None)
    said.pop(HARDWARE_REFUSED, None)
    unclear = said.pop(HARDWARE_UNCLEAR, None)
    if "hardware" in relative:
        unclear = None  # "double the GPUs": the brief's GPUs, counted
    reading = read_hardware(text)
    if (kept := _same_counts(text, reading, brief)) is not None:
        said["hardware"], unclear = kept, None
    said = {**serving_follow_up(text, {**brief, **said}), **said}
    if "task" not in said:
        # "with gradient checkpointing", "rank 32": recipe words read for the brief's task.
        extra = recipe_text_fields(text, brief.get("task")).get("recipe") or {}
        if extra:
            said["recipe"] = {**extra, **(said.get("recipe") or {})}
        # "what if weight decay 0.05?", "with a cosine schedule": read for the brief's task.
        said = {**optim_fields(text, brief.get("task")), **said}
    for one, other in (("warmup_ratio", "warmup_steps"), ("warmup_steps", "warmup_ratio")):
        if said.get(one) is not None and brief.get(other) is not None:
            said[other] = None  # the newer warm-up replaces the brief's other spelling of it
    if "recipe" in said and isinstance(brief.get("recipe"), dict):
        # "what if rank 32?" changes the adapters' rank, not the rest of the brief's recipe.
        said["recipe"] = {**brief["recipe"], **said["recipe"]}
    if said.get("task") == "agent-app" and brief.get("model") is not None:
        del said["task"]  # "my assistant" in a follow-up does not drop the model
    spec = SPEC_RE.match(str(brief.get("hardware") or ""))
    if "hardware" not in said and spec:
        # A part named beside the count ("2 nodes of H100") replaces the brief's.
        nodes, per_node, gpu = int(spec[1] or 1), int(spec[2]), reading.gpu or spec[3]
        node_count, gpu_count = _NODE_COUNT_RE.search(text), _GPU_COUNT_RE.search(text)
        if node_count:
            nodes = int(node_count[1])
            if gpu_count:  # "2 nodes of 4 GPUs": the count is per node
                per_node = int(gpu_count[1])
        elif gpu_count:
            total = int(gpu_count[1])
            # "N GPUs" is the total: whole nodes of the brief's size when it divides, else one node.
            nodes, per_node = (
                (total // per_node, per_node)
                if total > per_node and total % per_node == 0
                else (1, total)
            )
        if (nodes, per_node, gpu) != (int(spec[1] or 1), int(spec[2]), spec[3]):
            said["hardware"] = f"{nodes}x{per_node}x{gpu}"
        if node_count or gpu_count:
            unclear = None  # a count of the brief's own GPUs
    if unclear:
        raise InputError("hardware", f"unclear: {unclear}; name the GPUs (e.g. '4 A100 40GB')")
    _newer_wins(said, brief)
    recipe = brief.get("recipe")
    if (
        isinstance(recipe, dict)
        and recipe.get("framework")
        and recipe_contradiction(
            said.get("framework", brief.get("framework")),
            recipe["framework"],
            list(said.get("avoid_frameworks", brief.get("avoid_frameworks")) or []),
        )
    ):
        # The newer word wins: the recipe's framework, priced for the framework the follow-up
        # replaces (or refuses), goes; the follow-up line lists the recipe's change.
        said["recipe"] = {k: v for k, v in recipe.items() if k != "framework"}
    recipe = said.get("recipe", recipe)
    if (
        isinstance(recipe, dict)
        and recipe.get("precision")
        and "precision" in said
        and precision_contradiction(said["precision"], recipe["precision"])
    ):
        # Likewise a precision the follow-up names replaces the recipe's.
        said["recipe"] = {k: v for k, v in recipe.items() if k != "precision"}
    return said
