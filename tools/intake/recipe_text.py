"""A request's words that set the brief's recipe: QLoRA, the adapters' rank, activation checkpointing.

"QLoRA" already makes the task ``lora`` (tools/intake/words.py); without this reading the plan
priced and launched plain 16-bit LoRA at the default rank, and "rank 64" was only listed as not
understood. A QLoRA request becomes ``recipe.qlora: true`` (train.py ``--qlora``: the base in
4-bit NF4 through bitsandbytes, Dettmers et al. 2023); an adapter rank ("rank 64", "r=16",
"LoRA rank-8") becomes ``recipe.lora_rank``. Both only for a LoRA task: "rank" in a serving or
pretraining request is left to the not-understood list.

"with gradient checkpointing" / "activation checkpointing" / "recompute" (the wish
``technique:activation-checkpointing``) becomes ``recipe.checkpointing: full``, the policy
Hugging Face's gradient_checkpointing_enable runs, which the plan's search then keeps
(tools/planning/search.py); refused in its clause ("no activation checkpointing") it is
``none``. Before, the plan searched its own policy and left the wish "not checked".

"pure bf16" (no fp32 master copy) and "tf32" become ``recipe.precision`` ``pure-bf16`` and
``tf32``, which the plan then says its launch does not run (tools/intake/recipe_fields.py);
before, "pure bf16" planned mixed bf16 and "tf32" left no trace.
"""

from __future__ import annotations

import re
from typing import Any

from tools.core.schemas import MAX_LORA_RANK, TRAINING_TASKS
from tools.intake.numbers_text import PURE_BF16
from tools.intake.readings import Read
from tools.intake.wishes import named_wishes

# "QLoRA", or a LoRA request's base "in 4-bit" / "4bit" / "NF4" (QLoRA's quantized base).
_QLORA_RE = re.compile(r"\bq-?lora\b|(?<![\w.])4[ -]?bits?\b|\bnf4\b|\bint4\b", re.I)
# "rank 64", "rank-8", "rank=16", "rank: 32", "r=16", "r = 8", "lora r 16" (a bare "r 16" is
# too loose).
_TF32_RE = re.compile(r"\btf32\b", re.I)
_RANK_RE = re.compile(
    r"\brank\s*[-=:]?\s*(\d{1,5})\b|\br\s*=\s*(\d{1,5})\b"
    r"|\blora[ _]r\s*[-=:]?\s*(\d{1,5})\b",  # "lora r 16", "lora_r: 64": "r" after "lora"
    re.I,
)


def recipe_reads(text: str, task: str | None) -> list[Read]:
    """The recipe fields a request's words set, each with its words (field ``recipe.<name>``)."""
    if task not in TRAINING_TASKS:
        return []
    reads: list[Read] = []
    for wish in named_wishes(text):
        if wish.field.endswith(":activation-checkpointing"):
            policy = "none" if wish.field.startswith("avoid:") else "full"
            reads.append(Read("recipe.checkpointing", policy, wish.quote, wish.start, wish.end))
    if m := re.search(PURE_BF16, text, re.I):
        reads.append(Read.of("recipe.precision", "pure-bf16", m))
    elif m := _TF32_RE.search(text):
        reads.append(Read.of("recipe.precision", "tf32", m))
    if task != "lora":
        return reads
    # Every spelling of it, so "QLoRA ..., 4-bit NF4" binds its "4" too (it was not understood).
    reads += [Read.of("recipe.qlora", True, m) for m in _QLORA_RE.finditer(text)]
    if m := _RANK_RE.search(text):
        rank = int(m.group(1) or m.group(2) or m.group(3))
        if 1 <= rank <= MAX_LORA_RANK:
            reads.append(Read.of("recipe.lora_rank", rank, m))
    return reads


def recipe_text_fields(text: str, task: str | None) -> dict[str, Any]:
    """The brief's ``recipe`` block those words give (empty: none)."""
    recipe = {r.field.removeprefix("recipe."): r.value for r in recipe_reads(text, task)}
    return {"recipe": recipe} if recipe else {}
