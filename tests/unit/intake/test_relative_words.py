"""Chat follow-ups that scale the brief's own values ("double the batch") change the plan.

Before, "double the batch" or "halve the sequence length" printed "that follow-up changes
nothing I can read": the words carry no number for the request parser.
"""

from __future__ import annotations

import pytest

from tools.core.errors import InputError
from tools.intake.follow_up import follow_up_fields
from tools.research.model_catalog import list_models

BRIEF = {
    "model": "llama-3-8b",
    "hardware": "1x8xA100-80GB",
    "seq_len": 4096,
    "global_batch_size": 64,
}


@pytest.mark.parametrize(
    ("text", "changes"),
    [
        ("double the batch", {"global_batch_size": 128}),
        ("what if we halve the sequence length?", {"seq_len": 2048}),
        ("double the context", {"seq_len": 8192}),
        ("halve the global batch size", {"global_batch_size": 32}),
        ("double the GPUs", {"hardware": "2x8xA100-80GB"}),  # past a node's 8: another node
        ("halve the GPUs", {"hardware": "1x4xA100-80GB"}),
        ("triple the nodes", {"hardware": "3x8xA100-80GB"}),
    ],
)
def test_a_scaling_follow_up_scales_the_briefs_value(text: str, changes: dict) -> None:
    said = follow_up_fields(text, BRIEF, list_models())
    assert {k: said[k] for k in changes} == changes


def test_a_batch_the_planner_chose_cannot_be_scaled_and_says_what_to_say() -> None:
    with pytest.raises(InputError) as err:
        follow_up_fields("double the batch", {**BRIEF, "global_batch_size": None}, list_models())
    assert err.value.field == "global_batch_size" and "planner's choice" in err.value.message


def test_a_number_the_follow_up_states_wins_over_a_scaling() -> None:
    said = follow_up_fields("double the batch, with seq len 1024", BRIEF, list_models())
    assert said["global_batch_size"] == 128 and said["seq_len"] == 1024
