"""Hardware trainwright cannot plan for, by name, and the GPU types it can.

``knowledge/accelerators.yaml`` lists accelerators a request may name (Gaudi, Ascend, TPU,
Trainium...) with what each is and what it trains through instead of CUDA or ROCm; ``why_not``
and ``plannable_types`` make the one line a request naming one (or any GPU the catalog lacks)
is refused with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

from tools.research.hardware import plannable_types

__all__ = ["Unplannable", "load_unplannable", "plannable_types", "unplannable", "why_not"]


@dataclass(frozen=True)
class Unplannable:
    """An accelerator kind the catalog knows it cannot plan for."""

    words: re.Pattern[str]
    spelling: str  # the words' regular expression, as the YAML gives it
    what: str
    runs_on: str


@lru_cache(maxsize=1)
def load_unplannable() -> tuple[Unplannable, ...]:
    """The entries of ``knowledge/accelerators.yaml``, their word patterns compiled."""
    text = resources.files("knowledge").joinpath("accelerators.yaml").read_text(encoding="utf-8")
    raw: dict[str, dict[str, str]] = yaml.safe_load(text)
    return tuple(
        Unplannable(re.compile(rf"\b(?:{e['words']})\b", re.I), e["words"], e["what"], e["runs_on"])
        for e in raw.values()
    )


def unplannable_words() -> str:
    """One regular-expression alternation of every unplannable accelerator's words."""
    return "|".join(f"(?:{u.spelling})" for u in load_unplannable())


def unplannable(name: str) -> Unplannable | None:
    """The unplannable kind a name is ("Ascend 910B" -> a Huawei Ascend NPU), or None."""
    return next((u for u in load_unplannable() if u.words.search(name)), None)


def why_not(name: str) -> str:
    """Why ``name`` cannot be planned for: what it is, or that the GPU catalog lacks it."""
    kind = unplannable(name)
    if kind is None:
        return f"{name} is not in the GPU catalog"
    return f"{name} is {kind.what} ({kind.runs_on}), not a CUDA or ROCm GPU"
