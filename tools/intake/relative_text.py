"""A chat follow-up that scales what the brief has: "double the batch", "halve the sequence length".

Before, such a follow-up changed nothing ("that follow-up changes nothing I can read"): the
request parser reads numbers, and these words carry none. Here the brief's own value is
scaled: ``seq_len``, ``global_batch_size``, the node count or the GPU count of its hardware.
A value the brief leaves to the planner (a batch the planner chose) has nothing to scale: one
line says which words to use instead.
"""

from __future__ import annotations

import re
from typing import Any

from tools.core.errors import InputError
from tools.intake.hardware_text import PLATFORM_GPUS_PER_NODE, SPEC_RE

_FACTORS = {"double": 2.0, "twice": 2.0, "triple": 3.0, "quadruple": 4.0, "halve": 0.5, "half": 0.5}
_RELATIVE_RE = re.compile(
    r"\b(double|twice|triple|quadruple|halve|half)\s+(?:the\s+|our\s+|my\s+)?"
    r"(global\s+batch(?:\s+size)?|batch(?:\s+size)?|seq(?:uence)?(?:[ _-]?len(?:gth)?)?|"
    r"context(?:\s+(?:length|window))?|nodes?|gpus?)\b",
    re.I,
)


def relative_fields(text: str, brief: dict[str, Any]) -> dict[str, Any]:
    """The brief fields a follow-up scales, from the brief's own values (none: no such words)."""
    out: dict[str, Any] = {}
    for m in _RELATIVE_RE.finditer(text):
        factor, what = _FACTORS[m[1].lower()], m[2].lower()
        if what.startswith(("seq", "context")):
            out["seq_len"] = _scaled(brief.get("seq_len"), factor, m[0], "the sequence length")
        elif "batch" in what:
            if brief.get("global_batch_size") is None:
                raise InputError(
                    "global_batch_size",
                    f"'{m[0]}': the batch was the planner's choice, not the brief's; say the "
                    "batch you want (e.g. 'with a global batch of 512')",
                )
            out["global_batch_size"] = _scaled(
                brief["global_batch_size"], factor, m[0], "the global batch"
            )
        elif (spec := SPEC_RE.match(str(brief.get("hardware") or ""))) is not None:
            nodes, per_node, gpu = int(spec[1] or 1), int(spec[2]), spec[3]
            # More GPUs than a node's 8 (HGX/DGX) are more nodes: "double the GPUs" of 1x8 is 2x8.
            if what.startswith("node") or nodes > 1 or per_node * factor > PLATFORM_GPUS_PER_NODE:
                nodes = _scaled(nodes, factor, m[0], "the node count")
            else:
                per_node = _scaled(per_node, factor, m[0], "the GPU count")
            out["hardware"] = f"{nodes}x{per_node}x{gpu}"
        else:
            raise InputError(
                "hardware", f"'{m[0]}': the brief's hardware ({brief.get('hardware')}) has no count"
            )
    return out


def _scaled(value: Any, factor: float, words: str, name: str) -> int:
    """``value`` x ``factor``, a whole number of at least 1, else one line naming the words."""
    new = float(value or 0) * factor
    if new < 1 or new != int(new):
        raise InputError("follow-up", f"'{words}': {name} {value} x {factor:g} is no whole count")
    return int(new)
