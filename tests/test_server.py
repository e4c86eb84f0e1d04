"""The LangGraph dev server serves the graph: ``langgraph dev`` started away from the repo.

The server runs as a user would start it, ``langgraph dev --config /abs/path/langgraph.json``,
but from an empty temporary folder: the graph is named by module (``graphs.serve:graph``), so
it is found through the installed package, not relative to the current folder (a path form
such as ``./graphs/serve.py:graph`` is opened relative to the server's cwd and fails there).
One plan then runs over the server's REST API with the LangGraph SDK client.

Offline: only 127.0.0.1 is contacted. Besides the project's telemetry opt-outs
(``TELEMETRY_OFF``, which also carries the CLI's ``LANGGRAPH_CLI_NO_ANALYTICS`` and the
server's ``LANGGRAPH_NO_VERSION_CHECK``), no LangSmith key or LangGraph licence key is passed,
so the server's usage-metadata loop and LangSmith tracing stay off. The server's whole process
group gets SIGTERM, then SIGKILL, in a ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.core.settings import TELEMETRY_OFF
from tools.core.strategies import STRATEGY_ORDER

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "langgraph.json"
LANGGRAPH = Path(sys.executable).parent / "langgraph"
# gpt2's position table holds 1024 tokens; a brief without seq_len gets the 2048 default,
# which intake refuses (the second run below checks that the refusal comes back over HTTP).
BRIEF = {"model": "gpt2", "hardware": "1x8xA100-80GB", "seq_len": 1024, "smoke": False}
START_GUARD_S = 120.0  # hang guards, not timing assertions
RUN_GUARD_S = 240.0
# Whatever would let the server or its SDK client talk to LangSmith or a licence server.
CLOUD_KEYS = (
    "LANGSMITH_API_KEY",
    "LANGCHAIN_API_KEY",
    "LANGGRAPH_API_KEY",
    "LANGGRAPH_CLOUD_LICENSE_KEY",
    "LANGSMITH_ENDPOINT",
    "LANGCHAIN_ENDPOINT",
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after 10 s, reap the leader.

    Then wait (at most 10 s) until the group is empty: killed children of the leader (uvicorn's
    reloader worker) are reaped by init, not by us.
    """
    deadline = time.monotonic() + 10.0
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10.0
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + START_GUARD_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"server exited with {proc.returncode}:\n{log.read_text()}"
        try:
            if httpx.get(f"{url}/ok", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"server not ready after {START_GUARD_S} s:\n{log.read_text()}")


@pytest.mark.slow
def test_langgraph_dev_serves_a_plan_from_another_folder(
    tmp_path: Path, knowledge_dir: Path
) -> None:
    from langgraph_sdk import get_sync_client

    assert LANGGRAPH.is_file(), "langgraph-cli[inmem] is in the lock: rebuild .venv (make venv)"
    elsewhere = tmp_path / "elsewhere"  # not the repository: the server must not need its cwd
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in CLOUD_KEYS}
    env.update(TELEMETRY_OFF)
    env.update(
        TRAINWRIGHT_HOME=str(tmp_path / "home"),
        TRAINWRIGHT_OUT=str(tmp_path / "out"),
        TRAINWRIGHT_KNOWLEDGE_DIR=str(knowledge_dir),
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.pop("PYTHONPATH", None)  # the graph must come from the installed package
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    cmd = [str(LANGGRAPH), "dev", "--no-browser", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--config", str(CONFIG)]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, cwd=elsewhere, env=env, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_ready(proc, url, log)
        client = get_sync_client(url=url, api_key=None, timeout=RUN_GUARD_S)
        assistants = client.assistants.search(graph_id="trainwright")
        assert [a["graph_id"] for a in assistants] == ["trainwright"]

        thread = client.threads.create()
        final: Any = client.runs.wait(thread["thread_id"], "trainwright", input={"brief": BRIEF})
        plan = final["plan"]
        assert plan["memory"]["chosen"] in STRATEGY_ORDER
        assert plan["review"]["verdict"] in {"approved", "changes_requested", "rejected"}
        assert plan["model"]["name"] == "gpt2"
        assert plan["smoke_test"]["status"] == "skipped"
        [run] = client.runs.list(thread["thread_id"])
        assert run["status"] == "success"
        # The plan's files went where TRAINWRIGHT_OUT says; the server's cwd holds only the
        # dev server's own store (.langgraph_api/).
        out_dir = Path(final["out_dir"])
        assert out_dir.resolve().is_relative_to((tmp_path / "out").resolve())
        written = json.loads((out_dir / "plan.json").read_text())
        assert written["memory"]["chosen"] == plan["memory"]["chosen"]
        assert {p.name for p in elsewhere.iterdir()} <= {".langgraph_api"}

        # A brief intake refuses comes back as a failed run naming the field.
        bad = client.threads.create()
        with pytest.raises(Exception, match="seq_len"):
            client.runs.wait(
                bad["thread_id"], "trainwright", input={"brief": {**BRIEF, "seq_len": 4096}}
            )
        assert proc.poll() is None, log.read_text()
    finally:
        _stop_group(proc)
    assert not _group_alive(proc.pid), "a process of the server's group outlived it"
