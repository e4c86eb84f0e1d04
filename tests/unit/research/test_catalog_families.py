"""Issue 28, item 5: the catalog grown to the families people ask about.

Each new entry says where its config came from (``config_source``) and is counted on the meta
device (knowledge/models/counts.json, checked against a live count in tests/test_models.py);
the count must agree with the published one, within 1% or at the precision it is published in.
"""

from __future__ import annotations

import math

import pytest

from tools.research.model_catalog import catalog_id, load_model_catalog, lookup_model

# Every catalog entry issue 28 added.
FAMILY_MODELS = (
    "opt-125m", "opt-350m", "opt-1.3b", "opt-2.7b", "opt-6.7b", "opt-13b", "opt-30b", "opt-66b",
    "falcon-7b", "falcon-40b", "phi-3-medium", "phi-4", "phi-4-mini", "gemma-3-4b", "gemma-3-12b",
    "gemma-3-27b", "qwen3-235b-a22b", "yi-6b", "yi-34b", "deepseek-llm-7b", "deepseek-llm-67b",
    "deepseek-v3", "mistral-nemo-12b", "mistral-small-22b", "mistral-small-24b",
)  # fmt: skip


def _agrees_with_published(count: int, published: float) -> bool:
    """Within 1%, or equal at the precision the published figure is given in ("13B")."""
    digits = len(f"{published:e}".split("e")[0].rstrip("0").replace(".", ""))
    scale = 10 ** (math.floor(math.log10(published)) - digits + 1)
    return abs(count - published) <= 0.01 * published or round(count / scale) * scale == published


@pytest.mark.parametrize("model_id", FAMILY_MODELS)
def test_each_new_model_is_counted_and_agrees_with_its_published_count(model_id: str) -> None:
    entry = load_model_catalog()[model_id]
    spec = lookup_model(model_id, 512)
    assert "stored for this exact config in knowledge/models/counts.json" in spec.source
    assert entry["hf_repo"] and entry["published_params_source"] and entry["config_source"]
    assert _agrees_with_published(spec.params, entry["published_params"]), (
        spec.params,
        entry["published_params_source"],
    )


def test_mixtures_of_experts_count_what_a_token_uses() -> None:
    qwen = lookup_model("qwen3-235b-a22b", 4096)  # model card: 22B activated of 235B
    assert qwen.active_params == pytest.approx(22e9, rel=0.02)
    deepseek = lookup_model("deepseek-v3", 4096)  # V3 report: 37B activated of 671B
    assert deepseek.active_params == pytest.approx(37e9, rel=0.02)


def test_a_dot_between_digits_tells_sizes_apart() -> None:
    # "opt-1.3b" and "opt-13b" lost their difference when punctuation was dropped.
    assert catalog_id("OPT-1.3B") == "opt-1.3b"
    assert catalog_id("facebook/opt-13b") == "opt-13b"
    assert catalog_id("opt 13b") == "opt-13b"
    assert catalog_id("LLAMA 3 8B") == "llama-3-8b"  # other punctuation is still ignored
    assert catalog_id("Meta-Llama-3.1-8B") == "llama-3.1-8b"


def test_gemma_3_is_counted_as_its_language_model() -> None:
    """The hub's 4B/12B/27B are image-text models; their text part is what a plan trains."""
    spec = lookup_model("gemma-3-27b", 4096)
    assert spec.family == "gemma3_text"
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads) == (62, 5376, 32, 16)
    assert spec.params == pytest.approx(27.016e9, rel=0.001)  # Table 1: 1,416M + 25,600M


def test_the_issues_unknowns_are_read_as_what_they_are() -> None:
    """Issue 28's findings: OPT-66B and the H800 were unknown; now each is read as itself."""
    from tools.intake.brief import parse_request
    from tools.research.model_catalog import list_models

    brief = parse_request("fine-tune OPT-66B on 4 nodes of 8 H800", list_models())
    assert (brief.model, brief.hardware) == ("opt-66b", "4x8xH800")
    brief = parse_request("用 8 张 H20 微调 Mistral-Nemo-Instruct-2407", list_models())
    assert (brief.model, brief.hardware) == ("mistral-nemo-12b", "1x8xH20")
