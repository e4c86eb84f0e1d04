"""The chat REPL: a piped session, a real prompt_toolkit session in a pseudo-terminal, helpers."""

from __future__ import annotations

import io
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphs.chat import HELP
from graphs.run import list_threads
from tools.artifacts.save import save_plan
from tools.core.errors import InputError
from tools.core.settings import Settings
from tools.intake.follow_up import follow_up_fields
from tools.research.model_catalog import list_models

ROOT = Path(__file__).resolve().parents[2]


def _json_block(text: str) -> dict:
    """The first JSON object printed flush left (as /config prints it)."""
    lines = text.splitlines()
    start = lines.index("{")
    end = lines.index("}", start)
    return json.loads("\n".join(lines[start : end + 1]))


def test_piped_session_plans_follows_up_and_answers_commands(tmp_path: Path) -> None:
    script = "\n".join(
        [
            "fine-tune llama-3-8b on 8 A100s",
            "what if I only had 4 GPUs?",
            "/config",
            "/brief",
            f"/save {tmp_path / 'saved'}",
            "/threads",
            "/quit",
            "this line is never read",
        ]
    )
    res = subprocess.run(
        [sys.executable, "app.py", "chat", "--no-smoke", "--thread", "piped-1"],
        input=script + "\n",
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    plans = [line for line in out.splitlines() if line.startswith("plan: ")]
    assert len(plans) == 2, out
    assert plans[0].startswith("plan: llama-3-8b on 1x8xA100-80GB")
    assert plans[1].startswith("plan: llama-3-8b on 1x4xA100-80GB")  # same model, 4 GPUs
    assert "follow-up: hardware '1x8xA100-80GB' -> '1x4xA100-80GB'" in out
    # After each plan, what was read, what was assumed, what was not done (issue 28).
    assert out.count("you asked:") == 2 and out.count("I assumed:") == 2, out
    assert "hardware: 1x8xA100-80GB (from '8 A100s')" in out, out
    assert "smoke test: skipped" in out
    config = _json_block(out)
    # The config is the follow-up's: sized for 4 data-parallel ranks.
    assert config["train_batch_size"] == (
        config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 4
    )
    assert "hardware: 1x4xA100-80GB" in out and "model: llama-3-8b" in out
    assert "piped-1" in out  # /threads
    saved = {p.name for p in (tmp_path / "saved").iterdir()}
    assert {"report.md", "plan.json", "ds_config.json", "launch.sh"} <= saved
    assert "never read" not in out + res.stderr
    # Events (agents and tools at work) go to stderr, so stdout stays scriptable.
    assert "[engineer] emit_deepspeed_config" in res.stderr
    assert "[engineer]" not in out


def _read_until(
    fd: int, needle: bytes, buf: bytearray, timeout_s: float, start: int | None = None
) -> int:
    """Read until ``needle`` appears at or after ``start`` (default: in what arrives from now on)."""
    start = len(buf) if start is None else start
    deadline = time.monotonic() + timeout_s
    while buf.find(needle, start) < 0:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {needle!r} within {timeout_s} s; got:\n{buf[-3000:]!r}")
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                raise AssertionError(
                    f"terminal closed before {needle!r}:\n{buf[-3000:]!r}"
                ) from None
            buf.extend(chunk)
    return buf.find(needle, start)


def test_prompt_toolkit_session_in_a_pseudo_terminal(tmp_path: Path) -> None:
    master, slave = os.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
    env["PROMPT_TOOLKIT_NO_CPR"] = "1"  # no cursor-position replies to wait for
    proc = subprocess.Popen(
        [sys.executable, "app.py", "chat", "--no-smoke"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    buf = bytearray()
    try:
        _read_until(master, b"you>", buf, 120)
        os.write(master, b"fine-tune llama-3-8b on 8 A100s\r")
        at = _read_until(master, b"review: approved", buf, 300)
        _read_until(master, b"you>", buf, 60, start=at)
        os.write(master, b"/config\r")
        at = _read_until(master, b"train_micro_batch_size_per_gpu", buf, 60)
        _read_until(master, b"you>", buf, 60, start=at)
        os.write(master, b"\x04")  # Ctrl-D
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = buf.decode("utf-8", "replace")
    assert "plan: llama-3-8b on 1x8xA100-80GB" in text
    assert "[researcher]" in text  # the agents at work are shown
    assert (Path(os.environ["TRAINWRIGHT_HOME"]) / "chat_history").is_file()


def test_follow_up_keeps_the_gpu_type_and_reads_counts() -> None:
    models = list_models()
    brief = {"model": "llama-3-8b", "hardware": "1x8xA100-80GB"}
    assert follow_up_fields("what if I only had 4 GPUs?", brief, models) == {
        "hardware": "1x4xA100-80GB"
    }
    assert follow_up_fields("and with 16 GPUs", brief, models) == {"hardware": "2x8xA100-80GB"}
    assert follow_up_fields("2 nodes of 4 GPUs", brief, models) == {"hardware": "2x4xA100-80GB"}
    assert follow_up_fields("on 4 H100s instead", brief, models) == {"hardware": "1x4xH100-80GB"}
    assert follow_up_fields("what about llama-3-70b", brief, models) == {"model": "llama-3-70b"}
    assert follow_up_fields("hello there", brief, models) == {}


def test_save_writes_only_under_the_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "report.md").write_text("# report\n")
    (src / "plan.json").write_text("{}\n")
    plan = {
        "report": {"markdown": str(src / "report.md"), "json": str(src / "plan.json")},
        "launch": {"files": {"../../evil.sh": str(src / "report.md")}},
        "deepspeed_config": {"train_batch_size": 8},
    }
    with pytest.raises(InputError, match="NUL"):
        save_plan(plan, "out\x00dir")
    dest = tmp_path / "dest"
    copied = save_plan(plan, str(dest))
    assert {p.name for p in copied} == {"report.md", "plan.json"}
    assert json.loads((dest / "ds_config.json").read_text()) == {"train_batch_size": 8}
    assert not (tmp_path / "evil.sh").exists()
    # A destination that is a symlink out of the directory is refused, not followed.
    outside = tmp_path / "outside.md"
    (dest / "report.md").unlink()
    (dest / "report.md").symlink_to(outside)
    with pytest.raises(InputError, match="outside"):
        save_plan(plan, str(dest))
    assert not outside.exists()


def test_list_threads_without_a_database(tmp_path: Path) -> None:
    assert list_threads(tmp_path / "none.sqlite") == []


def test_after_ctrl_c_a_message_is_a_new_request_and_resume_goes_back(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in the first plan's engineer; the next message plans itself; /resume the first."""
    import agents.roles
    from graphs.chat import ChatSession

    started = {"roles": 0}
    warm_up = agents.roles.warm_up

    def ctrl_c_in_the_first_engineer() -> None:
        started["roles"] += 1
        if started["roles"] == 2:  # researcher, then engineer of the first request
            raise KeyboardInterrupt
        warm_up()

    monkeypatch.setattr(agents.roles, "warm_up", ctrl_c_in_the_first_engineer)
    out = io.StringIO()
    session = ChatSession(settings, thread="c1", smoke=False, out=out, err=io.StringIO())
    lines = iter(
        [
            "fine-tune llama-3-8b on 8 A100s",
            "pretrain gpt2 on 1x8xA100-80GB with seq len 1024",
            "/resume",
            "/resume",
            "/quit",
        ]
    )
    session._read = lambda prompt: next(lines, None)
    assert session.run() == 0
    said = out.getvalue().splitlines()
    plans = [line for line in said if line.startswith("plan: ")]
    assert plans[0].startswith("plan: gpt2 on 1x8xA100-80GB"), said  # the new request's own
    assert plans[1].startswith("plan: llama-3-8b on 1x8xA100-80GB"), said  # the stopped one
    assert len(plans) == 2, said
    resumed = [i for i, line in enumerate(said) if line.startswith("resuming thread c1 at")]
    assert len(resumed) == 1 and said[resumed[0]] == "resuming thread c1 at engineer", said
    assert said.index(plans[0]) < resumed[0] < said.index(plans[1])
    assert "nothing to resume on thread c1: no plan was stopped" in said[-1], said
    assert sum(line.startswith("cancelled;") for line in said) == 1, said
    assert "/resume continues this plan; a new message is a new request" in out.getvalue()
    assert "/resume        continue the plan Ctrl-C stopped" in HELP
