"""A brief file's ``goal`` is its title, not its settings: words there that ask are said.

Before, a brief whose goal read "pretrain in JAX with seq 8192" and whose fields said neither
was planned on the fields alone (DeepSpeed, sequence 2048) without a word. The goal text stays
the plan's title (a brief's fields are its settings: merging free text into them would let
two sources disagree), and "I assumed" now says which of its words were not applied. What
the goal is read for stays so: a framework it names is scored (tools/research/framework.py),
and on the default hardware a sizing question and its limits are answered (agents/intake.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tools.core.request_account import AssumedFact
from tools.core.schemas import TrainingBrief
from tools.intake.numbers_text import number_reads
from tools.intake.readings import Read
from tools.intake.refused_words import refused_reads
from tools.intake.wishes import framework_reads, named_wishes, pin_reads

_SIZING_LIMITS = ("deadline", "money-budget", "compute-budget")
# How the chat joins a request and its follow-ups into one goal (tools/intake/follow_up.py).
_CHAT_SEPARATOR = "; then: "
# At most this many of the goal's words are quoted in the line.
_MAX_QUOTES = 6


def _applied(r: Read, brief: dict[str, Any], stated: set[str]) -> bool:
    """Whether the brief already does what the goal's reading ``r`` says."""
    kind, _, name = r.field.partition(":")
    if kind == "framework":
        return brief.get("framework") == name
    if kind == "avoid" and name in (brief.get("avoid_frameworks") or []):
        return True  # "no deepspeed": the avoid list carries it
    if kind == "objective":  # SFT and continued pretraining are what fine-tune and pretrain run
        return brief.get("objective") == name or name in ("sft", "continued-pretraining")
    key = r.field.split(".", 1)[0]
    if key == "pins":
        return "pins" in stated and brief["pins"].get(r.field.split(".", 1)[1]) == r.value
    return key in stated and brief.get(key) == r.value


def _group(r: Read) -> str:
    """The setting a reading sets: one framework, one value per field."""
    return "framework" if r.field.startswith("framework:") else r.field


def _newest(reads: list[Read]) -> list[Read]:
    """Each setting's last reading: in a chat goal a later follow-up replaced the earlier words.

    "1B tokens; then: now for 500B tokens" is 500B tokens; the follow-up line said so.
    """
    ordered = sorted(reads, key=lambda r: r.start)
    last = {_group(r): r for r in ordered}
    # "no deepspeed; then: use deepspeed": the newer word about one framework wins.
    named = {r.field.partition(":")[2]: r for r in ordered if _framework_word(r)}
    return [
        r
        for r in reads
        if last[_group(r)] is r
        and (not _framework_word(r) or named[r.field.partition(":")[2]] is r)
    ]


def _wanted(part: str, chat: bool) -> list[Read]:
    """A chat message's framework ("use deepspeed"): it replaces an earlier "no deepspeed"."""
    wanted = framework_reads(part)[0] if chat else None
    return [wanted] if wanted is not None else []


def _framework_word(r: Read) -> bool:
    return r.field.partition(":")[0] in ("framework", "avoid")


def _goal_reads(
    goal: str, brief: TrainingBrief, dumped: dict[str, Any], stated: set[str]
) -> list[Read]:
    """The settings ``goal``'s words ask for: numbers, pins, framework wishes, refused words."""
    # A framework named in the goal is read: the framework choice scores it (research/framework.py).
    _, avoided = framework_reads(goal)
    reads = number_reads(goal, brief.seq_len)[0] + pin_reads(goal) + avoided
    if brief.hardware == "local":  # the sizing question reads the goal's limits (agents/intake.py)
        reads = [r for r in reads if r.field not in _SIZING_LIMITS]
    return reads + named_wishes(goal) + refused_reads(goal, {k: dumped.get(k) for k in stated})


def goal_assumed(brief: TrainingBrief, stated: set[str]) -> list[AssumedFact]:
    """The line naming the goal's words a brief file's fields do not carry (none: no line)."""
    goal = brief.goal
    if not goal:
        return []
    dumped = brief.model_dump(mode="json")
    chat = _CHAT_SEPARATOR in goal
    reads: list[Read] = []
    at = 0
    # A chat's goal is read part by part (each part is one message), each setting's last word wins.
    for part in goal.split(_CHAT_SEPARATOR) if chat else [goal]:
        reads += [
            replace(r, start=r.start + at, end=r.end + at)
            for r in _goal_reads(part, brief, dumped, stated) + _wanted(part, chat)
        ]
        at += len(part) + len(_CHAT_SEPARATOR)
    if chat:
        reads = _newest(reads)
    quotes = list(
        dict.fromkeys(
            r.quote for r in sorted(reads, key=lambda r: r.start) if not _applied(r, dumped, stated)
        )
    )
    if not quotes:
        return []
    shown = ", ".join(repr(q) for q in quotes[:_MAX_QUOTES])
    if chat:  # a chat's goal is its request and follow-ups: no brief file was given
        why = (
            f"a follow-up changes the brief's fields only, so {shown} in the chat's goal "
            "change nothing; ask them as a request naming the model"
        )
        return [AssumedFact(field="goal", value="not read for settings", why=why)]
    return [
        AssumedFact(
            field="goal",
            value="not read for settings",
            why=(
                f"a brief file's fields are its settings, so {shown} in its goal change "
                "nothing; state them as fields (the README lists the brief format) or give "
                'the goal as a request (plan "...")'
            ),
        )
    ]
