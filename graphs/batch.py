"""Batch reports: many briefs, one planning-graph run each, and an index that compares them.

``python app.py report PATHS... --out DIR`` lands here. Each brief becomes ``DIR/<name>/`` with
what ``plan`` writes for one brief (report.md, report.html with its charts, plan.json,
ds_config.json, launch files); ``DIR/index.md`` and ``DIR/index.html`` hold one comparison
table (tools/artifacts/index.py).

A brief is skipped when its inputs hash (brief bytes, the flags that change the plan, and the
code version) matches the one stored beside its last good report. Briefs run on a thread
pool; smoke runs take a lock, so at most one trains at a time (they share the CPU ranks).
Two batches into one ``DIR`` run one after the other (``tools.core.outputs.hold``): the second
says that it waits, then finds the first's reports unchanged, so every count it prints is true.
A brief folder that is a symbolic link (or a file) is refused before any work.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from graphs.run import Watcher, open_checkpointer, run_plan
from tools.artifacts.index import INDEX_FILES, BriefOutcome, index_row, write_index
from tools.core import imports
from tools.core.errors import InputError, shown
from tools.core.outputs import claim, hold, remove_file, subfolder, write_file
from tools.core.settings import Settings
from tools.intake.brief_files import BriefJob, find_briefs, folder_note
from tools.smoke import stop_requested

STAMP = ".batch-inputs.json"
ROOT = Path(__file__).resolve().parents[1]
# Source folders whose content is the "code version" of a plan.
CODE_DIRS = ("agents", "graphs", "tools", "prompts", "knowledge")
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".md", ".json")


_code_hash: str | None = None


def code_version() -> str:
    """A hash of the package's source and data (agents, graphs, tools, prompts, knowledge)."""
    global _code_hash
    if _code_hash is None:
        h = hashlib.sha256()
        for folder in CODE_DIRS:
            for f in sorted((ROOT / folder).rglob("*")):
                if f.is_file() and f.suffix in CODE_SUFFIXES and "__pycache__" not in f.parts:
                    h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
        _code_hash = h.hexdigest()
    return _code_hash


def inputs_hash(path: Path, flags: dict[str, Any]) -> str:
    """The hash that decides a rerun: brief bytes, the flags that change the plan, code version."""
    h = hashlib.sha256(path.read_bytes())
    h.update(json.dumps(flags, sort_keys=True).encode())
    h.update(code_version().encode())
    return h.hexdigest()


class _BriefWatcher(Watcher):
    """One brief's run, shown on the batch's progress: node steps and where a resume starts."""

    def __init__(self, progress: _Progress, name: str) -> None:
        self.progress, self.name = progress, name

    def node_done(self, node: str) -> None:
        """A node of this brief's graph finished."""
        self.progress.step(self.name, node)

    def resumed(self, nodes: tuple[str, ...]) -> None:
        """An unfinished run of the same inputs carries on."""
        self.progress.resumed(self.name, ", ".join(nodes))


def plan_one(
    job: BriefJob,
    out: Path,
    graph: Any,
    thread: str,
    smoke: bool | None,
    smoke_lock: threading.Lock,
    watcher: Watcher,
) -> dict[str, Any]:
    """Run the planning graph on one brief (as ``plan --brief`` does) and return the plan JSON.

    The run is checkpointed under ``thread``: an unfinished run of the same inputs resumes at
    the node that was running, and a run that finished, wrote ``plan.json`` and was killed
    before the batch recorded it is not run again. A brief that will run a smoke test holds
    ``smoke_lock`` for its whole run.
    """
    from tools.intake.brief import brief_from_dict, load_brief

    overrides: dict[str, Any] = {} if smoke is None else {"smoke": smoke}
    stated = load_brief(job.path).model_dump(mode="json", exclude_unset=True)
    brief = brief_from_dict({**stated, **overrides})
    inputs = {
        "request": None,
        # The fields the file states: intake quotes these and names the defaults as assumed.
        "brief": brief.model_dump(mode="json", exclude_unset=True),
        "overrides": overrides,
        "out_dir": str(out),
    }
    with smoke_lock if brief.smoke else contextlib.nullcontext():
        result = run_plan(
            graph, inputs, thread, watcher, reuse=lambda plan: (out / "plan.json").is_file()
        )
    if result.question is not None:
        raise InputError(
            "brief", f"the brief leaves a question open: {result.question.get('question')}"
        )
    if result.plan is None:
        raise RuntimeError("the graph finished without a plan")
    return result.plan


