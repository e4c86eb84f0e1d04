"""``estimate --batch FILE.jsonl``: many setups in one process, one answer per line.

Each answer equals what ``estimate --json`` writes for the same flags; a bad line (not JSON,
an unknown key, a bad value, a setup the estimate refuses) is a line on stderr naming its line
number and ``{line, error}`` in the output, and the others are still estimated (exit 1); an
empty file answers nothing (exit 0); a file that cannot be read is one line, exit 2. The CLI is
called in process (tests/inproc.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inproc import run_main

from tools.planning.estimate_batch import PROGRESS_EVERY_S, estimate_lines
from tools.research import gpu_probe

ROOT = Path(__file__).resolve().parents[3]
PREFIX = "trainwright: estimate --batch: "
# Dense and mixture-of-experts models, pinned and searched layouts, a recipe, two GPU families.
SETUPS = [
    {"model": "llama-3-8b", "hardware": "1x8xH100-80GB", "seq_len": 4096, "global_batch": 64},
    {"model": "mixtral-8x7b", "hardware": "2x8xA100-80GB", "seq_len": 4096, "tp": 2, "pp": 2},
    {"model": "qwen2.5-0.5b", "hardware": "1x4xRTX4090", "seq_len": 2048, "global_batch": 32,
     "framework": "fsdp", "precision": "pure-bf16", "checkpointing": "full"},
    {"model": "gpt2", "hardware": "1x1xV100-32GB", "seq_len": 1024, "global_batch": 8,
     "micro_batch": 2, "strategy": "zero2", "task": "pretrain", "precision": "fp16"},
]  # fmt: skip


def _argv(setup: dict[str, object]) -> list[str]:
    """The command-line flags of one batch line's keys."""
    argv: list[str] = []
    for key, value in setup.items():
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "setups.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_each_answer_equals_estimate_json_for_the_same_flags(tmp_path: Path) -> None:
    batch = _write(tmp_path, [json.dumps(s) for s in SETUPS])
    proc = run_main("estimate", "--batch", batch, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == len(SETUPS)
    for setup, answer in zip(SETUPS, answers, strict=True):
        single = tmp_path / "one.json"
        one = run_main("estimate", *_argv(setup), "--json", single, cwd=ROOT)
        assert one.returncode == 0, one.stderr
        assert answer == json.loads(single.read_text()), setup
    assert proc.stderr.strip().splitlines()[-1].startswith(f"{PREFIX}4 of 4 setup(s) estimated")


def test_bad_lines_are_skipped_by_number_and_the_rest_estimated(tmp_path: Path) -> None:
    good = json.dumps(SETUPS[0])
    lines = [
        good,  # 1
        "",  # 2: blank, not a setup
        "{not json",  # 3
        json.dumps({**SETUPS[0], "seq-len": 4096}),  # 4: a flag's spelling, not the field's
        json.dumps({**SETUPS[0], "tp": "2"}),  # 5: a string for a count
        json.dumps({**SETUPS[0], "seq_len": 0}),  # 6: out of the flag's bounds
        json.dumps({**SETUPS[0], "hardware": "1x1xH100-80GB", "tp": 2}),  # 7: refused setup
        "[1, 2]",  # 8
        json.dumps({**SETUPS[0], "model": "no-such-model-7b"}),  # 9
        good,  # 10
    ]
    path = _write(tmp_path, lines)
    path.write_bytes(path.read_bytes() + b'{"model": "\xff"}\n')  # 11: not UTF-8
    proc = run_main("estimate", "--batch", path, cwd=ROOT)
    assert proc.returncode == 1
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == 10  # one per non-blank line
    assert answers[0] == answers[-2] and "strategies" in answers[0]
    skipped = {a["line"]: a["error"] for a in answers if set(a) == {"line", "error"}}
    assert sorted(skipped) == [3, 4, 5, 6, 7, 8, 9, 11]
    assert "not JSON" in skipped[3]
    assert "'seq-len'" in skipped[4] and "'seq_len'" in skipped[4]
    assert skipped[5].startswith("tp (--tp)")
    assert skipped[6].startswith("--seq-len: must be a whole number from 1")
    assert skipped[7].startswith("--tp: 2 exceeds the 1 GPUs")
    assert "not a JSON object" in skipped[8] and "unknown model" in skipped[9]
    assert "UTF-8" in skipped[11]
    stderr = proc.stderr.strip().splitlines()
    for line, error in skipped.items():
        assert f"{PREFIX}line {line}: {error}" in stderr
    assert stderr[-1].startswith(f"{PREFIX}2 of 10 setup(s) estimated")
    assert stderr[-1].endswith("8 line(s) skipped: 3, 4, 5, 6, 7, 8, 9, 11")


def test_empty_file_answers_nothing(tmp_path: Path) -> None:
    for text in ("", "\n\n  \n"):
        path = tmp_path / "empty.jsonl"
        path.write_text(text)
        proc = run_main("estimate", "--batch", path, cwd=ROOT)
        assert (proc.returncode, proc.stdout) == (0, "")
        assert proc.stderr.startswith(f"{PREFIX}0 of 0 setup(s) estimated")


def test_unreadable_file_or_other_flags_are_one_line_exit_2(tmp_path: Path) -> None:
    missing = run_main("estimate", "--batch", tmp_path / "nope.jsonl", cwd=ROOT)
    folder = run_main("estimate", "--batch", tmp_path, cwd=ROOT)
    path = _write(tmp_path, [json.dumps(SETUPS[0])])
    mixed = run_main("estimate", "--batch", path, "--model", "gpt2", "--tp", "2", cwd=ROOT)
    for proc in (missing, folder, mixed):
        assert proc.returncode == 2 and proc.stdout == ""
        assert len(proc.stderr.splitlines()) == 1
        assert proc.stderr.startswith("trainwright: error: --batch: ")
    assert "No such file" in missing.stderr
    assert "put --model, --tp in each line" in mixed.stderr


def test_json_flag_writes_the_answers_to_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, [json.dumps(SETUPS[3]), "nope"])
    out = tmp_path / "out.jsonl"
    proc = run_main("estimate", "--batch", path, "--json", out, cwd=ROOT)
    assert proc.returncode == 1 and proc.stdout == ""
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert first["setup"]["strategy"] == "zero2" and first["setup"]["micro_batch_size"] == 2
    assert second == {"line": 2, "error": "not JSON: Expecting value at column 1"}


