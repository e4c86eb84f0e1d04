"""The words of a request that set the task, the team and the deployment, and where they stood.

The tables are read in order by the request parser (tools/intake/brief.py ``request_fields``);
``word_reads`` finds, for the values it read, the words they came from (the request's
accounting, tools/intake/account.py).
"""

from __future__ import annotations

import re
from typing import Any

from tools.intake.readings import Read

# Checked in order: training words win over serving words ("serves a model; retrain it").
TASKS = (
    ("lora", r"\b(?:q?lora|adapters?)\b"),
    (
        "pretrain",
        r"\bpre-?train|\btrain(?:ing)?\s+(?:our|its|their|my)\s+own\b|\bfrom scratch\b|"
        r"预训练|从零训练|从头训练",
    ),
    ("finetune", r"\bfine-?tun|\bre-?train|\bcontinue(?:d)? training\b|微调"),
    ("inference", r"\b(?:inference|serv(?:e|es|ing))\b"),
)
# An application built from agents, where nothing is trained.
AGENT_APP = re.compile(
    r"\b(?:agent(?:ic)?\s+app\w*|multi-?agent|assistant|chatbot|copilot)\b", re.I
)
TRAINING = re.compile(
    r"\b(?:pre-?train\w*|fine-?tun\w*|re-?train\w*|train(?:ing)?)\b|训练|微调", re.I
)
TEAM = (
    ("experience", "beginner", r"\b(?:beginners?|novices?|new to|junior|first time)\b"),
    # Not a mixture of experts' experts ("8 experts", "mixture of experts", "expert parallelism").
    (
        "experience",
        "expert",
        r"(?<!of )(?<!\d )\bexperts?\b(?![ -]parallel)|\b(?:experienced|senior|veterans?)\b",
    ),
    ("existing_stack", "tensorflow", r"\b(?:tensorflow|keras|tf\.distribute)\b"),
    ("existing_stack", "pytorch", r"\b(?:pytorch|torch)\b(?![.\s-]*(?:compile|titan|tune))"),
)
DEPLOYMENT = (
    ("mobile", r"\b(?:mobile|on-device|android|ios)\b"),
    ("production-serving", r"\b(?:serv(?:e|es|ing)|production)\b"),
    ("research", r"\b(?:research\w*|prototyp\w*|university|lab|experiment\w*|paper)\b"),
)


def _whole(field: str, value: Any, m: re.Match[str], text: str) -> Read:
    """A reading whose quote runs to the end of its word ("fine-tun" -> "fine-tune")."""
    end = m.end()
    while end < len(text) and (text[end].isalnum() or text[end] == "-") and text[end].isascii():
        end += 1
    return Read(field, value, text[m.start() : end].strip(), m.start(), end)


def word_reads(text: str, fields: dict[str, Any]) -> list[Read]:
    """Where the task, team and deployment values in ``fields`` were read, with their words."""
    reads: list[Read] = []
    task = fields.get("task")
    if task == "agent-app" and (m := AGENT_APP.search(text)):
        reads.append(_whole("task", task, m, text))
    for name, pattern in TASKS:
        if name == task and (m := re.search(pattern, text, re.I)):
            reads.append(_whole("task", task, m, text))
    team = fields.get("team") or {}
    for key, value, pattern in TEAM:
        if team.get(key) == value and (m := re.search(pattern, text, re.I)):
            reads.append(_whole(f"team.{key}", value, m, text))
    for value, pattern in DEPLOYMENT:
        if fields.get("deployment") == value and (m := re.search(pattern, text, re.I)):
            reads.append(_whole("deployment", value, m, text))
    if fields.get("smoke") is False and (
        m := re.search(r"\bno smoke\b|\bwithout (?:a )?smoke\w*", text, re.I)
    ):
        reads.append(Read.of("smoke", False, m))
    return reads
