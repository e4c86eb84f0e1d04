"""Megatron's pretrain_gpt.py builds decoder-only language models only.

A ViT-L/16 plan on 8 V100 picked a pipeline split and launched pretrain_gpt.py with ViT-L's
widths (a GPT trained on text), and "pretrain bert-large with Megatron" did the same at BERT's
shape: a launch for another model.
"""

from __future__ import annotations

import pytest

from tools.core.schemas import TrainingBrief
from tools.research.model_catalog import lookup_model
from tools.research.splits import megatron_builds, runs_setup


@pytest.mark.parametrize(
    ("model", "builds"),
    [
        ("llama-3-8b", True),
        ("gpt2", True),
        ("mixtral-8x7b", True),
        ("vit-large", False),
        ("bert-large", False),
        ("t5-large", False),
        ("resnet-50", False),
    ],
)
def test_only_decoder_language_models_are_built(model: str, builds: bool) -> None:
    assert megatron_builds(lookup_model(model, 512)) is builds


def test_a_vision_model_gets_no_megatron_split() -> None:
    vit = lookup_model("vit-large", 197)
    brief = TrainingBrief(model="vit-large", hardware="1x8xV100-32GB")
    assert not runs_setup(brief, vit, "ddp", 1, 2, 1)
    assert runs_setup(brief, vit, "ddp", 1, 1, 1)
    llama = lookup_model("llama-3-8b", 2048)
    assert runs_setup(TrainingBrief(model="llama-3-8b"), llama, "ddp", 1, 2, 1)
