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
    "one": 1,
    "a pair of": 2,
    "pair of": 2,
    "a couple of": 2,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "twelve": 12,
    "a dozen": 12,
    "dozen": 12,
    "sixteen": 16,
    "twenty-four": 24,
    "thirty-two": 32,
    "sixty-four": 64,
    "a hundred": 100,
    "an": 1,
    "a": 1,
}
_WORDS_RE = re.compile(
    r"\b(" + "|".join(sorted((re.escape(w) for w in _WORD_COUNTS), key=len, reverse=True)) + r")\b"
    r"(?=\s+(?:\d{1,4}\s*gi?b\s+)?(?:nvidia\s+|amd\s+)?(?:" + _GPU_NAMES + r"|gpus?|nodes?|servers?"
    r"|machines?|dgx|hgx|cards?))",
    re.I,
)
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
    return _WORDS_RE.sub(lambda m: str(_WORD_COUNTS[m.group(1).lower()]), out)
