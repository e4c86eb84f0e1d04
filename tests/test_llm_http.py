"""A real chat-model client over real HTTP, against a local fake OpenAI-compatible server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents.models import load_chat_model
from graphs import build_graph
from tools.settings import Settings


class _FakeOpenAI(BaseHTTPRequestHandler):
    """Answers /v1/chat/completions: a tool call where the request offers select_framework, prose otherwise."""

    requests: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append({"path": self.path, "body": body})
        tools = [t["function"]["name"] for t in body.get("tools", [])]
        answered = any(m.get("role") == "tool" for m in body["messages"])
        message: dict[str, Any] = {"role": "assistant", "content": "Here is my analysis."}
        if "select_framework" in tools and not answered:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "profile_hardware",
                            "arguments": json.dumps({"spec": "1x8xA100-80GB"}),
                        },
                    }
                ],
            }
        payload = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def fake_server() -> Iterator[str]:
    _FakeOpenAI.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


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
