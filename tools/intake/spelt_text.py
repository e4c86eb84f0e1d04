"""Numbers written in words, read as digits and quoted as written: "twenty billion tokens".

The readers match digits, so ``spelt_numbers`` writes each number in words as its digits,
padded with spaces to the words' length: every span a reader finds on the result is a span of
the request, and ``read_as_written`` / ``as_written`` give its quote in the request's own words.
Before, "twenty billion tokens" and "seq len four thousand ninety six" were dropped without a
word: the not-understood list looks at digits alone.
"""

from __future__ import annotations

import re

from tools.intake.count_words import NUMBER_PHRASE, number_words
from tools.intake.readings import Read

# Every number in words but "one" alone (too often no number: "the one we use") and "zero"
# (ZeRO's name): "twenty billion", "four thousand ninety six", "five hundred".
_SPELT_RE = re.compile(r"\b(?!one\b)(?!zero\b)(" + NUMBER_PHRASE + r")\b", re.I)
# The letter k said aloud after a number: "four kay tokens", "a 4 kay context" ("4k").
_KAY_RE = re.compile(r"(?<![\w.])(\d+)(\s+kay)\b", re.I)


def spelt_numbers(text: str) -> str:
    """Numbers in words as digits, padded with spaces to the words' length."""

    def digits(m: re.Match[str]) -> str:
        number = number_words(m[1])
        return m[0] if number is None else str(number).ljust(len(m[0]))

    spelt = _SPELT_RE.sub(digits, text)
    # "4k" spread to the span's length ("4      k"): the readers take spaces before the k.
    return _KAY_RE.sub(lambda m: m[1] + "k".rjust(len(m[0]) - len(m[1])), spelt)


def read_as_written(r: Read, text: str, spelt: str) -> Read:
    """A reading of ``spelt`` (``spelt_numbers(text)``) quoted in ``text``'s own words."""
    if spelt == text or spelt[r.start : r.end].strip() != r.quote.strip():
        return r
    return Read(r.field, r.value, text[r.start : r.end].strip(), r.start, r.end)


def as_written(quote: str, spelt: str, text: str) -> str:
    """A quote of ``spelt`` in the words ``text`` has there ("of 300" -> "of three hundred")."""
    m = re.search(r"\s+".join(re.escape(w) for w in quote.split()), spelt)
    if m is None:
        return quote
    end = m.end()
    while end < len(spelt) and spelt[end] == " ":
        end += 1  # the padding after the last number is its words in ``text``
    return " ".join(text[m.start() : end].split())
