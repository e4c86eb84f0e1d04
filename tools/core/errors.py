"""Typed errors for what the user's input or our environment got wrong.

The CLI maps every ``TrainwrightError`` to one line on stderr and an exit code; tool-call
mistakes made by a chat model are not raised here but returned to the model as messages.
"""

from __future__ import annotations


def shown(text: object, limit: int = 80) -> str:
    """``text`` as a quoted one-line literal for an error message, cut to about ``limit`` chars.

    ``repr`` escapes newlines, NULs, ANSI escapes and other control characters, so what a
    user (or a document, or an LLM) typed cannot break the one-line message or a terminal.
    """
    value = str(text).strip()
    if len(value) > limit:
        return repr(value[:limit]) + f"... ({len(value)} chars)"
    return repr(value)


def printable(text: str) -> str:
    """``text`` made safe for one terminal line: control characters become escapes.

    A newline becomes a backslash and ``n``, ESC becomes backslash-x1b, so text from a brief, a
    document or an LLM cannot add lines or move the cursor.
    """
    if all(ch.isprintable() for ch in text):
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


# The most characters an error line may have: one terminal line or two, whatever a brief held.
MAX_ERROR_CHARS = 300


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` as one terminal line of at most ``limit`` characters (control characters escaped).

    Line breaks become `` / ``, tabs a space, other control characters escapes (``printable``);
    a longer message keeps its start and its end around ``...``, so the field it names (at the
    start) and the bound it states (often at the end) both survive a 900 KB value in between.
    """
    flat = " / ".join(part.strip() for part in text.splitlines() if part.strip())
    flat = printable(flat.replace("\t", " "))
    if len(flat) <= limit:
        return flat
    head = (limit - 3) * 2 // 3
    tail = limit - 3 - head
    return flat[:head] + "..." + flat[-tail:]


class TrainwrightError(Exception):
    """Base class for errors the CLI reports as one line."""

    exit_code = 1


class InputError(TrainwrightError):
    """The user's input is invalid; ``field`` names what to fix."""

    exit_code = 2

    def __init__(self, field: str, message: str) -> None:
        """Build the error for ``field`` with a human-readable ``message``."""
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class ToolFailure(TrainwrightError):
    """A tool could not do its job on valid input (e.g. a launcher that failed to start)."""


class ProviderError(TrainwrightError):
    """The configured LLM failed: unreachable, timed out, an HTTP error, or an unreadable reply.

    A run with a real LLM fails on this rather than quietly switching to the offline playbook:
    the user asked for that model, and a plan it never saw must not be attributed to it.
    """
