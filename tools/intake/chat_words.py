"""Chat messages after a plan that are not changes to its brief: questions, "undo", nothing.

A follow-up re-plans the last brief with the fields it names (``tools.intake.follow_up``).
Before, a question about the plan went the same way: "explain why not FSDP" re-planned with
FSDP avoided, "why deepspeed?" pinned DeepSpeed and "why 4 nodes?" re-planned on four nodes,
each printed as a follow-up the user never asked for. A question now changes nothing and the
chat says where the plan's reasons are and how to ask for a change (``question_reply``).
"undo that" read as a follow-up that "changes nothing I can read", so the brief kept the
change the user had taken back; ``is_undo`` names it, and the chat returns to the brief
before.
"""

from __future__ import annotations

import re
from typing import Any

from tools.intake.numbers_text import EPOCHS_RE
from tools.intake.wishes import framework_reads

# "why ...", "explain ...", "how come ...", "can you explain ...", "tell me why ...":
# a question about the plan, not a change to it.
_QUESTION_RE = re.compile(
    r"^\s*(?:(?:ok(?:ay)?|so|but|and|hmm+)[,\s]+)?(?:please\s+|can you\s+|could you\s+)?"
    r"(?:why\b|explain\b|how come\b|tell me why\b|what(?:'s| is) the reason\b)",
    re.I,
)
# "undo", "undo that", "go back", "revert that", "never mind", "scratch that".
_UNDO_RE = re.compile(
    r"^\s*(?:undo(?: (?:that|it|the last (?:change|one)))?|go back|revert(?: that| it)?"
    r"|never ?mind|scratch that|take that back)\s*[.!]?\s*$",
    re.I,
)


def is_undo(text: str) -> bool:
    """True when a chat message takes the last change back ("undo that", "go back")."""
    return bool(_UNDO_RE.match(text))


def question_reply(text: str, plan: dict[str, Any] | None) -> str | None:
    """The chat's line for a message that asks about the plan; None when it is no question.

    The chat re-plans briefs, it does not answer questions: the line says so, names where the
    last plan's reasons are written (its report) and how to ask for the change instead.
    """
    if not _QUESTION_RE.match(text):
        return None
    report = ((plan or {}).get("report") or {}).get("markdown")
    where = f"The report ({report})" if report else "The plan's report"
    wanted, avoided = framework_reads(text)
    names = [r.value for r in ([wanted] if wanted else []) + avoided]
    if names:
        name = names[0]
        how = f"to re-plan, say e.g. 'use {name}' or 'no {name}'"
    else:
        how = "to re-plan, say what to change, e.g. 'what if I only had 4 GPUs?'"
    return (
        f"that message asks a question ({text.strip()!r}): the chat changes a plan, it does not "
        f"answer questions, so nothing changed. {where} says why this plan chose its framework, "
        f"strategy and batch; {how}"
    )


# A cloud named without an instance type: the price catalog has no list for it.
_CLOUD_RE = re.compile(r"\b(?:aws|amazon(?: web services)?|ec2|gcp|google cloud|azure)\b", re.I)


def nothing_changed(text: str, brief: dict[str, Any]) -> str:
    """Why a follow-up re-plans nothing: its epochs, cloud or wish words, or what it can change.

    "what about 3 epochs" and "what would it cost on AWS?" said only "changes nothing I can
    read"; each now names its words and the way to ask that the chat reads.
    """
    from tools.intake.follow_up import wish_words

    if epochs := EPOCHS_RE.search(text):
        n = epochs[1] or epochs[2]
        return (
            f"that follow-up names {epochs[0]!r}: epochs are read beside the tokens of one "
            f"epoch, and the brief keeps only its total tokens; say e.g. '{n} epochs over 1B "
            "tokens'"
        )
    if cloud := _CLOUD_RE.search(text):
        return (
            f"that follow-up names {cloud[0]!r}: a plan prices GPU-hours from "
            "knowledge/gpu_prices.yaml, which lists no such cloud; say a rate (e.g. 'at $4 per "
            "GPU-hour') or an instance type (e.g. 'on p5.48xlarge') for its GPUs and network"
        )
    wishes = wish_words(text)
    if wishes:
        named = ", ".join(repr(w) for w in wishes)
        request = f"{brief.get('task')} {brief.get('model')} on {brief.get('hardware')} {text}"
        return (
            f"that follow-up names {named}: a plan reads such wishes from a whole request and "
            "says whether it honours each; a follow-up changes the last brief's fields only. "
            f"Ask it as a request, e.g. {request.strip()!r}"
        )
    return (
        "that follow-up changes nothing I can read (try e.g. 'what if I only had "
        "4 GPUs?', 'with seq len 8192', or a new request naming a model)"
    )
