"""Expert- and context-parallel degrees a request states are planned, quoted, or refused out loud.

"train mixtral-8x7b on 32 H100 with expert parallelism 8" listed "parallelism 8" as not
understood and left the expert-parallel degree to the search; the degree is now a pin
(``pins.expert_parallel``) the search keeps, like "TP 4", and "context parallel 4" likewise.
Expert parallelism asked of a dense model is one line under "Not as asked".
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tools.artifacts.headline import headline_notes
from tools.core.errors import InputError
from tools.core.schemas import TrainingBrief
from tools.planning.options import SearchOptions
from tools.planning.search import search_strategy
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model


def _plan(cli_main: Any, tmp_path: Path, request: str) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path / "plan"
    res = cli_main("plan", request, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "plan.json").read_text()), out, res.stdout


def _read(plan: dict[str, Any], field: str) -> dict[str, Any]:
    return next(r for r in plan["request"]["read"] if r["field"] == field)


def test_mixtral_with_expert_parallelism_8_plans_ep8_and_quotes_it(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, out, _ = _plan(
        cli_main, tmp_path, "train mixtral-8x7b on 32 H100 with expert parallelism 8"
    )
    assert plan["brief"]["pins"]["expert_parallel"] == 8
    assert plan["memory"]["setup"]["expert_parallel"] == 8
    pins = _read(plan, "pins")
    assert pins["quote"] == "expert parallelism 8" and pins["value"]["expert_parallel"] == 8
    assert plan["request"]["not_understood"] == []
    # "expert" in "expert parallelism" is not the team's experience.
    assert "team" not in {r["field"] for r in plan["request"]["read"]}
    assert "pinned by the request: expert parallel 8" in plan["memory"]["assumptions"]
    assert "--moe-expert-parallel-size 8" in (out / "launch.sh").read_text()
    assert plan["framework"]["primary"] == "megatron"
    # The framework's reason names the split it runs (it said "tensor parallel 1 x pipeline 1").
    assert (
        "expert parallel 8: Megatron-DeepSpeed splits the experts"
        in (plan["framework"]["rationale"])
    )


def test_a_pinned_expert_degree_other_than_the_searchs_own_is_kept() -> None:
    model = lookup_model("mixtral-8x7b", 2048)
    hw = parse_hardware("4x8xH100-80GB")
    free = search_strategy(model, hw, TrainingBrief(model="mixtral-8x7b", hardware="4x8xH100-80GB"))
    brief = TrainingBrief(
        model="mixtral-8x7b", hardware="4x8xH100-80GB", pins={"expert_parallel": 4}
    )
    pinned = search_strategy(model, hw, brief)
    assert free.chosen_setup.ep != 4  # the pin changes the plan
    assert pinned.chosen_setup.ep == 4 and pinned.chosen_row is not None
    assert pinned.chosen_row.fits and pinned.not_honoured == []
    # A degree that cannot run is said, with why and what was planned instead.
    brief = brief.model_copy(update={"pins": brief.pins.model_copy(update={"expert_parallel": 3})})
    fallback = search_strategy(model, hw, brief)
    (note,) = [n for n in fallback.not_honoured if "expert parallel 3" in n]
    assert "must divide the 8 routed experts" in note and "instead" in note


def test_ep_on_a_dense_model_says_it_has_no_experts_in_one_line(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, _, stdout = _plan(cli_main, tmp_path, "fine-tune llama-3.1-8b on 8 H100 with EP 4")
    assert _read(plan, "pins")["quote"] == "EP 4"
    assert plan["request"]["not_understood"] == []
    assert plan["memory"]["setup"]["expert_parallel"] == 1
    lines = [n for n in headline_notes(plan) if "no experts" in n]
    assert len(lines) == 1 and "expert parallel 4" in lines[0].lower()
    assert "the pin is dropped" in lines[0]
    assert "not as asked: " + lines[0] in stdout
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == "technique:expert-parallelism")
    assert wish["honoured"] is False


def test_context_parallel_4_at_128k_plans_cp4(cli_main: Any, tmp_path: Path) -> None:
    plan, out, _ = _plan(
        cli_main,
        tmp_path,
        "fine-tune llama-3.1-8b on 8 H100 at seq 131072 with context parallel 4",
    )
    assert plan["brief"]["seq_len"] == 131072
    assert plan["memory"]["setup"]["context_parallel"] == 4  # the free search picks cp2 here
    assert _read(plan, "pins")["quote"] == "context parallel 4"
    assert plan["request"]["not_understood"] == []
    assert "pinned by the request: context parallel 4" in plan["memory"]["assumptions"]
    assert plan["framework"]["primary"] == "torchtitan"
    assert "context parallel 4: torchtitan builds" in plan["framework"]["rationale"]
    toml = tomllib.loads((out / "torchtitan.toml").read_text())
    assert toml["parallelism"]["context_parallel_degree"] == 4


@pytest.mark.parametrize(
    ("model", "options", "says"),
    [
        ("llama-3.1-8b", SearchOptions(expert_parallel=4), "no experts to split"),
        ("mixtral-8x7b", SearchOptions(expert_parallel=16), "must divide the 8 routed experts"),
        ("mixtral-8x7b", SearchOptions(expert_parallel=8, tensor_parallel=2), "beside plain data"),
        ("llama-3.1-8b", SearchOptions(context_parallel=16), "must divide the 8 GPUs"),
    ],
)
def test_a_degree_that_cannot_run_is_refused_naming_its_field(
    model: str, options: SearchOptions, says: str
) -> None:
    hw = parse_hardware("1x8xH100-80GB")
    brief = TrainingBrief(model=model, hardware="1x8xH100-80GB", seq_len=32768)
    with pytest.raises(InputError) as err:
        search_strategy(lookup_model(model, brief.seq_len), hw, brief, options)
    assert says in err.value.message
    assert err.value.field in ("expert_parallel", "context_parallel")


def test_a_pin_that_cannot_run_when_nothing_fits_is_not_as_asked() -> None:
    # Tensor parallel 2 on one GPU cannot be built, and nothing fits without it either: the plan
    # (tp 1) was marked as keeping the pin, so "Not as asked" was empty while the pin's line sat
    # under the assumptions only.
    brief = TrainingBrief(
        model="llama-3.1-8b",
        task="finetune",
        hardware="1x1xA100-80GB",
        seq_len=2048,
        pins={"tensor_parallel": 2},
    )
    plan = search_strategy(
        lookup_model("llama-3.1-8b", 2048), parse_hardware("1x1xA100-80GB"), brief
    )
    assert plan.chosen_setup.tp == 1
    assert [n for n in plan.not_honoured if n.startswith("the pinned choice (tensor parallel 2)")]
