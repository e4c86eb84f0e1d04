"""What a request wishes for: a framework, frameworks it refuses, and pinned setup dimensions.

"we want to use FSDP, no deepspeed" -> framework pytorch_fsdp, avoid deepspeed; "with
Megatron" -> megatron; "use Horovod with Keras" -> horovod (the team's stack, TensorFlow, is
read by the brief parser); "PyTorch DDP only" -> pytorch_ddp; "torchtitan" -> pytorch_fsdp
(torchtitan is PyTorch's FSDP2 + tensor/pipeline reference trainer; trainwright writes no
torchtitan config, and the plan says so). Pins: "ZeRO-2", "ZeRO stage 3", "TP 4", "tensor
parallel 8", "PP 2", "pipeline parallelism of 4", "no tensor parallelism" (degree 1),
"no offload", "with offload"; "do not use ZeRO-3" refuses that stage (``avoid_zero_stages``).

Offline and deterministic, like the rest of the request parser (tools/intake/brief.py); every
pattern is linear (no nested quantifiers), and the request is already capped in length.
"""

from __future__ import annotations

import re
from typing import Any

# Each framework's names in a request, most specific first (a longer name wins its span).
_NAMES: tuple[tuple[str, str], ...] = (
    ("pytorch_fsdp", r"torch\s*titan|fsdp2?|fully[ -]sharded(?:\s+data[ -]parallel)?"),
    ("megatron", r"megatron(?:[ -](?:lm|deepspeed|core))?|nemo"),
    ("deepspeed", r"deep[ -]?speed"),
    ("horovod", r"horovod"),
    ("pytorch_ddp", r"(?:pytorch\s+|torch\s+)?ddp|distributed\s*data\s*parallel"),
)
_ANY_NAME = "|".join(f"(?:{p})" for _, p in _NAMES)
# A refusal before the name ("no DeepSpeed", "not megatron", "without FSDP", "avoid horovod",
# "don't want deepspeed") or after it ("DeepSpeed is not allowed", "deepspeed: no").
_REFUSE_BEFORE = re.compile(
    r"\b(?:no|not|never|without|avoid(?:ing)?|except|exclude|excluding|other than|"
    r"(?:do|does|can)\s*(?:n['’]?t|not)\s+(?:want|use|like|allow)(?:\s+to\s+use)?|"
    r"instead of|rather than|but not)\s+(?:using\s+|use\s+|the\s+)?(" + _ANY_NAME + r")\b",
    re.I,
)
_REFUSE_AFTER = re.compile(
    r"\b(" + _ANY_NAME + r")\s+(?:is\s+)?(?:not allowed|forbidden|banned|is out|not an option)",
    re.I,
)
_NAME_RE = re.compile(r"\b(" + _ANY_NAME + r")\b", re.I)

_ZERO_RE = re.compile(r"\bzero[ -]?(?:stage[ -]?)?([0-3])\b|\bstage[ -]?([0-3])\s+zero\b", re.I)
# "do not use ZeRO-3", "no ZeRO stage 3", "without ZeRO-3", "avoid zero-3": refused, not pinned.
_NO_ZERO_RE = re.compile(
    r"\b(?:no|not|never|without|avoid(?:ing)?|(?:do|does|can)\s*(?:n['’]?t|not)\s+"
    r"(?:want|use|like|allow)(?:\s+to\s+use)?)\s+(?:using\s+|use\s+|the\s+)?"
    r"zero[ -]?(?:stage[ -]?)?([0-3])\b",
    re.I,
)
_TP_RE = re.compile(
    r"\b(?:tp|tensor[ -]parallel(?:ism|\s+(?:size|degree))?)\s*(?:(?:of|=|:|size|degree)\s*)?(\d{1,2})\b",
    re.I,
)
_PP_RE = re.compile(
    r"\b(?:pp|pipeline[ -]parallel(?:ism|\s+(?:size|degree))?)\s*(?:(?:of|=|:|size|degree)\s*)?(\d{1,4})\b",
    re.I,
)
_TP_BEFORE_RE = re.compile(r"\b(\d{1,2})[ -]?way\s+tensor[ -]parallel", re.I)
_PP_BEFORE_RE = re.compile(r"\b(\d{1,4})[ -]?(?:way|stage)s?\s+pipeline", re.I)
_NO_TP_RE = re.compile(r"\b(?:no|without)\s+(?:tp|tensor[ -]parallel)", re.I)
_NO_PP_RE = re.compile(r"\b(?:no|without)\s+(?:pp|pipeline(?:[ -]parallel)?)\b", re.I)
_NO_OFFLOAD_RE = re.compile(
    r"\b(?:no|not|never|without|avoid(?:ing)?|don['’]?t)\s+(?:\w+\s+)?(?:cpu\s+|nvme\s+)?offload",
    re.I,
)
_OFFLOAD_RE = re.compile(r"\b(?:with|use|using|enable|want)\s+(?:cpu\s+|nvme\s+)?offload", re.I)


