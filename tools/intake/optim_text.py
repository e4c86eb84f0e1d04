"""A request's optimizer and schedule words: learning rate, warm-up, weight decay, clipping, decay.

Before, "weight decay 0.1", "clip grad norm 1.0", "betas 0.9, 0.95", "adam eps 1e-8", "10%
warmup" and "eval every 500 steps" were listed as not understood, "no weight decay", "cosine
schedule" or "constant LR" (no number in them) were dropped without a word, and "min lr 3e-5"
was read as the peak rate. Each is now a brief field with its words, which every launch file
carries (tools/artifacts/launch.py, megatron.py, torchtitan.py, deepspeed_config.py) or names
in one line where it cannot:

- ``weight_decay`` ("weight decay 0.1", "wd=0.01", "no weight decay": 0);
- ``max_grad_norm`` ("clip grad norm 1.0", "gradient clipping 0.5", "no gradient clipping": 0,
  clipping off as in Hugging Face's ``max_grad_norm``);
- ``adam_beta1``, ``adam_beta2`` ("betas 0.9, 0.95"; "adam_beta2=0.95" alone: beta1 the task's);
- ``adam_eps`` ("adam eps 1e-8", "epsilon 1e-6");
- ``lr_schedule`` ("cosine schedule", "linear decay", "constant LR"), ``min_lr`` ("min lr
  3e-5"), ``warmup_ratio`` ("warmup ratio 3%", "10% warmup");
- ``eval_every`` ("eval every 500 steps") and ``eval_holdout`` ("on a 1% holdout").

The peak learning rate (``lr_reading``) and warm-up steps (``warmup_reading``) are read here
too, for every request (tools/intake/numbers_text.py gathers them with the other numbers).

Only for a training task: in a serving request the numbers stay listed as not understood.
A DPO beta ("beta 0.1", one number) is no Adam beta and stays listed (no launch here trains DPO).
"""

from __future__ import annotations

import re
from typing import Any

from tools.core.schemas import TRAINING_TASKS
from tools.intake.readings import Read

