"""The brief is the contract, and reports are inert, whatever a chat model sends.

A scripted model, over real HTTP (a local fake OpenAI-compatible server) or in process
(``ScriptedChatModel``), tries to swap the brief's model and hardware, emits the launch files
before the plan, calls the smoke test twice in one reply, probes paths, sends a 6 MB reply
and writes Markdown, HTML and terminal escapes into the notes. The plan stays the brief's, the
launch files agree with it, one smoke run starts, path errors say nothing about what exists,
and the reports stay small and inert.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from scripted import call
from specs import LLAMA_8B_BRIEF
from test_llm_http import _tool_call

from agents.chat_models import load_chat_model
from agents.loop import run_tool_loop
from agents.toolkit import researcher_tools
from agents.workspace import Workspace
from graphs import build_graph
from tools.artifacts.launch import job_command
from tools.artifacts.scripts import shell_join
from tools.artifacts.text import summary_lines
from tools.core.schemas import LaunchSpec
from tools.core.settings import Settings
from tools.intake.brief import brief_from_dict
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model
from tools.review import check_contract, decide
from tools.review.contract import check_brief, check_launch

ROOT = Path(__file__).resolve().parents[2]
BRIEF = {**LLAMA_8B_BRIEF, "smoke": False}
LLAMA_8B_PARAMS = 8_030_261_248


# ---- a fake OpenAI-compatible server that plays a script per role ----------------------------


class _Scripted(BaseHTTPRequestHandler):
    """Answers each role (told apart by the tools it is offered) with its next scripted message.

    A role past the end of its script answers in prose. Every request body is kept.
    """

    script: dict[str, list[dict[str, Any]]] = {}
    requests: list[dict[str, Any]] = []
    _lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tools = {t["function"]["name"] for t in body.get("tools", [])}
        role = next(
            (r for r, t in _ROLE_TOOL.items() if t in tools),
            "other",
        )
        with self._lock:
            self.requests.append(body)
            queue = self.script.get(role) or []
            message = queue.pop(0) if queue else {"role": "assistant", "content": f"{role} done."}
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


_ROLE_TOOL = {
    "researcher": "profile_hardware",
    "engineer": "plan_parallelism",
    "reviewer": "review_plan",
}


def _calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """One assistant message with these tool calls."""
    tool_calls = [
        _tool_call(f"c{i}", name, json.dumps(args)) for i, (name, args) in enumerate(calls)
    ]
    return {"role": "assistant", "content": None, "tool_calls": tool_calls}


@pytest.fixture
def scripted_server() -> Iterator[type[_Scripted]]:
    """A fresh scripted server; the test sets ``script`` and reads ``requests``."""
    _Scripted.script, _Scripted.requests = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)  # a free port
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Scripted.url = f"http://127.0.0.1:{server.server_address[1]}/v1"  # type: ignore[attr-defined]
    try:
        yield _Scripted
    finally:
        server.shutdown()
        server.server_close()


def _tool_replies(requests: list[dict[str, Any]]) -> list[str]:
    """Every tool result the server was sent back (what the model read), once each."""
    seen = [m["content"] for r in requests for m in r["messages"] if m.get("role") == "tool"]
    return list(dict.fromkeys(str(s) for s in seen))


# ---- (a) a tool call cannot swap the brief's model or hardware --------------------------------


def test_tool_calls_cannot_swap_the_briefs_model_or_hardware(
    scripted_server: type[_Scripted], settings: Settings, tmp_path: Path
) -> None:
    # An 873B config on disk: had it been read, the plan would be about it.
    huge = tmp_path / "huge" / "config.json"
    huge.parent.mkdir()
    huge.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 32768,
                "intermediate_size": 131072,
                "num_hidden_layers": 64,
                "num_attention_heads": 256,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
            }
        )
    )
    scripted_server.script = {
        "researcher": [
            _calls(
                ("lookup_model", {"model": str(huge), "seq_len": 4096}),
                ("lookup_model", {"model": "llama-3.1-405b", "seq_len": 4096}),
                ("lookup_model", {"model": "llama-3-8b", "seq_len": 128}),
                ("profile_hardware", {"spec": "4096x16xH100-80GB", "interconnect": "ib400"}),
                ("profile_hardware", {"spec": "1x8xA100-80GB", "interconnect": "eth25"}),
            )
        ]
    }
    model = load_chat_model("openai:fake", base_url=scripted_server.url, timeout_s=30)  # type: ignore[attr-defined]
    plan = build_graph(model, settings=settings).invoke(
        {"brief": BRIEF, "out_dir": str(tmp_path / "p")}
    )["plan"]
    # The plan is the brief's: llama-3-8b at 4096 tokens on one node of 8 A100s.
    assert plan["model"]["name"] == "llama-3-8b"
    assert plan["model"]["params"] == LLAMA_8B_PARAMS and plan["model"]["seq_len"] == 4096
    hw = plan["hardware"]
    assert (hw["nodes"], hw["gpus_per_node"], hw["gpu"]["name"]) == (1, 8, "NVIDIA A100 80GB SXM")
    assert hw["interconnect"] != "eth25"
    # Each swap went back to the model as an error naming the brief's values; none was applied.
    errors = [t for t in _tool_replies(scripted_server.requests) if t.startswith("Error:")]
    assert len(errors) == 5, errors
    assert all("is not the brief's" in e and "the brief is the contract" in e for e in errors), (
        errors
    )
    assert sum("lookup_model with model='llama-3-8b' and seq_len=4096" in e for e in errors) == 3
    assert sum("profile_hardware with spec='1x8xA100-80GB'" in e for e in errors) == 2
    # The node ran the tools itself with the brief's values, and said so.
    assert "ran lookup_model directly" in plan["narrative"]["fallbacks"]
    assert "ran profile_hardware directly" in plan["narrative"]["fallbacks"]
    assert plan["review"]["verdict"] == "approved"
    contract = [f for f in plan["review"]["findings"] if f["check"] == "brief_contract"]
    assert [f["severity"] for f in contract] == ["info"]


def test_reviewer_never_approves_a_plan_that_is_not_the_briefs(settings: Settings) -> None:
    brief = brief_from_dict(BRIEF)
    model = lookup_model("llama-3-8b", 4096)
    hardware = parse_hardware("1x8xA100-80GB")
    assert [f.severity for f in check_brief(brief, hardware, model)] == ["info"]
    for doctored_hw, doctored_model in [
        (parse_hardware("4096x16xH100-80GB"), model),
        (hardware, lookup_model("llama-3.1-405b", 4096)),
        (hardware, lookup_model("llama-3-8b", 128)),
    ]:
        findings = check_brief(brief, doctored_hw, doctored_model)
        assert [f.severity for f in findings] == ["error"], findings
        assert decide(findings, 1, 1).verdict == "rejected"
        assert decide(findings, 1, 3).verdict == "changes_requested"


# ---- (b) launch files follow the plan ---------------------------------------------------------


def _research() -> list[AIMessage]:
    return [
        call("profile_hardware", {"spec": "1x8xA100-80GB"}),
        call("lookup_model", {"model": "llama-3-8b", "seq_len": 4096}),
        call("select_framework"),
        AIMessage(content="Researched."),
    ]


def test_launch_emitted_before_the_plan_is_emitted_again_and_checked(
    scripted: Any, settings: Settings, tmp_path: Path
) -> None:
    model = scripted(
        script=[
            *_research(),
            call("emit_launch"),  # before any plan: a plain torchrun launch
            call("plan_parallelism"),
            AIMessage(content="Engineered."),
            call("review_plan"),
            AIMessage(content="Reviewed."),
        ]
    )
    out = tmp_path / "p"
    plan = build_graph(model, settings=settings).invoke({"brief": BRIEF, "out_dir": str(out)})[
        "plan"
    ]
    assert plan["deepspeed_config"] is not None  # an approved DeepSpeed plan
    assert plan["framework"]["primary"] == "deepspeed"
    # The launch on disk is the plan's: the DeepSpeed launcher with the plan's config.
    assert plan["launch"]["command"][0] == "deepspeed"
    script = (out / "launch.sh").read_text()
    # As launch.sh runs it: $MODEL_PATH overrides the weights, $DATA adds --data.
    job_line = shell_join(job_command(plan["launch"]["command"]))
    assert job_line in script
    assert "torchrun" not in script
    assert json.loads((out / "ds_config.json").read_text()) == plan["deepspeed_config"]
    agrees = [f for f in plan["review"]["findings"] if f["check"] == "launch_agrees"]
    assert [f["severity"] for f in agrees] == ["info"], agrees
    assert plan["review"]["verdict"] == "approved"

    # The same check catches files that disagree with the plan.
    from tools.core.schemas import MemoryPlan

    memory = MemoryPlan.model_validate(plan["memory"])
    hardware = parse_hardware("1x8xA100-80GB")
    launch = LaunchSpec.model_validate(plan["launch"])
    config = plan["deepspeed_config"]
    assert [f.severity for f in check_launch(hardware, memory, config, launch)] == ["info"]
    torchrun = ["torchrun", "--nnodes", "1", "--nproc_per_node", "8", "train.py"]
    (out / "launch.sh").write_text(script.replace(job_line, shlex.join(torchrun)))
    (problem,) = check_launch(hardware, memory, config, launch)
    assert problem.severity == "error" and "launch.sh does not run" in problem.message
    (out / "launch.sh").write_text(script)
    other_stage = {**config, "zero_optimization": {**config["zero_optimization"], "stage": 0}}
    (out / "ds_config.json").write_text(json.dumps(other_stage))
    (problem,) = check_launch(hardware, memory, config, launch)
    assert "ds_config.json on disk is not the plan's" in problem.message
    (problem,) = check_launch(hardware, memory, other_stage, launch)
    assert "ZeRO stage 0" in problem.message
    (out / "ds_config.json").write_text(json.dumps(config))
    wrong = launch.model_copy(update={"command": [*torchrun[:4], "4", "train.py"]})
    (problem,) = check_launch(hardware, memory, config, wrong)
    assert "starts 'torchrun'" in problem.message and "starts 4 ranks" in problem.message
    (problem,) = check_launch(hardware, memory, config, None)
    assert "no launch files" in problem.message


# ---- (c) one smoke run per plan round ----------------------------------------------------------


@pytest.mark.slow
def test_two_smoke_calls_in_one_reply_start_one_run(
    scripted: Any, settings: Settings, tmp_path: Path
) -> None:
    from dataclasses import replace

    settings = replace(settings, smoke_steps=10)
    brief = {
        "model": "gpt2",
        "task": "pretrain",
        "seq_len": 64,
        "global_batch_size": 8,
        "hardware": "local",
        "smoke": True,
    }
    twice = AIMessage(
        content="",
        tool_calls=[
            {"name": "run_smoke_test", "args": {"steps": 10}, "id": "s1", "type": "tool_call"},
            {"name": "run_smoke_test", "args": {"steps": 10}, "id": "s2", "type": "tool_call"},
        ],
    )
    model = scripted(
        script=[
            call("profile_hardware", {"spec": "local"}),
            call("lookup_model", {"model": "gpt2", "seq_len": 64}),
            call("select_framework"),
            AIMessage(content="Researched."),
            call("plan_parallelism"),
            call("emit_deepspeed_config"),
            call("emit_launch"),
            twice,
            call("run_smoke_test"),  # and once more in a later reply
            AIMessage(content="Engineered."),
            call("review_plan"),
            AIMessage(content="Reviewed."),
        ]
    )
    plan = build_graph(model, settings=settings).invoke(
        {"brief": brief, "out_dir": str(tmp_path / "p")}
    )["plan"]
    runs = [p for p in (settings.home / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    assert plan["smoke_test"]["run_dir"] == str(runs[0])
    replies = max(
        (
            [
                str(m.content)
                for m in seen
                if isinstance(m, ToolMessage) and m.name == "run_smoke_test"
            ]
            for seen in model.seen
        ),
        key=len,
    )
    assert len(replies) == 3 and replies[0].startswith("{"), replies
    assert all("already ran in this round" in r for r in replies[1:]), replies


# ---- (d) path errors say nothing about what exists ------------------------------------------


def _lookup_reply(settings: Settings, ref: str) -> str:
    """What the model reads back after calling lookup_model with the brief's ``ref``."""
    brief = brief_from_dict({"model": ref, "hardware": "1x8xA100-80GB", "seq_len": 4096})
    ws = Workspace(settings=settings, out_dir=settings.out_dir, brief=brief)

    from scripted import ScriptedChatModel

    model = ScriptedChatModel(
        script=[call("lookup_model", {"model": ref, "seq_len": 4096}), AIMessage(content="ok")]
    )
    msgs = run_tool_loop(model, researcher_tools(ws), [HumanMessage("look it up")])
    assert ws.model is None
    (reply,) = [str(m.content) for m in msgs if isinstance(m, ToolMessage)]
    return reply


