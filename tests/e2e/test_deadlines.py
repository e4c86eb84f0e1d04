"""Deadlines, not timeouts: what bounds a plan's time, with real processes and a real fake LLM.

- An LLM server that drips its reply one byte every 2 s is cut off at the configured timeout
  (a total deadline per request, not httpx's per-read timeout).
- Ctrl-C (SIGINT) and SIGTERM end ``plan`` within 2 s wherever it is (an LLM request, a smoke
  run), exit 130 / 143 with one last line, and leave no process of the run.
- One run per thread: a second ``plan --thread T`` while T runs is refused (exit 2, one line),
  or waits with ``--wait``; the first keeps its own plan.
- A chat interrupted during a smoke run runs the next smoke run normally.
- ``estimate`` into a pipe whose reader is gone ends quietly.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from procs import ours, read_until, wait_none_left
from specs import TINY_GPT2_BRIEF_YAML
from test_llm_http import BRIEF_FILE, _FakeOpenAI, _serve

from agents.deadline import deadline_client

ROOT = Path(__file__).resolve().parents[2]
DRIP_EVERY_S = 2.0
LLM_TIMEOUT_S = 3.0
GATE_S = 120.0
# What a signal may take to end the CLI: the deadline it keeps (app.STOP_WITHIN_S), plus the
# time the kernel and a loaded test machine need to deliver the signal and reap the process.
SIGNAL_EXIT_S = 2.5


class _Slow(_FakeOpenAI):
    """The fake OpenAI server, plus two ways of being slow.

    drip: answers 200 with a long body, one byte every DRIP_EVERY_S (until the client leaves).
    gated: answers with prose once the test opens ``gate`` (at most GATE_S after the request).
    """

    seen = threading.Event()
    gate = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        if self.mode not in ("drip", "gated"):
            super().do_POST()
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append({"path": self.path, "body": body, "at": time.monotonic()})
        self.seen.set()
        if self.mode == "gated":
            self.gate.wait(GATE_S)
            if self.release.is_set():
                return
            self._send(200, self._completion(body, {"role": "assistant", "content": "ok"}))
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.flush()
            while not self.release.wait(DRIP_EVERY_S):
                self.wfile.write(b" ")
                self.wfile.flush()


@contextlib.contextmanager
def _server(mode: str) -> Iterator[str]:
    _Slow.seen = threading.Event()
    _Slow.gate = threading.Event()
    yield from _serve(mode, _Slow)


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OPENAI_API_KEY": "sk-dummy", **extra}
    env.pop("TRAINWRIGHT_DEBUG", None)
    return env


def _llm_plan(base_url: str, *args: str) -> list[str]:
    return [
        sys.executable, str(ROOT / "app.py"), "plan", "--brief", str(BRIEF_FILE), "--no-smoke",
        "--llm", "openai:fake", "--base-url", base_url, *args,
    ]  # fmt: skip


def _start(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _reap(proc: subprocess.Popen[str]) -> None:
    """SIGKILL what is left of ``proc``'s group (a hang guard), reap it, close its pipes."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError, ValueError):
            if pipe is not None:
                pipe.close()


def _group_left(pgid: int) -> list[int]:
    found = []
    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
    return found


# ---- a total deadline per LLM request -------------------------------------------------------


def test_deadline_client_cuts_off_a_server_that_drips_one_byte_every_2_s() -> None:
    with _server("drip") as url:
        client = deadline_client(1.0)
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout, match="total deadline"):
            client.post(f"{url}/chat/completions", json={"messages": []})
        elapsed = time.monotonic() - started
    print(f"drip server cut off after {elapsed:.2f} s (deadline 1 s)")
    assert 0.9 < elapsed < 1.5


def test_cli_with_a_dripping_server_fails_at_the_llm_timeout(tmp_path: Path) -> None:
    with _server("drip") as url:
        env = _env(TRAINWRIGHT_LLM_TIMEOUT_S=str(LLM_TIMEOUT_S))
        proc = _start(_llm_plan(url, "--json", "p.json"), tmp_path, env)
        try:
            _, err = proc.communicate(timeout=90)  # hang guard: the old client never stopped
        finally:
            _reap(proc)
        ended = time.monotonic()
        first = _FakeOpenAI.requests[0]["at"]
    lines = err.splitlines()
    assert proc.returncode == 1, err[-2000:]
    assert lines[-1].startswith(
        f"trainwright: error: LLM request failed: timed out waiting for {url}/chat/completions "
        f"within {LLM_TIMEOUT_S:g} s, 2 attempt(s)"
    ), err[-2000:]
    assert [line for line in lines if line.startswith("trainwright:")] == [lines[-1]]
    # Two attempts of 3 s each, the client's short back-off between them, then the exit.
    assert len(_FakeOpenAI.requests) == 2
    retried = _FakeOpenAI.requests[1]["at"] - first
    since_first = ended - first
    print(
        f"dripping server: retried after {retried:.1f} s, the CLI ended {since_first:.1f} s "
        "after its first request"
    )
    assert LLM_TIMEOUT_S <= retried < LLM_TIMEOUT_S + 2
    assert since_first < 2 * LLM_TIMEOUT_S + 10  # the exit of a loaded machine on top
    assert not (tmp_path / "p.json").exists()


