"""Batch reports: many briefs, one planning-graph run each, and an index that compares them.

``python app.py report PATHS... --out DIR`` lands here. Each brief becomes ``DIR/<name>/`` with
what ``plan`` writes for one brief (report.md, report.html with its charts, plan.json,
ds_config.json, launch files); ``DIR/index.md`` and ``DIR/index.html`` hold one comparison
table. The graph itself comes from the caller as ``make_graph(checkpointer)``: this module
sits under ``graphs`` in the layering (DESIGN.md), so it must not import it.

A brief is skipped when its inputs hash (brief bytes, the flags that change the plan, and the
code version) matches the one stored beside its last good report. Briefs run on a thread
pool; smoke runs take a lock, so at most one trains at a time (they share the CPU ranks).
"""

from __future__ import annotations

import hashlib
import html
import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tools.artifacts.report import STYLE
from tools.core import imports
from tools.core.errors import InputError
from tools.core.files import write_atomic
from tools.core.settings import Settings
from tools.core.strategies import setup_label

BRIEF_SUFFIXES = (".yaml", ".yml", ".json")
STAMP = ".batch-inputs.json"
ROOT = Path(__file__).resolve().parents[1]
# Source folders whose content is the "code version" of a plan.
CODE_DIRS = ("agents", "graphs", "tools", "prompts", "knowledge")
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".md", ".json")

Status = Literal["ok", "failed", "skipped"]


@dataclass
class BriefJob:
    """One brief to plan: its file and the folder name it gets under ``--out``."""

    name: str
    path: Path


@dataclass
class BriefOutcome:
    """What became of one brief: ok (planned now), skipped (unchanged), or failed (``error``)."""

    name: str
    path: Path
    status: Status
    summary: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    elapsed_s: float = 0.0


def find_briefs(paths: Iterable[Path]) -> list[BriefJob]:
    """Brief files named directly or found (not recursively) in the directories given.

    Folder names are the file stems, made unique with ``-2``, ``-3``... in input order.
    Raises InputError for a path that does not exist, or when no brief is found at all.
    """
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.is_file() and f.suffix in BRIEF_SUFFIXES)
        elif p.is_file():
            files.append(p)
        else:
            raise InputError("report", f"no such file or directory: {p}")
    if not files:
        raise InputError("report", "no brief files (.yaml, .yml, .json) in the paths given")
    jobs: list[BriefJob] = []
    seen: dict[str, int] = {}
    for f in dict.fromkeys(f.resolve() for f in files):  # a file named twice runs once
        # Leading dots off: a file named "...yaml" (stem "..") must not name out_dir's parent.
        safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in f.stem)
        stem = safe.lstrip(".")[:100] or "brief"
        seen[stem] = seen.get(stem, 0) + 1
        jobs.append(BriefJob(stem if seen[stem] == 1 else f"{stem}-{seen[stem]}", f))
    return jobs


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


def summarize(plan: dict[str, Any], name: str) -> dict[str, Any]:
    """The index row of a plan (contract JSON): model, hardware, choice, memory, speed, verdicts."""
    hw, mem = plan["hardware"], plan.get("memory")
    gpu = hw.get("gpu")
    hardware = (
        f"{hw['nodes']}x{hw['gpus_per_node']} {gpu['name']}"
        if gpu
        else f"{hw['nodes']} node(s), CPU only"
    )
    row: dict[str, Any] = {
        "model": (plan.get("model") or {}).get("name", "-"),
        "hardware": hardware,
        "strategy": "none",
        "batching": "-",
        "per_gpu_gb": None,
        "tokens_per_s": None,
        "smoke": plan["smoke_test"]["status"],
        "review": plan["review"]["verdict"],
        "link": f"{name}/report.html",
    }
    if mem:
        tp, pp = mem.get("tensor_parallel", 1), mem.get("pipeline_parallel", 1)
        row["strategy"] = setup_label(mem["chosen"], tp, pp)
        row["batching"] = f"{mem['micro_batch_size']} x {mem['gradient_accumulation_steps']}"
        chosen = next(
            (
                s
                for s in mem["strategies"]
                if s["name"] == mem["chosen"]
                and s.get("tensor_parallel", 1) == tp
                and s.get("pipeline_parallel", 1) == pp
            ),
            None,
        )
        if chosen:
            row["per_gpu_gb"] = round(chosen["per_gpu_bytes"]["total"] / 1e9, 2)
            row["tokens_per_s"] = chosen.get("tokens_per_s")
    speed = plan.get("speed") or {}
    if speed.get("tokens_per_s"):
        row["tokens_per_s"] = speed["tokens_per_s"]
    return row


