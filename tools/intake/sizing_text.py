"""A sizing question in words: "how many A100s", "which GPUs", "cheapest ... within 30 days".

``sizing_question`` says whether a request asks what hardware it needs rather than how to lay
out hardware it has, and reads the limits it states: a deadline ("within 30 days", "in 2
weeks", "3天内"), a budget in US dollars ("$5,000", "a budget of $50k", "20000 USD"), one node
("on one node", "single machine", "单机") and a GPU cap ("at most 16 GPUs"). What it cannot
use (a budget in another currency, GPU-hours) is said in ``notes``. The sizing itself is
tools/planning/sizing.py's; the graph runs it (agents/sizing.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tools.intake.count_words import chinese_number
from tools.intake.numbers_text import deadline_reading, money_readings
from tools.intake.readings import Read

# Words that ask what to get, not how to use what one has.
_ASK_RE = re.compile(
    r"\bhow many\b|\bwhich (?:gpus?|gpu types?|hardware|accelerators?|cards?)\b"
    r"|\bwhat (?:gpus?|hardware|cluster|machines?)\b(?:[^.?!]{0,30}\b(?:need|use|rent|get|buy))?"
    r"|\bwhat (?:do|would|should) (?:i|we) need\b|\bwhat (?:i|we) need\b"
    r"|\bcheapest\b|\bleast expensive\b|\blowest (?:possible )?cost\b|\bfastest way\b"
    r"|需要多少|多少张|多少块|多少卡|哪种\s*(?:gpu|显卡|卡)|什么\s*(?:gpu|显卡)|最便宜|最省钱|最快",
    re.I,
)
# A wish for the least cost: a sizing question without a GPU count; with one, a wish the
# plan's fastest setup honours (tools/intake/refused_words.py).
CHEAP_RE = re.compile(
    r"\bas cheap(?:ly)? as possible\b|\bminimi[sz]e (?:the )?(?:cost|spend|price)\b", re.I
)
_ONE_NODE_RE = re.compile(
    r"\b(?:on |in )?(?:one|a single|single|1)[ -](?:node|machine|server|box)\b(?: only)?"
    r"|\bone node only\b|单机|单节点|一台(?:机器|服务器)",
    re.I,
)
_MAX_GPUS_RE = re.compile(
    r"\b(?:at most|up to|no more than|max(?:imum)?(?: of)?)\s+(\d{1,4})\s*(?:gpus?|cards?)\b"
    r"|最多\s*(\d{1,4})\s*(?:张|块)",
    re.I,
)
_DURATION_RE = re.compile(
    r"(\d+(?:\.\d+)?|[一二两三四五六七八九十]+)\s*"
    r"(hours?|hrs?|days?|weeks?|months?|小时|天|周|星期|个月)",
    re.I,
)
_UNIT_S = {"hour": 3600.0, "hr": 3600.0, "day": 86_400.0, "week": 604_800.0, "month": 2_592_000.0}
_UNIT_S |= {"小时": 3600.0, "天": 86_400.0, "周": 604_800.0, "星期": 604_800.0, "个月": 2_592_000.0}
_USD_RE = re.compile(
    r"^(?:\$\s*([\d,]+(?:\.\d+)?)\s*(k|m|thousand|million)?"
    r"|([\d,]+(?:\.\d+)?)\s*(k|m)?\s*(?:usd|dollars?|美元))$",
    re.I,
)
_SCALE = {"k": 1e3, "thousand": 1e3, "m": 1e6, "million": 1e6}


@dataclass
class SizingAsk:
    """What a sizing question asks, with the words each part came from."""

    words: str  # the words that ask ("how many", "cheapest", "within 30 days")
    deadline_s: float | None = None
    deadline_words: str | None = None
    budget_usd: float | None = None
    budget_words: str | None = None
    one_node: bool = False
    max_gpus: int | None = None
    reads: list[Read] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def deadline_seconds(words: str) -> float | None:
    """Seconds a deadline's words give ("within 30 days" -> 2,592,000), None if no duration."""
    words = re.sub(r"\ban?(?=\s+(?:hours?|hrs?|days?|weeks?|months?)\b)", "1", words, flags=re.I)
    m = _DURATION_RE.search(words)
    if m is None:
        return None
    count = float(m[1]) if m[1][0].isdigit() else float(chinese_number(m[1]) or 0)
    unit = m[2].lower()
    key = next((k for k in _UNIT_S if unit.startswith(k)), None)
    return count * _UNIT_S[key] if key and count > 0 else None


def budget_dollars(words: str) -> float | None:
    """US dollars a budget's words give ("$50k" -> 50,000), None in another currency."""
    m = _USD_RE.match(words.strip())
    if m is None:
        return None
    number, scale = (m[1], m[2]) if m[1] else (m[3], m[4])
    value = float(number.replace(",", "")) * _SCALE.get((scale or "").lower(), 1.0)
    return value if value > 0 else None


def sizing_question(text: str, count_given: bool) -> SizingAsk | None:
    """The sizing question ``text`` asks, or None.

    ``count_given``: the request states how many GPUs it has; then only asking words make it a
    sizing question, while a deadline or budget alone is a wish about the plan on that hardware.
    """
    asked = _ASK_RE.search(text) or (None if count_given else CHEAP_RE.search(text))
    deadline = deadline_reading(text)
    money = [r for r in money_readings(text) if r.field == "money-budget"]
    # A day ("by Friday") gives the sizing no duration: alone it asks no sizing question.
    timed = deadline is not None and deadline_seconds(str(deadline.value)) is not None
    if asked is None and (count_given or (not timed and not money)):
        return None
    first = asked or deadline or (money[0] if money else None)
    assert first is not None
    words = first.group(0) if isinstance(first, re.Match) else first.quote
    ask = SizingAsk(words=words)
    if asked is not None:
        ask.reads.append(Read.of("sizing", words, asked))
    if deadline is not None:
        ask.deadline_words = str(deadline.value)
        ask.deadline_s = deadline_seconds(ask.deadline_words)
        if ask.deadline_s is None:
            ask.notes.append(f"deadline {ask.deadline_words!r}: no duration read, not used")
    for read in money:
        dollars = budget_dollars(str(read.value))
        if dollars is None:
            ask.notes.append(
                f"budget {read.value!r}: not in US dollars (the price table's currency), "
                "not converted and not used"
            )
        elif ask.budget_usd is None:
            ask.budget_usd, ask.budget_words = dollars, str(read.value)
    if m := _ONE_NODE_RE.search(text):
        ask.one_node = True
        ask.reads.append(Read.of("sizing", "one node", m))
    if m := _MAX_GPUS_RE.search(text):
        ask.max_gpus = int(m[1] or m[2])
        ask.reads.append(Read.of("sizing", f"at most {ask.max_gpus} GPUs", m))
    return ask
