"""A name for a variant of a catalog model loads that variant's weights, or says it does not.

The catalog prices architectures, so ``Llama-3-8B-Instruct`` is an alias of ``llama-3-8b``;
its weights are ``meta-llama/Meta-Llama-3-8B-Instruct``, not the entry's own base weights.
"""

from __future__ import annotations

import pytest

from tools.intake.brief import request_fields
from tools.intake.readings import MODEL_ASSUMED
from tools.research.model_catalog import list_models
from tools.research.variant_weights import variant_weights


@pytest.mark.parametrize(
    ("name", "weights"),
    [
        ("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct"),
        ("Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct"),
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
        # the entry's own weights, in any of their names
        ("llama-3-8b", None),
        ("Meta-Llama-3-8B", None),
        ("meta-llama/Meta-Llama-3-8B", None),
        ("llama3-8b", None),
        # not a catalog name, or no name at all
        ("qwen2.5-7b-instruct-awq", None),
        ("./models/llama", None),
        ({"params": 7e9}, None),
    ],
)
def test_a_variant_names_its_own_weights(name: object, weights: str | None) -> None:
    assert variant_weights(name) == weights


def test_a_request_for_a_variant_plans_its_architecture_and_loads_its_weights() -> None:
    fields = request_fields("fine-tune Llama-3-8B-Instruct on 8 H100", list_models())
    assert fields["model"] == "Llama-3-8B-Instruct" and MODEL_ASSUMED not in fields


def test_a_variant_the_catalog_lacks_is_planned_as_its_base_out_loud() -> None:
    fields = request_fields("lora qwen2.5-7b-instruct on 2 H100", list_models())
    assert fields["model"] == "qwen2.5-7b"
    (note,) = fields[MODEL_ASSUMED]
    assert "'qwen2.5-7b-instruct' is not in the catalog: planned as qwen2.5-7b" in note
    assert "loads its own weights, Qwen/Qwen2.5-7B: set MODEL_PATH" in note


def test_a_path_or_the_plain_name_is_no_variant() -> None:
    for text in (
        "fine-tune llama-3-8b on 8 H100 with data at /data/llama-3-8b/train.jsonl",
        "fine-tune llama-3-8b, on 8 H100.",
    ):
        fields = request_fields(text, list_models())
        assert fields["model"] == "llama-3-8b" and MODEL_ASSUMED not in fields, text
