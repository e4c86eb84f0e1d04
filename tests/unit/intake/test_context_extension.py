"""Words that ask to extend a model's context are a wish, not dropped (the plan says what it does)."""

from __future__ import annotations

import pytest

from tools.intake.wishes import named_wishes


@pytest.mark.parametrize(
    ("text", "quote"),
    [
        ("extend llama-3-8b to 64k context on 32 H100", "extend llama-3-8b to 64k context"),
        ("long-context extension of qwen2.5-7b to 128k", "long-context extension"),
        ("extend the context of mistral-7b to 32k tokens", "extend the context"),
        ("fine-tune llama-3-8b at 32k with YaRN", "YaRN"),
        ("use rope scaling to reach 64k", "rope scaling"),
    ],
)
def test_context_extension_words_are_a_wish(text: str, quote: str) -> None:
    (read,) = [r for r in named_wishes(text) if r.field == "technique:context-extension"]
    assert read.quote == quote


def test_a_long_sequence_alone_is_no_extension_wish() -> None:
    reads = named_wishes("fine-tune llama-3-8b on 8 H100 with seq 32k and an extended warmup")
    assert not [r for r in reads if r.field == "technique:context-extension"]
