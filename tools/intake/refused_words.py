"""Wishes intake itself refuses, each in one line: nothing a request names is dropped without a word.

A reading here is a wish (``technique:<name>``) whose value is already the line that refuses
it: the plan cannot do it as asked whatever the search finds, so intake marks it refused
(``intake_mark``) and the report's "Not as asked" says it. The unoffered stacks' marks
(tools/intake/wishes.py ``stack_mark``) are given here too, so the accounting asks one place.
"""

from __future__ import annotations

import re
from typing import Any

from tools.intake.numbers_text import EPOCHS_RE
from tools.intake.readings import Read
from tools.intake.sizing_text import CHEAP_RE
from tools.intake.wishes import stack_mark

# The wish ids whose reading's value is the refusal line (tools/intake/parallel_words.py, here).
REFUSED_AT_INTAKE: tuple[str, ...] = ("technique:data-parallel-degree", "technique:optimizer-")
REFUSED_AT_INTAKE += ("technique:epochs", "technique:vocabulary", "technique:spot", "data:named")

# Optimizers other than AdamW, by name: "Adafactor", "SGD with momentum", "Lion", "Sophia".
# (8-bit Adam is the wish technique:8bit-optimizer, refused by the planner with its reason.)
_OPTIMIZERS = {
    "adafactor": ("Adafactor", r"adafactor"),
    "sgd": ("SGD", r"sgd(?:\s+with\s+(?:nesterov\s+)?momentum)?"),
    "lion": ("Lion", r"lion"),
    "sophia": ("Sophia", r"sophia[gh]?"),
    "lamb": ("LAMB", r"lamb"),
    "muon": ("Muon", r"muon"),
    "shampoo": ("Shampoo", r"(?:distributed\s+)?shampoo"),
    "adagrad": ("Adagrad", r"adagrad"),
    "rmsprop": ("RMSprop", r"rmsprop"),
}
# "estimate --optimizer" prices these optimizers' states (tools/planning/recipe.py OPTIMIZERS).
_ESTIMATED = ("adafactor", "sgd")
_OPTIMIZER_RE = re.compile(
    r"\b(?:" + "|".join(f"(?P<{k}>{p})" for k, (_, p) in _OPTIMIZERS.items()) + r")"
    r"(?:\s+optimi[sz]er)?\b",
    re.I,
)
# "no SGD", "instead of Lion": AdamW, which every launch steps, is what the words ask.
_REFUSED_BEFORE = re.compile(r"\b(?:no|not|without|instead\s+of|rather\s+than)\s+$", re.I)


def intake_mark(r: Read) -> tuple[bool, str] | None:
    """How intake marks the wish ``r`` reads (honoured, how), or None: the planner decides."""
    if r.field == "technique:least-cost":
        return True, str(r.value)
    if r.field.startswith(REFUSED_AT_INTAKE):
        return False, str(r.value)
    kind, _, _ = r.field.partition(":")
    return stack_mark(kind, r.value)


