"""The CLI contract: exit codes 0/2/1, one-line errors, files written.

The CLI runs in process (``cli_main``, see inproc.py) where a test reads its answer; a real
``python app.py`` process stays where the process is the point: ``--help``'s cold start and a
plan whose stdout stream must carry nothing but the answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BRIEFS = Path(__file__).parents[1] / "data"
STDOUT_KEYS = {"framework", "time to train", "smoke test", "review", "report", "plan json"}


def run_cli(*args: str, cwd: Path, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, str(ROOT / "app.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_help_is_fast_and_lists_commands(tmp_path: Path) -> None:
    res = run_cli("--help", cwd=tmp_path)
    assert res.returncode == 0
    for cmd in ("plan", "profile", "estimate"):
        assert cmd in res.stdout


def test_plan_llama_8b_writes_json_that_deepspeed_accepts_at_world_size_8(tmp_path: Path) -> None:
    res = run_cli(
        "plan",
        "--brief",
        str(BRIEFS / "llama3-8b-finetune-8xa100.yaml"),
        "--no-smoke",
        "--out",
        "o",
        "--json",
        "p.json",
        cwd=tmp_path,
        flags=("-X", "importtime"),  # on stderr: what the plan imported, below
    )
    assert res.returncode == 0, res.stderr[-3000:]
    plan = json.loads((tmp_path / "p.json").read_text())
    assert len(plan["memory"]["strategies"]) >= 4
    from tools.artifacts.ds_validate import validate_deepspeed_config

    validate_deepspeed_config(plan["deepspeed_config"], 8)
    assert (tmp_path / "o" / "report.md").is_file()
    assert "report: " in res.stdout
    # stdout is the answer, for scripts: library log lines stay off it.
    assert all(line.split(":")[0] in STDOUT_KEYS for line in res.stdout.splitlines()), res.stdout
    # One plan per process: each library is imported where it is used (matplotlib draws the
    # report's charts), none that the plan does not use: the DeepSpeed config is checked against
    # DeepSpeed's rules without importing it, the query is embedded in numpy (no torch), and
    # chromadb only when the index is (re)built. (-X importtime names a package imported by
    # importlib.import_module by its submodules only.)
    names = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if "|" in line}
    roots = {name.split(".")[0] for name in names}
    assert "matplotlib" in roots
    assert roots & {"deepspeed", "torch", "transformers", "sentence_transformers"} == set()
    assert not any(name.startswith("torch._dynamo") for name in names)


def test_cli_runs_main_with_a_cli_processs_gc(monkeypatch: pytest.MonkeyPatch) -> None:
    """``app.cli`` (``python app.py`` and the console script) exits with main's code; the cyclic
    GC runs less often and not at exit (an in-process ``main`` leaves the GC alone)."""
    import gc

    import app

    seen: dict[str, object] = {}
    monkeypatch.setattr(app, "main", lambda: seen.setdefault("threshold", gc.get_threshold()) and 3)
    monkeypatch.setattr(gc, "freeze", lambda: seen.setdefault("frozen", True))
    before = gc.get_threshold()
    try:
        with pytest.raises(SystemExit) as stop:
            app.cli()
    finally:
        gc.set_threshold(*before)
    assert stop.value.code == 3 and seen["frozen"] is True
    assert seen["threshold"][0] > before[0]  # type: ignore[index]


BAD_BRIEFS = {
    "no-model.yaml": ("goal: train something\ntask: pretrain\n", "brief.model"),
    "neg-batch.yaml": ("model: gpt2\nglobal_batch_size: -4\n", "brief.global_batch_size"),
    "not-yaml.yaml": ("model: [gpt2\n  : : {\n", "--brief"),
    "banana.yaml": ("model: gpt2\nhardware: 9xbanana\n", "hardware"),
}


@pytest.mark.parametrize("name", sorted(BAD_BRIEFS))
def test_bad_briefs_exit_2_with_one_line(name: str, tmp_path: Path, cli_main: Any) -> None:
    text, field = BAD_BRIEFS[name]
    (tmp_path / name).write_text(text)
    res = cli_main("plan", "--brief", name, "--no-smoke", "--out", "o", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert field in lines[0]
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists()


def test_bad_hardware_flag_exits_2(tmp_path: Path, cli_main: Any) -> None:
    res = cli_main("plan", "train gpt2", "--hardware", "9xbanana", "--no-smoke", cwd=tmp_path)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1
    assert "banana" in res.stderr


def test_missing_brief_file_and_unknown_flag_exit_2(tmp_path: Path, cli_main: Any) -> None:
    assert cli_main("plan", "--brief", "nope.yaml", cwd=tmp_path).returncode == 2
    res = cli_main("plan", "--frobnicate", cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1


def test_profile_local(tmp_path: Path, cli_main: Any) -> None:
    res = cli_main("profile", "--json", "hw.json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    hw = json.loads((tmp_path / "hw.json").read_text())["hardware"]
    assert hw["source"] == "local" and hw["cpu_cores"] >= 1


def test_thread_checkpoints_to_sqlite_and_rejects_unsafe_ids(tmp_path: Path, cli_main: Any) -> None:
    brief = str(BRIEFS / "llama3-8b-finetune-8xa100.yaml")
    res = cli_main(
        "plan", "--brief", brief, "--no-smoke", "--out", "o", "--thread", "job-1", cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    import os
    import sqlite3

    db = Path(os.environ["TRAINWRIGHT_HOME"]) / "checkpoints.sqlite"
    with sqlite3.connect(db) as conn:
        threads = {row[0] for row in conn.execute("select distinct thread_id from checkpoints")}
    assert threads == {"job-1"}
    bad = cli_main(
        "plan", "--brief", brief, "--no-smoke", "--thread", "../x; rm -rf ~", cwd=tmp_path
    )
    assert bad.returncode == 2 and "--thread" in bad.stderr


def test_estimate_from_flags_prints_every_strategy_and_writes_json(
    tmp_path: Path, cli_main: Any
) -> None:
    res = cli_main(
        "estimate",
        "--model",
        "llama-3-8b",
        "--hardware",
        "1x8xA100-80GB",
        "--seq-len",
        "4096",
        "--global-batch",
        "64",
        "--json",
        "e.json",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads((tmp_path / "e.json").read_text())
    names = [s["name"] for s in data["strategies"]]
    assert {"ddp", "zero1", "zero2", "zero3"} <= set(names)
    for name in names:
        assert name in res.stdout
    assert f"chosen: {data['chosen']}" in res.stdout
    bad = cli_main(
        "estimate",
        "--model",
        "llama-3-8b",
        "--hardware",
        "1x8xA100-80GB",
        "--micro-batch",
        "0",
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
