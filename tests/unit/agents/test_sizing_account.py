"""Intake's sizing step in the request's accounting: the hardware assumed, deadline and budget decided."""

from __future__ import annotations

from agents.sizing import Sizing, account_sizing
from tools.core.request_account import RequestAccount, Wish
from tools.core.schemas import SizingBinding, SizingPlan, SizingRow
from tools.intake.sizing_text import sizing_question

DAY = 86_400.0


def _account() -> dict:
    wishes = [Wish(wish="deadline", quote="within 30 days"), Wish(wish="money-budget", quote="$5k")]
    return RequestAccount(text="t", wishes=wishes).model_dump(mode="json")


def _row(**over: object) -> SizingRow:
    fields = {"gpu": "H100-80GB", "count": 8, "nodes": 1, "gpus_per_node": 8, "setup": "zero3"}
    return SizingRow(**{**fields, "fit": "fits", "tokens_per_s": 1e5, **over})  # type: ignore[arg-type]


def test_a_met_deadline_and_budget_are_honoured_with_the_picks_figures() -> None:
    ask = sizing_question("cheapest way within 30 days for $5k", count_given=False)
    assert ask is not None
    pick = _row(time_s=10 * DAY, cost_usd=4000.0, meets_deadline=True, meets_budget=True)
    sized = Sizing(SizingPlan(pick=pick), "1x8xH100-80GB", ["intake: planned for the pick"])
    acc = RequestAccount.model_validate(account_sizing(_account(), sized, ask))
    assert acc.wish("deadline").honoured is True  # type: ignore[union-attr]
    assert "10.0 days" in acc.wish("deadline").how  # type: ignore[union-attr]
    assert acc.wish("money-budget").honoured is True  # type: ignore[union-attr]
    hw = next(a for a in acc.assumed if a.field == "hardware")
    assert hw.value == "1x8xH100-80GB" and hw.why == "planned for the pick"


def test_a_missed_deadline_is_refused_with_what_binds() -> None:
    ask = sizing_question("cheapest way within 30 days", count_given=False)
    assert ask is not None
    binding = SizingBinding(constraint="deadline", limit=30 * DAY, text="the deadline: 5 days over")
    sized = Sizing(SizingPlan(binding=binding), "1x8xH100-80GB", ["intake: closest"])
    acc = RequestAccount.model_validate(account_sizing(_account(), sized, ask))
    wish = acc.wish("deadline")
    assert wish is not None and wish.honoured is False and wish.how == "the deadline: 5 days over"


def test_without_a_token_count_the_deadline_is_not_checked_and_says_why() -> None:
    ask = sizing_question("how many H100 within 30 days", count_given=False)
    assert ask is not None
    sized = Sizing(SizingPlan(pick=_row()), "1x8xH100-80GB", ["intake: pick"])
    acc = RequestAccount.model_validate(account_sizing(_account(), sized, ask))
    wish = acc.wish("deadline")
    assert wish is not None and wish.honoured is False and "no token count" in wish.how
