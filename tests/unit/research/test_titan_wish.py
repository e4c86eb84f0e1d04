"""A torchtitan wish (tools/research/titan_wish.py): torchtitan where it runs the job, else FSDP.

The framework the choice scores for it, the setups the search may use (every dense split on a
Llama a flavor builds; data parallel alone otherwise), the recipe it is priced with, and the
one line that says why torchtitan is not used.
"""

from __future__ import annotations

from typing import Any

import pytest

from tools.intake.brief import brief_from_dict
from tools.planning.recipe import recipe_from_brief
from tools.research.model_catalog import lookup_model
from tools.research.splits import runs_on, runs_setup, split_framework
from tools.research.titan_flavors import build_refusal, titan_refusal
from tools.research.titan_wish import titan_not_honoured, titan_score


def _brief(model: str, **extra: Any):  # type: ignore[no-untyped-def]
    fields = {"goal": "x", "model": model, "task": "pretrain", "framework": "torchtitan"}
    return brief_from_dict({**fields, **extra})


def test_a_flavor_runs_on_torchtitan_priced_as_torchtitan() -> None:
    model = lookup_model("llama-3.1-8b", 2048)
    brief = _brief("llama-3.1-8b")
    fid, reason = titan_score(brief, model) or ("", "")
    assert fid == "torchtitan" and "flavor 8B" in reason
    assert titan_not_honoured(brief, "torchtitan", model) is None
    recipe = recipe_from_brief(brief, model)
    assert recipe is not None and recipe.framework == "torchtitan"
    # A tensor split alone would run on DeepSpeed AutoTP; asked for torchtitan, it runs there.
    assert split_framework(model, "zero1", 2, 1) == "deepspeed"
    assert runs_setup(brief, model, "zero1", 2, 1, 1)
    assert runs_on(brief, model, "zero1", 2, 1) == "torchtitan"
    assert runs_on(brief, model, "zero1", 1, 1) is None  # data parallel: any framework


@pytest.mark.parametrize(
    ("name", "task"),
    [("qwen2.5-7b", "finetune"), ("llama-3-8b", "pretrain"), ("llama-3.1-8b", "lora")],
)
def test_what_torchtitan_cannot_run_is_fsdp_and_said_in_one_line(name: str, task: str) -> None:
    model = lookup_model(name, 2048)
    brief = _brief(name, task=task)
    why = titan_refusal(model, task)
    assert why is not None
    assert (why == build_refusal(model)) is (task != "lora")
    fid, _ = titan_score(brief, model) or ("", "")
    assert fid == "pytorch_fsdp"
    line = titan_not_honoured(brief, "pytorch_fsdp", model)
    assert line is not None and why in line and "\n" not in line
    assert "the plan runs on pytorch_fsdp" in line
    recipe = recipe_from_brief(brief, model)
    assert recipe is not None and recipe.framework == "fsdp"
    # Only data parallelism, as FSDP runs it: no split needs torchtitan here.
    assert runs_setup(brief, model, "zero3", 1, 1, 1)
    assert not runs_setup(brief, model, "zero1", 2, 2, 1)


def test_no_wish_no_line() -> None:
    model = lookup_model("qwen2.5-7b", 2048)
    brief = brief_from_dict({"goal": "x", "model": "qwen2.5-7b", "framework": "pytorch_fsdp"})
    assert titan_score(brief, model) is None
    assert titan_not_honoured(brief, "pytorch_fsdp", model) is None
