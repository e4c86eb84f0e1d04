"""A real chat-model client over real HTTP, against a local fake OpenAI-compatible server.

The server plays four kinds of model: one that calls tools properly, one that only writes
prose, one whose tool calls are malformed or name tools that do not exist, and a dead one
(HTTP 500, or no answer at all). Each run ends in a complete plan whose numbers are the
offline plan's, or in one clear error, through the graph API and through the CLI.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents.chat_models import load_chat_model
from graphs import build_graph
from tools.core.errors import InputError, ProviderError
from tools.core.settings import Settings
from tools.intake.brief import load_brief

ROOT = Path(__file__).resolve().parents[2]
BRIEF_FILE = Path(__file__).parents[1] / "data" / "llama3-8b-finetune-8xa100.yaml"
# A dead server must end the run quickly: short timeout, one retry (the CLI's default).
TIMEOUT_S = 1.0
DEAD_RUN_LIMIT_S = 30.0
# Numbers a prose-writing model might invent; none of them may reach the plan.
INVENTED = "Use ZeRO-3 with micro-batch 99 and 12 accumulation steps; it needs 1234 GB per GPU."
# A request the offline parser cannot read beyond its words: no digits, no catalog id.
# Issue 28: the parser now reads digits of a size ("8 billion parameter llama") and says what
# it assumed for a part left open ("A100s": 40 or 80 GB); it reads numbers in words too ("eight
# billion parameter llama three" is llama-3-8b), so the model and the context here are named
# in ways only a reader of English gets: the LLM's to read.
WORDY = (
    "train the eight-billion-parameter third llama on four eighty-gig A100 SXM cards "
    "with a context twice two thousand forty eight tokens long"
)
# What the fake LLM reads from it, as a real one would (a Hugging Face name, not a catalog id).
LLM_BRIEF = {
    "model": "Meta-Llama-3-8B",
    "task": "finetune",
    "seq_len": 4096,
    "hardware": "1x4xA100-80GB",
    "precision": "bf16",
}


def _tool_call(call_id: str, name: str | None, arguments: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    return {"id": call_id, "type": "function", "function": function}


def _forced_tool(body: dict[str, Any]) -> str | None:
    """The tool a request forces the model to call (``tool_choice``), if any."""
    choice = body.get("tool_choice")
    return choice.get("function", {}).get("name") if isinstance(choice, dict) else None


class _FakeOpenAI(BaseHTTPRequestHandler):
    """Answers POST /v1/chat/completions as the model named by ``mode``.

    tools: a tool call where the request offers select_framework, prose otherwise.
    prose: only prose, with invented numbers.
    malformed: first a call with arguments that are not JSON plus a call to an unknown tool,
        then arguments that are JSON but not an object, then only calls without a name: never
        a usable one, so the loop's step bound must end each role.
    http500: HTTP 500 with an OpenAI-style error body.
    http401: HTTP 401, as for a rejected API key.
    hang: reads the request and never answers (until the test tears the server down).
    """

    mode = "tools"
    requests: list[dict[str, Any]] = []
    release = threading.Event()
    # Intake's structured-output request (function calling: it forces the RequestBrief tool)
    # is answered, in every mode that answers, with a call whose arguments are this text;
    # None answers it with HTTP 400, as a server without tool_choice support does.
    brief_args: str | None = json.dumps(LLM_BRIEF)

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append({"path": self.path, "body": body})
        if self.mode == "hang":
            self.release.wait(60)
            return
        if self.mode == "http500":
            error = {"error": {"message": "model worker crashed", "type": "server_error"}}
            self._send(500, error)
            return
        if self.mode == "http401":
            error = {"error": {"message": "Incorrect API key provided", "type": "auth_error"}}
            self._send(401, error)
            return
        if _forced_tool(body) == "RequestBrief" and self.brief_args is None:
            error = {"error": {"message": "tool_choice is not supported", "type": "invalid"}}
            self._send(400, error)
            return
        self._send(200, self._completion(body, self._message(body)))

    def _message(self, body: dict[str, Any]) -> dict[str, Any]:
        msgs = body["messages"]
        tools = [t["function"]["name"] for t in body.get("tools", [])]
        answered = any(m.get("role") == "tool" for m in msgs)
        if _forced_tool(body) == "RequestBrief":
            calls = [_tool_call("brief_1", "RequestBrief", self.brief_args)]
            return {"role": "assistant", "content": None, "tool_calls": calls}
        if self.mode == "prose":
            return {"role": "assistant", "content": INVENTED}
        if self.mode == "malformed":
            sent = len(msgs) - 2  # after the system and task messages
            if sent == 0:
                calls = [
                    _tool_call("bad_json", tools[0], '{"spec": "1x8xA100-80GB", '),
                    _tool_call("unknown", "gpu_memory_calculator", json.dumps({"gpus": 8})),
                ]
            elif sent == 3:  # one reply and its two error messages later
                calls = [_tool_call("list_args", tools[0], json.dumps(["1x8xA100-80GB"]))]
            else:
                calls = [_tool_call("no_name", None, "{}")]
            return {"role": "assistant", "content": None, "tool_calls": calls}
        if "select_framework" in tools and not answered:
            args = json.dumps({"spec": "1x8xA100-80GB"})
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [_tool_call("call_1", "profile_hardware", args)],
            }
        return {"role": "assistant", "content": "Here is my analysis."}

    @staticmethod
    def _completion(body: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _serve(mode: str, handler: type[_FakeOpenAI] = _FakeOpenAI) -> Iterator[str]:
    """The fake server's base URL in ``mode``; ``handler`` may be a subclass (slower replies)."""
    if mode == "down":  # a port nothing listens on
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        yield f"http://127.0.0.1:{port}/v1"
        return
    _FakeOpenAI.mode = mode
    _FakeOpenAI.requests = []
    _FakeOpenAI.release = threading.Event()
    _FakeOpenAI.brief_args = json.dumps(LLM_BRIEF)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True  # a reply held open never blocks shutdown
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        _FakeOpenAI.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake_server() -> Iterator[str]:
    yield from _serve("tools")


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The fake server in the mode the test is parametrized with."""
    yield from _serve(request.param)


def _brief() -> dict[str, Any]:
    return load_brief(BRIEF_FILE).model_dump(mode="json")


def _numbers(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan's facts: everything a tool computes, nothing a model writes."""
    return {
        "brief": plan["brief"],
        "hardware": plan["hardware"],
        "model": plan["model"],
        "framework": {k: plan["framework"][k] for k in ("primary", "stack")},
        "memory": plan["memory"],
        "speed": plan.get("speed"),
        "deepspeed_config": plan["deepspeed_config"],
        "launch": plan["launch"]["command"],
        "smoke_test": plan["smoke_test"]["status"],
        "review": {k: plan["review"][k] for k in ("verdict", "rounds")},
    }