def plan_one(
    job: BriefJob,
    out: Path,
    make_graph: Callable[[Any], Any],
    checkpointer: Any,
    thread: str,
    smoke: bool | None,
    smoke_lock: threading.Lock,
    on_node: Callable[[str], None] = lambda node: None,
    on_resume: Callable[[str], None] = lambda nodes: None,
) -> dict[str, Any]:
    """Run the planning graph on one brief (as ``plan --brief`` does) and return the plan JSON.

    The run is checkpointed under ``thread``: an unfinished run of the same inputs resumes at
    the node that was running (``on_resume`` hears which), and a run that finished, wrote
    ``plan.json`` and was killed before the batch recorded it is not run again.
    A brief that will run a smoke test holds ``smoke_lock`` for its whole run.
    """
    from tools.intake.brief import brief_from_dict, load_brief

    overrides: dict[str, Any] = {} if smoke is None else {"smoke": smoke}
    brief = brief_from_dict({**load_brief(job.path).model_dump(mode="json"), **overrides})
    inputs = {
        "request": None,
        "brief": brief.model_dump(mode="json"),
        "overrides": overrides,
        "out_dir": str(out),
    }
    graph = make_graph(checkpointer)
    config: dict[str, Any] = {"configurable": {"thread_id": thread}}
    previous = graph.get_state(config)
    run_input: Any = inputs
    if previous.next:
        on_resume(", ".join(previous.next))
        run_input = None
    elif (previous.values or {}).get("plan") and (out / "plan.json").is_file():
        return dict(previous.values["plan"])
    with smoke_lock if brief.smoke else _NO_LOCK:
        for chunk in graph.stream(run_input, config, stream_mode="updates", durability="sync"):
            for node in chunk if isinstance(chunk, dict) else ():
                if not node.startswith("__"):
                    on_node(node)
    snapshot = graph.get_state(config)
    if snapshot.interrupts:
        value = snapshot.interrupts[0].value
        question = value.get("question") if isinstance(value, dict) else value
        raise InputError("brief", f"the brief leaves a question open: {question}")
    plan = snapshot.values.get("plan")
    if not plan:
        raise RuntimeError("the graph finished without a plan")
    return dict(plan)


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()


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
    make_graph: Callable[[Any], Any],
    *,
    jobs: int = 2,
    smoke: bool | None = None,
    force: bool = False,
    llm: str | None = None,
    base_url: str | None = None,
) -> list[BriefOutcome]:
    """Plan every brief under ``paths`` into ``out_dir/<name>/`` and write the index.

    Args:
        paths: Brief files, or directories of them.
        out_dir: Where the report folders and index.md / index.html go.
        settings: The run's settings (checkpoint database, smoke ranks, ...).
        make_graph: Builds the compiled planning graph on a given checkpointer.
        jobs: Briefs planned at the same time (smoke runs still go one at a time).
        smoke: Override every brief's ``smoke`` (None: each brief decides).
        force: Plan even briefs whose inputs did not change.
        llm: The chat-model spec, part of the inputs hash.
        base_url: The OpenAI-compatible server, part of the inputs hash.
    """
    if jobs < 1:
        raise InputError("--jobs", f"must be at least 1, got {jobs}")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("--out", f"{out_dir} exists and is not a directory")
    briefs = find_briefs(paths)
    out_dir.mkdir(parents=True, exist_ok=True)
    flags = {"smoke": smoke, "llm": llm or "offline", "base_url": base_url}
    smoke_lock = threading.Lock()

    from langgraph.checkpoint.sqlite import SqliteSaver

    settings.checkpoint_db.parent.mkdir(parents=True, exist_ok=True)
    with (
        SqliteSaver.from_conn_string(str(settings.checkpoint_db)) as saver,
        _Progress(len(briefs)) as progress,
    ):
        warmed: list[bool] = []
        warm_lock = threading.Lock()

        def work(job: BriefJob) -> BriefOutcome:
            started = time.perf_counter()
            folder = out_dir / job.name
            stamp = folder / STAMP
            try:
                digest = inputs_hash(job.path, flags)
                if not force and stamp.is_file():
                    saved = json.loads(stamp.read_text())
                    if saved.get("inputs_sha256") == digest and (folder / "plan.json").is_file():
                        outcome = BriefOutcome(job.name, job.path, "skipped", saved["summary"])
                        progress.finished(outcome)
                        return outcome
                stamp.unlink(missing_ok=True)
                progress.started(job.name)
                with warm_lock:  # once, and only when something is planned
                    if not warmed and min(jobs, len(briefs)) > 1:
                        warm_up()
                        make_graph(saver)
                    warmed.append(True)
                # Same inputs and folder: same thread, so a crashed run resumes; --force
                # starts a fresh one.
                key = f"{digest}{out_dir.resolve()}"
                thread = f"report-{job.name[:60]}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
                if force:
                    thread += f"-{os.urandom(3).hex()}"
                plan = plan_one(
                    job,
                    folder,
                    make_graph,
                    saver,
                    thread,
                    smoke,
                    smoke_lock,
                    on_node=lambda node: progress.step(job.name, node),
                    on_resume=lambda nodes: progress.resumed(job.name, nodes),
                )
                summary = summarize(plan, job.name)
                write_atomic(
                    stamp,
                    json.dumps(
                        {"inputs_sha256": digest, "brief": str(job.path), "summary": summary}
                    )
                    + "\n",
                )
                outcome = BriefOutcome(
                    job.name, job.path, "ok", summary, elapsed_s=time.perf_counter() - started
                )
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
            progress.finished(outcome)
            return outcome

        with ThreadPoolExecutor(max_workers=min(jobs, len(briefs))) as pool:
            # On Ctrl-C, Executor.map's iterator cancels the briefs not yet started; the running
            # ones finish or stop (the interrupt handler stops their smoke runs).
            outcomes = list(pool.map(work, briefs))
    write_index(out_dir, outcomes)
    return outcomes


