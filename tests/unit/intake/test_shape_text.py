"""A model given by its dimensions in the words is that shape, not the model a size stood for.

"a custom 1B model with 24 layers, hidden 2048, 16 heads, vocab 32000" used to plan
llama-3.2-1b (16 layers, a 128K vocabulary) and list the dimensions as not understood.
"""

from __future__ import annotations

from tools.intake.brief import brief_from_request, request_fields
from tools.intake.shape_text import DEFAULT_VOCAB, shape_model, shape_reads
from tools.research.model_catalog import list_models, lookup_model


def test_the_dimensions_are_the_briefs_model() -> None:
    text = "pretrain a custom 1B model with 24 layers, hidden 2048, 16 heads, vocab 32000 on 8 H100"
    brief = brief_from_request(request_fields(text, list_models()))
    assert not isinstance(brief.model, str | dict)
    shape = brief.model.model_dump()
    assert {k: shape[k] for k in ("layers", "hidden", "heads", "vocab")} == {
        "layers": 24,
        "hidden": 2048,
        "heads": 16,
        "vocab": 32000,
    }


def test_spellings_and_kv_heads_apart_from_heads() -> None:
    text = "d_model=1024, n_layers=16, 16 attention heads, 4 kv heads, ffn 2816, 50k vocab"
    got = {r.field: r.value for r in shape_reads(text)}
    assert got == {
        "model.layers": 16,
        "model.hidden": 1024,
        "model.heads": 16,
        "model.kv_heads": 4,
        "model.intermediate": 2816,
    }
    assert [r.quote for r in shape_reads("num_attention_heads: 32, kv heads 8")] == [
        "kv heads 8",
        "num_attention_heads: 32",
    ]


def test_a_vocabulary_left_out_is_assumed_out_loud_and_a_name_is_the_like() -> None:
    shape = shape_model("llama-3.2-1b with 20 layers, hidden size 2048, 32 heads", "llama-3.2-1b")
    assert shape is not None
    dims, notes = shape
    assert dims["vocab"] == DEFAULT_VOCAB and dims["like"] == "llama-3.2-1b"
    assert len(notes) == 1 and "vocabulary" in notes[0]


def test_fewer_than_layers_hidden_and_heads_is_no_shape() -> None:
    assert shape_model("fine-tune llama-3-8b on 8 H100 with 24 layers frozen", None) is None
    fields = request_fields("fine-tune llama-3-8b on 8 H100, hidden 4096", list_models())
    assert fields["model"] == "llama-3-8b"


def test_hyphenated_dimensions_are_read() -> None:
    # "a 2-layer 128-hidden llama": before, neither dimension was read.
    got = {r.field: r.value for r in shape_reads("a 2-layer 128-hidden, 4-head model")}
    assert got == {"model.layers": 2, "model.hidden": 128, "model.heads": 4}
    got = {r.field: r.value for r in shape_reads("a 6-layer, 512-wide mistral")}
    assert got == {"model.layers": 6, "model.hidden": 512}


def test_a_family_name_with_layers_and_hidden_is_that_family_at_that_shape() -> None:
    # Before, "a 2-layer 128-hidden llama" asked which llama (llama-2-7b, ..., llama-3-8b) and
    # listed the dimensions as not understood.
    fields = request_fields(
        "pretrain a 2-layer 128-hidden llama on 1 H100, 20 steps", list_models()
    )
    brief = brief_from_request(fields)
    assert not isinstance(brief.model, str | dict)
    shape = brief.model.model_dump()
    assert (shape["layers"], shape["hidden"], shape["like"]) == (2, 128, "llama-2-7b")
    assert shape["heads"] == 1  # llama-2-7b's heads are 128 wide: 128 / 128
    assert shape["intermediate"] == 344  # llama-2-7b's 11008 / 4096 at 128, not its 11008
    notes = " ".join(fields.get("_model_assumed", []))
    assert "llama" in notes and "heads" in notes and "llama-2-7b" in notes


def test_a_family_shape_takes_heads_of_the_familys_width() -> None:
    fields = request_fields("a 4-layer 512-hidden qwen2.5 on 1 A100", list_models())
    brief = brief_from_request(fields)
    assert not isinstance(brief.model, str | dict)
    shape = brief.model.model_dump()
    like = lookup_model(shape["like"], 2048)
    assert shape["like"].startswith("qwen2.5-")
    assert (shape["layers"], shape["hidden"]) == (4, 512)
    assert shape["heads"] == 512 // (like.hidden // like.heads)
    # Stated heads win over the family's width.
    fields = request_fields("a 4-layer 512-hidden 8-head llama", list_models())
    assert fields["model"]["heads"] == 8


def test_a_gpt_with_layers_and_hidden_is_gpt2_at_that_shape() -> None:
    # Before, "a 12-layer 768-hidden gpt" was refused as naming no model.
    fields = request_fields("pretrain a 12-layer 768-hidden gpt on 8 V100 32GB", list_models())
    brief = brief_from_request(fields)
    assert not isinstance(brief.model, str | dict)
    shape = brief.model.model_dump()
    assert (shape["layers"], shape["hidden"], shape["like"]) == (12, 768, "gpt2")
    assert shape["heads"] == 12  # gpt2's heads are 64 wide
    assert shape["vocab"] == 50257  # gpt2's tokenizer, not the Llama 2 default
