"""Wishes intake itself refuses, each in one line (STYLE.md entry 25: nothing silent).

A reading here is a wish (``technique:<name>``) whose value is already the line that refuses
it: the plan cannot do it as asked whatever the search finds, so intake marks it refused
(``intake_mark``) and the report's "Not as asked" says it. The unoffered stacks' marks
(tools/intake/wishes.py ``stack_mark``) are given here too, so the accounting asks one place.
"""

from __future__ import annotations

from tools.intake.readings import Read
from tools.intake.wishes import stack_mark

# The wish ids whose reading's value is the refusal line (tools/intake/parallel_words.py, here).
REFUSED_AT_INTAKE = ("technique:data-parallel-degree",)


def intake_mark(r: Read) -> tuple[bool, str] | None:
    """How intake marks the wish ``r`` reads (honoured, how), or None: the planner decides."""
    if r.field.startswith(REFUSED_AT_INTAKE):
        return False, str(r.value)
    kind, _, _ = r.field.partition(":")
    return stack_mark(kind, r.value)
