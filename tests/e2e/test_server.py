"""The LangGraph dev server serves the graph: ``langgraph dev`` started away from the repo.

The server runs as a user would start it, ``langgraph dev --config /abs/path/langgraph.json``,
but from an empty temporary folder: the graph is named by module (``graphs.serve:graph``), so
it is found through the installed package, not relative to the current folder (a path form
such as ``./graphs/serve.py:graph`` is opened relative to the server's cwd and fails there).
Plans then run over the server's REST API with the LangGraph SDK client.

One server serves every test here (it takes a while to start). It runs without
TRAINWRIGHT_HOME or TRAINWRIGHT_OUT, so its files must go to its own home under the user cache
(``XDG_CACHE_HOME``, a temporary folder), never its working folder. It may run 4 runs at once
(``--n-jobs-per-worker 4``) but the graph's own bound lets one node work at a time
(TRAINWRIGHT_SERVE_MAX_ACTIVE=1), and every smoke run it starts hangs (an injected fault, until
a 200 s timeout far past the hang guards), so only a cancellation ends one early.

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

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "langgraph.json"
LANGGRAPH = Path(sys.executable).parent / "langgraph"
# gpt2's position table holds 1024 tokens; a brief that asks for 4096 of a job loading its
# weights is refused (the second run below checks that the refusal comes back over HTTP).
BRIEF = {"model": "gpt2", "hardware": "1x8xA100-80GB", "seq_len": 1024, "smoke": False}
START_GUARD_S = 120.0  # hang guards, not timing assertions
RUN_GUARD_S = 240.0
# Far shorter than the smoke runs' 200 s timeout: only a cancellation that reaches the run's
# process groups ends them within it.
CANCEL_GUARD_S = 60.0
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


def _pgids_alive(pgids: list[int]) -> list[int]:
    """Those of ``pgids`` that still hold a process that is not a zombie."""
    import psutil

    alive = set()
    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) in pgids:
                alive.add(os.getpgid(p.pid))
    return sorted(alive)


def _installed_is_this_checkout(env: dict[str, str]) -> bool:
    """Whether ``import graphs`` outside the repository, in ``env``, finds this checkout's."""
    res = subprocess.run(
        [sys.executable, "-c", "import graphs; print(graphs.__file__)"],
        cwd="/", env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return res.returncode == 0 and Path(res.stdout.strip()).is_relative_to(ROOT)


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


class _Server:
    """The one dev server of this module: its URL, folders and process."""

    def __init__(self, tmp: Path, knowledge_dir: Path) -> None:
        self.cwd = tmp / "elsewhere"  # not the repository: the server must not need its cwd
        self.cwd.mkdir()
        self.cache = tmp / "cache"
        self.home = self.cache / "trainwright" / "serve"  # the home it must choose itself
        self.log = tmp / "server.log"
        env = {k: v for k, v in os.environ.items() if k not in CLOUD_KEYS}
        for key in ("TRAINWRIGHT_HOME", "TRAINWRIGHT_OUT", "TRAINWRIGHT_SERVE_ROOT", "PYTHONPATH"):
            env.pop(key, None)  # PYTHONPATH: the graph must come from the installed package
        if not _installed_is_this_checkout(env):
            # A second checkout (a git worktree) sharing a venv whose editable install is
            # another: the server must still load this checkout's graph, by module name.
            env["PYTHONPATH"] = str(ROOT)
        env.update(TELEMETRY_OFF)
        env.update(
            XDG_CACHE_HOME=str(self.cache),
            # torch's extension builds stay where they always are (they follow XDG_CACHE_HOME)
            TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR")
            or str(Path.home() / ".cache" / "torch_extensions"),
            TRAINWRIGHT_KNOWLEDGE_DIR=str(knowledge_dir),
            TRAINWRIGHT_SERVE_MAX_ACTIVE="1",
            TRAINWRIGHT_SMOKE_INJECT="hang:always",
            TRAINWRIGHT_SMOKE_TIMEOUT_S="200",
            PYTHONDONTWRITEBYTECODE="1",
        )
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = [str(LANGGRAPH), "dev", "--no-browser", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--config", str(CONFIG), "--n-jobs-per-worker", "4"]
        with self.log.open("wb") as sink:
            self.proc = subprocess.Popen(
                cmd, cwd=self.cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def client(self) -> Any:
        from langgraph_sdk import get_sync_client

        return get_sync_client(url=self.url, api_key=None, timeout=RUN_GUARD_S)

    def smoke_pgids(self) -> list[int]:
        """The process groups of every smoke run the server started (their launch.json)."""
        found: list[int] = []
        for launch in self.home.glob("runs/*/launch.json"):
            with contextlib.suppress(OSError, ValueError):
                found += json.loads(launch.read_text())["pgids"]
        return found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, knowledge_dir: Path) -> Any:
    assert LANGGRAPH.is_file(), "langgraph-cli[inmem] is in the lock: rebuild .venv (make venv)"
    served = _Server(tmp_path_factory.mktemp("server"), knowledge_dir)
    try:
        _wait_ready(served.proc, served.url, served.log)
        yield served
        assert served.proc.poll() is None, served.log.read_text()
    finally:
        _stop_group(served.proc)
        for pgid in served.smoke_pgids():  # a hang guard's leftovers: the run ignored its cancel
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
    assert not _group_alive(served.proc.pid), "a process of the server's group outlived it"


@pytest.mark.slow
def test_langgraph_dev_serves_a_plan_from_another_folder(server: _Server) -> None:
    client = server.client()
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
    # The plan's files went under the server's own home in the user cache (no TRAINWRIGHT_OUT
    # given); the server's cwd holds only the dev server's own store (.langgraph_api/).
    out_dir = Path(final["out_dir"])
    assert out_dir.resolve().is_relative_to((server.home / "out").resolve())
    written = json.loads((out_dir / "plan.json").read_text())
    assert written["memory"]["chosen"] == plan["memory"]["chosen"]
    assert {p.name for p in server.cwd.iterdir()} <= {".langgraph_api"}

    # A brief intake refuses comes back as a failed run naming the field.
    bad = client.threads.create()
    with pytest.raises(Exception, match="seq_len"):
        client.runs.wait(
            bad["thread_id"], "trainwright", input={"brief": {**BRIEF, "seq_len": 4096}}
        )


@pytest.mark.slow
def test_a_served_request_gets_a_smoke_run_only_when_it_asks(server: _Server) -> None:
    client = server.client()
    thread = client.threads.create()
    request = "pretrain gpt2 on 1x8xA100-80GB with seq len 1024"
    final: Any = client.runs.wait(thread["thread_id"], "trainwright", input={"request": request})
    plan = final["plan"]
    assert plan["model"]["name"] == "gpt2"
    assert plan["smoke_test"]["status"] == "skipped"
    # Said, not silent (agents/intake.py SERVED_NO_SMOKE).
    assert "did not ask for one (set smoke: true)" in plan["narrative"]["fallbacks"]
    assert not list(server.home.glob("runs/*"))  # nothing was launched
    assert {p.name for p in server.cwd.iterdir()} <= {".langgraph_api"}


@pytest.mark.slow
def test_a_served_input_past_its_bounds_is_refused_by_name(server: _Server) -> None:
    client = server.client()
    for inputs, problem in (
        ({"brief": {**BRIEF, "goal": "g" * 100_000}}, "brief.goal: is 100,000 characters"),
        ({"brief": BRIEF, "out_dir": "d" * 70_000}, "input: is 70,"),
    ):
        thread = client.threads.create()
        with pytest.raises(Exception, match=problem) as info:
            client.runs.wait(thread["thread_id"], "trainwright", input=inputs)
        assert "the server takes at most" in str(info.value)
        [run] = client.runs.list(thread["thread_id"])
        assert run["status"] == "error"


@pytest.mark.slow
def test_a_cancelled_run_stops_its_smoke_run_and_the_next_run_waits_for_a_slot(
    server: _Server,
) -> None:
    import queue
    import threading

    client = server.client()
    first = client.threads.create()
    run = client.runs.create(
        first["thread_id"], "trainwright", input={"brief": BRIEF, "smoke": True}
    )
    guard = time.monotonic() + RUN_GUARD_S
    while not (pgids := server.smoke_pgids()):
        assert time.monotonic() < guard, server.log.read_text()[-3000:]
        assert client.runs.get(first["thread_id"], run["run_id"])["status"] in {
            "pending",
            "running",
        }
        time.sleep(0.5)
    assert _pgids_alive(pgids) == sorted(set(pgids))  # the smoke run is up (and hangs)

    # A second run while the first one's engineer holds the one slot: it waits, and says so.
    events: queue.Queue[Any] = queue.Queue()
    second = client.threads.create()

    def stream_second() -> None:
        try:
            for part in server.client().runs.stream(
                second["thread_id"], "trainwright", input={"brief": BRIEF},
                stream_mode=["custom", "updates"],
            ):  # fmt: skip
                events.put((part.event, part.data))
        finally:
            events.put(None)

    streamer = threading.Thread(target=stream_second, daemon=True)
    streamer.start()
    seen: list[Any] = []
    while not any(e == "custom" and d.get("kind") == "waiting" for e, d in seen):
        item = events.get(timeout=RUN_GUARD_S)
        assert item is not None, f"the second run never waited: {seen}"
        seen.append(item)
    assert not any(e == "updates" for e, _ in seen)  # no node of it has worked yet

    client.runs.cancel(first["thread_id"], run["run_id"])
    guard = time.monotonic() + CANCEL_GUARD_S
    while _pgids_alive(pgids):
        assert time.monotonic() < guard, f"smoke groups {_pgids_alive(pgids)} outlived the cancel"
        time.sleep(0.2)
    while client.runs.get(first["thread_id"], run["run_id"])["status"] != "interrupted":
        assert time.monotonic() < guard, client.runs.get(first["thread_id"], run["run_id"])
        time.sleep(0.2)

    # The slot came free once the first run's work had stopped: the second run plans.
    while (item := events.get(timeout=RUN_GUARD_S)) is not None:
        seen.append(item)
    streamer.join(timeout=10)
    done = [list(d) for e, d in seen if e == "updates"]
    assert ["reporter"] in done, seen[-5:]
    [second_run] = client.runs.list(second["thread_id"])
    assert second_run["status"] == "success"
    assert len(server.smoke_pgids()) == len(pgids)  # the cancelled run started nothing more


def test_a_cancelled_node_stops_its_thread_and_only_then_frees_its_slot() -> None:
    """graphs/cancel.py in process: what the server test sees, on a one-node graph."""
    import asyncio
    import threading
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from graphs.cancel import NodeCancelled, Slots, cancellable

    class _State(TypedDict, total=False):
        n: int

    started, stopped = threading.Event(), threading.Event()

    def busy(state: _State) -> _State:
        started.set()
        try:
            while True:  # a node that never returns on its own (a hung tool, say)
                time.sleep(0.01)
        except NodeCancelled:
            time.sleep(0.3)  # cleanup (a smoke run's kill) still holds the slot
            stopped.set()
            raise

    slots = Slots(1)
    builder = StateGraph(_State)
    builder.add_node("busy", cancellable("busy", busy, slots))
    builder.add_edge(START, "busy")
    builder.add_edge("busy", END)
    graph = builder.compile()

    async def scenario() -> list[Any]:
        first = asyncio.create_task(graph.ainvoke({"n": 1}))
        while not started.is_set():
            await asyncio.sleep(0.01)
        waited: list[Any] = []
        second = asyncio.create_task(_events(graph, waited))
        while not waited:
            await asyncio.sleep(0.01)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        assert stopped.is_set()  # the cancel waited for the thread to end
        started.clear()
        while not started.is_set():  # the second run got the slot only now
            await asyncio.sleep(0.01)
        second.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await second
        return waited

    async def _events(graph: Any, into: list[Any]) -> None:
        async for chunk in graph.astream({"n": 2}, stream_mode="custom"):
            into.append(chunk)

    waited = asyncio.run(asyncio.wait_for(scenario(), 60))  # a hang guard
    assert waited[0]["kind"] == "waiting" and "at most 1 served run(s)" in waited[0]["text"]
    assert slots.in_use == 0  # both threads ended: the slot is free again