def _framework_of(name: str) -> str:
    """The framework id a matched name means."""
    for fid, pattern in _NAMES:
        if re.fullmatch(pattern, name, re.I):
            return fid
    raise ValueError(name)  # unreachable: the name was matched by one of the patterns


def wish_fields(text: str) -> dict[str, Any]:
    """The brief fields a request's wishes set: framework, avoid_frameworks, pins (when stated).

    A named framework that is also refused counts as refused; of several named ones the first
    named wins ("FSDP or DeepSpeed" -> FSDP), and a refused one is never the framework.
    """
    avoided: list[str] = []
    refused_spans: list[tuple[int, int]] = []
    for regex in (_REFUSE_BEFORE, _REFUSE_AFTER):
        for m in regex.finditer(text):
            fid = _framework_of(m.group(1))
            refused_spans.append(m.span(1))
            if fid not in avoided:
                avoided.append(fid)
    framework = None
    for m in _NAME_RE.finditer(text):
        if any(a <= m.start() < b for a, b in refused_spans):
            continue
        fid = _framework_of(m.group(1))
        if fid not in avoided:
            framework = fid
            break
    fields: dict[str, Any] = {}
    if framework:
        fields["framework"] = framework
    if avoided:
        fields["avoid_frameworks"] = avoided
    pins = pin_fields(text)
    if pins:
        fields["pins"] = pins
    return fields


def pin_fields(text: str) -> dict[str, Any]:
    """The setup dimensions a request fixes: zero_stage, tensor/pipeline degrees, offload."""
    pins: dict[str, Any] = {}
    refused = [(m.start(), m.end(), int(m.group(1))) for m in _NO_ZERO_RE.finditer(text)]
    if refused:
        pins["avoid_zero_stages"] = sorted({stage for _, _, stage in refused})
    for zero in _ZERO_RE.finditer(text):
        if not any(a <= zero.start() < b for a, b, _ in refused):
            pins["zero_stage"] = int(zero.group(1) or zero.group(2))
            break
    if m := (_TP_RE.search(text) or _TP_BEFORE_RE.search(text)):
        pins["tensor_parallel"] = int(m.group(1))
    elif _NO_TP_RE.search(text):
        pins["tensor_parallel"] = 1
    if m := (_PP_RE.search(text) or _PP_BEFORE_RE.search(text)):
        pins["pipeline_parallel"] = int(m.group(1))
    elif _NO_PP_RE.search(text):
        pins["pipeline_parallel"] = 1
    if _NO_OFFLOAD_RE.search(text):
        pins["offload"] = False
    elif _OFFLOAD_RE.search(text):
        pins["offload"] = True
    return pins


def torchtitan_note(goal: str) -> str | None:
    """The wish trainwright cannot honour as asked: torchtitan, planned as PyTorch FSDP."""
    if re.search(r"\btorch\s*titan\b", goal, re.I):
        return (
            "torchtitan asked for: trainwright writes no torchtitan config, so this plans PyTorch "
            "FSDP (which torchtitan builds on: FSDP2 with tensor and pipeline parallelism)"
        )
    return None
