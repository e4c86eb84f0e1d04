"""The framework choice's fp8 sentence (tools/research/fp8_framework.py), and when fp8 is dropped.

A recipe that trains fp8 moves the choice to the launcher that applies it and says so; when the
setup that fits rules that fp8 out (Megatron's pipeline model), the sentence says the plan
trains bf16 there instead of claiming fp8 linears it does not train.
"""

from __future__ import annotations

from tools.core.schemas import FrameworkChoice
from tools.research.fp8_framework import fp8_dropped, fp8_rationale


def _choice(primary: str, rationale: str) -> FrameworkChoice:
    return FrameworkChoice(primary=primary, stack=[primary], rationale=rationale)  # type: ignore[arg-type]


def test_the_fp8_sentence_is_replaced_once_fp8_is_dropped() -> None:
    rest = "deepspeed scores 9: PyTorch-based."
    opened = fp8_rationale("megatron", "deepspeed")
    assert "Transformer Engine" in opened and opened.endswith("not the primary. ")
    dropped = fp8_dropped(_choice("megatron", opened + rest)).rationale
    assert dropped.startswith("megatron: chosen for the recipe's fp8 linears")
    assert "priced bf16" in dropped and dropped.endswith(rest)
    assert "applies them" not in dropped
    # A choice fp8 did not move keeps its rationale as it is.
    assert fp8_rationale("megatron", "megatron") == ""
    assert fp8_dropped(_choice("megatron", rest)).rationale == rest
