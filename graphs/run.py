"""The one graph-run loop: a checkpointed thread, resume, streaming, and intake's questions.

The CLI's ``plan``, the chat REPL, batch reports and the adapters all run the planning graph
through ``run_plan``; each says what to do with what the run shows by passing a ``Watcher``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import os
import queue
import re
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from langgraph.types import Command

from tools.core.errors import InputError
from tools.core.settings import Settings

# Where the graph's node code lives: a worker thread with a frame here is running a node.
AGENTS_DIR = str(Path(__file__).resolve().parents[1] / "agents")


# A thread id: what --thread, chat --thread and /resume accept.
THREAD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def check_thread_id(thread: str, field: str) -> str:
    """``thread`` if it is a usable thread id, else InputError naming ``field``."""
    if not THREAD_RE.fullmatch(thread):
        raise InputError(field, "use letters, digits, '.', '_' or '-' (at most 128)")
    return thread


class RunWatcher(Protocol):
    """What a caller does with a run's progress (``Watcher`` does nothing with it)."""

    def segment(self) -> contextlib.AbstractContextManager[None]: ...  # noqa: D102
    def event(self, chunk: dict[str, Any]) -> None: ...  # noqa: D102
    def node_done(self, node: str) -> None: ...  # noqa: D102
    def resumed(self, nodes: tuple[str, ...]) -> None: ...  # noqa: D102
    def ask(self, question: dict[str, Any]) -> str | None: ...  # noqa: D102


class Watcher:
    """A ``RunWatcher`` whose every hook does nothing; subclass what you need."""

    def segment(self) -> contextlib.AbstractContextManager[None]:
        """Entered around each stretch of streaming (e.g. a live display), left before a question."""
        return contextlib.nullcontext()

    def event(self, chunk: dict[str, Any]) -> None:
        """A node's custom stream event (agents/events.py): a tool call, progress, an answer."""

    def node_done(self, node: str) -> None:
        """A node finished; its checkpoint is on disk (durability ``sync``)."""

    def resumed(self, nodes: tuple[str, ...]) -> None:
        """The thread had an unfinished run; it carries on at ``nodes``."""

    def ask(self, question: dict[str, Any]) -> str | None:
        """Answer intake's question ``{"field", "question", "problem"}``; None leaves it pending."""
        return None

    def waiting(self, thread_id: str) -> None:
        """Another run holds the thread, and this one (``wait``) waits for it to end."""


@dataclass
class RunResult:
    """Where a run ended: the thread's state, and a question left unanswered, if any."""

    values: dict[str, Any]
    question: dict[str, Any] | None = None
    resumed_at: tuple[str, ...] = ()

    @property
    def plan(self) -> dict[str, Any] | None:
        """The finished plan (contract JSON), or None while a question is pending."""
        plan = self.values.get("plan")
        return dict(plan) if plan else None


def thread_config(thread_id: str) -> dict[str, Any]:
    """The LangGraph config that names a checkpointed thread."""
    return {"configurable": {"thread_id": thread_id}}


