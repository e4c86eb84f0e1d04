"""A GPU name typed with a letter O for a zero is refused with the name it looks like.

Before, "8 H1OO" named no hardware the reader knew: the plan went to this machine, silently.
"""

from __future__ import annotations

import pytest

from tools.intake.hardware_text import HARDWARE_REFUSED, hardware_fields


@pytest.mark.parametrize(
    ("text", "written", "meant"),
    [
        ("instruction tuning llama-3-8b on 8 H1OO", "H1OO", "H100"),
        ("fine-tune llama-3-8b on 4 A1OO 80GB", "A1OO", "A100"),
        ("pretrain gpt2 on two h1o0s", "h1o0", "H100"),
    ],
)
def test_a_gpu_name_with_an_o_for_a_zero_is_refused_with_its_likely_name(
    text: str, written: str, meant: str
) -> None:
    fields = hardware_fields(text)
    assert "hardware" not in fields
    refused = fields[HARDWARE_REFUSED]
    assert written in refused and f"did you mean {meant}?" in refused


def test_words_with_o_and_digits_that_are_no_gpu_are_not_refused() -> None:
    fields = hardware_fields("fine-tune llama-3-8b on 8 H100 with a 2o23 dataset")
    assert fields["hardware"] == "1x8xH100-80GB" and HARDWARE_REFUSED not in fields
