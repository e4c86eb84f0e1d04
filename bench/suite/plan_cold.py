"""Cold CPU time of an offline plan without smoke, per graph node, and of ``app.py --help``.

``python bench/suite/plan_cold.py [--runs 5] [--help-pairs 20] [--json FILE]``; run.py's
section ``plan_cold``. Every figure is CPU time (user + sys of the process and of the children
it waited for, from ``os.wait4``) of a fresh process, as a user pays it; on a shared machine CPU
time moves far less with the load than wall time, which is reported beside it.

1. ``plan``: ``python app.py plan --brief examples/briefs/llama3-8b-finetune-8xa100.yaml
   --no-smoke --out DIR --json DIR/plan.json`` in a fresh TRAINWRIGHT_HOME. The first run
   builds the knowledge index (once per install) and is reported apart; the next ``runs`` are
   counted (median, min).
2. ``nodes``: the same command ``runs`` more times through ``--node-child``, which runs
   ``app.cli`` with the CLI's LineWatcher instrumented: the process CPU when the graph starts
   streaming, when each node ends and when each tool call starts (its ``tool`` event). Nodes
   run one after another, so a node's share is the CPU between the previous node's end and its
   own; ``start`` is everything before the graph streams (interpreter, imports, graph build),
   ``finish`` the summary and the JSON, ``exit`` the rest of the process's CPU (interpreter
   shutdown, waited-for children). Each tool's share, inside its node's (``split_marks``), runs
   from its call to the next call or the node's end. It also times each call of
   ``tools.planning.search_strategy`` (the chooser, which the researcher's framework choice
   and the engineer's plan each run for the same brief; the reporter's scaling table calls it
   from tools.planning.scaling, not counted here).
3. ``help``: ``python app.py --help`` and ``python -c pass``, interleaved pairs after one
   uncounted pair; medians and the ratio of the CPU medians.

Targets (issue 27): the plan under 3 s of CPU, ``--help`` under 2x ``python -c pass``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import PY, BenchError, bench_env, median  # noqa: E402

BRIEF = "examples/briefs/llama3-8b-finetune-8xa100.yaml"
NODES = ("intake", "researcher", "engineer", "reviewer", "reporter")
TARGET_PLAN_CPU_S = 3.0
TARGET_HELP_RATIO = 2.0


@dataclass
class Run:
    """A finished command: CPU seconds (user + sys, waited-for children included), wall, exit."""

    cpu_s: float
    wall_s: float
    returncode: int
    output: str


def cpu_run(argv: list[str], *, env: dict[str, str], timeout: float) -> Run:
    """Run ``argv`` from the repository root in its own process group; its rusage at exit.

    On timeout the group gets SIGTERM, then SIGKILL, and BenchError is raised.
    """
    with tempfile.TemporaryFile() as log:
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        timer = threading.Timer(timeout, _stop_group, (proc.pid,))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        log.seek(0)
        output = log.read().decode(errors="replace")
    if wall >= timeout:
        raise BenchError(f"timed out after {timeout:g} s: {' '.join(argv)[:200]}")
    return Run(usage.ru_utime + usage.ru_stime, wall, proc.returncode, output)


def _stop_group(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        time.sleep(5.0)


def _plan_argv(out: Path, child_json: Path | None = None) -> list[str]:
    args = ["plan", "--brief", BRIEF, "--no-smoke", "--out", str(out),
            "--json", str(out / "plan.json")]  # fmt: skip
    if child_json is None:
        return [PY, "app.py", *args]
    return [PY, str(Path(__file__).resolve()), "--node-child", str(child_json), "--", *args]


def _checked(run: Run, what: str) -> Run:
    if run.returncode != 0:
        tail = "\n".join(run.output.strip().splitlines()[-10:])
        raise BenchError(f"{what} exited {run.returncode}:\n{tail}")
    return run


def plan_runs(runs: int, home: Path) -> dict[str, Any]:
    """The first plan (it builds the knowledge index), then ``runs`` counted cold plans."""
    env = bench_env(TRAINWRIGHT_HOME=str(home))
    first = _checked(cpu_run(_plan_argv(home / "out-first"), env=env, timeout=600), "plan")
    counted = [
        _checked(cpu_run(_plan_argv(home / f"out-{i}"), env=env, timeout=600), "plan")
        for i in range(runs)
    ]
    plan = json.loads((home / f"out-{runs - 1}" / "plan.json").read_text())
    cpus = [r.cpu_s for r in counted]
    return {
        "what": f"CPU (user+sys) of `python app.py plan --brief {BRIEF} --no-smoke --out DIR "
        "--json DIR/plan.json`, a fresh process each, knowledge index built",
        "runs": runs,
        "first_run_builds_index_cpu_s": first.cpu_s,
        "first_run_builds_index_wall_s": first.wall_s,
        "cpu_s": cpus,
        "wall_s": [r.wall_s for r in counted],
        "cpu_median_s": median(cpus),
        "cpu_min_s": min(cpus),
        "wall_median_s": median([r.wall_s for r in counted]),
        "target_cpu_s": TARGET_PLAN_CPU_S,
        "chosen": plan["memory"]["chosen"],
        "verdict": plan["review"]["verdict"],
    }


def node_runs(runs: int, home: Path) -> dict[str, Any]:
    """The per-node CPU split of ``runs`` instrumented cold plans (``--node-child``)."""
    env = bench_env(TRAINWRIGHT_HOME=str(home))
    records = []
    for i in range(runs):
        out, record = home / f"nodes-{i}", home / f"nodes-{i}.json"
        run = _checked(cpu_run(_plan_argv(out, record), env=env, timeout=600), "plan (nodes)")
        data = json.loads(record.read_text())
        # What the marks miss: the interpreter's shutdown, and any child process waited for.
        data["phases"]["exit"] = run.cpu_s - sum(data["phases"].values())
        records.append({**data, "cpu_s": run.cpu_s})
    phases = ["start", *NODES, "finish", "exit"]
    split = {p: [r["phases"].get(p, 0.0) for r in records] for p in phases}
    tools = list(dict.fromkeys(t for r in records for t in r["tools"]))  # in call order
    search = [r["search_strategy_s"] for r in records]
    return {
        "what": "process CPU between the instrumented CLI's marks (graph start, each node's end, "
        "exit) of the same plan; the review loop's second engineer/reviewer round, if any, "
        "adds to theirs",
        "runs": runs,
        "median_s": {p: median(v) for p, v in split.items()},
        "tool_median_s": {t: median([r["tools"].get(t, 0.0) for r in records]) for t in tools},
        "cpu_median_s": median([r["cpu_s"] for r in records]),
        "search_strategy_calls": len(search[0]),
        "search_strategy_median_s": [median(list(c)) for c in zip(*search, strict=True)],
    }


def help_ratio(pairs: int) -> dict[str, Any]:
    """``app.py --help`` vs ``python -c pass``: interleaved pairs after an uncounted pair."""
    env = bench_env()
    bare_argv, help_argv = [PY, "-c", "pass"], [PY, "app.py", "--help"]
    bare: list[Run] = []
    app: list[Run] = []
    for i in range(pairs + 1):
        b = _checked(cpu_run(bare_argv, env=env, timeout=60), "python -c pass")
        a = _checked(cpu_run(help_argv, env=env, timeout=60), "app.py --help")
        if i:  # the first pair only warms the page cache
            bare.append(b)
            app.append(a)
    bare_cpu, app_cpu = median([r.cpu_s for r in bare]), median([r.cpu_s for r in app])
    bare_wall, app_wall = median([r.wall_s for r in bare]), median([r.wall_s for r in app])
    return {
        "what": "CPU (user+sys) of `python app.py --help` over `python -c pass`, "
        "interleaved pairs, medians",
        "pairs": pairs,
        "python_pass_cpu_median_s": bare_cpu,
        "app_help_cpu_median_s": app_cpu,
        "ratio": app_cpu / bare_cpu,
        "python_pass_wall_median_s": bare_wall,
        "app_help_wall_median_s": app_wall,
        "wall_ratio": app_wall / bare_wall,
        "target_ratio": TARGET_HELP_RATIO,
    }


def measure(quick: bool, runs: int | None = None, pairs: int | None = None) -> dict[str, Any]:
    """Every figure of this benchmark; quick mode runs fewer repeats."""
    runs = runs or (3 if quick else 7)
    with tempfile.TemporaryDirectory(prefix="bench-plan-cold-") as tmp:
        home = Path(tmp)
        plan = plan_runs(runs, home)
        nodes = node_runs(runs, home)
    return {"plan": plan, "nodes": nodes, "help": help_ratio(pairs or (10 if quick else 25))}


def node_child(record: Path, argv: list[str]) -> int:
    """Run the CLI (``app.cli``) on ``argv`` with CPU marks at the graph's start, each node's end."""
    import graphs.terminal

    marks: list[tuple[str, float]] = []  # ("tool:<node>.<tool>" | phase, process CPU)
    search_s: list[float] = []
    watcher = graphs.terminal.LineWatcher
    segment, event, node_done = watcher.segment, watcher.event, watcher.node_done

    def marked_segment(self: Any) -> Any:
        if not marks:
            _time_search(search_s)
            marks.append(("start", time.process_time()))
        return segment(self)

    def marked_event(self: Any, chunk: dict[str, Any]) -> None:
        if chunk.get("kind") == "tool":  # a tool call starts (agents/events.py ToolEvents)
            marks.append((f"tool:{chunk.get('agent')}.{chunk.get('tool')}", time.process_time()))
        event(self, chunk)

    def marked_done(self: Any, node: str) -> None:
        marks.append((node, time.process_time()))
        node_done(self, node)

    watcher.segment, watcher.event = marked_segment, marked_event  # type: ignore[method-assign]
    watcher.node_done = marked_done  # type: ignore[method-assign]
    import app

    sys.argv, code = ["app.py", *argv], 1
    try:
        app.cli()  # as `python app.py` runs: main() with the CLI process's GC settings
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    marks.append(("finish", time.process_time()))
    phases, tools = split_marks(marks)
    record.write_text(
        json.dumps({"phases": phases, "tools": tools, "search_strategy_s": search_s, "code": code})
    )
    return code


def split_marks(marks: list[tuple[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """CPU per phase (between phase marks) and per tool (from its call's mark to the next mark).

    Marks are ``(name, process CPU)`` in order; a ``tool:<node>.<tool>`` mark is a tool call
    starting, any other ends a phase. A phase's figure includes its tools' (the next mark after a
    tool call is the next call or the node's end, so what the node does after the call counts
    to the tool); a tool called twice adds up.
    """
    phases: dict[str, float] = {}
    tools: dict[str, float] = {}
    last_phase = 0.0
    for i, (name, at) in enumerate(marks):
        if name.startswith("tool:"):
            end = marks[i + 1][1] if i + 1 < len(marks) else at
            tools[name[5:]] = tools.get(name[5:], 0.0) + end - at
            continue
        phases[name] = phases.get(name, 0.0) + at - last_phase
        last_phase = at
    return phases, tools


def _time_search(calls: list[float]) -> None:
    """Wrap ``tools.planning.search_strategy`` (looked up at each call) to time each call."""
    import tools.planning

    search = tools.planning.search_strategy

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return search(*args, **kwargs)
        finally:
            calls.append(time.thread_time() - start)

    tools.planning.search_strategy = timed  # type: ignore[assignment]


def render(result: dict[str, Any]) -> list[str]:
    """The figures as Markdown lines."""
    plan, nodes, help_ = result["plan"], result["nodes"], result["help"]
    lines = [
        f"Plan, cold, no smoke ({BRIEF}): CPU median {plan['cpu_median_s']:.2f} s, min "
        f"{plan['cpu_min_s']:.2f} s over {plan['runs']} runs (wall median "
        f"{plan['wall_median_s']:.2f} s; target < {TARGET_PLAN_CPU_S:g} s). First run, "
        f"building the knowledge index: {plan['first_run_builds_index_cpu_s']:.2f} s CPU.",
        "",
        "| phase | CPU median s |",
        "|---|---|",
    ]
    lines += [f"| {p} | {s:.2f} |" for p, s in nodes["median_s"].items()]
    lines += [
        f"| total (instrumented child) | {nodes['cpu_median_s']:.2f} |",
        "",
        "Tool calls, inside their node's figure (CPU from the call to the next call or the "
        "node's end, imports it triggers included): "
        + ", ".join(f"{t} {s:.2f} s" for t, s in nodes.get("tool_median_s", {}).items())
        + ".",
        "",
        f"tools.planning.search_strategy (framework choice, engineer's plan): "
        f"{nodes['search_strategy_calls']} calls per plan, CPU median "
        + ", ".join(f"{s * 1000:.0f} ms" for s in nodes["search_strategy_median_s"])
        + ".",
        "",
        f"`app.py --help`: {help_['app_help_cpu_median_s'] * 1000:.1f} ms CPU vs "
        f"{help_['python_pass_cpu_median_s'] * 1000:.1f} ms for `python -c pass`: "
        f"{help_['ratio']:.2f}x (wall {help_['wall_ratio']:.2f}x; target < "
        f"{TARGET_HELP_RATIO:g}x), {help_['pairs']} pairs.",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, optionally write the JSON."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--node-child"]:
        return node_child(Path(argv[1]), argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="counted plans (and as many split)")
    parser.add_argument("--help-pairs", type=int, default=20, help="--help / pass pairs")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.help_pairs < 1:
        parser.error("--runs and --help-pairs are at least 1")
    result = measure(False, args.runs, args.help_pairs)
    print("\n".join(render(result)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
