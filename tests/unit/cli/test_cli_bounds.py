"""Every number a user gives the CLI has a stated bound: outside it, one line naming it, exit 2.

Before the fix, `smoke --timeout nan|inf` (and the same in TRAINWRIGHT_SMOKE_TIMEOUT_S) turned
the timeout off, `--world-size`/`--micro-batch` of 1e20 or `--tp 100000000` ended as
"unexpected error" or a MemoryError (or started a run), and `estimate --grad-accum 2` without
`--global-batch` was an "unexpected error". The table of bounds is app.py ``number_flags``; the
first test fails when a command gains an int or float flag without a row there. The CLI is
called in process (``main(argv)``); a smoke run that would start is a failure of the test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import app
from app import main, number_flags
from tools.core.errors import MAX_ERROR_CHARS
from tools.core.settings import ENV_NUMBERS

PREFIX = "trainwright: error: "
BASE = {
    "estimate": ["estimate", "--model", "llama-3-8b"],
    "size": ["size", "--model", "llama-3-8b"],
    "smoke": ["smoke", "--model", "gpt2"],
    "report": ["report", "brief.yaml", "--out", "reports"],
}


@pytest.fixture(autouse=True)
def _no_run_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A refused value is refused before anything runs: a smoke run or a batch fails the test."""
    import graphs.batch
    import tools.smoke
    import tools.smoke.tf_runner

    def started(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a run started")

    monkeypatch.setattr(tools.smoke, "run_smoke_test", started)
    monkeypatch.setattr(tools.smoke.tf_runner, "run_tf_smoke", started)
    monkeypatch.setattr(graphs.batch, "run_batch", started)
    monkeypatch.chdir(tmp_path)


def _number_options() -> set[tuple[str, str, type]]:
    """(command, --flag, int or float) for every option of every command that takes a number."""
    parser = app.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = set()
    for command, sub in commands.choices.items():
        for action in sub._actions:
            if action.type in (int, float):
                flag = max(action.option_strings, key=len)
                found.add((command, flag, action.type))
    return found


def test_every_number_flag_of_every_command_has_a_bound() -> None:
    table = number_flags()
    declared = {(c, f) for c, flags in table.items() for f in flags}
    assert {(c, f) for c, f, _type in _number_options()} == declared
    # The float flags are times: above 0, finite, at most their bound.
    floats = {(c, f) for c, f, kind in _number_options() if kind is float}
    assert floats == {("smoke", "--timeout")}
    for command, flag in declared:
        least, most = table[command][flag]
        assert least < most


def _bad_values(command: str, flag: str) -> list[str]:
    least, most = number_flags()[command][flag]
    if (command, flag) == ("smoke", "--timeout"):
        return ["nan", "inf", "-inf", "0", "-1", str(most * 2), "1e20"]
    return [str(int(least) - 1), "-1", str(int(most) + 1), str(10**20)]


CASES = [
    (command, flag, value)
    for command, flags in sorted(number_flags().items())
    for flag in sorted(flags)
    for value in _bad_values(command, flag)
]


def _one_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2, err[-2000:]
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith(PREFIX) and len(lines[0]) <= len(PREFIX) + MAX_ERROR_CHARS
    assert out == ""
    return lines[0]


@pytest.mark.parametrize(("command", "flag", "value"), CASES)
def test_a_number_flag_outside_its_bound_is_one_line_and_exit_2(
    command: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _one_line(capsys, main([*BASE[command], f"{flag}={value}"]))
    assert line.startswith(f"{PREFIX}{flag}: must be "), line
    least, most = number_flags()[command][flag]
    assert f"{most:,g}" in line if isinstance(most, float) else f"{most:,}" in line


def test_a_layout_of_too_many_ranks_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_line(capsys, main([*BASE["smoke"], "--tp", "8", "--pp", "8", "--dp", "2"]))
    assert line.startswith(f"{PREFIX}--tp: --tp x --pp x --dp = 128 ranks"), line


ENV_CASES = [
    (f"TRAINWRIGHT_{name.upper()}", value)
    for name, (kind, _least, _most) in sorted(ENV_NUMBERS.items())
    for value in (
        ["nan", "inf", "-inf", "0", "-5", "1e20"]
        if kind is float
        else ["0", "-1", str(10**20), "1e20", "9" * 5000]
    )
] + [
    ("TRAINWRIGHT_SMOKE_MEMORY_CAP", "99999999999999999999T"),
    ("TRAINWRIGHT_SMOKE_MEMORY_CAP", "9" * 400),
]


@pytest.mark.parametrize(("key", "value"), ENV_CASES)
def test_a_number_variable_outside_its_bound_is_one_line_and_exit_2(
    key: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(key, value)
    line = _one_line(capsys, main(BASE["estimate"]))
    assert line.startswith(f"{PREFIX}{key}: must be "), line


def test_grad_accum_without_a_global_batch_uses_the_default_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*BASE["estimate"], "--hardware", "1x8xA100-80GB", "--grad-accum", "4"]
    assert main([*args, "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "e.json").read_text())
    # The planner's default global batch for the brief (32 here), split over 8 data ranks.
    assert data["gradient_accumulation_steps"] == 4 and data["micro_batch_size"] == 1
    assert data["assumptions"][0].startswith("global batch 32: default"), data["assumptions"]
    assert "  assumed: global batch 32: default" in out
    # One that does not divide it is refused, naming the flag and the way out.
    line = _one_line(capsys, main([*args[:-1], "3"]))
    assert line.startswith(f"{PREFIX}--grad-accum: 3 must divide"), line
    assert "the default global batch: set --global-batch" in line
