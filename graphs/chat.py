"""The chat REPL behind ``python app.py chat``: plan requests, follow-ups and slash commands.

A message is a planning request; a follow-up ("what if I only had 4 GPUs?") re-plans with the
last brief, changed by what the follow-up says (``tools.brief.follow_up_fields``). Every plan
runs on one checkpointed thread (LangGraph SqliteSaver), so ``/resume ID`` picks a chat up
again. On a terminal, input comes from prompt_toolkit (history, multi-line) and output from
rich (a spinner naming the working agent and tool, a progress bar for smoke runs); on piped
stdin, lines are read plainly and events go to stderr as plain lines, for scripting.

The graph is built by a factory the caller passes in (``app.py`` passes
``graphs.build_graph``), which keeps the imports pointing one way (app -> graphs -> agents).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from tools.core.errors import InputError, TrainwrightError
from tools.core.files import copy_atomic, write_atomic
from tools.core.settings import Settings

THREAD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# A message that reads as a change to the last plan, not as a new request.
_FOLLOW_UP_RE = re.compile(
    r"^\s*(?:what if|what about|how about|and\b|but\b|instead\b|now\b|same\b|only\b|with\b|"
    r"use\b|try\b|make it\b|then\b)",
    re.I,
)
_STEP_RE = re.compile(r"^step (\d+)/(\d+)\b(.*)$")

GraphFactory = Callable[[Any, Any, Settings], Any]
"""``(chat_model, checkpointer, settings) -> compiled graph``, e.g. ``graphs.build_graph``."""

HELP = """\
Type what you want to train, e.g. 'fine-tune llama-3-8b on 8 A100s'. A follow-up such as
'what if I only had 4 GPUs?' re-plans the last brief with what it changes.
Multi-line input: end a line with '\\' (or press Esc then Enter on a terminal).
  /help          this help
  /brief         the current brief as YAML
  /hardware      the last plan's hardware profile (or the brief's hardware)
  /config        the DeepSpeed JSON of the last plan
  /save DIR      copy the last plan's report, plan.json, DeepSpeed config and launch files to DIR
  /threads       the chat threads in the checkpoint database
  /resume ID     continue thread ID (its brief and plan become the current ones)
  /llm SPEC      switch the chat model: offline, or provider:model (e.g. openai:gpt-4o-mini)
  /quit          leave (Ctrl-D too); Ctrl-C stops a running plan or smoke run"""


class _Events:
    """Shows the graph's stream events: plain lines, or rich live progress on a terminal."""

    def __init__(self, console: Console, live: bool) -> None:
        self.console = console
        self.live = live
        self._progress: Any = None
        self._status: Any = None
        self._smoke: Any = None
        self._last = time.perf_counter()

    def __enter__(self) -> _Events:
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
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def line(self, agent: str, text: str, style: str = "") -> None:
        """Print one event line (above the live display on a terminal)."""
        self.console.print(Text(f"[{agent}] ", style="bold cyan") + Text(text, style=style))

    def event(self, chunk: dict[str, Any]) -> None:
        """One custom event ``{"agent", "kind", "text", ...}`` (agents/roles.py ``Events``)."""
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
        if kind == "start":
            self.line(agent, "started", "dim")
        elif kind == "tool_error":
            self.line(agent, f"! {text}", "red")
        elif kind == "progress":
            self.line(agent, f"  {text}", "" if step is None else "dim")
        elif kind == "answer":
            self.line(agent, f"answer: {text}")
        else:
            self.line(agent, text, "yellow" if kind == "tool" else "")

    def node_done(self, node: str) -> None:
        """A node finished (its checkpoint is on disk)."""
        now = time.perf_counter()
        self.line(node, f"done in {now - self._last:.1f} s", "green")
        self._last = now
        if self._progress is not None and self._smoke is not None:
            self._progress.remove_task(self._smoke)
            self._smoke = None


