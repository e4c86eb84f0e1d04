"""A run's own settings in a request: its seed, its Weights & Biases logging, its data, LoRA alpha.

"seed 1234" used to be listed as not understood, and "log to wandb" or "dataset at
/data/sft/train.jsonl" (no number in them) were dropped without a word, though train.py takes
``--seed``, ``--wandb PROJECT`` and ``--data PATH``. Each is now a brief field with its words:
``seed``, ``wandb_project`` (the project named, else ``trainwright``, and the plan says so) and
``data_path``, and a LoRA job's ``lora_alpha`` ("alpha 32" was not understood); the launch
passes them, and says in one line where a launch cannot.
"""

from __future__ import annotations

import re
from typing import Any

from tools.intake.readings import Read

# The project a "log to wandb" with no name logs to (train.py's --wandb needs one).
DEFAULT_WANDB_PROJECT = "trainwright"
_SEED_RE = re.compile(
    r"\b(?:random\s+)?seed(?:\s+(?:of|to|=)|\s*[=:])?\s*(\d{1,10})\b|\bseeded\s+(?:with\s+)?(\d{1,10})\b",
    re.I,
)
_WANDB = r"(?:wandb|w&b|w\s*and\s*b|weights\s*(?:&|and)\s*biases)"


def _project(group: str) -> str:
    """An optional project name after the W&B words ("project dpo-runs"), as ``group``."""
    return (
        r"(?:\s+(?:to\s+)?(?:the\s+)?(?:project|proj\.?)\s*[=:]?\s*[\"'`]?"
        rf"(?P<{group}>[A-Za-z0-9][\w.-]{{0,127}}))?"
    )


_WANDB_RE = re.compile(
    r"(?:\b(?:log(?:ging|s|ged)?|track(?:ing|ed)?|report(?:ing)?)\s+(?:\w+\s+){0,2}?"
    r"(?:to|in|with|on|into|via)\s+(?:the\s+)?" + _WANDB + r"\b" + _project("p1")
    + r"|\b" + _WANDB + r"\s+(?:logging|tracking)\b" + _project("p2")
    + r"|\b" + _WANDB + r"\s+project\s*[=:]?\s*[\"'`]?(?P<p3>[A-Za-z0-9][\w.-]{0,127})"
    + r"|\b(?:with|use|using|via)\s+" + _WANDB + r"\b" + _project("p4") + ")",
    re.I,
)  # fmt: skip
# "dataset at /data/sft/train.jsonl", "data in ~/corpus", "data: s3-mounted/train.parquet",
# "fine-tune llama-3-8b on /mnt/data/chat.jsonl": an absolute or home path, or a file with a data
# extension.
_PATH = (
    r"(?:(?:/|~/|\./)[\w./~+@:=-]*[\w/]|[\w.-]+/[\w./+@:=-]*\.(?:jsonl|json|txt|parquet|arrow|csv))"
)
_DATA_RE = re.compile(
    r"(?<![/~.-])\b(?:data(?:set)?|corpus|training\s+data|train(?:ing)?\s+file)s?\s*(?:is\s+|lives\s+|sits\s+)?"
    r"(?:at|in|from|under|on|=|:)?\s*[\"'`]?(?P<path>" + _PATH + ")"
    + r"|\b(?:on|from|using|with)\s+[\"'`]?(?P<path2>" + _PATH + ")",
    re.I,
)  # fmt: skip


# A LoRA alpha: "alpha 32", "lora_alpha=16", "LoRA alpha of 64", "alpha: 8".
_ALPHA_RE = re.compile(r"\b(?:lora[ _-]?)?alpha\s*(?:of|=|:)?\s*(\d{1,6}(?:\.\d+)?)(?![\w.])", re.I)


def run_reads(text: str) -> list[Read]:
    """The run settings a request names, each with its words (fields seed, wandb_project, data_path)."""
    reads: list[Read] = []
    if m := _SEED_RE.search(text):
        reads.append(Read.of("seed", int(m.group(1) or m.group(2)), m))
    if m := _ALPHA_RE.search(text):
        reads.append(Read.of("lora_alpha", float(m.group(1)), m))
    if m := _WANDB_RE.search(text):
        project = next((p for p in m.group("p1", "p2", "p3", "p4") if p), DEFAULT_WANDB_PROJECT)
        reads.append(Read.of("wandb_project", project.rstrip("."), m))
    if m := _DATA_RE.search(text):
        if m.group("path"):  # "dataset at /data/train.jsonl"
            reads.append(Read("data_path", m.group("path"), m.group(0).strip(), *m.span()))
        else:  # "... on /data/chat.jsonl": the path alone
            reads.append(Read("data_path", m.group("path2"), m.group("path2"), *m.span("path2")))
    return reads


def run_fields(text: str) -> dict[str, Any]:
    """The brief fields the run settings set."""
    return {r.field: r.value for r in run_reads(text)}