def _offline_plan(settings: Settings, out_dir: Path) -> dict[str, Any]:
    graph = build_graph(load_chat_model("offline"), settings=settings)
    plan: dict[str, Any] = graph.invoke({"brief": _brief(), "out_dir": str(out_dir)})["plan"]
    return plan


def _sent(role: str) -> list[str]:
    """Every message of ``role`` the fake server received (as text)."""
    return [
        str(m.get("content"))
        for r in _FakeOpenAI.requests
        for m in r["body"]["messages"]
        if m.get("role") == role
    ]


def test_openai_compatible_server_drives_the_graph(
    fake_server: str, settings: Settings, tmp_path: Path
) -> None:
    model = load_chat_model("openai:fake-model", base_url=fake_server, timeout_s=10)
    brief = {
        "model": "llama-3-8b",
        "hardware": "1x8xA100-80GB",
        "seq_len": 4096,
        "global_batch_size": 64,
        "smoke": False,
    }
    plan = build_graph(model, settings=settings).invoke(
        {"brief": brief, "out_dir": str(tmp_path / "p")}
    )["plan"]
    reqs = _FakeOpenAI.requests
    assert reqs and all(r["path"] == "/v1/chat/completions" for r in reqs)
    offered = {t["function"]["name"] for r in reqs for t in r["body"].get("tools", [])}
    assert {"profile_hardware", "plan_parallelism", "review_plan"} <= offered
    # The model's tool call was executed; what it skipped the node ran, and said so.
    assert plan["hardware"]["gpus_per_node"] == 8
    assert "ran profile_hardware directly" not in plan["narrative"]["fallbacks"]
    assert "ran lookup_model directly" in plan["narrative"]["fallbacks"]
    assert plan["narrative"]["researcher"] == "Here is my analysis."
    assert plan["review"]["verdict"] == "approved"