# ---- Ctrl-C and SIGTERM -------------------------------------------------------------------------

SIGNALS = [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]


def _llm_report(base_url: str, tmp_path: Path) -> list[str]:
    (tmp_path / "briefs").mkdir()
    (tmp_path / "briefs" / "a.yaml").write_text(BRIEF_FILE.read_text())
    return [
        sys.executable, str(ROOT / "app.py"), "report", str(tmp_path / "briefs"), "--out",
        str(tmp_path / "reports"), "--no-smoke", "--llm", "openai:fake", "--base-url", base_url,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "sig", "code", "word"),
    [("plan", *SIGNALS[0]), ("plan", *SIGNALS[1]), ("report", *SIGNALS[1])],
    ids=["plan-SIGINT", "plan-SIGTERM", "report-SIGTERM"],
)
def test_signal_during_an_llm_request_ends_the_plan_within_2_s(
    command: str, sig: signal.Signals, code: int, word: str, tmp_path: Path
) -> None:
    with _server("hang") as url:
        env = _env(TRAINWRIGHT_LLM_TIMEOUT_S="60")
        if command == "plan":
            argv = _llm_plan(url, "--json", "p.json")
        else:
            argv = _llm_report(url, tmp_path)
        proc = _start(argv, tmp_path, env)
        try:
            guard = time.monotonic() + 120
            while not _FakeOpenAI.requests and proc.poll() is None:
                assert time.monotonic() < guard, "the LLM was never asked"
                time.sleep(0.05)
            time.sleep(0.3)  # inside the request, waiting for the reply
            sent = time.monotonic()
            os.killpg(proc.pid, sig)
            _, err = proc.communicate(timeout=60)  # hang guard
            elapsed = time.monotonic() - sent
            left = _group_left(proc.pid)
        finally:
            _reap(proc)
    print(
        f"{command}: {sig.name} during an LLM request: exit {proc.returncode} after {elapsed:.2f} s"
    )
    assert proc.returncode == code, err[-2000:]
    assert err.splitlines()[-1] == f"trainwright: {word}", err[-2000:]
    assert "Traceback" not in err
    assert elapsed < SIGNAL_EXIT_S
    assert left == []


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code", "word"), SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_signal_during_a_smoke_run_ends_the_plan_within_2_s_and_leaves_no_process(
    sig: signal.Signals, code: int, word: str, tmp_path: Path
) -> None:
    home = Path(os.environ["TRAINWRIGHT_HOME"])
    (tmp_path / "brief.yaml").write_text(TINY_GPT2_BRIEF_YAML)
    env = _env(TRAINWRIGHT_SMOKE_STEPS="100000", TRAINWRIGHT_SMOKE_TIMEOUT_S="600")
    argv = [sys.executable, str(ROOT / "app.py"), "plan", "--brief", "brief.yaml"]
    proc = _start([*argv, "--out", str(tmp_path / "plan-out")], tmp_path, env)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        guard = time.monotonic() + 300  # hang guard
        while not any("step 2/100000" in line for line in seen):
            line = lines.get(timeout=max(0.1, guard - time.monotonic()))
            assert line is not None, "\n".join(seen)
            seen.append(line)
        ranks = [p for p in ours(home) if "train.py" in " ".join(p.cmdline())]
        sent = time.monotonic()
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)  # hang guard
        elapsed = time.monotonic() - sent
        left_at_exit = [p.pid for p in ours(home)]
        while (line := lines.get(timeout=10)) is not None:
            seen.append(line)
    finally:
        _reap(proc)
        wait_none_left(home)
        for p in ours(home):
            with contextlib.suppress(psutil.Error):
                p.kill()
    print(f"{sig.name} during a smoke run: exit {proc.returncode} after {elapsed:.2f} s")
    assert proc.returncode == code, seen[-20:]
    assert seen[-1] == f"trainwright: {word}", seen[-20:]
    assert len(ranks) >= 2, ranks
    assert elapsed < SIGNAL_EXIT_S
    assert left_at_exit == []
    assert not (tmp_path / "plan-out" / "plan.json").exists()


# ---- one run per thread -----------------------------------------------------------------------


