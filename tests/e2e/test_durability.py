"""Checkpoints per thread: a run killed with SIGKILL resumes; a clarifying question pauses a thread.

These run the real CLI in a subprocess, as a user (or a batch system that kills jobs) would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import cli as _cli
from procs import history_nodes as _history_nodes
from procs import ours as _ours
from specs import TINY_GPT2_BRIEF_YAML

TINY_GPT2 = TINY_GPT2_BRIEF_YAML


@pytest.mark.slow
def test_sigkill_mid_smoke_run_resumes_without_rerunning_finished_nodes(tmp_path: Path) -> None:
    home = Path(os.environ["TRAINWRIGHT_HOME"])
    (tmp_path / "brief.yaml").write_text(TINY_GPT2)
    out = tmp_path / "plan-out"
    cmd = _cli("plan", "--brief", "brief.yaml", "--thread", "T", "--out", str(out))
    # A long first smoke run, so that ranks left behind by the kill would still be training
    # long after the check below; the resumed run uses the default length.
    first = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env={**os.environ, "TRAINWRIGHT_SMOKE_STEPS": "400"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: list[str] = []
    started = time.monotonic()
    try:
        assert first.stderr is not None
        for line in first.stderr:
            seen.append(line.rstrip("\n"))
            # Training steps arrive while the engineer node is still running: streamed live.
            if "[engineer]   step 3/400" in line:
                break
            assert time.monotonic() - started < 300, "\n".join(seen)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    stderr1 = "\n".join(seen)
    assert first.returncode == -signal.SIGKILL
    assert "[researcher] done" in stderr1 and "[engineer] done" not in stderr1, stderr1
    assert not (out / "plan.json").exists()

    # The ranks notice their supervisor is gone and end their groups; none may linger.
    deadline = time.monotonic() + 15
    while _ours(home) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ours(home), [p.info["cmdline"] for p in _ours(home)]

    second = subprocess.run(
        cmd, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stderr
    assert "resuming thread T at engineer" in second.stderr
    # Finished before the kill, so not run again; the interrupted engineer ran once, afresh.
    assert second.stderr.count("[intake] done") == 0
    assert second.stderr.count("[researcher] done") == 0
    assert second.stderr.count("[engineer] done") == 1
    assert "[engineer]   step 30/30" in second.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert plan["smoke_test"]["status"] == "passed", plan["smoke_test"]["reason"]
    assert plan["review"]["verdict"] == "approved"
    # The checkpoint history agrees: one checkpoint before each node, none repeated.
    nodes = _history_nodes(home / "checkpoints.sqlite", "T")
    assert nodes == ["__start__", "intake", "researcher", "engineer", "reviewer", "reporter"], nodes
    assert not _ours(home)


def test_cli_asks_one_question_and_reads_the_answer_from_a_pipe(tmp_path: Path) -> None:
    res = subprocess.run(
        _cli("plan", "train a model on 4 A100s", "--no-smoke", "--json", "p.json"),
        cwd=tmp_path,
        input="llama 3 8b\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("[intake] question: Which model") == 1
    assert "[intake] answer: model: llama 3 8b" in res.stderr
    brief = json.loads((tmp_path / "p.json").read_text())["brief"]
    assert brief["model"] == "llama-3-8b"
    assert brief["hardware"] == "1x4xA100-80GB"  # from the request, kept through the answer
    assert brief["smoke"] is False  # the flag
    assert "Traceback" not in res.stderr


def test_cli_without_an_answer_exits_2_and_the_paused_thread_takes_one_later(
    tmp_path: Path,
) -> None:
    args = ("plan", "train a model on 4 A100s", "--no-smoke", "--thread", "Q", "--out", "o")
    res = subprocess.run(
        _cli(*args), cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "names no model" in lines[0] and "--answer" in lines[0]
    # The thread waits at the question: answering it later resumes there.
    res = subprocess.run(
        _cli(*args, "--answer", "a 7B model"),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    assert "resuming thread Q at intake" in res.stderr
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["brief"]["model"] == "llama-2-7b"  # issue 28: a size is the catalog model of it
    assert plan["hardware"]["gpus_per_node"] == 4


def test_cli_answer_that_names_no_model_exits_2(tmp_path: Path) -> None:
    res = subprocess.run(
        _cli("plan", "train a model on 4 A100s", "--no-smoke", "--answer", "dunno"),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("trainwright: error: model: the answer")
    assert "Traceback" not in res.stderr
