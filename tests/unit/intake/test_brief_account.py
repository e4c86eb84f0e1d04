"""A brief's empty fields are not quoted as stated.

Before, a chat follow-up (which re-plans the last brief, every field filled) listed
"objective: chosen by the planner (from 'brief: objective')" and 25 more such lines under
"What you asked", and "I assumed: nothing".
"""

from __future__ import annotations

from tools.intake.account import account_brief
from tools.intake.brief import brief_from_dict


def test_empty_fields_of_a_brief_are_assumed_not_read() -> None:
    brief = brief_from_dict(
        {"model": "llama-3-8b", "task": "finetune", "hardware": "1x8xH100-80GB"}
    )
    data = brief.model_dump(mode="json")  # every field, as a follow-up's brief has them
    account = account_brief(data, brief)
    read = {f.field for f in account.read}
    assert {"model", "task", "hardware", "seq_len"} <= read
    assert not read & {"objective", "global_batch_size", "framework", "pins", "avoid_frameworks"}
    assert "global_batch_size" in {a.field for a in account.assumed}