@pytest.mark.parametrize("server", ["prose", "malformed"], indirect=True)
def test_misbehaving_model_still_gives_the_offline_plans_numbers(
    server: str, settings: Settings, tmp_path: Path
) -> None:
    model = load_chat_model("openai:fake", base_url=server, timeout_s=10)
    plan = build_graph(model, settings=settings).invoke(
        {"brief": _brief(), "out_dir": str(tmp_path / "p")}
    )["plan"]
    expected = _offline_plan(settings, tmp_path / "p")
    assert _numbers(plan) == _numbers(expected)
    for tool in ("profile_hardware", "lookup_model", "plan_parallelism", "review_plan"):
        assert f"ran {tool} directly" in plan["narrative"]["fallbacks"]
    assert INVENTED not in json.dumps(_numbers(plan))
    if _FakeOpenAI.mode == "malformed":
        # Every mistake went back to the model as a message saying what to do next, and the
        # loop's step bound ended each role's conversation.
        tool_replies = _sent("tool")
        assert any("are not valid JSON" in t for t in tool_replies)
        assert any("no tool 'gpu_memory_calculator'" in t for t in tool_replies)
        assert any("no tool ''" in t for t in tool_replies)
        assert any("must be a JSON object" in t for t in _sent("user"))
        assert len(_FakeOpenAI.requests) == 3 * settings.max_agent_steps
    else:
        assert len(_FakeOpenAI.requests) == 3  # one prose answer per role
        assert plan["narrative"]["engineer"] == INVENTED


@pytest.mark.parametrize(
    ("server", "problem"),
    [("http500", "HTTP 500 from "), ("hang", "timed out waiting for ")],
    indirect=["server"],
)
def test_dead_server_fails_the_run_with_one_clear_error(
    server: str, problem: str, settings: Settings, tmp_path: Path
) -> None:
    model = load_chat_model("openai:fake", base_url=server, timeout_s=TIMEOUT_S, max_retries=1)
    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        build_graph(model, settings=settings).invoke(
            {"brief": _brief(), "out_dir": str(tmp_path / "p")}
        )
    assert time.monotonic() - started < DEAD_RUN_LIMIT_S
    message = str(info.value)
    assert message.startswith(f"LLM request failed: {problem}{server}/chat/completions")
    assert "\n" not in message
    assert len(_FakeOpenAI.requests) == 2  # the first try and one retry, then it gives up
    if _FakeOpenAI.mode == "http500":
        assert message.endswith(": model worker crashed")
    else:
        assert f"within {TIMEOUT_S:g} s, 2 attempt(s)" in message


@pytest.mark.parametrize(
    ("server", "error", "problem"),
    [
        ("down", ProviderError, "LLM request failed: cannot reach "),
        ("http401", InputError, "--llm: LLM request failed: HTTP 401 from "),
    ],
    indirect=["server"],
)
def test_unreachable_server_and_rejected_key_are_one_clear_error(
    server: str, error: type[Exception], problem: str, settings: Settings, tmp_path: Path
) -> None:
    model = load_chat_model("openai:fake", base_url=server, timeout_s=TIMEOUT_S, max_retries=0)
    with pytest.raises(error) as info:
        build_graph(model, settings=settings).invoke(
            {"brief": _brief(), "out_dir": str(tmp_path / "p")}
        )
    assert type(info.value) is error  # exit 1 for a dead server, 2 for the user's key
    assert str(info.value).startswith(f"{problem}{server}/chat/completions")


