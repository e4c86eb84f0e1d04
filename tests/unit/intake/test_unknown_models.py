"""A model the catalog lacks, named by the request, is said to be missing by its name.

Before, "fine-tune roberta-large ...", "fine-tune whisper-large-v3 ...", "fine-tune flan-t5-xl
..." and "train OLMo 2 7B ..." were refused with "names no model": the user named one.
"""

from __future__ import annotations

import pytest

from tools.core.errors import InputError
from tools.intake.brief import parse_request
from tools.intake.model_text import read_model
from tools.research.model_catalog import list_models


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("fine-tune roberta-large for sentiment classification on 1 T4", "roberta-large"),
        ("fine-tune flan-t5-xl on 8 A100 80GB, 3 epochs", "flan-t5-xl"),
        ("fine-tune whisper-large-v3 on 2000 hours of audio on 8 A10G", "whisper-large-v3"),
        ("fine-tune deberta-v3-base for NER on 1 A100", "deberta-v3-base"),
        ("fine-tune sdxl unet on 4 A100 80GB", "sdxl"),
        ("train OLMo 2 7B sft on 2 nodes of 8 L4", "OLMo 2 7B"),
    ],
)
def test_an_unknown_model_is_named_in_the_refusal(text: str, name: str) -> None:
    reading = read_model(text)
    assert reading is not None and reading.value is None and reading.said == name
    with pytest.raises(InputError) as caught:
        parse_request(text, list_models())
    line = str(caught.value)
    assert f"{name!r} is not in the model catalog" in line and "names no model" not in line


@pytest.mark.parametrize(
    "text",
    ["fine-tune a small model on one 4090", "fine-tune something for my agents' tool calls"],
)
def test_no_model_named_is_still_no_model(text: str) -> None:
    with pytest.raises(InputError, match="names no model"):
        parse_request(text, list_models())


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("train a CLIP ViT-B/16 from scratch on 400M image-text pairs on 64 A100", "CLIP"),
        ("fine-tune llama-3-8b on 8 H100 as the text encoder of sdxl", "sdxl"),
    ],
)
def test_an_unknown_model_beside_a_planned_one_is_said_not_planned(text: str, name: str) -> None:
    # Before, "a CLIP ViT-B/16" planned the ViT image classifier and dropped CLIP without a word.
    from tools.intake.account import account_request
    from tools.intake.brief import brief_from_dict, request_fields

    fields = request_fields(text, list_models())
    brief = brief_from_dict({k: v for k, v in fields.items() if not k.startswith("_")})
    account = account_request(text, fields, brief)
    (wish,) = [w for w in account.wishes if w.wish == f"other-model:{name}"]
    assert wish.honoured is False and "not in the model catalog" in wish.how
    assert str(brief.model) in wish.how


@pytest.mark.parametrize(
    "text",
    [
        "fine-tune qwen2.5-7b-instruct on 1 A100 with gradient clip 1.0",
        "fine-tune bert-base-uncased for NER on one rtx 3090",
    ],
)
def test_a_planned_models_own_name_is_no_other_model(text: str) -> None:
    from tools.intake.account import account_request
    from tools.intake.brief import brief_from_dict, request_fields

    fields = request_fields(text, list_models())
    brief = brief_from_dict({k: v for k, v in fields.items() if not k.startswith("_")})
    assert not [w for w in account_request(text, fields, brief).wishes if "other-model" in w.wish]


def test_an_unclear_name_is_asked_about_with_the_models_whose_numbers_it_has() -> None:
    # "qwen2.5-coder-7b" offered qwen2.5-72b beside qwen2.5-7b: a 7B name is not a 72B model.
    reading = read_model("fine-tune qwen2.5-coder-7b on 4 H100")
    assert reading is not None and reading.value is None
    assert reading.candidates == ("qwen2.5-7b",)
    # No candidate has all of its numbers: the close ones are all offered, as before.
    unclear = read_model("fine-tune llama-3-7b on 4 H100")
    assert unclear is not None and "llama-3-70b" in unclear.candidates
    assert "llama-3-8b" in unclear.candidates
