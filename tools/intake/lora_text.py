"""A request's LoRA words as the brief's recipe: "QLoRA" loads a 4-bit base, "rank 64" sizes the adapters.

"QLoRA" already makes the task ``lora`` (tools/intake/words.py); without this reading the plan
priced and launched plain 16-bit LoRA at the default rank, and "rank 64" was only listed as not
understood. A QLoRA request becomes ``recipe.qlora: true`` (train.py ``--qlora``: the base in
4-bit NF4 through bitsandbytes, Dettmers et al. 2023); an adapter rank ("rank 64", "r=16",
"LoRA rank-8") becomes ``recipe.lora_rank``. Both only for a LoRA task: "rank" in a serving or
pretraining request is left to the not-understood list.
"""

from __future__ import annotations

import re
from typing import Any

from tools.core.schemas import MAX_LORA_RANK
from tools.intake.readings import Read

_QLORA_RE = re.compile(r"\bq-?lora\b", re.I)
# "rank 64", "rank-8", "rank=16", "rank: 32", "r=16", "r = 8" (a bare "r 16" is too loose).
_RANK_RE = re.compile(r"\brank\s*[-=:]?\s*(\d{1,5})\b|\br\s*=\s*(\d{1,5})\b", re.I)


def lora_reads(text: str, task: str | None) -> list[Read]:
    """The recipe fields a LoRA request's words set (``recipe.qlora``, ``recipe.lora_rank``)."""
    if task != "lora":
        return []
    reads: list[Read] = []
    if m := _QLORA_RE.search(text):
        reads.append(Read.of("recipe.qlora", True, m))
    if m := _RANK_RE.search(text):
        rank = int(m.group(1) or m.group(2))
        if 1 <= rank <= MAX_LORA_RANK:
            reads.append(Read.of("recipe.lora_rank", rank, m))
    return reads


def lora_fields(text: str, task: str | None) -> dict[str, Any]:
    """The brief's ``recipe`` block those words give (empty: none)."""
    recipe = {r.field.removeprefix("recipe."): r.value for r in lora_reads(text, task)}
    return {"recipe": recipe} if recipe else {}
