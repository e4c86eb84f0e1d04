"""``app.py size`` in process: the three answers, the JSON contract, constraints, bad flags exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.core.schemas import SizingPlan
from tools.research.prices import load_price_table

PREFIX = "trainwright: error: "


@pytest.fixture(scope="module")
def a100(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, SizingPlan]:
    """``size --model llama-2-13b --task finetune --gpus A100-40GB --tokens 1B --json``."""
    from inproc import run_main

    out = tmp_path_factory.mktemp("size") / "size.json"
    done = run_main(
        "size", "--model", "llama-2-13b", "--task", "finetune", "--gpus", "A100-40GB",
        "--tokens", "1B", "--json", out,
    )  # fmt: skip
    return done, SizingPlan.model_validate(json.loads(out.read_text()))


def test_how_many_a100_40gb_answers_the_least_count_with_its_setup(
    a100: tuple[Any, SizingPlan],
) -> None:
    done, plan = a100
    assert done.returncode == 0, done.stderr
    answer = next(a for a in plan.answers if a.gpu == "A100-40GB")
    assert answer.min_count and answer.min_setup
    line = next(x for x in done.stdout.splitlines() if x.startswith("How many A100-40GB"))
    assert f"at least {answer.min_count} ({answer.min_setup};" in line
    assert f"cost-optimal for 1B tokens: {answer.cost_optimal_count} " in line
    assert plan.pick is not None and plan.pick.gpu == "A100-40GB"
    assert "Pick (cheapest of the asked types): " in done.stdout
    assert "Pareto set (time vs cost, fastest first): " in done.stdout


def test_the_table_has_a_row_per_priced_type_and_the_json_keeps_the_contract(
    a100: tuple[Any, SizingPlan],
) -> None:
    done, plan = a100
    table = done.stdout.split("Which GPUs")[1].split("(* asked for)")[0].splitlines()[2:]
    named = {line.split()[0].rstrip("*") for line in table if line.strip()}
    assert named == set(load_price_table())
    data = plan.model_dump(mode="json")
    shape = {"gpu", "count", "nodes", "gpus_per_node", "setup", "tokens_per_s", "time_s"}
    shape |= {"cost_usd", "fit"}
    assert {"pick", "rows", "pareto", "binding"} <= set(data)
    assert shape <= set(data["pick"]) and all(shape <= set(r) for r in data["rows"])
    for row in plan.rows:
        if row.tokens_per_s:
            assert row.time_s == pytest.approx(1e9 / row.tokens_per_s)
            assert row.cost_usd == pytest.approx(
                row.time_s / 3600 * row.count * (row.price_per_gpu_hour or 0)
            )


def test_a_deadline_nothing_meets_says_what_binds_and_by_how_much(cli_main: Any) -> None:
    done = cli_main(
        "size", "--model", "llama-3.2-1b", "--task", "pretrain", "--tokens", "1T",
        "--deadline-days", "0.01", "--max-gpus", "8",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("Nothing meets it: "))
    assert "the deadline of 0.01 days" in line and "over" in line
    assert "Pick (" not in done.stdout


def test_a_budget_picks_the_fastest_within_it(cli_main: Any, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    done = cli_main(
        "size", "--model", "llama-3.2-1b", "--task", "finetune", "--tokens", "1e9",
        "--budget", "$20", "--max-gpus", "8", "--json", out,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = SizingPlan.model_validate(json.loads(out.read_text()))
    assert plan.objective == "fastest" and plan.pick is not None
    assert plan.pick.cost_usd is not None and plan.pick.cost_usd <= 20
    assert "Pick (fastest within the budget): " in done.stdout


@pytest.mark.parametrize(
    ("flags", "starts"),
    [
        (["--gpus", "A100-41GB"], "--gpus: unknown GPU type"),
        (["--gpus", "A100-40GB=abc"], "--gpus: cannot read"),
        (["--tokens", "lots"], "--tokens: must be a number above 0"),
        (["--tokens", "-5"], "--tokens: must be a number above 0"),
        (["--deadline-days", "0"], "--deadline-days: must be a number above 0"),
        (["--budget", "1e40"], "--budget: must be a number above 0"),
        (["--task", "inference"], "--task: sizing is for training"),
        (["--task", "dance"], "--task: "),
        (["--gpus", "L4", "--refuse", "L4"], "--gpus: L4 is both asked for and refused"),
        (["--max-gpus", "0"], "--max-gpus: must be "),
        (["--json", "/proc/x.json"], "--json: "),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(cli_main: Any, flags: list[str], starts: str) -> None:
    done = cli_main("size", "--model", "llama-3.2-1b", *flags)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX + starts), lines
    assert done.stdout == ""


def test_an_unknown_model_is_one_line_naming_the_flag(cli_main: Any) -> None:
    done = cli_main("size", "--model", "no-such-model-xyz")
    assert done.returncode == 2 and done.stderr.startswith(PREFIX + "--model: "), done.stderr


def test_each_row_carries_the_band_of_its_gpu_family(a100: tuple[Any, SizingPlan]) -> None:
    from tools.planning.bands import lookup
    from tools.research.hardware import find_gpu

    done, plan = a100
    rows = [r for r in plan.rows if r.tokens_per_s]
    assert rows
    kinds = set()
    for row in rows:
        band = lookup("tokens_per_s", find_gpu(row.gpu), None)
        assert row.speed_error == band.band
        kinds.add(row.speed_error_kind)
        if band.band is None:  # no published runs of the kind: no band, said so
            assert row.tokens_per_s_band is None
            assert row.speed_error_kind == f"{band.kind}: uncalibrated"
            continue
        assert row.speed_error_kind == band.matched and row.tokens_per_s_band is not None
        low, high = row.tokens_per_s_band
        assert low == row.tokens_per_s * (1 - band.band) and high > row.tokens_per_s
    assert "a100/*" in kinds
    a100 = lookup("tokens_per_s", find_gpu("A100-40GB"), None)
    assert f"(+-{a100.band:.0%}, a100/*)" in done.stdout
    assert plan.pick is not None and plan.speed_error == plan.pick.speed_error == a100.band
