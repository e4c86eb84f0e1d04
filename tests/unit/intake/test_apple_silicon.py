"""A Mac's GPU (Apple silicon, PyTorch's mps device) is refused in one line, never planned.

Before, "lora finetune llama 3.2 3b on my apple m2 max 64gb" read no hardware: it was planned
for "this machine" (hardware: local) and "max 64gb" listed as not understood.
"""

from __future__ import annotations

import pytest

from tools.core.errors import InputError
from tools.intake.brief import parse_request, request_fields
from tools.intake.hardware_text import HARDWARE_UNCLEAR

MODELS = ["llama-3.2-3b", "llama-3-8b"]


@pytest.mark.parametrize(
    "text",
    [
        "lora finetune llama 3.2 3b on my apple m2 max 64gb",
        "fine-tune llama-3-8b on an M3 Ultra Mac Studio",
        "qlora llama-3-8b on my macbook pro",
        "fine-tune llama-3.2-3b with mps on apple silicon",
    ],
)
def test_apple_silicon_is_refused_in_one_line(text: str) -> None:
    fields = request_fields(text, MODELS)
    assert "hardware" not in fields and fields[HARDWARE_UNCLEAR]  # never this machine
    with pytest.raises(InputError) as caught:
        parse_request(text, MODELS)
    line = str(caught.value)
    assert "Apple" in line and "not a CUDA or ROCm GPU" in line and "\n" not in line


@pytest.mark.parametrize(
    "text",
    ["fine-tune llama-3-8b on 8 H100, max 2 epochs", "fine-tune llama-3-8b on 8 A100, m2m data"],
)
def test_other_words_are_no_mac(text: str) -> None:
    assert request_fields(text, MODELS).get("hardware")
