"""What a request's words were read as: the value, the words it came from, and what was assumed.

A reading is data, not prose: ``Assumed`` is one fact the request did not state (its field,
the value taken, why, and the words it was read from), and ``ModelReading`` is how the words
about the model were read. The plan's notes show each as one line; the request accounting
(plan.json ``request``) takes them as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# A request-field key (not a brief field): the model assumption lines ``request_fields`` read,
# carried to intake's notes and removed before the fields are validated as a brief.
MODEL_ASSUMED = "_model_assumed"
# Likewise, how a number was converted ("a 4M-token batch is 1953 sequences of 2048").
NUMBER_NOTES = "_number_notes"


@dataclass(frozen=True)
class Assumed:
    """One fact the request did not state: what was taken, and why."""

    field: str  # the brief field it sets: model, hardware
    value: str  # what was taken: "llama-3.1-70b", "A100-80GB"
    why: str  # what the words did not say, and the rule that chose
    quote: str  # the words it was read from

    def line(self) -> str:
        """The plan note: ``assumed A100-80GB: the request does not say 40 or 80 GB``."""
        return f"assumed {self.value} for {self.quote!r}: {self.why}"


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", text.lower())


@dataclass(frozen=True)
class ModelReading:
    """What the text says about the model: a catalog id or a shape, or the candidates to ask about.

    ``said`` is the quote the reading came from. ``assumed`` says why, when the words named
    no model and one was taken for them ("a 70B policy" -> llama-3.1-70b); ``alternatives``
    are the other catalog models the words fit. ``shape`` is a family's shape at a size no
    catalog model has (ModelShape fields, "a 20B llama"); ``params`` a bare size the catalog
    has no model of (a llama-style shape is derived from it).
    """

    said: str
    model: str | None = None
    candidates: tuple[str, ...] = field(default=())
    shape: dict[str, Any] | None = None
    params: float | None = None
    assumed: str | None = None
    alternatives: tuple[str, ...] = field(default=())
    unknown: bool = False  # ``said`` names a model the catalog lacks ("roberta-large")

    @property
    def value(self) -> str | dict[str, Any] | None:
        """The brief's ``model`` value: a catalog id, a shape, ``{params: N}``, or None."""
        if self.model is not None:
            return self.model
        if self.shape is not None:
            return dict(self.shape)
        return {"params": self.params} if self.params is not None else None

    @property
    def assumption(self) -> Assumed | None:
        """The model taken for words that named none, with why; None when the words named it."""
        if self.assumed is None or self.value is None:
            return None
        shown = self.model or (
            f"a {self.shape['like']}-like shape"
            if self.shape
            else f"a {(self.params or 0) / 1e9:g}B shape"
        )
        return Assumed("model", shown, self.assumed, self.said)

    @property
    def note(self) -> str | None:
        """The plan's line: what was assumed, or a name read as another ("read 'lama-3-8b' as ...")."""
        if (assumption := self.assumption) is not None:
            return assumption.line()
        if self.model is None or _squash(self.said) == _squash(self.model):
            return None
        return f"read {self.said!r} as {self.model}"

    @property
    def question(self) -> str | None:
        """What is unclear, for the clarifying question: the candidates, by name."""
        if self.unknown:
            return (
                f"{self.said!r} is not in the model catalog (trainwright plans its catalog "
                "models, a size such as 'a 7B model', or a shape: layers, hidden, heads)"
            )
        if self.value is not None or not self.candidates:
            return None
        names = list(self.candidates)
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        return f"{self.said!r} could be {listed}"


@dataclass(frozen=True)
class Read:
    """One fact read from the words: the brief field, its value, and where in the text it stood."""

    field: str  # a brief field (seq_len, global_batch_size, dataset_tokens, ...) or a wish id
    value: Any
    quote: str  # the words, as written
    start: int = 0  # the quote's span in the request text
    end: int = 0

    @classmethod
    def of(cls, field: str, value: Any, m: re.Match[str], group: int = 0) -> Read:
        """A reading from a regex match over the request text (its whole match, or ``group``)."""
        return cls(field, value, m.group(group).strip(), m.start(group), m.end(group))


def joined_quote(reads: list[Read], text: str) -> str:
    """One quote for several spans: the text from the first to the last when close, else joined."""
    spans = sorted((r.start, r.end) for r in reads)
    start, end = spans[0][0], max(e for _, e in spans)
    if end - start <= 80:
        return text[start:end].strip()
    return " … ".join(dict.fromkeys(text[s:e].strip() for s, e in spans))


def states(value: Any) -> bool:
    """Whether a brief field's value states anything (None, [], pins of None do not)."""
    return value not in (None, [], {}) and not (
        isinstance(value, dict) and not any(map(states, value.values()))
    )