def _run_cli(base_url: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-dummy",
        "TRAINWRIGHT_LLM_TIMEOUT_S": str(TIMEOUT_S),
    }
    env.pop("TRAINWRIGHT_DEBUG", None)
    argv = [sys.executable, str(ROOT / "app.py"), "plan", "--brief", str(BRIEF_FILE)]
    argv += ["--no-smoke", "--llm", "openai:fake", "--base-url", base_url, "--json", "p.json"]
    started = time.monotonic()
    res = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return res, time.monotonic() - started


@pytest.mark.parametrize("server", ["prose", "malformed"], indirect=True)
def test_cli_with_a_misbehaving_model_writes_the_offline_plans_numbers(
    server: str, settings: Settings, tmp_path: Path
) -> None:
    res, _ = _run_cli(server, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert _FakeOpenAI.requests  # the CLI really talked to the server
    plan = json.loads((tmp_path / "p.json").read_text())
    expected = _offline_plan(settings, Path(plan["report"]["markdown"]).parent)
    assert _numbers(plan) == _numbers(expected)
    assert "ran plan_parallelism directly" in plan["narrative"]["fallbacks"]


def test_settings_read_the_llm_timeout_and_refuse_a_bad_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAINWRIGHT_LLM_TIMEOUT_S", str(TIMEOUT_S))
    assert Settings.load().llm_timeout_s == TIMEOUT_S
    monkeypatch.setenv("TRAINWRIGHT_LLM_TIMEOUT_S", "soon")
    with pytest.raises(InputError, match="TRAINWRIGHT_LLM_TIMEOUT_S"):
        Settings.load()


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ("http500", "HTTP 500 from "),
        # TRAINWRIGHT_LLM_TIMEOUT_S keeps this short; a hung server would otherwise cost the
        # default 2 x 60 s before this same error.
        ("hang", "timed out waiting for "),
    ],
    indirect=["server"],
)
def test_cli_with_a_dead_server_exits_1_with_one_error_line(
    server: str, problem: str, tmp_path: Path
) -> None:
    res, elapsed_s = _run_cli(server, tmp_path)
    assert res.returncode == 1, res.stderr
    assert elapsed_s < DEAD_RUN_LIMIT_S + 30  # interpreter start and imports on top
    assert "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("trainwright:")]
    assert errors == [res.stderr.splitlines()[-1]], res.stderr  # one error line, and it is last
    assert errors[0].startswith(
        f"trainwright: error: LLM request failed: {problem}{server}/chat/completions"
    )
    assert not (tmp_path / "p.json").exists()
    assert res.stdout == ""


# ---- intake: free text read by the LLM through structured output --------------------------------


def _llm_settings(settings: Settings, base_url: str) -> Settings:
    """Settings naming the fake server's model, as ``--llm openai:fake --base-url URL`` would."""
    return replace(settings, llm="openai:fake", base_url=base_url, llm_timeout_s=TIMEOUT_S)


def _plan_request(settings: Settings, text: str, out: Path, **extra: Any) -> dict[str, Any]:
    model = load_chat_model("openai:fake", base_url=settings.base_url, timeout_s=TIMEOUT_S)
    inputs = {"request": text, "overrides": {"smoke": False}, "out_dir": str(out), **extra}
    plan: dict[str, Any] = build_graph(model, settings=settings).invoke(inputs)["plan"]
    return plan


def _structured_requests() -> list[dict[str, Any]]:
    return [r["body"] for r in _FakeOpenAI.requests if r["body"].get("tool_choice")]


