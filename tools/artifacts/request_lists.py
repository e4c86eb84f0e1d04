"""The three short lists a plan opens with: what you asked, what I assumed, what I could not do.

One source for the report (Markdown, right under the headline) and for chat (plain lines after
each plan), both from the plan's ``request`` section (tools/core/request_account.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tools.core.request_account import RequestAccount

# At most this many entries per list in chat (the report lists them all).
CHAT_MAX_ITEMS = 8


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "chosen by the planner"
    return json.dumps(value, separators=(", ", ": "))


def request_lists(account: RequestAccount) -> dict[str, list[str]]:
    """The three lists as plain sentences: ``asked``, ``assumed``, ``could_not``."""
    asked = [f"{r.field}: {_value(r.value)} (from {r.quote!r})" for r in account.read]
    asked += [f"{w.wish} (from {w.quote!r}): {w.how}" for w in account.wishes if w.honoured is True]
    assumed = [f"{a.field}: {_value(a.value)}: {a.why}" for a in account.assumed]
    could_not = [
        f"{w.wish} (from {w.quote!r}): {'refused' if w.honoured is False else 'open'}: {w.how}"
        for w in account.wishes
        if w.honoured is not True
    ]
    could_not += [f"not understood: {q!r}" for q in account.not_understood]
    return {"asked": asked, "assumed": assumed, "could_not": could_not}


def report_request_section(account: RequestAccount, md_text: Callable[[object], str]) -> list[str]:
    """The report's opening lists (Markdown), empty for a plan without a request section.

    ``md_text`` is the report's own escaping (tools/artifacts/report.py): every item is text
    from the request, inert in Markdown and HTML.
    """
    if not (account.read or account.assumed or account.wishes or account.not_understood):
        return []
    lists = request_lists(account)
    titles = (
        ("asked", "What you asked"),
        ("assumed", "What I assumed"),
        ("could_not", "What I could not do or did not understand"),
    )
    lines: list[str] = []
    for key, title in titles:
        items = lists[key] or ["nothing"]
        lines += [f"**{title}:**", "", *[f"- {md_text(item)}" for item in items], ""]
    return lines


def chat_request_lines(plan: dict[str, Any]) -> list[str]:
    """The three lists for chat after a plan: a few entries each, the count of the rest."""
    account = RequestAccount.model_validate(plan.get("request") or {})
    if not (account.read or account.assumed or account.wishes or account.not_understood):
        return []
    lists = request_lists(account)
    out: list[str] = []
    for key, title in (
        ("asked", "you asked"),
        ("assumed", "I assumed"),
        ("could_not", "I could not do / did not understand"),
    ):
        items = lists[key]
        if not items:
            out.append(f"{title}: nothing")
            continue
        out.append(f"{title}:")
        out += [f"  - {' '.join(i.split())[:200]}" for i in items[:CHAT_MAX_ITEMS]]
        if len(items) > CHAT_MAX_ITEMS:
            out.append(f"  ... and {len(items) - CHAT_MAX_ITEMS} more in the report")
    return out