COLUMNS = (
    ("brief", "brief"),
    ("model", "model"),
    ("hardware", "hardware"),
    ("strategy", "strategy"),
    ("batching", "micro-batch x accum"),
    ("per_gpu_gb", "per-GPU GB"),
    ("tokens_per_s", "tokens/s"),
    ("smoke", "smoke"),
    ("review", "review"),
)


def _cells(o: BriefOutcome) -> dict[str, str]:
    s = o.summary
    if o.status == "failed":
        return {"brief": o.name, "model": f"error: {o.error}"}
    gb, tps = s.get("per_gpu_gb"), s.get("tokens_per_s")
    return {
        "brief": o.name,
        "model": str(s.get("model", "-")),
        "hardware": str(s.get("hardware", "-")),
        "strategy": str(s.get("strategy", "-")),
        "batching": str(s.get("batching", "-")),
        "per_gpu_gb": "-" if gb is None else f"{gb:.2f}",
        "tokens_per_s": "-" if not tps else f"{tps:,.0f}",
        "smoke": str(s.get("smoke", "-")),
        "review": str(s.get("review", "-")),
    }


def render_index_markdown(outcomes: list[BriefOutcome]) -> str:
    """The comparison table as Markdown, failed briefs with their one-line error."""
    ok = sum(o.status != "failed" for o in outcomes)
    lines = [
        "# Training plans",
        "",
        f"{len(outcomes)} brief(s): {ok} planned, {len(outcomes) - ok} failed.",
        "",
        "| " + " | ".join(title for _, title in COLUMNS) + " | report |",
        "|---|---|---|---|---|---:|---:|---|---|---|",
    ]
    for o in outcomes:
        c = _cells(o)
        if o.status == "failed":
            cells = [c["brief"], c["model"].replace("|", "\\|"), *["-"] * (len(COLUMNS) - 2), "-"]
        else:
            cells = [c[key] for key, _ in COLUMNS] + [f"[report]({o.name}/report.md)"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_index_html(outcomes: list[BriefOutcome]) -> str:
    """The comparison table as a self-contained HTML page linking each report.html."""
    e = html.escape
    head = "".join(f"<th>{e(title)}</th>" for _, title in COLUMNS) + "<th>report</th>"
    rows = []
    for o in outcomes:
        c = _cells(o)
        if o.status == "failed":
            rows.append(
                f"<tr class='failed'><td>{e(o.name)}</td>"
                f"<td colspan='{len(COLUMNS)}'>error: {e(o.error)}</td></tr>"
            )
            continue
        cells = "".join(f"<td>{e(c[key])}</td>" for key, _ in COLUMNS)
        rows.append(f"<tr>{cells}<td><a href='{e(o.name)}/report.html'>report</a></td></tr>")
    ok = sum(o.status != "failed" for o in outcomes)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Training plans</title>"
        f"<style>{STYLE}tr.failed td{{color:#b00020}}</style></head><body>"
        f"<h1>Training plans</h1><p>{len(outcomes)} brief(s): {ok} planned, "
        f"{len(outcomes) - ok} failed.</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "</body></html>\n"
    )


def write_index(out_dir: Path, outcomes: list[BriefOutcome]) -> None:
    """Write ``index.md`` and ``index.html`` under ``out_dir``."""
    write_atomic(out_dir / "index.md", render_index_markdown(outcomes))
    write_atomic(out_dir / "index.html", render_index_html(outcomes))
