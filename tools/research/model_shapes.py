"""Catalog language models by family and size, and a family's shape at a size it lacks.

A catalog id names a family line and a size: ``llama-3.1-70b`` is line ``llama-3.1`` (family
``llama``, version 3.1) at 70B; an id without a size (``phi-4``) is sized by its published
count. ``models_of_size`` lists the catalog's trainable language models of a size, in the
order trainwright assumes one when a request gives only a size ("a 70B policy") or a size
and a family ("a 1B llama"); ``family_shape`` shapes a family at a size no catalog model has
("a 20B llama"), by the rule in its docstring.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tools.research.architectures import trains_as_causal_lm
from tools.research.model_catalog import load_model_catalog, lookup_model

# The order trainwright takes a family in when a request gives only a size: the open families
# most fine-tunes and papers start from first. Within a family the newest version comes first
# (llama-3.1-70b before llama-3-70b before llama-2-70b). A convention, said as one in the plan.
FAMILY_ORDER = ("llama", "qwen", "mistral", "gemma", "deepseek", "phi", "yi", "falcon", "opt")
# A catalog figure published without a size in its name matches a size within this much.
UNNAMED_SIZE_TOLERANCE = 0.05
_SIZE_IN_ID = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)([bm])(?![a-z0-9])")


@dataclass(frozen=True)
class CatalogLM:
    """A catalog model a causal-LM training job can train, with its family facts."""

    id: str
    family: str  # the id's leading letters: llama, qwen, opt
    line: str  # the id without its size: llama-3.1, qwen2.5, mistral-nemo
    version: tuple[float, ...]  # the line's numbers, newest compares highest
    size: float  # parameters by the size in the id, else the published count
    named_size: bool  # whether the id carries its size ("70b")
    dense: bool  # every parameter runs for every token (no mixture of experts)
    params: int


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", text.lower())


@lru_cache(maxsize=1)
def catalog_lms() -> tuple[CatalogLM, ...]:
    """Every catalog checkpoint that trains as a causal LM (no GPT-3 stand-ins, encoders, images)."""
    found = []
    for model_id, entry in load_model_catalog().items():
        if not entry.get("hf_repo"):
            continue  # a shape built from a paper (gpt3-*): the GPT-size rule reads those
        spec = lookup_model(model_id, 1)
        if not trains_as_causal_lm(spec.hf_config or {}):
            continue
        named = None if re.search(r"\dx\d", model_id) else _SIZE_IN_ID.search(model_id)
        line = model_id[: named.start()].rstrip("-") if named else model_id
        size = (
            float(named[1]) * (1e9 if named[2] == "b" else 1e6)
            if named
            else float(entry["published_params"])
        )
        family = re.match(r"[a-z]+", model_id)
        found.append(
            CatalogLM(
                id=model_id,
                family=family[0] if family else model_id,
                line=line,
                version=tuple(float(n) for n in re.findall(r"\d+(?:\.\d+)?", line)),
                size=size,
                named_size=named is not None,
                dense=spec.active_params == spec.params,
                params=spec.params,
            )
        )
    return tuple(found)


def families() -> tuple[str, ...]:
    """The family words the catalog knows (``llama``, ``qwen``, ``opt``...), longest first."""
    return tuple(sorted({m.family for m in catalog_lms()}, key=lambda f: (-len(f), f)))


def _of_line(model: CatalogLM, family: str, line: str | None) -> bool:
    if model.family != family:
        return False
    return line is None or _squash(model.line).startswith(_squash(line))


def _order(model: CatalogLM, line: str | None) -> tuple[Any, ...]:
    rank = FAMILY_ORDER.index(model.family) if model.family in FAMILY_ORDER else len(FAMILY_ORDER)
    exact = line is not None and _squash(model.line) == _squash(line)
    return (rank, not exact, tuple(-v for v in model.version), model.id)


def _same_size(model: CatalogLM, params: float) -> bool:
    if model.named_size:
        return math.isclose(model.size, params, rel_tol=1e-6)
    return abs(model.size - params) <= UNNAMED_SIZE_TOLERANCE * params


def models_of_size(params: float, family: str | None = None, line: str | None = None) -> list[str]:
    """Catalog models of this size, the one to assume first; only dense ones without a family.

    Args:
        params: The size asked for ("70B" -> 7e10); a model matches when the size in its id
            is that number, or its published count is within 5% (an id without a size).
        family: A family word ("llama"); None for any family (dense models only: "a 30B
            model" is not a 3B-active mixture of experts).
        line: A version within the family ("llama-3", "qwen2.5"), matched as a prefix.
    """
    models = [
        m
        for m in catalog_lms()
        if _same_size(m, params) and (m.dense if family is None else _of_line(m, family, line))
    ]
    return [m.id for m in sorted(models, key=lambda m: _order(m, line))]


def family_template(params: float, family: str, line: str | None = None) -> str | None:
    """The family's dense catalog model nearest in size to ``params`` (log scale), or None."""
    models = [m for m in catalog_lms() if m.dense and _of_line(m, family, line)]
    if not models:
        return None
    return min(models, key=lambda m: (abs(math.log(m.params / params)), _order(m, line))).id


def family_shape(template_id: str, params: float) -> dict[str, Any]:
    """A shape of ``template_id``'s family with about ``params`` parameters (ModelShape fields).

    The rule: the template's width grows by the cube root of the size ratio (heads with it,
    in whole KV groups; the head size, the KV grouping and the FFN's ratio to the width are
    kept; a width set apart from the heads is rounded to 128, the FFN to 256), and the depth
    is whatever brings the count to ``params``, counted on the meta device. Vocabulary,
    activation, norms, positions and embedding tying are the template's (``like``).
    """
    base = lookup_model(template_id, 1)
    config = base.hf_config or {}
    factor = (params / base.params) ** (1 / 3)
    group = max(1, base.heads // max(1, base.kv_heads or base.heads))
    heads = max(group, group * round(base.heads * factor / group))
    if "head_dim" in config:
        hidden = max(128, 128 * round(base.hidden * factor / 128))
    else:
        hidden = heads * (base.hidden // base.heads)
    ffn = (
        max(256, 256 * round(base.intermediate * hidden / base.hidden / 256))
        if base.intermediate
        else None
    )
    shape: dict[str, Any] = {
        "hidden": hidden,
        "heads": heads,
        "kv_heads": heads // group,
        "vocab": base.vocab,
        "intermediate": ffn,
        "like": template_id,
    }
    # Two counts give the parameters per layer and the rest (embeddings, final norm).
    guess = max(1, round(base.layers * (params / base.params) / (hidden / base.hidden) ** 2))
    low = lookup_model({**shape, "layers": guess}, 1).params
    high = lookup_model({**shape, "layers": guess + 1}, 1).params
    per_layer = high - low
    rest = low - guess * per_layer
    shape["layers"] = max(1, round((params - rest) / per_layer))
    return shape
