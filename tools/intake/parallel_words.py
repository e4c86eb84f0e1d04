"""Words that name the parallel layout as a whole: "data parallelism only", "TP only", "4-way DP".

Before, "data parallelism only, no sharding", "pure data parallel", "no model parallelism",
"using tensor parallelism only" and "with 4-way DP" left no trace: the plan searched every
split and every ZeRO stage as if they were unsaid. Each now pins what it means:

- "data parallelism only", "pure data parallel", "DP only", "no model parallelism": tensor,
  pipeline and context degree 1 (ZeRO sharding is data parallelism and stays searched);
- "no sharding", "without sharding", "unsharded": ZeRO stage 0 (plain replicas, as DDP);
- "tensor parallelism only", "TP only": pipeline and context degree 1, ZeRO stage 0, and the
  tensor degree the GPU count (every GPU one tensor split);
- "4-way DP", "data parallel 4", "DP=4": on 8 GPUs the other factor of 2 is model parallel:
  a pinned tensor or pipeline degree where the request gives one, else tensor parallel 2
  (said under "I assumed"). A degree the GPU count does not divide, or that the request's
  own split pins contradict, is refused in one line, never dropped.

A degree the request pins by name ("TP 4", "ZeRO-2") wins over what these words imply.
"""

from __future__ import annotations

import re
from typing import Any

from tools.core.request_account import AssumedFact
from tools.intake.hardware_text import SPEC_RE
from tools.intake.readings import Read
from tools.intake.wishes import pin_fields, pin_reads

_DP = r"(?:data[ -]parallel(?:ism)?|dp)"
_DP_ONLY_RE = re.compile(
    r"\b(?:(?:pure|plain|only)\s+" + _DP + r"|" + _DP + r"\s+only"
    r"|(?:no|without)\s+(?:any\s+)?model[ -]parallel(?:ism)?)\b",
    re.I,
)
_NO_SHARD_RE = re.compile(
    r"\b(?:(?:no|without|not)\s+(?:any\s+)?(?:zero\s+|model\s+)?shard(?:ing|ed)?"
    r"|unsharded)\b",
    re.I,
)
_TP_ONLY_RE = re.compile(
    r"\b(?:(?:tensor[ -]parallel(?:ism)?|tp)\s+only|only\s+(?:tensor[ -]parallel(?:ism)?|tp))\b",
    re.I,
)
_DP_DEGREE_RE = re.compile(
    r"\b(\d{1,4})[ -]?way\s+" + _DP + r"\b"
    r"|\b" + _DP + r"\s*(?:(?:size|degree)\s*)?(?:(?:of|=|:)\s*)?(\d{1,4})\b",
    re.I,
)
# The split degrees whose product with the data-parallel degree is the GPU count.
_SPLITS = ("pins.tensor_parallel", "pins.pipeline_parallel", "pins.context_parallel")


def _gpus(hardware: Any) -> tuple[int, int] | None:
    """Nodes and GPUs per node of a hardware spec ("2x8xH100-80GB"), or None."""
    m = SPEC_RE.match(hardware) if isinstance(hardware, str) else None
    return (int(m.group(1) or 1), int(m.group(2))) if m else None


def _pin(field: str, value: int, m: re.Match[str], taken: dict[str, Any]) -> list[Read]:
    """A pin these words imply, unless the request pinned that dimension by name."""
    return [] if field in taken else [Read.of(field, value, m)]