@pytest.mark.parametrize("server", ["prose"], indirect=True)
def test_llm_reads_the_request_fields_the_parser_cannot(
    server: str, settings: Settings, tmp_path: Path
) -> None:
    from tools.intake.brief import request_fields
    from tools.research.model_catalog import list_models

    # The parser reads only the hardware ("four eighty-gig A100 SXM cards"), as the LLM does.
    assert set(request_fields(WORDY, list_models())) == {"goal", "hardware"}
    plan = _plan_request(_llm_settings(settings, server), WORDY, tmp_path / "p")
    brief = plan["brief"]
    # The LLM's name was mapped onto the catalog; the rest of its fields passed validation.
    assert brief["model"] == "llama-3-8b"
    assert (brief["hardware"], brief["seq_len"]) == ("1x4xA100-80GB", 4096)
    assert (brief["task"], brief["precision"]) == ("finetune", "bf16")
    assert plan["model"]["params"] == 8_030_261_248
    assert plan["hardware"]["nodes"] == 1 and plan["hardware"]["gpus_per_node"] == 4
    # One structured-output request, by function calling, carrying the request text.
    (asked,) = _structured_requests()
    assert asked["tool_choice"] == {"type": "function", "function": {"name": "RequestBrief"}}
    (tool,) = asked["tools"]
    assert {"model", "seq_len", "global_batch_size", "hardware", "precision", "task"} <= set(
        tool["function"]["parameters"]["properties"]
    )
    assert asked["messages"][-1] == {"role": "user", "content": WORDY}
    assert "intake:" not in plan["narrative"].get("fallbacks", "")


@pytest.mark.parametrize("server", ["prose"], indirect=True)
def test_parser_wins_where_both_read_a_value_and_bad_llm_values_are_dropped(
    server: str, settings: Settings, tmp_path: Path
) -> None:
    _FakeOpenAI.brief_args = json.dumps(
        {**LLM_BRIEF, "hardware": "1x8xA100-80GB", "global_batch_size": 0, "gpus": 4}
    )
    text = (
        "fine-tune llama 3 8b on 4 A100s with a context twice two thousand forty eight tokens long"
    )
    plan = _plan_request(_llm_settings(settings, server), text, tmp_path / "p")
    brief = plan["brief"]
    assert brief["hardware"] == "1x4xA100-80GB"  # the text's "4 A100s", not the LLM's 8
    assert (brief["seq_len"], brief["precision"]) == (4096, "bf16")  # only the LLM read these
    # The LLM's 0 was refused: the planner's default stands (64K fine-tuning tokens at 4096).
    assert brief["global_batch_size"] == 16
    notes = plan["narrative"]["fallbacks"]
    assert (
        "intake: hardware: kept '1x4xA100-80GB' from the text over the LLM's '1x8xA100-80GB'"
        in notes
    )
    assert (
        "intake: dropped the LLM's brief.global_batch_size: Input should be greater than 0" in notes
    )
    assert "intake: dropped the LLM's gpus: is not a request field" in notes


@pytest.mark.parametrize(
    ("server", "reply", "why"),
    [
        ("prose", '{"model": "llama-3-8b", "seq_len": ', "arguments are not valid JSON"),
        (
            "prose",
            '["llama-3-8b", 4096]',
            "unreadable reply: tool_calls.0.args: Input should be a valid dictionary",
        ),
        ("prose", None, "HTTP 400 from "),
    ],
    indirect=["server"],
)
def test_unusable_structured_output_falls_back_to_the_parser_with_a_note(
    server: str, reply: str | None, why: str, settings: Settings, tmp_path: Path
) -> None:
    _FakeOpenAI.brief_args = reply
    text = (
        "fine-tune llama 3 8b on 4 A100s with a context twice two thousand forty eight tokens long"
    )
    plan = _plan_request(_llm_settings(settings, server), text, tmp_path / "p")
    assert _structured_requests()  # the LLM was asked
    brief = plan["brief"]
    assert (brief["model"], brief["hardware"]) == ("llama-3-8b", "1x4xA100-80GB")
    assert brief["seq_len"] == 2048  # the words were not read: the default
    notes = plan["narrative"]["fallbacks"]
    (reason,) = re.findall(
        r"intake: the LLM's structured reading .*? \((.*?)\); parser only", notes
    )
    assert why in reason
    assert "Traceback" not in notes


