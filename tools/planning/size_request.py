"""The ``size`` command's request: flags in, the sizing out (tools/planning/sizing.py).

``SizeRequest`` has one field per flag of ``python app.py size`` (the flag's name with
underscores; tests/unit/cli/test_cli_flags.py keeps the two sets equal), so any caller fills
the same fields. Numbers the user writes with a scale ("1T", "300B", "$50k") are read here,
and errors name the flag as the user wrote it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from tools.core.errors import InputError
from tools.core.schemas import ModelSpec, SizingPlan, TrainingBrief
from tools.planning.sizing import MAX_SIZING_GPUS, SizingLimits, size_training

DAY_S = 86_400.0
# The longest deadline read (ten years) and the largest budget and token count: past them a
# figure is a typo, not a plan.
MAX_DEADLINE_DAYS = 3650.0
MAX_BUDGET_USD = 1e12
MAX_TOKENS = 1e16
_SCALES = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_AMOUNT = re.compile(r"^\s*\$?\s*(\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?)\s*([kmbgt]?)\s*$", re.I)
_PRICED = re.compile(r"^\s*([^=]+?)\s*(?:=\s*\$?\s*(\d+(?:\.\d+)?)\s*)?$")


class SizeRequest(BaseModel):
    """One ``size``: the model and task, the token budget, and the limits (None: not limited).

    ``gpus``: comma-separated GPU types, each optionally with its price per GPU-hour
    (``A100-40GB=1.20``); ``refuse``: types never sized. ``tokens``, ``deadline_days`` and
    ``budget`` are the flags' text ("1T", "30", "$50k").
    """

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str
    task: str | None = None
    tokens: str | None = None
    deadline_days: str | None = None
    budget: str | None = None
    gpus: str | None = None
    refuse: str | None = None
    max_gpus: int | None = None
    one_node: bool = False
    seq_len: int | None = None
    global_batch: int | None = None


@dataclass(frozen=True)
class Sized:
    """What ``size`` found: the inputs it read and the sizing."""

    model: ModelSpec
    brief: TrainingBrief
    sizing: SizingPlan


def amount(flag: str, text: str, most: float) -> float:
    """A positive number as written ("1e12", "1T", "300B", "$50k", "2,000"); InputError otherwise."""
    m = _AMOUNT.match(text)
    value = float(m[1].replace(",", "")) * _SCALES[m[2].lower()] if m else math.nan
    if not (math.isfinite(value) and 0 < value <= most):
        raise InputError(
            flag, f"must be a number above 0 and at most {most:,g} (e.g. 1e12 or 1T), got {text!r}"
        )
    return value


def gpu_list(flag: str, text: str | None) -> tuple[tuple[str, ...], dict[str, float]]:
    """Catalog ids of a comma-separated list, and the prices given as TYPE=PRICE."""
    from tools.research.hardware import find_gpu

    if text is None:
        return (), {}
    names: list[str] = []
    prices: dict[str, float] = {}
    for part in text.split(","):
        m = _PRICED.match(part)
        if m is None or not part.strip():
            raise InputError(
                flag, f"cannot read {part.strip()!r}; e.g. A100-40GB or A100-40GB=1.20"
            )
        try:
            gpu_id = find_gpu(m[1]).id
        except InputError as exc:
            raise InputError(flag, exc.message) from None
        names.append(gpu_id)
        if m[2] is not None:
            prices[gpu_id] = amount(flag, m[2], 100_000)
    return tuple(dict.fromkeys(names)), prices


def size(request: SizeRequest) -> Sized:
    """The sizing ``request`` asks for, its brief built as ``estimate`` builds one."""
    from tools.intake.brief import brief_from_dict
    from tools.research.model_catalog import brief_model

    asked, prices = gpu_list("--gpus", request.gpus)
    refused, _ = gpu_list("--refuse", request.refuse)
    limits = SizingLimits(
        tokens=amount("--tokens", request.tokens, MAX_TOKENS) if request.tokens else None,
        deadline_s=DAY_S * amount("--deadline-days", request.deadline_days, MAX_DEADLINE_DAYS)
        if request.deadline_days
        else None,
        budget_usd=amount("--budget", request.budget, MAX_BUDGET_USD) if request.budget else None,
        asked=asked,
        refused=refused,
        prices=prices,
        max_gpus=request.max_gpus or MAX_SIZING_GPUS,
        one_node=request.one_node,
    )
    fields = {
        "model": request.model,
        "task": request.task,
        "seq_len": request.seq_len,
        "global_batch_size": request.global_batch,
    }
    try:
        brief = brief_from_dict({k: v for k, v in fields.items() if v is not None})
    except InputError as exc:
        name = exc.field.removeprefix("brief.")
        flag = {"global_batch_size": "--global-batch", "seq_len": "--seq-len"}.get(name)
        raise InputError(flag or f"--{name}", exc.message) from None
    if brief.model is None:
        raise InputError("--task", "an agent-app trains nothing, so there is nothing to size")
    try:
        model = brief_model(brief)
    except InputError as exc:
        raise InputError(
            "--seq-len" if exc.field == "seq_len" else "--model", exc.message
        ) from None
    try:
        sizing = size_training(model, brief, limits)
    except InputError as exc:
        raise InputError(f"--{exc.field.replace('_', '-')}", exc.message) from None
    sizing.notes[:0] = model.notes
    return Sized(model, brief, sizing)
