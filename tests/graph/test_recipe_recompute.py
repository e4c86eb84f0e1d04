"""A brief's recipe that states its recompute is the run the plan prices and launches.

Before, ``recipe: {checkpointing: full}`` was priced with the search's own policy (no recompute
on 8 A100 40GB for llama-3.1-8b) while the plan's assumptions named the recipe: the stated
policy was dropped without a word.
"""

from __future__ import annotations

from tools.core.schemas import TrainingBrief
from tools.planning import SearchOptions, search_strategy
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model


def _plan(seq_len: int, checkpointing: str | None, hardware: str = "1x8xA100-40GB"):
    recipe = {"checkpointing": checkpointing} if checkpointing else {"optimizer": "adamw"}
    brief = TrainingBrief(
        model="llama-3.1-8b", task="finetune", seq_len=seq_len, hardware=hardware, recipe=recipe
    )
    model = lookup_model("llama-3.1-8b", seq_len)
    return search_strategy(model, parse_hardware(hardware), brief, SearchOptions())


def test_a_stated_recompute_is_the_one_searched_and_priced() -> None:
    free = _plan(2048, None)
    assert free.chosen_row is not None and free.chosen_row.checkpointing == "none"
    for policy in ("full", "selective"):
        plan = _plan(2048, policy)
        row = plan.chosen_row
        assert row is not None and row.fits and row.checkpointing == policy
        assert f"recompute {policy}" in next(
            a for a in plan.assumptions if a.startswith("memory priced for: ")
        )
        assert f"recompute ['{policy}']" in next(
            a for a in plan.assumptions if a.startswith("search:")
        )
        assert not plan.not_honoured


def test_a_stated_recompute_that_fits_nowhere_is_replaced_and_said() -> None:
    plan = _plan(32768, "none")
    row = plan.chosen_row
    assert row is not None and row.fits and row.checkpointing != "none"
    line = plan.not_honoured[0]
    assert line.startswith("recipe.checkpointing none does not fit: its smallest setup needs ")
    assert f"with recompute {row.checkpointing} instead" in line
    assert line in plan.assumptions
