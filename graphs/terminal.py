"""What a running plan shows on a terminal, and how the terminal's answers are read.

On a terminal, input comes from prompt_toolkit (history, multi-line) and output from rich (a
spinner naming the working agent and tool, a progress bar for smoke runs); on piped stdin,
lines are read plainly and events are plain lines, for scripting.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from graphs.run import Watcher
from tools.artifacts.text import event_text
from tools.core.errors import InputError

_STEP_RE = re.compile(r"^step (\d+)/(\d+)\b(.*)$")
# The colour of each kind of event on a terminal.
_STYLES = {"start": "dim", "tool_error": "red", "tool": "yellow"}


class ChatWatcher(Watcher):
    """Shows a chat's plan as it runs: plain lines, or rich live progress on a terminal.

    Intake's question is asked through ``ask_user``; no answer leaves it pending.
    """

    def __init__(
        self,
        console: Console,
        live: bool,
        ask_user: Callable[[dict[str, Any]], str | None],
        on_resume: Callable[[tuple[str, ...]], None],
    ) -> None:
        self.console = console
        self.live = live
        self.ask_user = ask_user
        self.on_resume = on_resume
        self._progress: Any = None
        self._status: Any = None
        self._smoke: Any = None
        self._last = time.perf_counter()

    @contextlib.contextmanager
    def segment(self) -> Iterator[None]:
        """The live display (spinner, smoke-run bar) while the graph runs; gone for a question."""
        self._last = time.perf_counter()
        self._start()
        try:
            yield
        finally:
            self._stop()

    def _start(self) -> None:
        if self.live:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._progress.start()
            self._status = self._progress.add_task("intake", total=None)

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def line(self, agent: str, text: str, style: str = "") -> None:
        """Print one event line (above the live display on a terminal)."""
        self.console.print(Text(f"[{agent}] ", style="bold cyan") + Text(text, style=style))

    def event(self, chunk: dict[str, Any]) -> None:
        """One custom event ``{"agent", "kind", "text", ...}`` (agents/events.py ``Events``)."""
        agent, kind = str(chunk.get("agent", "?")), str(chunk.get("kind", ""))
        text = str(chunk.get("text", ""))
        step = _STEP_RE.match(text) if kind == "progress" else None
        if self._progress is not None:
            if step:
                done, total = int(step[1]), int(step[2])
                if self._smoke is None:
                    self._smoke = self._progress.add_task("smoke run", total=total)
                self._progress.update(
                    self._smoke,
                    completed=done,
                    total=total,
                    description=f"smoke run{step[3]}",
                )
                return
            if kind == "tool":
                self._progress.update(self._status, description=f"{agent}: {chunk.get('tool')}")
            elif kind == "start":
                self._progress.update(self._status, description=f"{agent} working")
        style = _STYLES.get(kind, "")
        if kind == "progress" and step is not None:
            style = "dim"
        self.line(agent, event_text(chunk), style)

    def node_done(self, node: str) -> None:
        """A node finished (its checkpoint is on disk)."""
        now = time.perf_counter()
        self.line(node, f"done in {now - self._last:.1f} s", "green")
        self._last = now
        if self._progress is not None and self._smoke is not None:
            self._progress.remove_task(self._smoke)
            self._smoke = None

    def resumed(self, nodes: tuple[str, ...]) -> None:
        """The thread's unfinished run carries on."""
        self.on_resume(nodes)

    def ask(self, question: dict[str, Any]) -> str | None:
        """Intake's question, asked of the user."""
        return self.ask_user(question)


