"""ORPO (and SimPO) are preference objectives without a reference model: the plan says so.

Before, "ORPO on llama-3.1-8b" was read as DPO and the plan said the DPO loss was not trained
and that the reference model was not priced: ORPO has no reference model.
"""

from __future__ import annotations

import pytest

from tools.artifacts.headline import objective_note
from tools.core.request_account import RequestAccount, Wish, closed_account

MODEL = {"name": "llama-3.1-8b", "params": 8_030_261_248}


@pytest.mark.parametrize(("quote", "name"), [("ORPO", "ORPO"), ("simpo", "SimPO")])
def test_a_reference_free_preference_objective_is_named_without_a_reference_model(
    quote: str, name: str
) -> None:
    wishes = [{"wish": "objective:dpo", "quote": quote, "honoured": None, "how": ""}]
    note = objective_note(
        {"brief": {"objective": "dpo"}, "model": MODEL, "request": {"wishes": wishes}}
    )
    assert note is not None and name in note and "reference model" in note
    assert "frozen reference model" not in note and "DPO loss" not in note
    account = RequestAccount(text="x", wishes=[Wish(wish="objective:dpo", quote=quote)])
    (wish,) = closed_account(account, objective="dpo").wishes
    assert wish.honoured is False and name in wish.how and "DPO" not in wish.how


def test_dpo_keeps_its_reference_model_line() -> None:
    wishes = [{"wish": "objective:dpo", "quote": "DPO", "honoured": None, "how": ""}]
    note = objective_note(
        {"brief": {"objective": "dpo"}, "model": MODEL, "request": {"wishes": wishes}}
    )
    assert note is not None and "frozen reference model" in note