_NUM = r"(\d*\.?\d+(?:e-?\d+)?)"
_SEP = r"\s*(?:of|=|:|is|at|to)?\s*"
_WD_RE = re.compile(
    r"\b(?:weight[ _-]?decay|wd)" + _SEP + _NUM + r"(?![\w.%])"
    r"|(?<![\w.])" + _NUM + r"\s+weight[ _-]decay\b",
    re.I,
)
_NO_WD_RE = re.compile(
    r"\b(?:no|without|zero|disable|turn\s+off)\s+(?:the\s+)?weight[ _-]?decay\b"
    r"|\bweight[ _-]?decay\s+(?:off|disabled)\b",
    re.I,
)
_CLIP = (
    r"(?:(?:clip(?:ping)?|max)[ _-](?:the\s+)?grad(?:ient)?s?(?:[ _-]norm)?(?:\s+clipping)?"
    r"|grad(?:ient)?[ _-]?(?:norm[ _-]?)?clip(?:ping)?(?:[ _-]norm)?)"
)
_CLIP_RE = re.compile(r"\b" + _CLIP + _SEP + _NUM + r"(?![\w.%])", re.I)
_NO_CLIP_RE = re.compile(
    r"\b(?:no|without|disable)\s+(?:the\s+)?(?:grad(?:ient)?[ _-]?(?:norm[ _-]?)?clip\w*|clip\w*)",
    re.I,
)
_BETA = r"(0?\.\d+|0|1(?:\.0+)?)"
_BETAS_RE = re.compile(
    r"\b(?:adam(?:w)?[ _-]?)?betas?\s*(?:of|=|:|are)?\s*[(\[]?\s*" + _BETA
    + r"\s*(?:,|/|and|\s)\s*" + _BETA + r"\s*[)\]]?(?![\w.])",
    re.I,
)  # fmt: skip
_BETA_N_RE = re.compile(
    r"\b(?:adam(?:w)?[ _-]?)?beta[ _]?([12])" + _SEP + _BETA + r"(?![\w.])", re.I
)
_EPS_RE = re.compile(r"\b(?:adam(?:w)?[ _-]?)?(?:eps|epsilon)" + _SEP + _NUM + r"(?![\w.])", re.I)
_SCHEDULE_RE = re.compile(
    r"\b(cosine|linear|constant)(?:[ _-](?:lr|learning[ _-]rate))?[ _-]"
    r"(?:schedule|scheduler|decay|annealing|lr|learning[ _-]rate)\b"
    r"|\b(?:lr[ _-]schedule(?:r)?(?:[ _-]type)?|schedule)" + _SEP + r"(cosine|linear|constant)\b",
    re.I,
)
_MIN_LR_RE = re.compile(
    r"\b(?:min(?:imum)?|final|end)[ _-]?(?:lr|learning[ _-]rate)" + _SEP + _NUM + r"(?![\w.%])",
    re.I,
)
_WARMUP_RATIO_RE = re.compile(
    r"\bwarm[ _-]?up[ _-]ratio" + _SEP + _NUM + r"(\s*%)?"
    r"|(?<![\w.])" + _NUM + r"(\s*%)\s+(?:of\s+(?:the\s+)?(?:run|steps|training)\s+)?"
    r"(?:(?:linear|lr)\s+)?warm[ _-]?up\b"
    # "warmup of 3%", "warmup over the first 5%", "warmup 3%", "warmup: 3%"
    r"|\bwarm[ _-]?up\s*(?:(?:of|over|for)\s+(?:the\s+first\s+)?|[=:]\s*)?" + _NUM + r"(\s*%)",
    re.I,
)
_EVAL = r"(?:eval(?:uat(?:e|es|ion|ing))?|validat(?:e|es|ion|ing))"
_EVAL_RE = re.compile(
    r"\b" + _EVAL + r"\s+(?:(?:the\s+)?(?:model|loss)\s+)?(?:on\s+\S+\s+)?every\s+"
    r"(\d[\d,]*)\s*(k)?\s*(?:steps?|iterations?|iters?)\b"
    r"|\b(?:eval|validation)[ _-](?:steps|interval|every|freq)\s*[=:]?\s*(\d[\d,]*)(k)?\b",
    re.I,
)
_HOLDOUT_RE = re.compile(
    r"(?<![\w.])" + _NUM + r"\s*%\s*(?:of\s+(?:the\s+)?data\s+)?(?:as\s+(?:a\s+)?)?"
    r"(?:held[ -]?out|hold[ -]?out|validation|val|eval(?:uation)?|dev)\b(?:\s+(?:split|set|data))?"
    r"|\b(?:hold(?:ing)?[ -]?out|held[ -]?out|validation\s+split|val(?:idation)?[ _]split)"
    + _SEP + _NUM + r"\s*%",
    re.I,
)  # fmt: skip


def _number(m: re.Match[str]) -> float:
    return float(next(g for g in m.groups() if g and g[0] in "0123456789."))


def _steps(m: re.Match[str]) -> int:
    at = 0 if m.group(1) else 2
    return int(m.group(at + 1).replace(",", "")) * (1000 if m.group(at + 2) else 1)


