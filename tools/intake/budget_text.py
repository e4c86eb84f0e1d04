"""A request's training budget in words: tokens to train on and the price of a GPU-hour.

"on 20B tokens", "over 1.5 trillion tokens", "$2.50/GPU-hour", "at 2 USD per GPU hour": the
two brief fields the report needs for time to train and cost (``dataset_tokens``,
``price_per_gpu_hour``). Offline and deterministic; what the text does not say stays unset.
"""

from __future__ import annotations

import re
from typing import Any

_SCALE = {
    "k": 1e3, "thousand": 1e3,
    "m": 1e6, "million": 1e6,
    "b": 1e9, "billion": 1e9,
    "t": 1e12, "trillion": 1e12,
}  # fmt: skip
# Tokens to train on: a count with a scale, after on/over/for/with ("on 20B tokens"): a bare
# "4k tokens" is a context length (tools/intake/brief.py), not a budget.
_TOKENS_RE = re.compile(
    r"\b(?:on|over|for|with|of)\s+(?:about\s+|~\s*)?(\d+(?:\.\d+)?)\s*"
    r"(k|m|b|t|thousand|million|billion|trillion)\s*(?:training\s+)?tokens?\b",
    re.I,
)
_GPU_HOUR = r"(?:/|\s*per\s+|\s*an?\s+)\s*gpu[- ]?(?:h|hr|hour)s?\b"
_PRICE_RES = (
    re.compile(r"[$€£]\s*(\d+(?:\.\d+)?)\s*" + _GPU_HOUR, re.I),
    re.compile(r"\b(\d+(?:\.\d+)?)\s*(?:usd|eur|gbp|dollars?|euros?)\s*" + _GPU_HOUR, re.I),
)


def budget_fields(text: str) -> dict[str, Any]:
    """``dataset_tokens`` and ``price_per_gpu_hour`` as the request states them (maybe neither)."""
    fields: dict[str, Any] = {}
    if m := _TOKENS_RE.search(text):
        fields["dataset_tokens"] = float(m[1]) * _SCALE[m[2].lower()]
    for pattern in _PRICE_RES:
        if m := pattern.search(text):
            fields["price_per_gpu_hour"] = float(m[1])
            break
    return fields
