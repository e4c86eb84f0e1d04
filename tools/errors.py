"""Typed errors for what the user's input or our environment got wrong.

The CLI maps every ``TrainwrightError`` to one line on stderr and an exit code; tool-call
mistakes made by a chat model are not raised here but returned to the model as messages.
"""

from __future__ import annotations


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