class ChatSession:
    """One chat: the current thread, brief and plan, and the commands that act on them."""

    def __init__(
        self,
        settings: Settings,
        build_graph: GraphFactory,
        *,
        thread: str | None = None,
        smoke: bool | None = None,
        interactive: bool = False,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        """Set up the session; the graph and checkpointer open in ``run``."""
        if thread is not None and not THREAD_RE.fullmatch(thread):
            raise InputError("--thread", "use letters, digits, '.', '_' or '-' (at most 128)")
        self.settings = settings
        self.build_graph = build_graph
        self.thread = thread or f"chat-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"
        self.overrides: dict[str, Any] = {} if smoke is None else {"smoke": smoke}
        self.interactive = interactive
        self.out = Console(file=out or sys.stdout, highlight=False, soft_wrap=True)
        # On a terminal events share the screen with the answers; piped, they go to stderr so
        # that stdout holds only the answers (the plan summary, /config's JSON).
        self.log = (
            self.out
            if interactive
            else Console(file=err or sys.stderr, highlight=False, soft_wrap=True)
        )
        self.brief: dict[str, Any] | None = None
        self.plan: dict[str, Any] | None = None
        self.graph: Any = None
        self._saver: Any = None
        self._model: Any = None
        self._read: Callable[[str], str | None] = _stdin_reader()

    # ---- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Read messages until /quit or end of input; returns the exit code (0)."""
        from langgraph.checkpoint.sqlite import SqliteSaver

        self.settings.home.mkdir(parents=True, exist_ok=True)
        self.settings.checkpoint_db.parent.mkdir(parents=True, exist_ok=True)
        if self.interactive:
            self._read = _prompt_reader(self.settings.home / "chat_history")
        with SqliteSaver.from_conn_string(str(self.settings.checkpoint_db)) as saver:
            self._saver = saver
            self._model = self._load_model(self.settings)
            self.graph = self.build_graph(self._model, saver, self.settings)
            self.say(f"trainwright chat, thread {self.thread}; /help for commands", "dim")
            self._load_thread(announce=False)
            while True:
                line = self._read("you> ")
                if line is None:
                    break
                if not line.strip():
                    continue
                try:
                    if not self.handle(line.strip()):
                        break
                except TrainwrightError as exc:
                    self.say(f"error: {exc}", "red")
        return 0

    def handle(self, line: str) -> bool:
        """Act on one message or slash command; False ends the session."""
        if line.startswith("/"):
            name, _, arg = line.partition(" ")
            command = _COMMANDS.get(name.lower())
            if command is None:
                self.say(f"unknown command {name}; /help lists them", "red")
                return True
            return command(self, arg.strip())
        self.request(line)
        return True

    def say(self, text: str, style: str = "") -> None:
        """Print one answer line (stdout)."""
        self.out.print(Text(text, style=style if self.interactive else ""))

    # ---- planning ------------------------------------------------------------------------

    def request(self, text: str) -> None:
        """Plan a new request, or re-plan the last brief with a follow-up's changes."""
        from tools.intake.brief import brief_from_dict, follow_up_fields, request_fields
        from tools.research.model_catalog import list_models

        models = list_models()
        run_input: dict[str, Any]
        if self.brief is not None and (
            _FOLLOW_UP_RE.match(text) or "model" not in request_fields(text, models)
        ):
            changes = follow_up_fields(text, self.brief, models)
            if not changes:
                self.say(
                    "that follow-up changes nothing I can read (try e.g. 'what if I only had "
                    "4 GPUs?', 'with seq len 8192', or a new request naming a model)",
                    "yellow",
                )
                return
            merged = {**self.brief, **changes}
            brief_from_dict(merged)  # one clear line here, before a run starts
            said = ", ".join(f"{k} {self.brief.get(k)!r} -> {v!r}" for k, v in changes.items())
            self.say(f"follow-up: {said}", "dim")
            run_input = {"request": None, "brief": merged}
        else:
            run_input = {"request": text, "brief": None}
        self._plan({**run_input, "overrides": self.overrides, "out_dir": str(self._out_dir())})

    def _out_dir(self) -> Path:
        """A fresh directory per plan of this thread, so a follow-up keeps the earlier report."""
        base = self.settings.out_dir / self.thread
        n = 1
        while (base / f"plan-{n}").exists():
            n += 1
        return base / f"plan-{n}"

    def _plan(self, run_input: Any) -> None:
        """Run the graph on this thread, asking intake's questions, and show the result."""
        from langgraph.types import Command

        config: dict[str, Any] = {"configurable": {"thread_id": self.thread}}
        try:
            while True:
                self._stream(run_input, config)
                snapshot = self.graph.get_state(config)
                if not snapshot.interrupts:
                    break
                value = snapshot.interrupts[0].value
                question = value.get("question") if isinstance(value, dict) else str(value)
                self.say(f"[intake] {question}", "bold")
                answer = self._read("answer> ")
                if answer is None or not answer.strip():
                    self.say("no answer; the request is dropped", "yellow")
                    return
                run_input = Command(resume=answer.strip())
        except KeyboardInterrupt:
            self.say(
                f"cancelled; any smoke run was stopped. /resume {self.thread} continues this "
                "plan, a new message starts another",
                "yellow",
            )
            return
        self._take(snapshot.values)

    def _stream(self, run_input: Any, config: dict[str, Any]) -> None:
        """Run the graph, showing its events; Ctrl-C stops it and any smoke run it started.

        The graph runs in a thread and the main thread waits on a queue with a timeout, so
        Ctrl-C lands within a fraction of a second whatever LangGraph is waiting on.
        """
        chunks: queue.Queue[Any] = queue.Queue()
        finished = object()

        def pump() -> None:
            try:
                for item in self.graph.stream(
                    run_input, config, stream_mode=["updates", "custom"], durability="sync"
                ):
                    chunks.put(item)
                chunks.put(finished)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, re-raised
                chunks.put(exc)

        worker = threading.Thread(target=pump, name="chat-graph", daemon=True)
        with _Events(self.log, live=self.interactive) as events:
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
                    mode, chunk = item
                    if mode == "custom" and isinstance(chunk, dict):
                        events.event(chunk)
                    elif mode == "updates" and isinstance(chunk, dict):
                        for node, update in chunk.items():
                            if not node.startswith("__") and update is not None:
                                events.node_done(node)
            except KeyboardInterrupt:
                stop_running_nodes()
                worker.join(timeout=10.0)
                raise
        worker.join()

    def _take(self, values: dict[str, Any]) -> None:
        """Make a finished run's brief and plan the current ones, and summarise the plan."""
        if values.get("brief"):
            self.brief = values["brief"]
        plan = values.get("plan")
        if not plan:
            self.say("the run finished without a plan", "red")
            return
        self.plan = plan
        for line in summary(plan):
            self.say(line, "bold" if line.startswith("plan:") else "")

    def _load_thread(self, announce: bool = True) -> None:
        """Take the current thread's brief and plan; continue it if a run was left unfinished."""
        config: dict[str, Any] = {"configurable": {"thread_id": self.thread}}
        snapshot = self.graph.get_state(config)
        values = snapshot.values or {}
        if not values:
            if announce:
                self.say(f"thread {self.thread} is new")
            return
        self.brief, self.plan = values.get("brief"), values.get("plan")
        if snapshot.next:
            # Killed (or stopped) mid-graph: the nodes that finished are checkpointed, so only
            # the one that was running starts again; the same line as ``plan --thread``.
            self.say(f"resuming thread {self.thread} at {', '.join(snapshot.next)}")
            self._plan(None)
        elif self.plan:
            self.say(f"thread {self.thread}: last plan")
            for line in summary(self.plan):
                self.say(line)

    def _load_model(self, settings: Settings) -> Any:
        from agents.chat_models import load_chat_model

        return load_chat_model(
            settings.llm,
            base_url=settings.base_url,
            api_key=settings.api_key,
            timeout_s=settings.llm_timeout_s,
        )

    # ---- slash commands ------------------------------------------------------------------

    def cmd_help(self, arg: str) -> bool:
        """/help."""
        self.out.print(HELP, markup=False)
        return True

    def cmd_quit(self, arg: str) -> bool:
        """/quit."""
        return False

    def cmd_brief(self, arg: str) -> bool:
        """/brief: the current brief as YAML."""
        import yaml

        if self.brief is None:
            self.say("no brief yet; describe what to train")
        else:
            self.out.print(yaml.safe_dump(self.brief, sort_keys=False).rstrip(), markup=False)
        return True

    def cmd_hardware(self, arg: str) -> bool:
        """/hardware: the last plan's hardware, else the brief's spec resolved."""
        import yaml

        hardware = (self.plan or {}).get("hardware")
        if hardware is None and self.brief is not None:
            from tools.research.hardware import parse_hardware

            hw = parse_hardware(
                self.brief.get("hardware") or "local", self.brief.get("interconnect")
            )
            hardware = hw.model_dump(mode="json")
        if hardware is None:
            from tools.research.hardware import describe_local_machine, format_profile

            self.out.print(
                format_profile(describe_local_machine(self.settings.out_dir)), markup=False
            )
        else:
            self.out.print(yaml.safe_dump(hardware, sort_keys=False).rstrip(), markup=False)
        return True

    def cmd_config(self, arg: str) -> bool:
        """/config: the DeepSpeed JSON of the last plan."""
        if self.plan is None:
            self.say("no plan yet; describe what to train")
        elif self.plan.get("deepspeed_config") is None:
            primary = (self.plan.get("framework") or {}).get("primary")
            self.say(f"the last plan uses no DeepSpeed config (framework: {primary})")
        else:
            text = json.dumps(self.plan["deepspeed_config"], indent=2)
            if self.interactive:
                self.out.print_json(text)
            else:
                self.out.print(text, markup=False)
        return True

    def cmd_save(self, arg: str) -> bool:
        """/save DIR: copy the last plan's files into DIR."""
        if self.plan is None:
            self.say("no plan yet; nothing to save")
            return True
        copied = save_plan(self.plan, arg)
        self.say(f"saved {len(copied)} file(s) to {arg}: {', '.join(p.name for p in copied)}")
        return True

    def cmd_threads(self, arg: str) -> bool:
        """/threads: the thread ids in the checkpoint database, newest first."""
        threads = list_threads(self.settings.checkpoint_db)
        if not threads:
            self.say("no threads yet")
        for thread in threads:
            self.say(f"{'*' if thread == self.thread else ' '} {thread}")
        return True

    def cmd_resume(self, arg: str) -> bool:
        """/resume ID: switch to thread ID."""
        if not THREAD_RE.fullmatch(arg):
            raise InputError("/resume", "give a thread id (see /threads)")
        if arg not in list_threads(self.settings.checkpoint_db):
            raise InputError("/resume", f"no thread {arg!r} in the checkpoint database")
        self.thread, self.brief, self.plan = arg, None, None
        self._load_thread()
        return True

    def cmd_llm(self, arg: str) -> bool:
        """/llm SPEC: switch the chat model (the next plan uses it)."""
        if not arg:
            self.say(f"model: {self.settings.llm}")
            return True
        settings = self.settings.with_(llm=arg)
        model = self._load_model(settings)  # an unknown provider fails here, with one line
        self.settings, self._model = settings, model
        self.graph = self.build_graph(model, self._saver, settings)
        self.say(f"model: {arg}")
        return True


_COMMANDS: dict[str, Callable[[ChatSession, str], bool]] = {
    "/help": ChatSession.cmd_help,
    "/?": ChatSession.cmd_help,
    "/brief": ChatSession.cmd_brief,
    "/hardware": ChatSession.cmd_hardware,
    "/config": ChatSession.cmd_config,
    "/save": ChatSession.cmd_save,
    "/threads": ChatSession.cmd_threads,
    "/resume": ChatSession.cmd_resume,
    "/llm": ChatSession.cmd_llm,
    "/quit": ChatSession.cmd_quit,
    "/exit": ChatSession.cmd_quit,
}


def summary(plan: dict[str, Any]) -> list[str]:
    """A few lines on a plan: what, where, which setup, smoke and review verdicts, report path."""
    brief, memory = plan.get("brief") or {}, plan.get("memory")
    model = brief.get("model")
    name = model if isinstance(model, str) else "custom model" if model else brief.get("task")
    setup = "nothing to train"
    if memory:
        setup = (
            f"{memory['chosen']}, micro-batch {memory.get('micro_batch_size')} x accumulation "
            f"{memory.get('gradient_accumulation_steps')}"
        )
    smoke, review = plan.get("smoke_test") or {}, plan.get("review") or {}
    reason = smoke.get("reason")
    return [
        f"plan: {name} on {brief.get('hardware')}: {plan['framework']['primary']}, {setup}",
        f"smoke test: {smoke.get('status')}" + (f" ({reason.splitlines()[0]})" if reason else ""),
        f"review: {review.get('verdict')} after {review.get('rounds')} round(s)",
        f"report: {(plan.get('report') or {}).get('markdown')}",
    ]


def save_plan(plan: dict[str, Any], directory: str) -> list[Path]:
    """Copy a plan's report, plan.json, DeepSpeed config and launch files into ``directory``.

    Each file keeps its base name and lands directly in ``directory``: a destination that
    would resolve anywhere else (a symlink out of it) is refused, as is a path with NUL.
    """
    if not directory.strip():
        raise InputError("/save", "give a directory, e.g. /save saved/llama")
    if "\x00" in directory:
        raise InputError("/save", "the path contains a NUL character")
    target = Path(directory).expanduser()
    if target.exists() and not target.is_dir():
        raise InputError("/save", f"{target} exists and is not a directory")
    sources: dict[str, Path] = {}
    for path in (plan.get("report") or {}).values():
        if path:
            sources[Path(path).name] = Path(path)
    for path in ((plan.get("launch") or {}).get("files") or {}).values():
        sources[Path(path).name] = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    root = target.resolve()
    if plan.get("deepspeed_config") is not None and "ds_config.json" not in sources:
        write_atomic(root / "ds_config.json", json.dumps(plan["deepspeed_config"], indent=2))
    copied = []
    for name, source in sorted(sources.items()):
        dest = root / name
        if dest.resolve().parent != root or dest.is_symlink():
            raise InputError("/save", f"{dest} would be written outside {root}")
        if not source.is_file():
            continue
        copy_atomic(source, dest)  # keeps launch scripts executable
        copied.append(dest)
    return copied


def stop_running_nodes(timeout_s: float = 20.0) -> None:
    """Stop the graph's node threads after Ctrl-C, and any smoke run they started.

    With ``custom`` streaming LangGraph runs each node in a worker thread, so Ctrl-C reaches
    only the main thread. Each worker still inside our node code (agents/roles.py) gets a
    KeyboardInterrupt of its own, raised at its next bytecode (the smoke runner polls, so
    within a poll interval): the smoke runner's ``finally`` then kills its process groups, as
    it does under a plain Ctrl-C. Whatever child process group is left after that (a worker
    that did not stop in time) is killed here, TERM then KILL.
    """
    import ctypes
    import signal

    roles = str(Path(__file__).parents[1] / "agents" / "roles.py")
    main = threading.main_thread().ident

    def node_threads() -> list[int]:
        found = []
        for tid, frame in sys._current_frames().items():
            f: Any = frame
            while tid != main and f is not None:
                if f.f_code.co_filename == roles:
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

    # Launchers lead their own process groups (tools/smoke/supervise.py starts them in new sessions).
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


def _joined(lines: Iterator[str]) -> str | None:
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


def _stdin_reader() -> Callable[[str], str | None]:
    """Messages from piped stdin, one per line (a trailing backslash continues it)."""

    def lines() -> Iterator[str]:
        while True:
            line = sys.stdin.readline()
            if not line:
                return
            yield line

    def read(prompt: str) -> str | None:
        return _joined(lines())

    return read


def _prompt_reader(history: Path) -> Callable[[str], str | None]:
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


def run_chat(
    settings: Settings,
    build_graph: GraphFactory,
    *,
    thread: str | None = None,
    smoke: bool | None = None,
) -> int:
    """Start the chat: prompt_toolkit and rich on a terminal, plain lines when stdin is piped."""
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    return ChatSession(
        settings, build_graph, thread=thread, smoke=smoke, interactive=interactive
    ).run()