def test_a_second_plan_on_a_running_thread_is_refused_or_waits(tmp_path: Path) -> None:
    with _server("gated") as url:
        env = _env(TRAINWRIGHT_LLM_TIMEOUT_S="300")

        def plan(*args: str) -> subprocess.Popen[str]:
            return _start(_llm_plan(url, "--thread", "T1", *args), tmp_path, env)

        # The first run holds T1 while its first LLM request waits at the gate.
        first = plan("--json", "a.json", "--out", str(tmp_path / "outA"))
        procs = [first]
        try:
            assert _Slow.seen.wait(GATE_S), "the first run never asked the LLM"
            second = plan("--json", "b.json", "--out", str(tmp_path / "outB"))
            procs.append(second)
            _, err2 = second.communicate(timeout=120)
            assert first.poll() is None
            waiter = plan("--wait", "--json", "c.json", "--out", str(tmp_path / "outC"))
            procs.append(waiter)
            assert waiter.stderr is not None
            said = read_until(waiter, waiter.stderr, "waiting for thread T1", guard_s=120)
            assert first.poll() is None and len(_FakeOpenAI.requests) == 1
            _Slow.gate.set()  # the first run goes on, and ends; then the waiter runs
            _, err1 = first.communicate(timeout=300)
            _, rest = waiter.communicate(timeout=300)
        finally:
            for proc in procs:
                _reap(proc)
    assert second.returncode == 2, err2[-2000:]
    assert err2.splitlines() == [
        "trainwright: error: --thread: thread T1 is already running; wait for that run to end "
        "(plan --wait) or use another thread"
    ]
    assert not (tmp_path / "b.json").exists() and not (tmp_path / "outB").exists()
    # The first run finished with its own plan, in its own folder.
    assert first.returncode == 0, err1[-2000:]
    plan_a = json.loads((tmp_path / "a.json").read_text())
    assert Path(plan_a["report"]["markdown"]).parent == tmp_path / "outA"
    # The waiting run ran once the first had ended: same thread, its own inputs and plan.
    assert waiter.returncode == 0, "\n".join(said) + rest[-2000:]
    plan_c = json.loads((tmp_path / "c.json").read_text())
    assert Path(plan_c["report"]["markdown"]).parent == tmp_path / "outC"
    assert json.loads((tmp_path / "a.json").read_text()) == plan_a


# ---- the chat after Ctrl-C ---------------------------------------------------------------------


@pytest.mark.slow
def test_chat_runs_the_next_smoke_run_after_ctrl_c_stopped_one(tmp_path: Path) -> None:
    request = "pretrain gpt2 on this machine with seq len 128 and global batch 8"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "chat", "--thread", "c1"],
        cwd=tmp_path,
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    events: queue.Queue[str | None] = queue.Queue()
    answers: queue.Queue[str | None] = queue.Queue()

    def pump(stream: Any, into: queue.Queue[str | None]) -> None:
        for line in stream:
            into.put(line.rstrip("\n"))
        into.put(None)

    threading.Thread(target=pump, args=(proc.stderr, events), daemon=True).start()
    threading.Thread(target=pump, args=(proc.stdout, answers), daemon=True).start()

    def until(q: queue.Queue[str | None], marker: str, seen: list[str]) -> None:
        guard = time.monotonic() + 300  # hang guard
        while not any(marker in line for line in seen):
            line = q.get(timeout=max(0.1, guard - time.monotonic()))
            assert line is not None, "\n".join(seen)
            seen.append(line)

    said: list[str] = []
    shown: list[str] = []
    try:
        proc.stdin.write(request + "\n")
        proc.stdin.flush()
        until(events, "step 2/", shown)
        os.killpg(proc.pid, signal.SIGINT)
        until(answers, "cancelled; any smoke run was stopped", said)
        shown.clear()
        proc.stdin.write(request + "\n")
        proc.stdin.flush()
        until(answers, "plan:", said)
        proc.stdin.write("/quit\n")
        proc.stdin.close()
        proc.wait(timeout=120)
        while (line := answers.get(timeout=10)) is not None:
            said.append(line)
        while (line := events.get(timeout=10)) is not None:
            shown.append(line)
    finally:
        _reap(proc)
    assert proc.returncode == 0, "\n".join(shown[-20:])
    assert sum("cancelled" in line for line in said) == 1, "\n".join(said)
    # The second plan's smoke run ran to the end and passed.
    assert any("step 30/30" in line for line in shown), "\n".join(shown[-30:])
    assert any(line.startswith("smoke test: passed") for line in said), "\n".join(said)


# ---- a closed pipe --------------------------------------------------------------------------


def test_estimate_into_a_pipe_closed_early_ends_quietly(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (``head -1``) is gone before the first line
    try:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "app.py"), "estimate", "--model", "llama-3-8b",
             "--hardware", "1x8xA100-80GB"],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=_env(),
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert proc.returncode in (0, 141), proc.stderr
    assert proc.stderr == ""