def warm_up() -> None:
    """Import what the planning graph imports lazily, and the package's own modules, once."""
    # Not graphs.adapters: CrewAI and AutoGen are slow imports.
    imports.warm_up(packages=("agents",))
    importlib.import_module("graphs")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if not isinstance(exc, InputError) else first


class _Progress:
    """One line per brief on stderr, or a rich progress bar when stderr is a terminal."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self._lock = threading.Lock()
        self._bar: Any = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._task = self._bar.add_task("briefs", total=total)

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def _line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, markup=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def step(self, name: str, node: str) -> None:
        """A brief's graph finished a node."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{name}: {node} done")

    def started(self, name: str) -> None:
        """A brief started planning."""
        with self._lock:
            self._line(f"[{self.done}/{self.total}] {name}: planning")

    def resumed(self, name: str, nodes: str) -> None:
        """A brief's earlier run was cut short (a crash, a kill): it continues at ``nodes``."""
        with self._lock:
            self._line(f"[{self.done}/{self.total}] {name}: resuming at {nodes}")

    def finished(self, outcome: BriefOutcome) -> None:
        """A brief is done (planned, skipped or failed)."""
        with self._lock:
            self.done += 1
            s = outcome.summary
            what = {
                "ok": f"ok ({s.get('strategy')}, review {s.get('review')}) "
                f"in {outcome.elapsed_s:.1f} s",
                "skipped": "unchanged, skipped",
                "failed": f"FAILED: {outcome.error}",
            }[outcome.status]
            self._line(f"[{self.done}/{self.total}] {outcome.name}: {what}")
            if self._bar is not None:
                self._bar.advance(self._task)


def run_batch(
    paths: Iterable[Path],
    out_dir: Path,
    settings: Settings,
    *,
    jobs: int = 2,
    smoke: bool | None = None,
    force: bool = False,
) -> list[BriefOutcome]:
    """Plan every brief under ``paths`` into ``out_dir/<name>/`` and write the index.

    Args:
        paths: Brief files, or directories of them.
        out_dir: Where the report folders and index.md / index.html go.
        settings: The run's settings (chat model, checkpoint database, smoke ranks, ...).
        jobs: Briefs planned at the same time (smoke runs still go one at a time).
        smoke: Override every brief's ``smoke`` (None: each brief decides).
        force: Plan even briefs whose inputs did not change.
    """
    if jobs < 1:
        raise InputError("--jobs", f"must be at least 1, got {jobs}")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("--out", f"{out_dir} exists and is not a directory")
    briefs = find_briefs(paths)
    # Before any work: the folder is new, empty or an earlier report's, the index files are
    # ours to replace (tools/core/outputs.py).
    claim(out_dir, field="--out", force_flag=None, create=True, names=INDEX_FILES)
    with hold(out_dir, lambda: _say_waiting(out_dir)):
        return _run_held(briefs, out_dir, settings, jobs, smoke, force)


def _say_waiting(out_dir: Path) -> None:
    print(
        f"another report is writing into {shown(str(out_dir), 160)}; waiting for it to finish",
        file=sys.stderr,
        flush=True,
    )


def _run_held(
    briefs: list[BriefJob],
    out_dir: Path,
    settings: Settings,
    jobs: int,
    smoke: bool | None,
    force: bool,
) -> list[BriefOutcome]:
    """``run_batch`` once it holds ``out_dir``: every brief in a real folder of its own."""
    briefs = own_folders(briefs, out_dir)
    for job in briefs:
        subfolder(out_dir, job.name, "--out", create=False)
    from agents.chat_models import load_chat_model
    from graphs.graph import build_graph

    model = load_chat_model(settings)
    with (
        open_checkpointer(settings.checkpoint_db) as saver,
        _Progress(len(briefs)) as progress,
    ):
        batch = _Batch(
            out_dir,
            build_graph(model, saver, settings),
            progress,
            settings,
            smoke,
            force,
            min(jobs, len(briefs)),
        )
        pool = ThreadPoolExecutor(max_workers=min(jobs, len(briefs)))
        try:
            outcomes = list(pool.map(batch.work, briefs))
        except BaseException:
            # Ctrl-C or SIGTERM: the briefs not yet started are cancelled, and the caller is
            # not kept waiting for the running ones (the CLI stops their smoke runs and exits).
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    write_index(out_dir, outcomes)
    return outcomes


