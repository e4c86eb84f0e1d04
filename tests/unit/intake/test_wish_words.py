"""Words of a request that are part of something else are no wish.

"mistral-nemo-12b" names a model, not NVIDIA NeMo: the word inside it used to read as
``framework: megatron`` and a ``trainer:nemo`` wish, so every plan for that model ran on
Megatron-DeepSpeed though nobody asked for it.
"""

from __future__ import annotations

import pytest

from tools.intake.wishes import framework_reads, named_wishes


@pytest.mark.parametrize(
    "text",
    [
        "fine-tune mistral-nemo-12b on 8 H100, seq 4096",
        "fine-tune Mistral NeMo 12B on 8 H100",
        "LoRA on mistral_nemo_12b with 2 A100",
    ],
)
def test_a_model_named_nemo_is_no_framework_wish(text: str) -> None:
    framework, avoided = framework_reads(text)
    assert framework is None and avoided == []
    assert [r.field for r in named_wishes(text)] == []


def test_nemo_the_trainer_is_still_read_beside_that_model() -> None:
    framework, _ = framework_reads("fine-tune mistral-nemo-12b on 8 H100 with NeMo")
    assert framework is not None and framework.value == "megatron" and framework.quote == "NeMo"
    assert [r.field for r in named_wishes("fine-tune llama-3-8b with nemo")] == ["trainer:nemo"]


@pytest.mark.parametrize(
    ("text", "wish"),
    [
        ("train gpt2 on 8 V100 with packing disabled", "avoid:packing"),
        (
            "fine-tune llama-3-8b on 8 H100, gradient checkpointing off",
            "avoid:activation-checkpointing",
        ),
        ("fine-tune llama-3-8b on 8 H100, flash attention: off", "avoid:flash-attention"),
    ],
)
def test_a_refusal_after_the_name_is_an_avoid_wish(text: str, wish: str) -> None:
    # "packing disabled" read as the wish for packing, honoured.
    assert [r.field for r in named_wishes(text)] == [wish]


def test_resume_is_another_runs_checkpoint_only() -> None:
    quotes = {
        r.field: r.quote for r in named_wishes("fine-tune, resume from checkpoint /ckpt/step-4000")
    }
    assert quotes == {"checkpoint:resume": "resume from checkpoint /ckpt/step-4000"}
    assert named_wishes("fine-tune llama-3-8b on 8 H100, then resume from where it stopped") == []
