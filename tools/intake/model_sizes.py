"""Sizes in free text: "a 70B policy", "a 1B llama", "一个 70B 的模型", "a llama with 20B parameters".

A size always reads as a model, never as "names no model", and what was taken is said:

- a size and a family ("a 1B llama", "7B 的 qwen2.5"): the catalog model of that family and
  size (``tools.research.model_shapes.models_of_size``: the newest version first), or, when the
  catalog has none, the family's shape at that size (``family_shape``: its rule is stated);
- a size and a word for a model ("a 70B policy", "a 7B LLM", "70B 模型"): the catalog's
  dense model of that size in trainwright's family order (Llama, Qwen, Mistral, Gemma, ...),
  with the others of that size named; with none of that size, a llama-style shape sized to it.

GPT sizes ("a 1.3B GPT") keep their own rule (``model_text``); a family written before its
size without "of/with" ("llama-3-7b") is a name, read by the close-match rules instead.
"""

from __future__ import annotations

import re
from functools import lru_cache

from tools.intake.readings import ModelReading
from tools.research import model_shapes

_NUMBER = r"(?<![\w.])(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>billion|million|b|m|亿)(?![a-z])"
_PARAMS = r"(?:[\s-]*param(?:eter)?s?|\s*参数)?(?:\s*的)?"
_NOUN = (
    r"(?:(?:dense|base|decoder(?:-only)?|language|chat|instruct)[\s-]+)?"
    r"(?:models?|polic(?:y|ies)|llms?|lms?|networks?|transformers?|checkpoints?|"
    r"大模型|语言模型|模型)(?![a-z])"
)
_VERSION = (
    r"(?:[\s-]?v?(\d+(?:\.\d+)?|two|three|four)(?![\d.]*\s*(?:x|×|gpus?|nodes?|张|台|卡|[a-z]\d)))?"
)
_WORD_VERSIONS = {"two": "2", "three": "3", "four": "4"}
_SCALE = {"b": 1e9, "billion": 1e9, "m": 1e6, "million": 1e6, "亿": 1e8}


@lru_cache(maxsize=1)
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """(size family, family of/with size, size noun), compiled once from the catalog's families."""
    families = "|".join(re.escape(f) for f in model_shapes.families() if f != "gpt")
    family = rf"(?P<family>{families})(?![a-z])" + _VERSION.replace("(\\d", "(?P<version>\\d", 1)
    size_first = re.compile(_NUMBER + _PARAMS + r"\s*" + family, re.I)
    family_first = re.compile(
        r"\b"
        + family
        + r"(?:[\s-]+models?)?\s+(?:of|with|at)\s+(?:about\s+|around\s+|~)?"
        + _NUMBER
        + _PARAMS,
        re.I,
    )
    size_noun = re.compile(_NUMBER + _PARAMS + r"\s*" + _NOUN, re.I)
    return size_first, family_first, size_noun


def _params(number: str, unit: str) -> float:
    return float(number) * _SCALE[unit.lower()]


def _size_label(params: float) -> str:
    return f"{params / 1e9:g}B" if params >= 1e9 else f"{params / 1e6:g}M"


def read_size(text: str) -> ModelReading | None:
    """The model a size in ``text`` stands for (see the module docstring), or None without one."""
    size_first, family_first, size_noun = _patterns()
    for pattern in (size_first, family_first):
        if m := pattern.search(text):
            params = _params(m["num"], m["unit"])
            return _family_reading(m[0].strip(), params, m["family"].lower(), m["version"])
    if m := size_noun.search(text):
        return _generic_reading(m[0].strip(), _params(m["num"], m["unit"]))
    return None


def _line(family: str, version: str | None) -> str | None:
    """The family line a version names ("llama" + "3" -> "llama3"), when the catalog has one."""
    if not version:
        return None
    line = f"{family}{_WORD_VERSIONS.get(version.lower(), version)}"
    known = [m.line for m in model_shapes.catalog_lms() if m.family == family]
    squashed = re.sub(r"[^a-z0-9.]", "", line)
    if any(re.sub(r"[^a-z0-9.]", "", k).startswith(squashed) for k in known):
        return line
    return None


def _family_reading(said: str, params: float, family: str, version: str | None) -> ModelReading:
    line = _line(family, version)
    size = _size_label(params)
    named = (
        f"{family} {_WORD_VERSIONS.get(version.lower(), version)}" if line and version else family
    )
    found = model_shapes.models_of_size(params, family, line)
    if found:
        first, others = found[0], tuple(found[1:])
        why = f"the request names a family and a size ({named}, {size}), not a checkpoint; " + (
            f"the newest {named} of that size is taken; also {size}: {', '.join(others)}"
            if others
            else f"{first} is the catalog's {named} of that size"
        )
        return ModelReading(said, model=first, assumed=why, alternatives=others)
    template = model_shapes.family_template(params, family, line)
    if template is None:  # only mixtures of experts (mixtral): no shape rule, so ask which
        members = [m.id for m in model_shapes.catalog_lms() if m.family == family]
        return ModelReading(said, candidates=tuple(members[:4]))
    shape = model_shapes.family_shape(template, params)
    why = (
        f"no {named} in the catalog is {size}, so a {named} shape of that size: {template}'s "
        f"config with its width scaled by the cube root of the size ratio (heads with it, head "
        f"size, KV grouping and FFN ratio kept) and its depth set to reach {size}: "
        f"{shape['layers']} layers, hidden {shape['hidden']}, {shape['heads']} heads "
        f"({shape['kv_heads']} KV), FFN {shape['intermediate'] or 'as ' + template}, vocab "
        f"{shape['vocab']}"
    )
    return ModelReading(said, shape=shape, assumed=why)


def _generic_reading(said: str, params: float) -> ModelReading:
    size = _size_label(params)
    found = model_shapes.models_of_size(params)
    if found:
        first, others = found[0], tuple(found[1:])
        order = ", ".join(f.capitalize() for f in model_shapes.FAMILY_ORDER[:4])
        why = (
            f"the request gives a size ({size}), not a model; trainwright takes the catalog's "
            f"dense {size} model in its family order ({order}, ...; newest version first)"
            + (f"; also {size}: {', '.join(others)}" if others else "")
        )
        return ModelReading(said, model=first, assumed=why, alternatives=others)
    nearest = sorted(
        {m.id: m.size for m in model_shapes.catalog_lms() if m.dense}.items(),
        key=lambda item: abs(item[1] - params),
    )[:2]
    why = (
        f"the request gives a size ({size}) and no catalog model is {size}, so a llama-style "
        f"shape sized to it (Llama-2's tokenizer, the nearest published depth and width)"
        + (f"; nearest catalog models: {', '.join(i for i, _ in nearest)}" if nearest else "")
    )
    return ModelReading(said, params=params, assumed=why)
