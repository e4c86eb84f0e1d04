"""A GPU the catalog plans as a near part says so: "MI250" is planned with the MI250X's figures.

Before, "sft llama3.1 8B on 4 AMD MI250" planned 4 MI250X (the catalog lists MI250 as its
alias) and said nothing, though the MI250 is a cut-down part.
"""

from __future__ import annotations

import pytest

from tools.intake.hardware_text import HARDWARE_ASSUMED, hardware_fields


@pytest.mark.parametrize(
    ("text", "spec", "said"),
    [
        ("sft llama-3.1-8b on 4 AMD MI250", "1x4xMI250X", "MI250X"),
        ("fine-tune llama-3-8b on 8 MI300", "1x8xMI300X", "MI300A"),
    ],
)
def test_a_near_part_is_said_as_assumed(text: str, spec: str, said: str) -> None:
    fields = hardware_fields(text)
    assert fields["hardware"] == spec
    assert any(said in line for line in fields.get(HARDWARE_ASSUMED, []))


def test_the_catalog_part_itself_assumes_nothing() -> None:
    fields = hardware_fields("fine-tune llama-3-8b on 8 MI250X")
    assert fields["hardware"] == "1x8xMI250X" and not fields.get(HARDWARE_ASSUMED)