def own_folders(briefs: list[BriefJob], out_dir: Path) -> list[BriefJob]:
    """Give a brief whose folder holds another brief's report (an earlier batch) a new folder.

    ``find_briefs`` makes the names unique within one batch; across batches into one
    ``--out``, ``a b.yaml`` then ``a_b.yaml`` would both want ``a_b/``. The folder's stamp
    names the brief it was planned from: a different brief gets ``<name>-<8 hex of its
    path>``, decided here, before any brief runs.
    """
    taken = {job.name.casefold() for job in briefs}
    fixed: list[BriefJob] = []
    for job in briefs:
        name = job.name
        owner = _stamped_brief(out_dir / name)
        if owner is not None and owner != str(job.path):
            digest = hashlib.sha256(str(job.path).encode()).hexdigest()
            for width in (8, 16, 64):
                name = f"{job.name}-{digest[:width]}"
                other = _stamped_brief(out_dir / name)
                if name.casefold() not in taken and other in (None, str(job.path)):
                    break
            taken.add(name.casefold())
        fixed.append(BriefJob(name, job.path))
    return fixed


def _stamped_brief(folder: Path) -> str | None:
    """The brief file that the report in ``folder`` was planned from, if it records one."""
    try:
        return str(json.loads((folder / STAMP).read_text()).get("brief"))
    except (OSError, ValueError, AttributeError):
        return None


class _Batch:
    """What every brief's job shares: the graph, the progress display, the locks, the flags."""

    def __init__(
        self,
        out_dir: Path,
        graph: Any,
        progress: _Progress,
        settings: Settings,
        smoke: bool | None,
        force: bool,
        jobs: int,
    ) -> None:
        self.out_dir, self.graph, self.progress = out_dir, graph, progress
        self.smoke, self.force, self.jobs = smoke, force, jobs
        self.flags = {
            "smoke": smoke,
            "llm": settings.llm or "offline",
            "base_url": settings.base_url,
        }
        self.smoke_lock = threading.Lock()
        self._warm_lock = threading.Lock()
        self._warmed = False

    def work(self, job: BriefJob) -> BriefOutcome:
        """Plan one brief (or skip it, unchanged); one bad brief does not stop the others."""
        started = time.perf_counter()
        try:
            outcome = self._plan(job, started)
        except Exception as exc:  # noqa: BLE001 - one bad brief must not stop the others
            if os.environ.get("TRAINWRIGHT_DEBUG") == "1":
                raise
            outcome = BriefOutcome(
                job.name,
                job.path,
                "failed",
                error=_one_line(exc),
                elapsed_s=time.perf_counter() - started,
            )
        if stop_requested():
            # Ctrl-C or SIGTERM: the brief was cut off (its database closed under it), not
            # failed, and the CLI's "interrupted" is the batch's last line.
            return outcome
        self.progress.finished(outcome)
        return outcome

    def _plan(self, job: BriefJob, started: float) -> BriefOutcome:
        folder = self.out_dir / job.name
        stamp = folder / STAMP
        digest = inputs_hash(job.path, self.flags)
        if not self.force and stamp.is_file():
            saved = json.loads(stamp.read_text())
            if saved.get("inputs_sha256") == digest and (folder / "plan.json").is_file():
                return BriefOutcome(job.name, job.path, "skipped", saved["summary"])
        remove_file(folder, STAMP)
        self.progress.started(job.name + folder_note(job))
        with self._warm_lock:  # once, and only when something is planned in parallel
            if not self._warmed and self.jobs > 1:
                warm_up()
            self._warmed = True
        # Same inputs and folder: same thread, so a crashed run resumes; --force starts anew.
        key = f"{digest}{self.out_dir.resolve()}"
        thread = f"report-{job.name[:60]}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        if self.force:
            thread += f"-{os.urandom(3).hex()}"
        watcher = _BriefWatcher(self.progress, job.name)
        plan = plan_one(job, folder, self.graph, thread, self.smoke, self.smoke_lock, watcher)
        summary = index_row(plan, job.name)
        record = {"inputs_sha256": digest, "brief": str(job.path), "summary": summary}
        write_file(folder, STAMP, json.dumps(record) + "\n")
        return BriefOutcome(
            job.name, job.path, "ok", summary, elapsed_s=time.perf_counter() - started
        )
