"""An encoder-only model (BERT) is no causal LM: train.py's next-token loss would train another job.

Before, "fine-tune bert-base-uncased for NER on one rtx 3090" launched trainer/train.py, whose
AutoModelForCausalLM builds BertLMHeadModel: without ``is_decoder`` its attention sees the
whole sequence, so the next-token loss only teaches it to copy the token it can already see.
"""

from __future__ import annotations

import pytest

from tools.research.architectures import trains_as_causal_lm
from tools.research.model_catalog import lookup_model


@pytest.mark.parametrize("name", ["bert-base", "bert-large"])
def test_an_encoder_is_no_causal_lm(name: str) -> None:
    assert not trains_as_causal_lm(lookup_model(name, 512).hf_config or {})


@pytest.mark.parametrize("name", ["gpt2", "llama-3-8b", "mistral-7b"])
def test_a_decoder_stays_a_causal_lm(name: str) -> None:
    assert trains_as_causal_lm(lookup_model(name, 512).hf_config or {})


def test_an_encoder_built_as_a_decoder_is_a_causal_lm() -> None:
    config = {"model_type": "bert", "architectures": ["BertLMHeadModel"], "is_decoder": True}
    assert trains_as_causal_lm(config)
    assert not trains_as_causal_lm(
        {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"]}
    )
