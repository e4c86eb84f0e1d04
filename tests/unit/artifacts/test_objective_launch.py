"""DPO and distillation plans say their launch trains the next-token loss, under "Not as asked".

Before, a DPO plan noted only that the reference model was not priced; its launch.sh trained the
ordinary language-modelling loss on the user's data, which nothing said.
"""

from __future__ import annotations

from tools.artifacts.headline import headline_caveats, headline_notes
from tools.core.request_account import OBJECTIVE_MARKS

MODEL = {"name": "llama-3-8b", "params": 8_030_261_248}


def test_dpo_and_distill_are_not_as_asked_with_what_runs_them() -> None:
    for objective, loss, tool in (
        ("dpo", "DPO loss", "DPOTrainer"),
        ("distill", "distillation loss", "GKDTrainer"),
    ):
        plan = {"brief": {"objective": objective}, "model": MODEL}
        notes = headline_notes(plan)
        assert len(notes) == 1 and f"train the next-token loss, not the {loss}" in notes[0]
        assert tool in notes[0]
        assert headline_caveats(plan) == []  # said once, under "Not as asked"
        assert "next-token loss" in OBJECTIVE_MARKS[objective][1]


def test_sft_and_continued_pretraining_stay_notes() -> None:
    assert headline_notes({"brief": {"objective": "sft"}, "model": MODEL}) == []
    cpt = {"brief": {"objective": "continued-pretraining"}, "model": MODEL}
    assert headline_notes(cpt) == [] and len(headline_caveats(cpt)) == 1
