"""The goal of a brief after a follow-up: the request as it stands now, not as it was first put.

A chat's follow-up ("what if I only had 4 GPUs?") changes brief fields
(``tools.intake.brief.follow_up_fields``); its words join the goal, so the report, its title
and ``/brief`` say what this plan answers. The goal keeps the first request and the newest
follow-ups within the brief's goal length (older follow-ups give way first).
"""

from __future__ import annotations

import re

from tools.intake.numbers_text import number_reads
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


def wish_words(text: str) -> list[str]:
    """The words of a follow-up that name a wish (fp8, 8-bit Adam, a deadline, a budget).

    A plan reads wishes from a whole request and marks each honoured or refused; a follow-up
    changes the last brief's fields, so the chat names these words instead of saying only
    that nothing changed.
    """
    reads = [r for r in named_wishes(text) if not r.field.startswith("objective:")]
    numbers, _ = number_reads(text, 2048)
    reads += [r for r in numbers if r.field in _WISH_NUMBERS]
    return [r.quote for r in sorted(reads, key=lambda r: r.start)]
