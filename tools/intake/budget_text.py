"""A request's training budget in words: tokens to train on and the price of a GPU-hour.

"on 20B tokens", "over 1.5 trillion tokens", "$2.50/GPU-hour", "at 2 USD per GPU hour": the
two brief fields the report needs for time to train and cost (``dataset_tokens``,
``price_per_gpu_hour``). Offline and deterministic; what the text does not say stays unset.
"""

from __future__ import annotations

import re
from typing import Any

from tools.intake.numbers_text import batch_reading, seq_reading, tokens_reading
from tools.intake.readings import Read

_GPU_HOUR = r"(?:/|\s*per\s+|\s*an?\s+)\s*gpu[- ]?(?:h|hr|hour)s?\b"
_PRICE_RES = (
    re.compile(r"[$€£]\s*(\d+(?:\.\d+)?)\s*" + _GPU_HOUR, re.I),
    re.compile(r"\b(\d+(?:\.\d+)?)\s*(?:usd|eur|gbp|dollars?|euros?)\s*" + _GPU_HOUR, re.I),
)


def price_reading(text: str) -> Read | None:
    """The price of a GPU-hour the request states ("$2.50/GPU-hour"), with its words, or None."""
    for pattern in _PRICE_RES:
        if m := pattern.search(text):
            return Read.of("price_per_gpu_hour", float(m[1]), m)
    return None


def budget_fields(text: str) -> dict[str, Any]:
    """``dataset_tokens`` and ``price_per_gpu_hour`` as the request states them (maybe neither)."""
    fields: dict[str, Any] = {}
    taken = [(r.start, r.end) for r in (seq_reading(text), batch_reading(text, 2048)[0]) if r]
    if (tokens := tokens_reading(text, taken)) is not None:
        fields["dataset_tokens"] = tokens.value
    if (price := price_reading(text)) is not None:
        fields["price_per_gpu_hour"] = price.value
    return fields
