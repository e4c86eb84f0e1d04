"""A model given by its dimensions in a request: its layers, hidden size and heads are the shape.

"a custom 1B model with 24 layers, hidden 2048, 16 heads, vocab 32000" is the brief's
``model: {layers: 24, hidden: 2048, heads: 16, vocab: 32000}``. Before, the dimensions were listed as not understood and the plan trained the catalog's 1B model
(llama-3.2-1b: 16 layers, a 128K vocabulary) that "1B" stood for: another model. The layers,
the hidden size and the heads make a shape; the vocabulary, the KV heads and the MLP width are
read when stated, the vocabulary otherwise taken as 32,000 (the Llama 2 tokenizer's) and said.
A catalog model named beside the dimensions ("llama-3.2-1b with 24 layers") is the shape's
``like``: its config gives everything but the sizes.
"""

from __future__ import annotations

import re
from typing import Any

from tools.intake.readings import Read

DEFAULT_VOCAB = 32000
_N = r"(\d{1,6}(?:,\d{3})*)"
# Each dimension, the number after its name or before it: "hidden 2048", "2048 hidden".
_DIMS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (key, re.compile(pattern, re.I))
    for key, pattern in (
        (
            "kv_heads",
            r"\b" + _N + r"\s*(?:kv|key[ -]value)[ -]heads?\b"
            r"|\b(?:kv[ _-]heads?|num_key_value_heads|key[ -]value[ -]heads?)\s*[=:]?\s*" + _N,
        ),
        ("layers", r"\b" + _N + r"\s*(?:transformer\s+)?(?:layers|blocks)\b"
         r"|\b(?:layers|n_layers?|num_(?:hidden_)?layers|depth)\s*[=:]?\s*" + _N + r"\b"),
        (
            "hidden",
            r"\b(?:hidden(?:[ _]size|[ _]dim(?:ension)?)?|d_model|model[ _]dim(?:ension)?|width|"
            r"embedding[ _]dim(?:ension)?)\s*(?:of\s+)?[=:]?\s*" + _N + r"\b"
            r"|\b" + _N + r"\s*hidden\b",
        ),
        (
            "heads",
            r"\b" + _N + r"\s*(?:attention\s+)?heads\b"
            r"|\b(?:n_heads?|num_attention_heads|heads)\s*[=:]?\s*" + _N + r"\b",
        ),
        (
            "vocab",
            r"\bvocab(?:ulary)?(?:[ _]size)?\s*(?:of\s+)?[=:]?\s*" + _N + r"\b"
            r"|\b" + _N + r"[ -](?:token\s+)?vocab(?:ulary)?\b",
        ),
        (
            "intermediate",
            r"\b(?:ffn|mlp|intermediate)(?:[ _](?:size|dim(?:ension)?|hidden))?\s*(?:of\s+)?[=:]?\s*"
            + _N + r"\b",
        ),
    )
)  # fmt: skip


def shape_reads(text: str) -> list[Read]:
    """Each model dimension the text states, with its words (field ``model.<dim>``)."""
    reads: list[Read] = []
    taken: list[tuple[int, int]] = []
    for key, pattern in _DIMS:
        for m in pattern.finditer(text):
            if any(a < m.end() and m.start() < b for a, b in taken):
                continue  # "8 kv heads" is no "8 heads"
            number = next(g for g in m.groups() if g is not None)
            reads.append(Read.of(f"model.{key}", int(number.replace(",", "")), m))
            taken.append(m.span())
            break
    return reads


def shape_model(text: str, like: str | None) -> tuple[dict[str, Any], list[str]] | None:
    """The brief's model from the stated dimensions, and a line per default it took; None if too few.

    Layers, hidden size and heads must all be stated: fewer is no shape, and the request's model
    name or size stands.
    """
    dims = {r.field.split(".", 1)[1]: r.value for r in shape_reads(text)}
    if not {"layers", "hidden", "heads"} <= dims.keys():
        return None
    notes: list[str] = []
    if "vocab" not in dims:
        dims["vocab"] = DEFAULT_VOCAB
        notes.append(
            f"vocabulary {DEFAULT_VOCAB:,} assumed (the Llama 2 tokenizer's): the request gives "
            "the model's layers, hidden size and heads but not its vocabulary"
        )
    if like is not None:
        dims["like"] = like
    return dims, notes