class LineWatcher(Watcher):
    """The CLI's ``plan``: events and node timings as lines on stderr.

    Intake's question is answered by ``--answer`` once, then by one line of stdin.
    """

    def __init__(self, thread: str, *, announce: bool, answer: str | None) -> None:
        self.thread = thread
        # Said once the input is known to be valid (after intake), so that an input error
        # stays the one line on stderr.
        self.notice = (
            f"thread {thread} (if this run stops, rerun with --thread {thread} to resume)"
            if announce
            else None
        )
        self.answer = answer
        self.last = time.perf_counter()

    def event(self, chunk: dict[str, Any]) -> None:
        """One node event on stderr."""
        _emit(f"[{chunk.get('agent', '?')}] {event_text(chunk)}")

    def node_done(self, node: str) -> None:
        """A node finished: its time, and after intake the thread notice."""
        now = time.perf_counter()
        _emit(f"[{node}] done in {now - self.last:.1f} s")
        self.last = now
        if node == "intake" and self.notice:
            _emit(self.notice)

    def resumed(self, nodes: tuple[str, ...]) -> None:
        """An unfinished run carries on; the input given now is not used."""
        _emit(f"resuming thread {self.thread} at {', '.join(nodes)}")

    def waiting(self, thread_id: str) -> None:
        """``--wait``: another run holds the thread."""
        _emit(f"waiting for thread {thread_id}: another run holds it")

    def ask(self, question: dict[str, Any]) -> str:
        """``--answer`` once, then one line of stdin."""
        given, self.answer = self.answer, None  # a given answer answers one question
        return _answer(question, given)


def _answer(value: dict[str, Any], given: str | None) -> str:
    """The answer to intake's clarifying question: ``given``, else one line of stdin."""
    field, text, problem = value.get("field", "request"), value["question"], value.get("problem")
    if given is not None:
        _emit(f"[intake] question: {text}")
        return given
    interactive = sys.stdin is not None and not sys.stdin.closed and sys.stdin.isatty()
    if interactive:
        _emit(f"[intake] question: {text}")
        print("answer> ", end="", file=sys.stderr, flush=True)
    try:
        line = sys.stdin.readline() if sys.stdin is not None else ""
    except (OSError, ValueError):  # stdin closed
        line = ""
    if not line.strip():
        # Piped or closed stdin with nothing on it: the error is the one line.
        if value.get("candidates"):  # the request's own words named several models
            raise InputError(
                "request",
                f"{problem}; say which in the request or pass --answer "
                f"(e.g. --answer {value['candidates'][0]})",
            )
        example = "'4 A100 40GB'" if field == "hardware" else "llama-3-8b"
        if problem:  # the request's words or a given answer were not enough
            raise InputError(
                field,
                f"{problem}; name another in the request or pass --answer (e.g. --answer {example})",
            )
        said = (
            f"hardware unclear ({value['unclear']})"
            if value.get("unclear")
            else f"names no {field}"
        )
        raise InputError(
            "request",
            f"{said}, and no answer came on stdin; name it in the request "
            f"or pass --answer (e.g. --answer {example})",
        )
    if not interactive:
        _emit(f"[intake] question: {text}")
    return line.strip()


def _emit(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def joined(lines: Iterator[str]) -> str | None:
    """One message from lines: a trailing backslash continues it on the next line."""
    parts: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        return "\n".join(parts)
    return "\n".join(parts) if parts else None


def stdin_reader() -> Callable[[str], str | None]:
    """Messages from piped stdin, one per line (a trailing backslash continues it)."""

    def lines() -> Iterator[str]:
        while True:
            line = sys.stdin.readline()
            if not line:
                return
            yield line

    def read(prompt: str) -> str | None:
        return joined(lines())

    return read


def prompt_reader(history: Path) -> Callable[[str], str | None]:
    """Messages from prompt_toolkit, with history; Esc-Enter or a trailing backslash adds a line."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings

    keys = KeyBindings()

    @keys.add("escape", "enter")
    def _newline(event: Any) -> None:
        event.current_buffer.insert_text("\n")

    @keys.add("enter")
    def _enter(event: Any) -> None:
        buffer = event.current_buffer
        if buffer.document.text_before_cursor.endswith("\\"):
            buffer.delete_before_cursor(1)
            buffer.insert_text("\n")
        else:
            buffer.validate_and_handle()

    session: PromptSession[str] = PromptSession(
        history=FileHistory(str(history)), key_bindings=keys, multiline=False
    )

    def read(prompt: str) -> str | None:
        while True:
            try:
                return session.prompt(prompt)
            except KeyboardInterrupt:  # Ctrl-C at the prompt clears the line, as in a shell
                continue
            except EOFError:
                return None

    return read
