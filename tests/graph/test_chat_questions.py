"""Chat messages that are not changes: a question re-plans nothing, "undo" returns to the plan before.

Before, "why 4 nodes?" re-planned on four nodes, "why deepspeed?" pinned DeepSpeed and "explain
why not FSDP" avoided FSDP, each printed as a follow-up nobody asked for; "undo that" said "that
follow-up changes nothing I can read" and the brief kept the change taken back.
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from graphs.chat import ChatSession
from tools.core.settings import Settings

BRIEF = {"model": "llama-3-8b", "hardware": "1x8xH100-80GB", "task": "lora", "seq_len": 2048}


def _plan(name: str) -> dict[str, Any]:
    return {"report": {"markdown": f"out/{name}/report.md"}}


def _session(settings: Settings) -> tuple[ChatSession, io.StringIO]:
    out = io.StringIO()
    chat = ChatSession(settings, out=out, err=io.StringIO())
    chat._take({"brief": dict(BRIEF), "plan": _plan("plan-1")})
    return chat, out


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("why 4 nodes?", "what if I only had 4 GPUs"),
        ("why deepspeed?", "'use deepspeed' or 'no deepspeed'"),
        ("explain why not FSDP", "'use pytorch_fsdp' or 'no pytorch_fsdp'"),
        ("why zero3 and not zero2", "say what to change"),
        ("ok, can you explain the micro-batch?", "say what to change"),
    ],
)
def test_a_question_changes_nothing_and_says_where_the_reasons_are(
    settings: Settings, text: str, hint: str
) -> None:
    chat, out = _session(settings)
    chat.request(text)  # no graph opened: a re-plan would fail here
    said = out.getvalue()
    assert chat.brief == BRIEF
    assert "follow-up:" not in said
    assert "asks a question" in said and "nothing changed" in said
    assert "out/plan-1/report.md" in said and hint in said


def test_a_follow_up_that_is_no_question_still_changes_the_brief() -> None:
    from tools.intake.chat_words import question_reply

    assert question_reply("what if I only had 4 GPUs?", _plan("p")) is None
    assert question_reply("use fsdp", _plan("p")) is None


@pytest.mark.parametrize("text", ["undo that", "undo", "go back", "never mind"])
def test_undo_returns_to_the_brief_and_plan_before(settings: Settings, text: str) -> None:
    chat, out = _session(settings)
    changed = {**BRIEF, "avoid_frameworks": ["pytorch_fsdp"]}
    chat._take({"brief": changed, "plan": _plan("plan-2")})
    assert chat.brief == changed
    chat.request(text)
    assert chat.brief == BRIEF and chat.plan == _plan("plan-1")
    assert "undone" in out.getvalue() and "out/plan-1/report.md" in out.getvalue()
    chat.request(text)  # nothing earlier than the first plan: said, not silent
    assert "nothing to undo" in out.getvalue() and chat.brief == BRIEF
