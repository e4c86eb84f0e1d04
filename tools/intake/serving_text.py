"""Read a serving request from free text: task inference, context, concurrency, engine, dtype.

"serve qwen2.5-72b for inference on 4 H100", "deploy llama-3-8b with TGI for 64 concurrent
users, 32k context", "用 vLLM 部署 Qwen2.5-7B，64 并发": the brief fields an inference plan
needs (tools/planning/inference.py). A request that also asks to train ("fine-tune it, then
serve it") stays a training request: the training verb wins, as in ``brief._TASKS``; a past
participle ("our fine-tuned model") is not a training verb.
"""

from __future__ import annotations

import re
from typing import Any

from tools.intake.readings import Read

_SERVING = re.compile(
    r"\b(?:inference|infer|serv(?:e|es|ed|ing)|deploy(?:s|ed|ing|ment)?|host(?:s|ed|ing)?|"
    r"endpoint|tokens?\s*/\s*s(?:ec)?|tokens?\s+per\s+second|vllm|tgi|"
    r"text[- ]generation[- ]inference|deepspeed[- ]?(?:inference|mii))\b"
    r"|推理|部署|上线|服务",
    re.I,
)
# A request to train: the verb, not its participle ("fine-tuned", "pre-trained" models serve).
_TRAINING_VERB = re.compile(
    r"\b(?:pre-?train(?:ing)?|fine-?tun(?:e|ing)|re-?train(?:ing)?|train(?:ing)?|q?lora|"
    r"from scratch)\b|预训练|微调|训练",
    re.I,
)
_ENGINES = (
    ("tgi", re.compile(r"\btgi\b|text[- ]generation[- ](?:inference|launcher)", re.I)),
    (
        "deepspeed-inference",
        re.compile(
            r"deepspeed[- ]?(?:inference|mii)|\bmii\b|\b(?:with|using|on|via)\s+deepspeed\b", re.I
        ),
    ),
    ("vllm", re.compile(r"\bvllm\b", re.I)),
)
_DTYPES = (
    ("int4", re.compile(r"\bint4\b|\b4[- ]?bit\b|\bawq\b|\bgptq\b|\bnf4\b", re.I)),
    ("int8", re.compile(r"\bint8\b|\b8[- ]?bit\b", re.I)),
    ("fp8", re.compile(r"\bfp8\b|\bfloat8\b", re.I)),
    ("fp16", re.compile(r"\bfp16\b|\bfloat16\b|\bhalf[- ]precision\b", re.I)),
    ("bf16", re.compile(r"\bbf16\b|\bbfloat16\b", re.I)),
)
_NUMBER = r"(\d+(?:\.\d+)?)\s*(k)?"
_CONCURRENCY = (
    re.compile(
        _NUMBER + r"\s*(?:(?:concurrent|simultaneous)(?:\s+(?:users?|requests?|sequences?|"
        r"sessions?|streams?|chats?|conversations?))?|parallel\s+(?:users?|requests?|"
        r"sequences?|sessions?|streams?))\b",
        re.I,
    ),
    re.compile(r"\b(?:concurrency|max[- _]num[- _]seqs)\s*(?:of|=|:)?\s*" + _NUMBER, re.I),
    re.compile(_NUMBER + r"\s*(?:users?|sessions?|requests?\s+at\s+once)\b", re.I),
    re.compile(_NUMBER + r"\s*(?:个|路)?\s*并发|并发(?:数|量)?\s*[:：为]?\s*" + _NUMBER, re.I),
)
_CONTEXT = (
    re.compile(
        r"\b(?:context(?:\s+(?:window|length|len))?|max[- _]model[- _]len|ctx)\s*"
        r"(?:of|=|:|up to)?\s*" + _NUMBER,
        re.I,
    ),
    re.compile(_NUMBER + r"(?:[ -]?tokens?)?[ -](?:context(?:\s+window)?|ctx)\b", re.I),
    re.compile(r"上下文(?:长度)?\s*[:：为]?\s*" + _NUMBER + r"|" + _NUMBER + r"\s*上下文", re.I),
)


def _value(match: re.Match[str]) -> int | None:
    groups = [g for g in match.groups()]
    for i in range(0, len(groups), 2):
        if groups[i] is not None:
            return int(float(groups[i]) * (1024 if groups[i + 1] else 1))
    return None


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        if (m := pattern.search(text)) and (value := _value(m)):
            return value
    return None


def is_serving(text: str) -> bool:
    """Whether the request asks to serve a model rather than to train one."""
    return bool(_SERVING.search(text)) and not _TRAINING_VERB.search(text)


def serving_fields(text: str, data: dict[str, Any]) -> dict[str, Any]:
    """The inference fields ``text`` states, given the fields already read (``data``).

    Empty unless the request is a serving request naming a model (a bare "inference
    assistant" with no model stays an agent application). ``context_len`` takes the
    sequence length the request gave, or its own context phrases ("32k context window",
    "max-model-len 8192"); a concurrency, engine or weight dtype only when stated.
    """
    if not is_serving(text) or data.get("model") is None:
        return {}
    return {"task": "inference", **_stated(text, data.get("seq_len"))}


def serving_follow_up(text: str, brief: dict[str, Any]) -> dict[str, Any]:
    """What a follow-up to an inference plan changes: "and 64 concurrent users?", "with TGI".

    No serving word is needed (the plan already serves); a training verb ("fine-tune it
    instead") changes the task through the request parser, and then nothing here applies.
    """
    if brief.get("task") != "inference" or _TRAINING_VERB.search(text):
        return {}
    return _stated(text, None)


def _stated(text: str, seq_len: Any) -> dict[str, Any]:
    """The context, concurrency, engine and weight format ``text`` states."""
    fields: dict[str, Any] = {}
    context = _first(_CONTEXT, text) or seq_len
    if context:
        fields["context_len"] = context
    if concurrency := _first(_CONCURRENCY, text):
        fields["concurrency"] = concurrency
    for engine, pattern in _ENGINES:
        if pattern.search(text):
            fields["engine"] = engine
            break
    for dtype, pattern in _DTYPES:
        if pattern.search(text):
            fields["weight_dtype"] = dtype
            break
    return fields


def serving_reads(text: str) -> list[Read]:
    """The serving word, context, concurrency, engine and weight format of a request, with words."""
    reads: list[Read] = []
    if m := _SERVING.search(text):
        reads.append(Read.of("task", "inference", m))
    for field, patterns in (("context_len", _CONTEXT), ("concurrency", _CONCURRENCY)):
        for pattern in patterns:
            if (m := pattern.search(text)) and (value := _value(m)):
                reads.append(Read.of(field, value, m))
                break
    for field, table in (("engine", _ENGINES), ("weight_dtype", _DTYPES)):
        for name, pattern in table:
            if m := pattern.search(text):
                reads.append(Read.of(field, name, m))
                break
    return reads