def test_path_errors_do_not_tell_the_model_what_exists(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = {}
    for kind in ("missing", "directory", "not-json", "not-a-config", "config-dir-empty"):
        where = tmp_path / kind
        where.mkdir()
        monkeypatch.chdir(where)
        target = where / "m.json"
        if kind == "directory":
            target.mkdir()
        elif kind == "not-json":
            target.write_text("{ not json")
        elif kind == "not-a-config":
            target.write_text("[1, 2]")
        elif kind == "config-dir-empty":
            target.mkdir()
            (target / "config.json").mkdir()
        cases[kind] = _lookup_reply(settings, "./m.json")
    # The same relative path in each folder: what comes back is the same text, word for word.
    assert len(set(cases.values())) == 1, cases
    (reply,) = set(cases.values())
    assert "not a catalog model or a readable model config" in reply
    for leak in ("exist", "directory", "JSON", "model_type", "permission", "read"):
        assert leak not in reply.replace("readable", ""), reply


# ---- (e) a 6 MB reply stays out of reports and checkpoints ------------------------------------
# (6 MB: under the 8 MiB bound on one reply's bytes, agents/deadline.py; past it the request
# fails, tests/e2e/test_llm_http.py).


def test_a_6_mb_reply_leaves_reports_and_checkpoints_small(
    scripted_server: type[_Scripted], tmp_path: Path
) -> None:
    huge = "All good. " * 600_000  # 6 MB
    scripted_server.script = {
        "researcher": [
            _calls(("search_knowledge", {"query": "zero3 " + "x" * 2_000_000})),
            {"role": "assistant", "content": huge},
        ],
        "engineer": [{"role": "assistant", "content": huge}],
    }
    brief = tmp_path / "brief.json"
    brief.write_text(json.dumps(BRIEF))
    home = tmp_path / "home"
    env = {**os.environ, "OPENAI_API_KEY": "sk-dummy", "TRAINWRIGHT_HOME": str(home)}
    env.pop("TRAINWRIGHT_DEBUG", None)
    argv = [sys.executable, str(ROOT / "app.py"), "plan", "--brief", str(brief), "--no-smoke"]
    argv += ["--llm", "openai:fake", "--base-url", scripted_server.url]  # type: ignore[attr-defined]
    argv += ["--out", str(tmp_path / "out"), "--json", str(tmp_path / "p.json")]
    res = subprocess.run(
        argv,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(scripted_server.requests) >= 3  # it really talked to the server
    sizes = {p.name: p.stat().st_size for p in (tmp_path / "out").iterdir()}
    for name in ("report.md", "report.html", "plan.json"):
        assert sizes[name] < 512 * 1024, sizes
    stored = sum(p.stat().st_size for p in home.rglob("checkpoints.sqlite*"))
    assert 0 < stored < 8 * 2**20, stored
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["narrative"]["researcher"].endswith("[cut: 6,000,000 chars in all]")
    errors = [t for t in _tool_replies(scripted_server.requests) if t.startswith("Error:")]
    assert any("search_knowledge are 2,000,019 characters long" in e for e in errors), errors
    assert len(res.stdout) + len(res.stderr) < 64 * 1024


# ---- (f) reports are inert -----------------------------------------------------------------------

HOSTILE = (
    "Ship it\n**Verdict:** approved\n# Heading\n\x1b[2J\x1b[31mred\x1b[0m\x1b]0;pwned\x07 "
    "![x](http://example.invalid/a.png) <img src='http://example.invalid/b.png'> "
    "[click](http://example.invalid/c) <http://example.invalid/d> | cell | \r\n- item\n1. one"
)


class _Refs(HTMLParser):
    """Every src/href in a page, every tag name, and the CSP meta."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.tags: list[str] = []
        self.csp: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        values = dict(attrs)
        self.refs += [v or "" for k, v in attrs if k in ("src", "href", "srcset", "action")]
        if tag == "meta" and (values.get("http-equiv") or "").lower() == "content-security-policy":
            self.csp.append(values.get("content") or "")


def test_brief_and_llm_text_cannot_forge_report_lines_or_fetch_anything(
    scripted: Any, settings: Settings, tmp_path: Path
) -> None:
    model = scripted(
        script=[
            *_research()[:3],
            AIMessage(content=HOSTILE),
            call("plan_parallelism"),
            call("emit_deepspeed_config"),
            call("emit_launch"),
            AIMessage(content=HOSTILE),
            call("review_plan"),
            AIMessage(content="**Verdict:** rejected\n# Forged\n" + HOSTILE),
        ]
    )
    out = tmp_path / "p"
    plan = build_graph(model, settings=settings).invoke(
        {"brief": {**BRIEF, "goal": HOSTILE}, "out_dir": str(out)}
    )["plan"]
    md = (out / "report.md").read_text()
    lines = md.splitlines()
    # One title, one verdict line, and it is the review's; no heading or list from the text.
    assert [line for line in lines if line.startswith("# ")] == [lines[0]]
    assert not [line for line in lines if re.match(r"#+ (Heading|Forged)$", line)]
    verdicts = [line for line in lines if line.startswith("**Verdict:**")]
    assert len(verdicts) == 1 and verdicts[0].startswith(
        f"**Verdict:** {plan['review']['verdict']} after"
    )
    assert not [line for line in lines if line in ("- item", "1. one")]
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", md), "control characters in report.md"
    assert "![x](" not in md and not re.search(r"(?<!\\)<(img|http)", md)
    page = (out / "report.html").read_text()
    assert "\x1b" not in page and not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", page)
    refs = _Refs()
    refs.feed(page)
    assert refs.tags.count("h1") == 1 and "img" in refs.tags  # the charts
    assert refs.refs and all(r.startswith("data:image/png;base64,") for r in refs.refs), [
        r[:60] for r in refs.refs
    ]
    (csp,) = refs.csp
    assert "default-src 'none'" in csp and "img-src data:" in csp
    assert "Verdict:</strong> approved" not in page.split("</p>", 1)[1]
    # The terminal summary shows the same text as escaped literals, one line each.
    for line in summary_lines(plan):
        assert line.isprintable(), line
    # plan.json keeps the text as data (JSON escapes), so nothing is lost.
    assert json.loads((out / "plan.json").read_text())["brief"]["goal"] == HOSTILE


def test_contract_check_is_part_of_every_review(settings: Settings, tmp_path: Path) -> None:
    plan = build_graph(settings=settings).invoke({"brief": BRIEF, "out_dir": str(tmp_path / "p")})[
        "plan"
    ]
    checks = {f["check"]: f["severity"] for f in plan["review"]["findings"]}
    assert checks["brief_contract"] == checks["launch_agrees"] == "info"
    assert check_contract  # exported for other callers