# Spot or preemptible capacity: "on spot instances", "preemptible VMs", "spot pricing".
_SPOT_RE = re.compile(
    r"\bspot(?:\s+(?:instances?|vms?|nodes?|capacity|pricing|prices?|gpus?))?\b"
    r"|\bpreemptible(?:\s+(?:instances?|vms?|nodes?|capacity|gpus?))?\b",
    re.I,
)
_SPOT_LINE = (
    "{words} not priced: the plan's costs are on-demand GPU-hour prices (knowledge/gpu_prices.yaml), "
    "and spot capacity costs less and can be taken back mid-run (a rerun resumes from the "
    "last checkpoint the launch saved); give your price as '$X/GPU-hour' to have it used"
)
# Public datasets by name: "the pile", "FineWeb-Edu", "C4", "imagenet-1k". No launch fetches one.
_DATASET_RE = re.compile(
    r"\b(?:the\s+pile|fineweb(?:[\s-]?edu)?|c4|(?:slim)?red[\s-]?pajama(?:[\s-]?v?\d)?|slimpajama|"
    r"openwebtext\d?|wikipedia|wikitext(?:-\d+)?|the\s+stack(?:[\s-]?v\d)?|starcoderdata|dolma|"
    r"imagenet(?:[\s-]?(?:1k|21k|22k))?|laion(?:[\s-]?\d+[bm]|[\s-]aesthetics)?|coco|"
    r"alpaca(?:[\s-]gpt4)?|ultrachat|ultrafeedback|sharegpt|openhermes|slimorca|gsm8k|"
    r"librispeech|common[\s-]voice)\b",
    re.I,
)
_DATASET_LINE = (
    "{words} not fetched: no launch file downloads a dataset; download it and set DATA to its "
    "files (launch.sh says which formats it reads){size}"
)
_NO_SIZE = (
    "; its size in tokens is not known to the plan, which runs its default steps: say 'on 300B "
    "tokens' to have them trained"
)
_LEAST_COST = (
    "planned on the GPUs given: the plan's setup is the fastest that fits them, which on a fixed "
    "GPU count is also the cheapest (cost is GPU-hours x price); leave the count out to have "
    "the cheapest count sized"
)
# "a 128k vocabulary", "vocab size 32000", "vocab_size=50257": a shape model's is read with it.
_VOCAB_RE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?\s*k?[ -]?(?:tokens?[ -])?vocab(?:ulary)?\b"
    r"|\bvocab(?:ulary)?(?:[ _-]?size)?\s*(?:of|=|:|is)?\s*\d+(?:\.\d+)?\s*k?\b",
    re.I,
)


def _optimizer_line(key: str) -> str:
    """The one line refusing the optimizer ``key``: what the plan steps and prices instead."""
    name = _OPTIMIZERS[key][0]
    line = (
        f"{name} not planned: every launch here steps AdamW, and memory is priced for AdamW's "
        "two fp32 moments"
    )
    if key in _ESTIMATED:
        line += f" ('app.py estimate --optimizer {key}' prices {name}'s states)"
    return line


def refused_reads(text: str, fields: dict[str, Any]) -> list[Read]:
    """The wishes intake refuses, read with their words.

    Optimizers other than AdamW; epochs without the data's size in tokens (``fields`` has no
    ``dataset_tokens``); a vocabulary size for a model named, not given by its shape.
    """
    reads: list[Read] = []
    for m in _OPTIMIZER_RE.finditer(text):
        key = next(k for k in _OPTIMIZERS if m.group(k))
        before = text[max(0, m.start() - 20) : m.start()]
        if _REFUSED_BEFORE.search(before) or any(r.field.endswith(key) for r in reads):
            continue
        reads.append(Read.of(f"technique:optimizer-{key}", _optimizer_line(key), m))
    if "dataset_tokens" not in fields and (epochs := EPOCHS_RE.search(text)):
        how = (
            f"{epochs.group(0).strip()} not planned as the run's length: without the data's size in "
            "tokens the plan cannot count epochs, so it gives tokens/s and the cost per billion "
            "tokens; say '3 epochs over 500M tokens' for the total"
        )
        reads.append(Read.of("technique:epochs", how, epochs))
    if (data := _DATASET_RE.search(text)) and "data_path" not in fields:
        size = "" if fields.get("dataset_tokens") or fields.get("train_steps") else _NO_SIZE
        line = _DATASET_LINE.format(words=repr(data[0]), size=size)
        reads.append(Read.of("data:named", line, data))
    if "hardware" in fields and (cheap := CHEAP_RE.search(text)):
        reads.append(Read.of("technique:least-cost", _LEAST_COST, cheap))
    if spot := _SPOT_RE.search(text):
        reads.append(Read.of("technique:spot", _SPOT_LINE.format(words=repr(spot[0])), spot))
    if not isinstance(fields.get("model"), dict) and (vocab := _VOCAB_RE.search(text)):
        how = (
            f"{vocab.group(0).strip()} not applied: the plan sizes the named model's own vocabulary "
            "(its config; the Brief section lists it); give the model by its shape (layers, "
            "hidden, heads, vocab) to plan another"
        )
        reads.append(Read.of("technique:vocabulary", how, vocab))
    return reads
