"""Crash and resume: a batch killed with SIGKILL and rerun, a chat thread killed mid-graph.

Real CLI processes, real SIGKILLs of their whole process group. The rerun of a batch plans
only what was not finished (the finished briefs are "unchanged, skipped" and their files are
not touched: same inode, same mtime) and loses none; a chat restarted on its thread resumes at
the node the kill cut short, without running the finished ones again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from procs import ROOT, cli, history_nodes, kill_group, read_until, wait_none_left

EXAMPLES = sorted((ROOT / "examples" / "briefs").glob("*.yaml"))
BRIEFS = 10
KILL_AFTER = 3  # briefs reported done when the batch is killed (more may finish meanwhile)
DONE_RE = re.compile(r"^\[\d+/\d+\] (\S+): ok \(")


def _briefs(folder: Path) -> dict[str, dict]:
    """Ten briefs: the example briefs with a goal and global batch size of their own."""
    folder.mkdir()
    briefs = {}
    for i in range(BRIEFS):
        source = EXAMPLES[i % len(EXAMPLES)]
        brief = yaml.safe_load(source.read_text())
        brief["goal"] = f"{brief['goal']} (variant {i})"
        brief["global_batch_size"] *= 1 + i // len(EXAMPLES)
        name = f"{source.stem}-v{i}"
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(brief, sort_keys=False))
        briefs[name] = brief
    return briefs


def _start(cmd: list[str], cwd: Path) -> subprocess.Popen[str]:
    """Start a batch in its own session (so its whole group can be signalled), stderr piped."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _stats(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: relative path -> (inode, mtime in ns)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_batch_killed_mid_run_finishes_the_rest_on_rerun(tmp_path: Path) -> None:
    briefs = _briefs(tmp_path / "briefs")
    out = tmp_path / "reports"
    cmd = cli("report", str(tmp_path / "briefs"), "--out", str(out), "--no-smoke", "--jobs", "2")
    first = _start(cmd, tmp_path)
    assert first.stderr is not None
    try:
        seen: list[str] = []
        while sum(bool(DONE_RE.match(line)) for line in seen) < KILL_AFTER:
            seen += read_until(first, first.stderr, ": ok (")
    finally:
        kill_group(first)
    # What the batch wrote before the kill landed: a brief it started after the last line read
    # says "planning" there (seen in CI: a brief resumed that the lines read never started).
    seen += first.stderr.read().splitlines()
    assert first.returncode == -9, "\n".join(seen)
    # Finished: the batch recorded the brief (its inputs stamp, written after its report).
    done = sorted(p.parent.name for p in out.glob("*/.batch-inputs.json"))
    said_ok = sorted(m[1] for line in seen if (m := DONE_RE.match(line)))
    assert set(said_ok) <= set(done)
    assert KILL_AFTER <= len(done) < BRIEFS, done
    assert not (out / "index.md").exists()  # the index comes at the end of a batch
    before = {name: _stats(out / name) for name in done}
    started = {line.split()[1].rstrip(":") for line in seen if line.endswith(": planning")}

    second = subprocess.run(
        cmd, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stderr[-3000:]
    err = second.stderr
    rest = sorted(set(briefs) - set(done))
    for name in done:  # not redone: skipped by its inputs hash, its files untouched
        assert f"] {name}: unchanged, skipped" in err, err
        assert f"] {name}: planning" not in err and f"] {name}: ok" not in err, err
        assert _stats(out / name) == before[name], name
    for name in rest:  # the rest planned, once each
        assert err.count(f"] {name}: ok (") == 1, err
    resumed = dict(re.findall(r"\] (\S+): resuming at (\S+)", err))
    assert set(resumed) <= set(started) - set(done), (resumed, started, done)
    # None lost: a whole report folder per brief, and the index lists them all.
    index = (out / "index.md").read_text()
    assert f"{BRIEFS} brief(s): {BRIEFS} planned, 0 failed." in index
    for name, brief in briefs.items():
        assert f"[report]({name}/report.md)" in index
        plan = json.loads((out / name / "plan.json").read_text())
        assert plan["brief"]["global_batch_size"] == brief["global_batch_size"], name
        assert (out / name / "report.html").read_text().rstrip().endswith("</html>")
        assert (out / name / ".batch-inputs.json").is_file()
    # A temporary file a kill left in a brief's folder went with the rerun's next write there.
    assert not list(out.rglob("*.tmp"))
    print(
        f"\nbatch: killed after {len(done)} of {BRIEFS} briefs finished "
        f"({len(started)} started); the rerun skipped {len(done)}, planned {len(rest)} "
        f"(resumed from a checkpoint: {resumed or 'none'})"
    )


def test_batch_interrupted_with_ctrl_c_starts_nothing_more_and_exits_130(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the batch's process group) stops it: no queued brief starts after it."""
    briefs = _briefs(tmp_path / "briefs")
    out = tmp_path / "reports"
    cmd = cli("report", str(tmp_path / "briefs"), "--out", str(out), "--no-smoke", "--jobs", "1")
    first = _start(cmd, tmp_path)
    assert first.stderr is not None
    try:
        seen = read_until(first, first.stderr, ": ok (")
        os.killpg(first.pid, signal.SIGINT)
        _, rest = first.communicate(timeout=120)  # a hang guard
    finally:
        kill_group(first)
    lines = seen + rest.splitlines()
    assert first.returncode == 130, "\n".join(lines)
    assert lines[-1] == "trainwright: interrupted", "\n".join(lines)
    started = [line for line in lines if line.endswith(": planning")]
    finished = [line for line in lines if ": ok (" in line]
    # One job: each brief started after the one before it finished, so at most one (the brief
    # running at the interrupt, cut off unreported) was started and not seen to finish; a
    # batch that went on would start more without a finish line, and never exit by itself.
    assert len(started) <= len(finished) + 1, "\n".join(lines)
    assert len(started) < BRIEFS, "\n".join(lines)
    assert not any("FAILED" in line for line in lines), "\n".join(lines)
    assert not (out / "index.md").exists()
    # The rerun plans the rest and skips what finished.
    second = subprocess.run(
        cmd, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stderr.count("unchanged, skipped") >= 1, second.stderr
    index = (out / "index.md").read_text()
    assert f"{BRIEFS} brief(s): {BRIEFS} planned, 0 failed." in index
    assert sorted(p.parent.name for p in out.glob("*/plan.json")) == sorted(briefs)


TINY_GPT2_REQUEST = "pretrain gpt2 on this machine, seq len 128, global batch 8"


@pytest.mark.slow
def test_chat_killed_mid_graph_resumes_on_its_thread(tmp_path: Path) -> None:
    home = Path(os.environ["TRAINWRIGHT_HOME"])
    cmd = cli("chat", "--thread", "C")
    # A long first smoke run (kill lands in it); the resumed one uses the default length.
    first = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env={**os.environ, "TRAINWRIGHT_SMOKE_STEPS": "400"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert first.stdin is not None and first.stderr is not None
    first.stdin.write(TINY_GPT2_REQUEST + "\n")
    first.stdin.flush()  # stdin stays open: the chat waits for more after the plan
    try:
        seen = read_until(first, first.stderr, "[engineer]   step 3/400")
    finally:
        kill_group(first)
    stderr1 = "\n".join(seen)
    assert first.returncode == -9
    assert "[researcher] done" in stderr1 and "[engineer] done" not in stderr1, stderr1
    assert not wait_none_left(home), "smoke ranks outlived the killed chat"
    # The thread's last checkpoint is before the engineer.
    assert history_nodes(home / "checkpoints.sqlite", "C")[-1] == "engineer"

    second = subprocess.run(
        cmd, cwd=tmp_path, input="/quit\n", capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming thread C at engineer" in second.stdout, second.stdout
    # The finished nodes do not run again; the interrupted engineer runs once, afresh.
    assert second.stderr.count("[intake] done") == 0, second.stderr
    assert second.stderr.count("[researcher] done") == 0, second.stderr
    assert second.stderr.count("[engineer] done") == 1, second.stderr
    assert "[engineer]   step 30/30" in second.stderr
    assert "plan: gpt2 on local" in second.stdout
    assert "smoke test: passed" in second.stdout, second.stdout
    nodes = history_nodes(home / "checkpoints.sqlite", "C")
    assert nodes == ["__start__", "intake", "researcher", "engineer", "reviewer", "reporter"], nodes
    plan = json.loads(next((tmp_path / "out" / "C").glob("plan-*/plan.json")).read_text())
    assert plan["smoke_test"]["status"] == "passed"
    assert plan["review"]["verdict"] == "approved"
    assert not wait_none_left(home)