def test_progress_is_reported_on_a_long_file() -> None:
    """``progress`` is called once per PROGRESS_EVERY_S of the (fake) clock, not per line."""
    ticks = iter(range(0, 1000, 2))  # every clock read advances 2 s
    seen: list[tuple[int, float]] = []
    lines = ["[]"] * 12  # quick to refuse: the clock, not the estimates, is under test
    answers = list(
        estimate_lines(lines, {}, lambda n, s: seen.append((n, s)), clock=lambda: next(ticks))
    )
    assert len(answers) == 12 and all(a.error for a in answers)
    assert PROGRESS_EVERY_S == 5.0
    assert seen == [(3, 6.0), (6, 12.0), (9, 18.0), (12, 24.0)]


def test_local_hardware_is_probed_once_for_the_whole_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines on this machine (the default hardware) share one probe, not one per line."""
    probes: list[int] = []

    def probe(*_args: object, **_kwargs: object) -> gpu_probe.GPUProbe:
        probes.append(1)
        return gpu_probe.GPUProbe()

    monkeypatch.setattr(gpu_probe, "probe_gpus", probe)
    line = {"model": "gpt2", "seq_len": 128, "global_batch": 2, "precision": "fp32"}
    path = _write(tmp_path, [json.dumps(line), json.dumps({**line, "hardware": "local"})] * 2)
    proc = run_main("estimate", "--batch", path, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 4 and probes == [1]
    single = run_main("estimate", *_argv(line), cwd=ROOT)
    assert single.returncode == 0 and probes == [1, 1]  # outside a batch: probed each time