@pytest.mark.parametrize("server", ["prose"], indirect=True)
def test_clarifying_question_still_asked_when_the_llm_finds_no_model(
    server: str, settings: Settings, tmp_path: Path
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    _FakeOpenAI.brief_args = json.dumps({"task": "pretrain", "seq_len": 4096, "model": None})
    settings = _llm_settings(settings, server)
    model = load_chat_model("openai:fake", base_url=server, timeout_s=TIMEOUT_S)
    graph = build_graph(model, checkpointer=InMemorySaver(), settings=settings)
    config = {"configurable": {"thread_id": "q"}}
    request = "pretrain something big on two nodes of eight H100s, a context twice two thousand forty eight tokens long"
    graph.invoke(
        {"request": request, "overrides": {"smoke": False}, "out_dir": str(tmp_path)}, config
    )
    (question,) = graph.get_state(config).interrupts
    assert question.value["field"] == "model"
    plan = graph.invoke(Command(resume="llama 3 8b"), config)["plan"]
    assert plan["brief"]["model"] == "llama-3-8b"
    assert (plan["brief"]["task"], plan["brief"]["seq_len"]) == ("pretrain", 4096)  # the LLM's
    assert plan["brief"]["hardware"] == "2x8xH100-80GB"  # the parser reads the words


@pytest.mark.parametrize("server", ["http500"], indirect=True)
def test_dead_server_at_intake_is_the_same_one_clear_error(
    server: str, settings: Settings, tmp_path: Path
) -> None:
    settings = _llm_settings(settings, server)
    model = load_chat_model("openai:fake", base_url=server, timeout_s=TIMEOUT_S, max_retries=1)
    with pytest.raises(ProviderError) as info:
        build_graph(model, settings=settings).invoke({"request": WORDY, "out_dir": str(tmp_path)})
    message = str(info.value)
    assert message.startswith(f"LLM request failed: HTTP 500 from {server}/chat/completions")
    assert message.endswith(": model worker crashed")
    # Intake asked (a try and one retry) and the run ended there: no role was started.
    assert len(_FakeOpenAI.requests) == 2
    assert all(r["body"].get("tool_choice") for r in _FakeOpenAI.requests)


# ---- bounds on one reply: its bytes, its tool calls ---------------------------------------------

# What the endless server sends at full speed before it slows to a drip: well past the bound,
# so a client without one would hold all of it (and then wait for the deadline).
ENDLESS_FAST_BYTES = 64 * 2**20
ENDLESS_CHUNK = 60 * 1024
# The bounds SECURITY.md states: bytes of one LLM reply, tool calls of one reply that run.
REPLY_BOUND_BYTES = 8 * 2**20
TOOL_CALLS_BOUND = 8


class _Endless(_FakeOpenAI):
    """A reply that never ends: 64 MiB at once, then one byte every 0.5 s until the client leaves.

    A plain request gets a JSON body that never closes its string; a streamed one (``stream``
    true) gets server-sent events, each a chunk of content, forever.
    """

    sent = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append({"path": self.path, "body": body})
        streamed = bool(body.get("stream"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
        if not streamed:
            self.send_header("Content-Length", str(10**12))
        self.end_headers()
        if streamed:
            delta = {"role": "assistant", "content": "x" * ENDLESS_CHUNK}
            event = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "f",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
            chunk, drip = b"data: " + json.dumps(event).encode() + b"\n\n", b"\n"
        else:
            head = b'{"id": "c", "object": "chat.completion", "choices": [{"index": 0, '
            self._write(head + b'"message": {"role": "assistant", "content": "')
            chunk, drip = b"x" * ENDLESS_CHUNK, b"x"
        with contextlib.suppress(OSError):
            while type(self).sent < ENDLESS_FAST_BYTES:
                self._write(chunk)
            while not self.release.wait(0.5):
                self._write(drip)

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()
        type(self).sent += len(data)


def _echo_tool(ran: list[dict[str, Any]]) -> Any:
    from langchain_core.tools import tool

    @tool
    def echo(text: str) -> str:
        """Say ``text`` back."""
        ran.append({"text": text})
        return text

    return echo


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_a_reply_that_never_ends_stops_at_the_byte_bound_in_bounded_memory(
    streamed: bool,
) -> None:
    import tracemalloc

    from langchain_core.messages import HumanMessage

    from agents.loop import run_tool_loop

    _Endless.sent = 0
    served = _serve("endless", _Endless)
    url = next(served)
    try:
        # The deadline is only a hang guard here: the bound must end the read long before it.
        model = load_chat_model("openai:fake", base_url=url, timeout_s=30, max_retries=1)
        model.streaming = streamed  # type: ignore[attr-defined]
        tracemalloc.start()
        try:
            with pytest.raises(ProviderError) as info:
                run_tool_loop(model, [_echo_tool([])], [HumanMessage("hi")])
            _, peak_bytes = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        served.close()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("LLM request failed (openai-chat): the reply from ")
    assert f"{url}/chat/completions" in message and "the bound of 8 MiB on one LLM reply" in message
    assert len(_Endless.requests) == 1  # not retried: the same server would send the same
    assert peak_bytes < 4 * REPLY_BOUND_BYTES, peak_bytes


def test_tool_calls_past_the_bound_are_not_run_and_the_model_is_told(
    fake_server: str,
) -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    from agents.loop import run_tool_loop

    calls = [_tool_call(f"c{i}", "echo", json.dumps({"text": str(i)})) for i in range(10_000)]

    class _Many(_FakeOpenAI):
        def _message(self, body: dict[str, Any]) -> dict[str, Any]:
            if len(self.requests) == 1:
                return {"role": "assistant", "content": None, "tool_calls": calls}
            return {"role": "assistant", "content": "done"}

    served = _serve("tools", _Many)
    url = next(served)
    ran: list[dict[str, Any]] = []
    events: list[str] = []
    try:
        model = load_chat_model("openai:fake", base_url=url, timeout_s=30)
        messages = run_tool_loop(
            model, [_echo_tool(ran)], [HumanMessage("go")], on_event=events.append
        )
    finally:
        served.close()
    assert ran == [{"text": str(i)} for i in range(TOOL_CALLS_BOUND)]
    # The conversation keeps the calls that ran (each with its result), not the 9,992 others.
    first = messages[1]
    assert isinstance(first, AIMessage) and len(first.tool_calls) == 8
    assert "tool_calls" not in first.additional_kwargs
    said = "that reply made 10,000 tool calls; at most 8 run per reply"
    assert any(said in e for e in events), events
    second = _Many.requests[1]["body"]["messages"]
    assert sum(m["role"] == "tool" for m in second) == 8
    assert len(second[1]["tool_calls"]) == 8
    assert said in second[-1]["content"] and "other 9,992 were not run" in second[-1]["content"]
    assert messages[-1].content == "done"


def test_a_compressed_reply_is_bounded_once_decompressed() -> None:
    import gzip

    from agents.deadline import ReplyTooLarge, deadline_client

    bomb = gzip.compress(b"0" * (64 * 2**20))  # 64 MiB of zeros in about 64 KiB

    class _Bomb(_FakeOpenAI):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(bomb)))
            self.end_headers()
            self.wfile.write(bomb)

    served = _serve("tools", _Bomb)
    url = next(served)
    try:
        with deadline_client(30.0) as client, pytest.raises(ReplyTooLarge) as info:
            client.post(f"{url}/chat/completions", json={})
    finally:
        served.close()
    assert len(bomb) < REPLY_BOUND_BYTES
    assert "passed, once decompressed, the bound of 8 MiB on one LLM reply" in str(info.value)
