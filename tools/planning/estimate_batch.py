"""``estimate --batch FILE.jsonl``: many setups in one process, one JSON object per line.

Each line is an ``EstimateRequest`` as a JSON object: the ``estimate`` flags as keys, spelled
as the request's fields (``seq_len`` for ``--seq-len``; a flag without a value, ``--qlora``, is
``true``), no other key. Each answer is what ``estimate --json`` writes for the same flags, or
``{"line": N, "error": "..."}`` for a line that could not be estimated: not JSON, not an
object, an unknown key, a value of the wrong type or out of the flag's bounds, or a setup the
estimate refuses. A bad line is skipped, never fatal; blank lines are not setups.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tools.core.errors import TrainwrightError, one_line, shown
from tools.core.settings import check_count
from tools.planning.estimate import EstimateRequest, estimate
from tools.research.hardware import local_profile_once

# Progress goes to stderr at most this often (seconds of wall time) on a long file.
PROGRESS_EVERY_S = 5.0
# Bounds of a count flag, by flag (app.py ``number_flags()["estimate"]``).
Bounds = dict[str, tuple[float, float]]


@dataclass(frozen=True)
class BatchAnswer:
    """One non-blank line's answer: the estimate JSON, or why the line was skipped."""

    line: int
    result: dict[str, Any] | None = None
    error: str | None = None

    def record(self) -> dict[str, Any]:
        """The output line's object: the ``--json`` shape, or ``{line, error}``."""
        if self.result is not None:
            return self.result
        return {"line": self.line, "error": self.error}


def flag_of(field: str) -> str:
    """The command-line flag of a request field: ``seq_len`` -> ``--seq-len``."""
    return "--" + field.replace("_", "-")


def _unknown_key(key: str) -> str:
    """Why ``key`` is no request field, naming the field it likely meant."""
    fields = EstimateRequest.model_fields
    guess = key.lstrip("-").replace("-", "_")
    if guess in fields:
        return f"unknown key {shown(key)}: write it as {guess!r} (the field of {flag_of(guess)})"
    return f"unknown key {shown(key)}; the keys are {', '.join(fields)}"


def parse_line(raw: str | bytes, bounds: Bounds) -> EstimateRequest:
    """The request one JSON line describes; ``ValueError`` with one line saying what is wrong."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start + 1})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object of estimate flags but a {type(data).__name__}")
    for key in data:
        if key not in EstimateRequest.model_fields:
            raise ValueError(_unknown_key(key))
    try:
        # Strict: "4" is not a count and 1 is not true, as on the command line's int flags.
        request = EstimateRequest.model_validate_json(text, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"])
        raise ValueError(
            f"{key} ({flag_of(key)}): {first['msg']}, got {json.dumps(first['input'])[:80]}"
        ) from None
    for flag, (least, most) in bounds.items():
        value = getattr(request, flag[2:].replace("-", "_"), None)
        if isinstance(value, int) and not isinstance(value, bool):
            check_count(flag, value, int(least), int(most))
    return request


def answer_line(text: str | bytes, line: int, bounds: Bounds) -> BatchAnswer:
    """The estimate of one line, or the one-line reason it has none (nothing is raised)."""
    try:
        request = parse_line(text, bounds)
        found = estimate(request)
    except (ValueError, TrainwrightError) as exc:
        return BatchAnswer(line, error=one_line(str(exc)))
    except OSError as exc:  # a brief file that cannot be read
        where = shown(exc.filename, 120) + ": " if exc.filename is not None else ""
        return BatchAnswer(line, error=one_line(f"{where}{exc.strerror or exc}"))
    except (RecursionError, OverflowError) as exc:
        return BatchAnswer(line, error=one_line(f"input: cannot be read ({type(exc).__name__})"))
    except Exception as exc:  # noqa: BLE001 - one setup's failure must not end the others
        return BatchAnswer(line, error=one_line(f"unexpected error: {type(exc).__name__}: {exc}"))
    return BatchAnswer(line, result=found.memory.model_dump(mode="json"))


def estimate_lines(
    lines: Iterable[str | bytes],
    bounds: Bounds,
    progress: Callable[[int, float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[BatchAnswer]:
    """Answer each non-blank line in order (line numbers from 1, blank lines counted).

    ``progress(lines_done, seconds)`` is called at most every ``PROGRESS_EVERY_S`` seconds.
    This machine (``"hardware": "local"``, the default) is probed once for all the lines.
    """
    start = last = clock()
    with local_profile_once():  # "local" lines share one probe of this machine
        for number, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            yield answer_line(text, number, bounds)
            now = clock()
            if progress is not None and now - last >= PROGRESS_EVERY_S:
                progress(number, now - start)
                last = now
