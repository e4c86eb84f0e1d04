"""A dataset counted in examples of an average length: "2M instruction pairs averaging 600 tokens".

"20k examples avg 800 tokens", "100k conversations with an average of 1.5k tokens", "50k
samples of about 700 tokens on average": the dataset's tokens are count x average length. An
average is no sequence length (examples vary, and packing fills each sequence), so only
``dataset_tokens`` is read; "10M examples of 512 tokens" (a length, not an average) is
tools/intake/numbers_text.py's ``examples_reads``, which also sets the sequence length.
"""

from __future__ import annotations

import re

from tools.intake.readings import Read

_NUM = r"(\d{1,3}(?:,\d{3})+(?!\d|,\d)(?:\.\d+)?|\d+(?:\.\d+)?)"
_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9, "thousand": 1e3, "million": 1e6, "billion": 1e9}
_APPROX = r"(?:about|around|roughly|approximately|approx\.?|~)"
_AVERAGE_RE = re.compile(
    r"(?<![\w.])" + _NUM + r"\s*(k|m|b|thousand|million|billion)?\s+(?:[a-z-]+\s+){0,2}?"
    r"(?:examples?|samples?|sequences?|conversations?|convos?|chats?|dialogues?|documents?|docs?|"
    r"rows|records|pairs|prompts?|sentences?|comparisons?|instructions?|tickets?|threads?)"
    r"\s*,?\s+(?:"
    # "averaging 600 tokens", "avg 800 tokens", "with an average of 1.5k tokens"
    r"(?:each\s+)?(?:averaging|avg\.?|(?:with\s+|at\s+)?an?\s+average(?:\s+length)?\s+of)\s*"
    r"(?:" + _APPROX + r"\s*)?"
    # "~1200 tokens each", "of roughly 900 tokens each": an approximate length is an average
    r"|(?:of\s+|at\s+)?" + _APPROX + r"\s*"
    # "of 700 tokens on average"
    r"|of\s+(?=[\d.,\s]*k?[ -]?tokens?\s+on\s+average)"
    r")" + _NUM + r"\s*(k)?[ -]?tokens?(?:\s+(?:each|on\s+average))?\b",
    re.I,
)


def average_examples_tokens(text: str) -> Read | None:
    """The dataset's tokens when given as examples x their average length, or None."""
    if m := _AVERAGE_RE.search(text):
        count = float(m[1].replace(",", "")) * (_SCALE[m[2].lower()] if m[2] else 1)
        length = float(m[3].replace(",", "")) * (1024 if m[4] else 1)
        if count > 0 and length > 0:
            return Read.of("dataset_tokens", count * length, m)
    return None