def _question(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {"question": str(value)}


def run_plan(
    graph: Any,
    inputs: dict[str, Any] | None,
    thread_id: str,
    watcher: RunWatcher | None = None,
    *,
    reuse: Callable[[dict[str, Any]], bool] | None = None,
    in_thread: bool = False,
    wait: bool = False,
    fresh: bool = False,
    checkpoint_id: str | None = None,
) -> RunResult:
    """Run the planning graph on ``thread_id`` until it finishes or a question stays open.

    An unfinished run on the thread carries on from its last checkpoint (``inputs`` unused);
    a question it was paused at is asked first. With ``fresh`` the unfinished run is left
    behind instead (it stays in the thread's history) and ``inputs`` start a new one.
    ``checkpoint_id`` carries on from that checkpoint of the thread rather than its last
    (the run a chat's Ctrl-C stopped, after another plan ran on the thread). With ``reuse``, a
    finished plan on the thread that ``reuse(plan)`` accepts is returned without running.
    ``in_thread`` streams from a worker thread, so Ctrl-C in the caller's thread lands within
    a fraction of a second and stops the nodes and any smoke run they started
    (``stop_running_nodes``).

    One run per thread: with a SQLite checkpointer the thread is locked for the whole run
    (``thread_lock``); a thread another run holds is an InputError, or, with ``wait``, waited
    for.
    """
    on_wait = getattr(watcher, "waiting", None)
    start = thread_config(thread_id)
    if checkpoint_id is not None:
        start["configurable"]["checkpoint_id"] = checkpoint_id
    with thread_lock(checkpoint_file(graph), thread_id, wait=wait, on_wait=on_wait):
        return _run_locked(graph, inputs, thread_id, watcher, reuse, in_thread, fresh, start)


def checkpoint_file(graph: Any) -> Path | None:
    """The SQLite file of ``graph``'s checkpointer, or None (in memory, another kind)."""
    saver = getattr(graph, "checkpointer", None)
    conn = getattr(saver, "conn", None)
    if not isinstance(conn, sqlite3.Connection):
        return None
    with getattr(saver, "lock", None) or contextlib.nullcontext():
        rows = conn.execute("PRAGMA database_list").fetchall()
    file = next((str(row[2]) for row in rows if row[1] == "main"), "")
    return Path(file) if file else None


@contextlib.contextmanager
def open_checkpointer(db: Path) -> Iterator[Any]:
    """A LangGraph ``SqliteSaver`` on ``db``, its connection closed under the saver's lock.

    Graph nodes and LangGraph's own checkpoint writes use the connection from worker
    threads. When the caller's thread leaves early (Ctrl-C, SIGTERM, an error) those threads
    may still be inside a statement, and closing a SQLite connection another thread is using
    crashes the process. Every use of the saver's connection holds ``saver.lock``, so closing
    under it makes a late write fail with a Python error instead; the file stays consistent
    (each checkpoint is one transaction).
    """
    from langgraph.checkpoint.sqlite import SqliteSaver

    db.parent.mkdir(parents=True, exist_ok=True)
    saver = SqliteSaver(sqlite3.connect(str(db), check_same_thread=False))
    try:
        yield saver
    finally:
        with saver.lock:
            saver.conn.close()


def lock_path(db: Path, thread_id: str) -> Path:
    """The lock file of ``thread_id``: ``<db>.locks/<id>.lock`` next to the database."""
    digest = hashlib.sha256(thread_id.encode()).hexdigest()[:12]
    name = thread_id if THREAD_RE.fullmatch(thread_id) else "thread"
    return db.parent / f"{db.name}.locks" / f"{name}-{digest}.lock"


@contextlib.contextmanager
def thread_lock(
    db: Path | None,
    thread_id: str,
    *,
    wait: bool = False,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold ``thread_id`` for one run: an exclusive ``flock`` on its lock file (no db: no lock).

    The kernel drops the lock when the process ends, however it ends (SIGKILL included), so a
    killed run never leaves its thread locked. A thread held by another run (this process or
    another) is an InputError naming it, or with ``wait`` is polled until it is free
    (``on_wait(thread_id)`` is called once when the waiting starts).
    """
    if db is None:
        yield
        return
    path = lock_path(db, thread_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait:
                    raise InputError(
                        "--thread",
                        f"thread {thread_id} is already running; wait for that run to end "
                        "(plan --wait) or use another thread",
                    ) from None
                if on_wait is not None:
                    on_wait(thread_id)
                    on_wait = None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # releases the lock


def _run_locked(
    graph: Any,
    inputs: dict[str, Any] | None,
    thread_id: str,
    watcher: RunWatcher | None,
    reuse: Callable[[dict[str, Any]], bool] | None,
    in_thread: bool,
    fresh: bool,
    start: dict[str, Any],
) -> RunResult:
    watcher = watcher if watcher is not None else Watcher()
    config = thread_config(thread_id)
    snapshot = graph.get_state(start)
    resumed: tuple[str, ...] = () if fresh else tuple(snapshot.next)
    plan = (snapshot.values or {}).get("plan")
    if not resumed and reuse is not None and plan and reuse(dict(plan)):
        return RunResult(dict(snapshot.values))
    run_input: Any = inputs
    pending = snapshot.interrupts if resumed else ()
    if resumed:
        watcher.resumed(resumed)
        run_input = None
    while True:
        if pending:
            question = _question(pending[0].value)
            answer = watcher.ask(question)
            if answer is None:
                return RunResult(dict(snapshot.values), question, resumed)
            run_input = Command(resume=answer)
        with watcher.segment():
            for mode, chunk in _stream(graph, run_input, start, in_thread):
                if mode == "custom" and isinstance(chunk, dict):
                    watcher.event(chunk)
                elif mode == "updates" and isinstance(chunk, dict):
                    for node, update in chunk.items():
                        # __interrupt__: a question, asked below; None: the node raised, and
                        # the error follows from the stream.
                        if not node.startswith("__") and update is not None:
                            watcher.node_done(node)
        start = config  # from here on, the thread's newest checkpoint
        snapshot = graph.get_state(config)
        pending = snapshot.interrupts
        if not pending:
            return RunResult(dict(snapshot.values), None, resumed)


def plan_on_thread(
    settings: Settings,
    inputs: dict[str, Any] | None,
    thread_id: str,
    watcher: RunWatcher | None = None,
    *,
    wait: bool = False,
) -> RunResult:
    """``run_plan`` on the graph ``settings`` describe, checkpointed in its SQLite database.

    The graph streams from a worker thread, so the caller's thread stays free for Ctrl-C and
    SIGTERM wherever the run is; ``wait`` waits for another run that holds the thread.
    """
    from agents.chat_models import load_chat_model
    from graphs.graph import build_graph

    model = load_chat_model(settings)
    with open_checkpointer(settings.checkpoint_db) as saver:
        graph = build_graph(model, saver, settings)
        return run_plan(graph, inputs, thread_id, watcher, in_thread=True, wait=wait)


def _stream(graph: Any, run_input: Any, config: dict[str, Any], in_thread: bool) -> Iterator[Any]:
    stream = graph.stream(run_input, config, stream_mode=["updates", "custom"], durability="sync")
    if not in_thread:
        yield from stream
        return
    chunks: queue.Queue[Any] = queue.Queue()
    finished = object()

    def pump() -> None:
        try:
            for item in stream:
                chunks.put(item)
            chunks.put(finished)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, re-raised
            chunks.put(exc)

    worker = threading.Thread(target=pump, name="graph-run", daemon=True)
    worker.start()
    try:
        while True:
            try:
                item = chunks.get(timeout=0.2)
            except queue.Empty:
                continue
            if item is finished:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    except KeyboardInterrupt:
        stop_running_nodes()
        worker.join(timeout=10.0)
        raise
    worker.join()


def stop_running_nodes(timeout_s: float = 20.0) -> None:
    """Stop the graph's node threads after Ctrl-C, and any smoke run they started.

    With ``custom`` streaming LangGraph runs each node in a worker thread, so Ctrl-C reaches
    only the main thread. Each worker still inside our node code (agents/) gets a
    KeyboardInterrupt of its own, raised at its next bytecode (the smoke runner polls, so
    within a poll interval): the smoke runner's ``finally`` then kills its process groups, as
    it does under a plain Ctrl-C. Whatever child process group is left after that (a worker
    that did not stop in time) is killed here, TERM then KILL.
    """
    main = threading.main_thread().ident

    def node_threads() -> list[int]:
        found = []
        for tid, frame in sys._current_frames().items():
            f: Any = frame
            while tid != main and f is not None:
                if os.path.abspath(f.f_code.co_filename).startswith(AGENTS_DIR):
                    found.append(tid)
                    break
                f = f.f_back
        return found

    for tid in node_threads():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(tid), ctypes.py_object(KeyboardInterrupt)
        )
    deadline = time.monotonic() + timeout_s
    while node_threads() and time.monotonic() < deadline:
        time.sleep(0.1)
    import psutil

    # Launchers lead their own process groups (the smoke runner starts them in new sessions).
    groups = [c.pid for c in psutil.Process().children() if _leads_group(c.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        if groups and sig == signal.SIGTERM:
            time.sleep(2.0)


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def list_threads(db: Path) -> list[str]:
    """The thread ids in the checkpoint database, most recently written first."""
    if not db.is_file():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        try:
            rows = conn.execute(
                "SELECT thread_id, MAX(checkpoint_id) AS last FROM checkpoints "
                "GROUP BY thread_id ORDER BY last DESC"
            ).fetchall()
        except sqlite3.OperationalError:  # no checkpoint table yet
            return []
    return [str(row[0]) for row in rows]