def parallel_reads(text: str, hardware: Any, pinned: dict[str, Any]) -> list[Read]:
    """The pins the layout words imply (``pins.<name>``), and a refused degree (a wish).

    ``pinned`` are the pins the request named (``pins.<name>`` -> value), which win.
    """
    taken = dict(pinned)
    reads: list[Read] = []

    def add(new: list[Read]) -> None:
        reads.extend(new)
        taken.update({r.field: r.value for r in new})

    gpus = _gpus(hardware)
    if m := _TP_ONLY_RE.search(text):
        add(
            _pin("pins.pipeline_parallel", 1, m, taken) + _pin("pins.context_parallel", 1, m, taken)
        )
        add(_pin("pins.zero_stage", 0, m, taken))
        others = int(taken.get("pins.pipeline_parallel") or 1) * int(
            taken.get("pins.context_parallel") or 1
        )
        if gpus is not None and (gpus[0] * gpus[1]) % others == 0:
            # Every GPU of a replica one tensor split: the GPUs over the splits the request pins.
            add(_pin("pins.tensor_parallel", gpus[0] * gpus[1] // others, m, taken))
    if m := _DP_ONLY_RE.search(text):
        add([r for f in _SPLITS for r in _pin(f, 1, m, taken)])
    if m := _NO_SHARD_RE.search(text):
        add(_pin("pins.zero_stage", 0, m, taken))
    if (m := _DP_DEGREE_RE.search(text)) is not None and gpus is not None:
        add(_dp_degree(m, gpus, taken))
    return reads


def _dp_degree(m: re.Match[str], gpus: tuple[int, int], taken: dict[str, Any]) -> list[Read]:
    """The split pins a data-parallel degree implies on ``gpus``, or its one refusal line."""
    dp = int(m.group(1) or m.group(2))
    total = gpus[0] * gpus[1]
    if dp < 1 or total % dp:
        how = (
            f"data-parallel degree {dp} not planned: it does not divide the {total} GPUs "
            "(the data-parallel degree times the tensor, pipeline and context degrees is the "
            "GPU count)"
        )
        return [Read.of("technique:data-parallel-degree", how, m)]
    rest = total // dp
    pinned = 1
    for field in _SPLITS:
        pinned *= int(taken.get(field) or 1)
    open_splits = [f for f in _SPLITS if f not in taken]
    if pinned == rest:
        return [Read.of(f, 1, m) for f in open_splits]
    if rest % pinned or "pins.tensor_parallel" not in open_splits:
        how = (
            f"data-parallel degree {dp} not planned: with the split the request pins "
            f"({pinned} GPUs per replica) {total} GPUs run {total // pinned} replicas"
        )
        return [Read.of("technique:data-parallel-degree", how, m)]
    tp = rest // pinned
    return [Read.of("pins.tensor_parallel", tp, m)] + [
        Read.of(f, 1, m) for f in open_splits if f != "pins.tensor_parallel"
    ]


def parallel_pins(text: str, hardware: Any, pins: dict[str, Any]) -> dict[str, Any]:
    """``pins`` with what the layout words imply added (the request's named pins win)."""
    pinned = {f"pins.{k}": v for k, v in pins.items()}
    added = {
        r.field.split(".", 1)[1]: r.value
        for r in parallel_reads(text, hardware, pinned)
        if r.field.startswith("pins.")
    }
    return {**added, **pins}


def layout_reads(text: str, fields: dict[str, Any]) -> list[Read]:
    """The pins the request names and those its layout words imply, for the accounting.

    Without pins in ``fields`` (a refused degree pins nothing) only the refusals are kept.
    """
    named = pin_reads(text)
    layout = parallel_reads(text, fields.get("hardware"), {r.field: r.value for r in named})
    if "pins" in fields:
        return named + layout
    return [r for r in layout if not r.field.startswith("pins.")]


def parallel_assumed(text: str, hardware: Any) -> list[AssumedFact]:
    """The tensor degree a data-parallel degree left to the model split, said as assumed."""
    named = {f"pins.{k}": v for k, v in pin_fields(text).items()}
    degree = _DP_DEGREE_RE.search(text)
    return [
        AssumedFact(
            field="pins",
            value=f"tensor parallel {r.value}",
            why=(
                f"{r.quote!r} leaves {r.value} GPUs per replica to the model split: tensor "
                "parallel (within a node); name 'PP' or 'CP' with the degree for another split"
            ),
        )
        for r in parallel_reads(text, hardware, named)
        if degree is not None
        and r.field == "pins.tensor_parallel"
        and r.value > 1
        and r.start == degree.start()
    ]
