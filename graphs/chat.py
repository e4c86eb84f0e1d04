"""The chat REPL behind ``python app.py chat``: plan requests, follow-ups and slash commands.

A message is a planning request; a follow-up ("what if I only had 4 GPUs?") re-plans with the
last brief, changed by what the follow-up says (``tools.intake.follow_up.follow_up_fields``). Every
plan runs on one checkpointed thread (LangGraph SqliteSaver) through graphs/run.py, so
``/resume ID`` picks a chat up again. A message is always a new request (or a follow-up to the
last finished plan), even after Ctrl-C stopped a plan; ``/resume`` is the way back to that one. What the terminal shows and how lines are read is
graphs/terminal.py.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from agents.chat_models import load_chat_model
from graphs.graph import build_graph as default_graph
from graphs.run import THREAD_RE, check_thread_id, list_threads, open_checkpointer, thread_config
from graphs.terminal import ChatWatcher, prompt_reader, stdin_reader
from tools.artifacts.request_lists import chat_request_lines
from tools.artifacts.save import save_plan
from tools.artifacts.text import summary_lines
from tools.core.errors import InputError, TrainwrightError
from tools.core.settings import Settings

# A message that reads as a change to the last plan, not as a new request.
_FOLLOW_UP_RE = re.compile(
    r"^\s*(?:what if|what about|how about|and\b|but\b|instead\b|now\b|same\b|only\b|with\b|"
    r"use\b|try\b|make it\b|then\b)",
    re.I,
)

# "plan it" after a sizing answer: the plan of the sizing's pick (intake already made it).
_PLAN_IT_RE = re.compile(
    r"^\s*(?:ok(?:ay)?,?\s*)?(?:plan (?:it|that|the pick|this)|go (?:with|for) (?:it|that|the pick)"
    r"|do it|就这个|按这个规划)\s*[.!]?\s*$",
    re.I,
)

GraphFactory = Callable[[Any, Any, Settings], Any]
"""``(chat_model, checkpointer, settings) -> compiled graph``, e.g. ``graphs.build_graph``."""

HELP = """\
Type what you want to train, e.g. 'fine-tune llama-3-8b on 8 A100s'. A follow-up such as
'what if I only had 4 GPUs?' re-plans the last brief with what it changes; 'undo' returns
to the plan before. A question ('why 4 nodes?') changes nothing: the report says why.
Multi-line input: end a line with '\\' (or press Esc then Enter on a terminal).
  /help          this help
  /brief         the current brief as YAML
  /hardware      the last plan's hardware profile (or the brief's hardware)
  /config        the DeepSpeed JSON of the last plan
  /save DIR      copy the last plan's report, plan.json, DeepSpeed config and launch files to DIR
  /threads       the chat threads in the checkpoint database
  /resume        continue the plan Ctrl-C stopped (a new message starts a new request instead)
  /resume ID     continue thread ID (its brief and plan become the current ones)
  /llm SPEC      switch the chat model: offline, or provider:model (e.g. openai:gpt-4o-mini)
  /quit          leave (Ctrl-D too); Ctrl-C stops a running plan or smoke run"""


class ChatSession:
    """One chat: the current thread, brief and plan, and the commands that act on them."""

    def __init__(
        self,
        settings: Settings,
        build_graph: GraphFactory = default_graph,
        *,
        thread: str | None = None,
        smoke: bool | None = None,
        interactive: bool = False,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        """Set up the session; the graph and checkpointer open in ``run``."""
        if thread is not None:
            check_thread_id(thread, "--thread")
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
        # The briefs and plans before each new plan of this session: what "undo" returns to.
        self._history: list[tuple[dict[str, Any] | None, dict[str, Any]]] = []
        self._last_brief: dict[str, Any] | None = None
        self.graph: Any = None
        # The checkpoint where Ctrl-C stopped a plan of this thread: what ``/resume`` continues.
        self._stopped: str | None = None
        self._saver: Any = None
        self._model: Any = None
        self._read: Callable[[str], str | None] = stdin_reader()

    # ---- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Read messages until /quit or end of input; returns the exit code (0)."""
        self.settings.home.mkdir(parents=True, exist_ok=True)
        if self.interactive:
            self._read = prompt_reader(self.settings.home / "chat_history")
        with open_checkpointer(self.settings.checkpoint_db) as saver:
            self._saver = saver
            self._model = load_chat_model(self.settings)
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
        from tools.intake.brief import brief_from_dict, request_fields
        from tools.intake.chat_words import is_undo, nothing_changed, question_reply
        from tools.intake.follow_up import dropped_wish_words, follow_up_fields, follow_up_goal
        from tools.research.model_catalog import list_models

        if self.plan is not None and self.plan.get("sizing") and _PLAN_IT_RE.match(text):
            from tools.artifacts.sizing_text import plan_it_line

            self.say(plan_it_line(self.plan))
            return
        if self.brief is not None and (asked := question_reply(text, self.plan)) is not None:
            self.say(asked, "yellow")  # "why 4 nodes?" asks; it does not re-plan on 4 nodes
            return
        if is_undo(text):
            self._undo()
            return
        models = list_models()
        run_input: dict[str, Any]
        if self.brief is not None and (
            _FOLLOW_UP_RE.match(text) or "model" not in request_fields(text, models)
        ):
            changes = follow_up_fields(text, self.brief, models)
            if not changes:
                self.say(nothing_changed(text, self.brief), "yellow")
                return
            merged = {**self.brief, **changes, "goal": follow_up_goal(self.brief.get("goal"), text)}
            brief_from_dict(merged)  # one clear line here, before a run starts
            said = ", ".join(f"{k} {self.brief.get(k)!r} -> {v!r}" for k, v in changes.items())
            self.say(f"follow-up: {said}", "dim")
            if dropped := dropped_wish_words(text, changes):
                self.say(_not_carried(dropped, self.brief, text), "yellow")
            run_input = {"request": None, "brief": merged}
        else:
            run_input = {"request": text, "brief": None}
        inputs = {**run_input, "overrides": self.overrides, "out_dir": str(self._out_dir())}
        # Fresh: a plan Ctrl-C stopped (or a question left unanswered) is not carried on here.
        self._plan(inputs, fresh=True)

    def _undo(self) -> None:
        """Return to the brief and plan before the last plan of this session, or say why not."""
        if not self._history:
            self.say("nothing to undo: no earlier plan in this session", "yellow")
            return
        self.brief, self.plan = self._history.pop()
        self._last_brief = self.brief
        where = ((self.plan or {}).get("report") or {}).get("markdown")
        self.say(f"undone: back to the plan before (report: {where}); /brief shows its brief")

    def _out_dir(self) -> Path:
        """A fresh directory per plan of this thread, so a follow-up keeps the earlier report."""
        base = self.settings.out_dir / self.thread
        n = 1
        while (base / f"plan-{n}").exists():
            n += 1
        return base / f"plan-{n}"

    def _plan(
        self, run_input: Any, *, fresh: bool = False, checkpoint_id: str | None = None
    ) -> None:
        """Run the graph on this thread, asking intake's questions, and show the result.

        ``fresh`` starts ``run_input`` as a new run whatever the thread left unfinished;
        ``checkpoint_id`` carries on from that checkpoint (``/resume`` after Ctrl-C).
        """
        from graphs.run import run_plan
        from tools.smoke import clear_stop

        watcher = ChatWatcher(self.log, self.interactive, self._ask, self._resuming)
        # A Ctrl-C during an earlier plan stopped its smoke run and barred new ones; that
        # plan is over, so this one may run its own.
        clear_stop()
        try:
            result = run_plan(
                self.graph,
                run_input,
                self.thread,
                watcher,
                in_thread=True,
                fresh=fresh,
                checkpoint_id=checkpoint_id,
            )
        except KeyboardInterrupt:
            snapshot = self.graph.get_state(thread_config(self.thread))
            if snapshot.next:
                self._stopped = snapshot.config["configurable"].get("checkpoint_id")
            self.say(
                "cancelled; any smoke run was stopped. /resume continues this plan; a new "
                "message is a new request (or a follow-up to the last finished plan)",
                "yellow",
            )
            return
        if checkpoint_id is not None:
            self._stopped = None
        if result.question is not None:
            self.say("no answer; the request is dropped", "yellow")
            return
        self._take(result.values)

    def _ask(self, question: dict[str, Any]) -> str | None:
        """Intake's question, on stdout; the answer from the prompt (None: none given)."""
        self.say(f"[intake] {question.get('question')}", "bold")
        answer = self._read("answer> ")
        return answer.strip() if answer and answer.strip() else None

    def _resuming(self, nodes: tuple[str, ...]) -> None:
        # Killed (or stopped) mid-graph: the nodes that finished are checkpointed, so only the
        # one that was running starts again; the same line as ``plan --thread``.
        self.say(f"resuming thread {self.thread} at {', '.join(nodes)}")

    def _take(self, values: dict[str, Any]) -> None:
        """Make a finished run's brief and plan the current ones, and summarise the plan."""
        if values.get("brief"):
            self.brief = values["brief"]
        plan = values.get("plan")
        if not plan:
            self.say("the run finished without a plan", "red")
            return
        if self.plan is not None:
            self._history.append((self._last_brief, self.plan))
        self._last_brief, self.plan = self.brief, plan
        for line in summary_lines(plan):
            self.say(line, "bold" if line.startswith("plan:") else "")
        # What was read, assumed and not done, after every plan (the report opens with them too).
        for line in chat_request_lines(plan):
            self.say(line, "dim" if line.startswith("  ") else "")

    def _load_thread(self, announce: bool = True) -> None:
        """Take the current thread's brief and plan; continue it if a run was left unfinished."""
        snapshot = self.graph.get_state(thread_config(self.thread))
        values = snapshot.values or {}
        if not values:
            if announce:
                self.say(f"thread {self.thread} is new")
            return
        self.brief, self.plan = values.get("brief"), values.get("plan")
        self._last_brief, self._history = self.brief, []  # undo stays within one thread
        if snapshot.next:
            self._plan(None)
        elif self.plan:
            self.say(f"thread {self.thread}: last plan")
            for line in summary_lines(self.plan):
                self.say(line)

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
            from tools.artifacts.text import profile_text
            from tools.research.hardware import describe_local_machine

            self.out.print(
                profile_text(describe_local_machine(self.settings.out_dir)), markup=False
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
        """/resume: continue the plan Ctrl-C stopped; /resume ID: switch to thread ID."""
        if not arg or arg == self.thread:
            if self._stopped is not None:
                self._plan(None, checkpoint_id=self._stopped)
            elif self.graph.get_state(thread_config(self.thread)).next:
                self._plan(None)  # a run left unfinished on this thread (e.g. the chat was killed)
            else:
                self.say(
                    f"nothing to resume on thread {self.thread}: no plan was stopped "
                    "(/resume ID continues another thread; /threads lists them)"
                )
            return True
        if not THREAD_RE.fullmatch(arg):
            raise InputError("/resume", "give a thread id (see /threads)")
        if arg not in list_threads(self.settings.checkpoint_db):
            raise InputError("/resume", f"no thread {arg!r} in the checkpoint database")
        self.thread, self.brief, self.plan, self._stopped = arg, None, None, None
        self._load_thread()
        return True

    def cmd_llm(self, arg: str) -> bool:
        """/llm SPEC: switch the chat model (the next plan uses it)."""
        if not arg:
            self.say(f"model: {self.settings.llm}")
            return True
        settings = self.settings.with_(llm=arg)
        model = load_chat_model(settings)  # an unknown provider fails here, with one line
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


def run_chat(settings: Settings, *, thread: str | None = None, smoke: bool | None = None) -> int:
    """Start the chat: prompt_toolkit and rich on a terminal, plain lines when stdin is piped."""
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    return ChatSession(settings, thread=thread, smoke=smoke, interactive=interactive).run()


def _not_carried(words: list[str], brief: dict[str, Any], text: str) -> str:
    """The line naming a changing follow-up's wishes that the re-plan does not check."""
    named = ", ".join(repr(w) for w in words)
    request = f"{brief.get('task')} {brief.get('model')} on {brief.get('hardware')} {text}"
    return (
        f"not carried: {named}: a follow-up changes the last brief's fields only, so this "
        f"plan does not check them; ask it as a request, e.g. {request.strip()!r}"
    )