def optim_reads(text: str, task: str | None) -> list[Read]:
    """The optimizer, schedule and evaluation fields the request's words set, with their words."""
    if task not in TRAINING_TASKS:
        return []
    reads: list[Read] = []
    if m := _NO_WD_RE.search(text):
        reads.append(Read.of("weight_decay", 0.0, m))
    elif (m := _WD_RE.search(text)) and _number(m) <= 10:
        reads.append(Read.of("weight_decay", _number(m), m))
    if m := _NO_CLIP_RE.search(text):
        reads.append(Read.of("max_grad_norm", 0.0, m))
    elif (m := _CLIP_RE.search(text)) and 0 < _number(m) <= 1e4:
        reads.append(Read.of("max_grad_norm", _number(m), m))
    if (m := _BETAS_RE.search(text)) and all(float(b) < 1 for b in m.groups()):
        reads += [Read.of(f"adam_beta{i}", float(m.group(i)), m) for i in (1, 2)]
    else:  # "beta2=0.95" alone: the other is the task's
        reads += [
            Read.of(f"adam_beta{m.group(1)}", float(m.group(2)), m)
            for m in _BETA_N_RE.finditer(text)
            if float(m.group(2)) < 1
        ]
    if (m := _EPS_RE.search(text)) and 0 < _number(m) < 1:
        reads.append(Read.of("adam_eps", _number(m), m))
    if m := _SCHEDULE_RE.search(text):
        reads.append(Read.of("lr_schedule", (m.group(1) or m.group(2)).lower(), m))
    if (m := _MIN_LR_RE.search(text)) and _number(m) < 1:
        reads.append(Read.of("min_lr", _number(m), m))
    if m := _WARMUP_RATIO_RE.search(text):
        percent = any(g and g.strip() == "%" for g in m.groups())
        ratio = _number(m) / (100 if percent or _number(m) >= 1 else 1)
        if 0 < ratio < 1:
            reads.append(Read.of("warmup_ratio", ratio, m))
    if (m := _EVAL_RE.search(text)) and _steps(m) >= 1:
        reads.append(Read.of("eval_every", _steps(m), m))
    if (m := _HOLDOUT_RE.search(text)) and 0 < _number(m) < 100:
        reads.append(Read.of("eval_holdout", _number(m) / 100, m))
    return reads


def optim_fields(text: str, task: str | None) -> dict[str, Any]:
    """The brief fields those words give."""
    return {r.field: r.value for r in optim_reads(text, task)}


# A peak learning rate: "lr 1e-5", "lr=2e-4", "learning rate of 0.0003", "学习率 1e-5", and the
# number first: "a 3e-5 learning rate", "2e-4 LR" (read as not understood before).
_LR_RE = re.compile(
    r"(?<![a-z])(?:lr|learning[ _-]rate|学习率)\s*(?:of|=|:|is|to|为)?\s*"
    r"(\d+(?:\.\d+)?(?:e-?\d+)?)(?![\w.])",
    re.I,
)
_LR_BEFORE_RE = re.compile(
    r"(?<![\w.])(\d*\.\d+|\d+(?:\.\d+)?e-?\d+)\s*(?:peak\s+)?(?:lr|learning[ _-]rate)\b", re.I
)
# Warm-up steps: "warmup of 500 steps", "500 warmup steps", "warmup_steps=100", "预热 500 步".
_WARMUP_RE = re.compile(
    r"(?<![a-z])warm[ _-]?up(?:[ _-]steps?)?\s*(?:of|=|:|for|over)?\s*(\d{1,3}(?:,\d{3})+|\d{1,7})"
    r"(?:\s*steps?)?\b"
    r"|(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d{1,7})\s*(?:steps?\s+(?:of\s+)?warm[ -]?up|warm[ -]?up\s+steps?)\b"
    r"|预热\s*(\d{1,7})\s*步",
    re.I,
)


# "min lr 3e-5", "final learning rate": the decay's floor (tools/intake/optim_text.py), no peak.
_FLOOR_BEFORE = re.compile(r"\b(?:min(?:imum)?|final|end)[ _-]?$", re.I)


def lr_reading(text: str) -> Read | None:
    """The peak learning rate the request names (0 < lr <= 1), or None."""
    found = [*_LR_RE.finditer(text), *_LR_BEFORE_RE.finditer(text)]
    for m in found:
        if not _FLOOR_BEFORE.search(text[: m.start()]) and 0 < float(m.group(1)) <= 1:
            return Read.of("learning_rate", float(m.group(1)), m)
    return None


def warmup_reading(text: str) -> Read | None:
    """The warm-up steps the request names (at least 1), or None ("warmup of 10%": a ratio)."""
    for m in _WARMUP_RE.finditer(text):
        steps = int(next(g for g in m.groups() if g).replace(",", ""))
        if steps >= 1 and not re.match(r"\s*%", text[m.end() :]):
            return Read.of("warmup_steps", steps, m)
    return None
