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
from tools.research.model_catalog import lookup_model

DEFAULT_VOCAB = 32000
DEFAULT_SEQ = 1  # any length the model has: only its widths are read
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
        ("layers", r"\b" + _N + r"(?:\s*(?:transformer\s+)?(?:layers?|blocks?)|-(?:layer|block))\b"
         r"|\b(?:layers|n_layers?|num_(?:hidden_)?layers|depth)\s*[=:]?\s*" + _N + r"\b"),
        (
            "hidden",
            r"\b(?:hidden(?:[ _]size|[ _]dim(?:ension)?)?|d_model|model[ _]dim(?:ension)?|width|"
            r"embedding[ _]dim(?:ension)?)\s*(?:of\s+)?[=:]?\s*" + _N + r"\b"
            r"|\b" + _N + r"(?:\s*|-)(?:hidden|wide)\b",
        ),
        (
            "heads",
            r"\b" + _N + r"(?:\s*(?:attention\s+)?heads|-head)\b"
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


def shape_model(
    text: str, like: str | None, family: tuple[str, tuple[str, ...]] | None = None
) -> tuple[dict[str, Any], list[str]] | None:
    """The brief's model from the stated dimensions, and a line per default it took; None if too few.

    Layers, hidden size and heads must all be stated: fewer is no shape, and the request's model
    name or size stands. ``family`` is a family word read without a member ("a 2-layer
    128-hidden llama": ``("llama", (llama-2-7b, ...))``): that family built at the shape, on its
    first member's config, with heads as wide as that member's when none are stated.
    """
    dims = {r.field.split(".", 1)[1]: r.value for r in shape_reads(text)}
    if not ({"layers", "hidden"} if family else {"layers", "hidden", "heads"}) <= dims.keys():
        return None
    notes: list[str] = []
    if like is None and family is not None:
        word, ids = family
        like = ids[0]
        notes.append(
            f"{word!r} with a shape: the {word} family built at that shape, its activation, "
            f"norms, positions and embedding tying those of {like} (the family's first in the "
            "catalog)"
        )
        spec = lookup_model(like, DEFAULT_SEQ)
        if "intermediate" not in dims and spec.intermediate:
            # The family's MLP ratio at this width, not the member's own width (11008 on 128).
            dims["intermediate"] = max(
                8, round(spec.intermediate / spec.hidden * dims["hidden"] / 8) * 8
            )
            notes.append(
                f"MLP width {dims['intermediate']} assumed: {like}'s ratio "
                f"({spec.intermediate} / {spec.hidden}) at hidden {dims['hidden']}"
            )
        if "vocab" not in dims:
            dims["vocab"] = spec.vocab
            notes.append(f"vocabulary {spec.vocab:,} assumed: {like}'s tokenizer, the family's")
        if "heads" not in dims:
            width = _head_width(like)
            while dims["hidden"] % width:
                width //= 2
            dims["heads"] = dims["hidden"] // width
            notes.append(
                f"{dims['heads']} attention head(s) assumed: the request gives none, and {like}'s "
                f"heads are {_head_width(like)} wide (hidden {dims['hidden']} / {width})"
            )
    if "vocab" not in dims:
        dims["vocab"] = DEFAULT_VOCAB
        notes.append(
            f"vocabulary {DEFAULT_VOCAB:,} assumed (the Llama 2 tokenizer's): the request gives "
            "the model's shape but not its vocabulary"
        )
    if like is not None:
        dims["like"] = like
    return dims, notes


def _head_width(model_id: str) -> int:
    """How wide a catalog model's attention heads are (its head_dim, else hidden / heads)."""
    spec = lookup_model(model_id, DEFAULT_SEQ)
    return int((spec.hf_config or {}).get("head_dim") or spec.hidden // spec.heads)
