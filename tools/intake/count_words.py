"""Counts and memory sizes in words, as digits: "a pair of" -> 2, "eighty-gig" -> 80gb, "两台" -> 2 nodes.

The hardware reader (tools/intake/hardware_text.py) matches digits; ``normalise`` rewrites a
request's English and Chinese count words, Chinese units and memory words first.
"""

from __future__ import annotations

import re

from tools.intake.gpu_names import GPU_NAMES as _GPU_NAMES

_WORD_COUNTS = {
    "a single": 1,
    "single": 1,
    "a pair of": 2,
    "pair of": 2,
    "a couple of": 2,
    "a dozen": 12,
    "dozen": 12,
    "an": 1,
    "a": 1,
}
# English number words, read whole: "two hundred fifty six" is 256, not the "six" before the GPU.
_UNITS = {
    w: n
    for n, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen".split()
    )
}
_TENS = {
    w: 10 * n
    for n, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)
}
_NUMBER_WORD = (
    r"(?:"
    + "|".join(sorted([*_UNITS, *_TENS, "hundred", "thousand"], key=len, reverse=True))
    + r")"
)
NUMBER_PHRASE = (
    r"(?:a\s+(?=hundred|thousand))?"
    + _NUMBER_WORD
    + r"(?:[\s-]+(?:and[\s-]+)?"
    + _NUMBER_WORD
    + r"){0,8}"  # bounded: "zero zero ... zero" (no count) must not backtrack quadratically
)
# A count in words, as the request account quotes it (tools/intake/account.py).
COUNT_WORDS = (
    NUMBER_PHRASE
    + "|"
    + "|".join(
        re.escape(w).replace(r"\ ", r"\s+") for w in sorted(_WORD_COUNTS, key=len, reverse=True)
    )
)
_WORDS_RE = re.compile(
    r"\b(" + COUNT_WORDS + r")\b"
    r"(?=\s+(?:\d{1,4}\s*gi?b\s+)?(?:nvidia\s+|amd\s+)?(?:" + _GPU_NAMES + r"|gpus?|nodes?|servers?"
    r"|machines?|dgx|hgx|cards?))",
    re.I,
)


def number_words(words: str) -> int | None:
    """'two hundred and fifty-six' -> 256; None when the words make no one number ('two six')."""
    total, current, last = 0, 0, ""
    for word in re.findall(r"[a-z]+", words.lower()):
        if word == "and":
            continue
        if word == "a":
            current, last = 1, "unit"
        elif word in _UNITS:
            if last == "unit" or (last == "tens" and _UNITS[word] >= 10):
                return None
            current, last = current + _UNITS[word], "unit"
        elif word in _TENS:
            if last in ("unit", "tens") or current % 100:
                return None
            current, last = current + _TENS[word], "tens"
        elif word == "hundred":
            if current >= 100:
                return None
            current, last = (current or 1) * 100, "hundred"
        elif word == "thousand":
            total, current, last = total + (current or 1) * 1000, 0, "thousand"
        else:
            return None
    return total + current


def _count(m: re.Match[str]) -> str:
    said = m.group(1)
    if (key := " ".join(said.lower().split())) in _WORD_COUNTS:
        return str(_WORD_COUNTS[key])
    number = number_words(said)
    return said if number is None else str(number)


_MEM_WORDS = {
    "sixteen": 16,
    "twenty-four": 24,
    "thirty-two": 32,
    "forty": 40,
    "forty-eight": 48,
    "eighty": 80,
    "ninety-four": 94,
}
_MEM_WORDS_RE = re.compile(
    r"\b("
    + "|".join(sorted(_MEM_WORDS, key=len, reverse=True))
    + r")[\s-]*(?:gig(?:abyte)?s?|gb)\b",
    re.I,
)
CN_DIGITS = {
    "一": 1,
    "二": 2,
    "两": 2,
    "俩": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
}
_CN_NUM_RE = re.compile(r"([一二两俩三四五六七八九十]{1,3})(?=\s*(?:台|张|块|卡|个|片|节点))")


def chinese_number(text: str) -> int | None:
    """一 .. 九十九 as a number (十 = 10, 三十 = 30, 十五 = 15, 六十四 = 64); None otherwise."""
    if "十" not in text:
        return CN_DIGITS.get(text)
    tens, _, ones = text.partition("十")
    if len(tens) > 1 or len(ones) > 1 or (tens and tens not in CN_DIGITS):
        return None
    if ones and ones not in CN_DIGITS:
        return None
    return CN_DIGITS.get(tens, 1) * 10 + CN_DIGITS.get(ones, 0)


def normalise(text: str) -> str:
    """Counts as digits and Chinese units as English words, for the patterns below."""
    out = _CN_NUM_RE.sub(lambda m: str(n) if (n := chinese_number(m[1])) else m[0], text)
    out = re.sub(r"(\d+)\s*(?:台|个节点|节点)(?:机器|服务器)?\s*(?:的)?", r" \1 nodes of ", out)
    out = re.sub(r"(\d+)\s*(?:张|块|片|个)\s*(?:卡|显卡|gpu)?", r" \1 ", out, flags=re.I)
    out = re.sub(r"(\d+)\s*(?:卡|显卡)", r" \1 gpus ", out)
    out = re.sub(r"(?<=[\u4e00-\u9fff])|(?=[\u4e00-\u9fff])", " ", out)
    out = re.sub(r"(?<![\d.])(\d{1,6})\s*[x×]\s*(?=[a-z])", r"\1 x ", out, flags=re.I)
    # Memory in words: "eighty-gig", "40 gig", "forty gigabytes".
    out = _MEM_WORDS_RE.sub(lambda m: str(_MEM_WORDS[m.group(1).lower()]) + "gb", out)
    out = re.sub(r"(\d)\s*-?\s*gig(?:abyte)?s?\b", r"\1gb", out, flags=re.I)
    return _WORDS_RE.sub(_count, out)
