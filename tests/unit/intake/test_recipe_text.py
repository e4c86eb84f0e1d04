"""A LoRA request's "QLoRA" and adapter rank are the brief's recipe, not dropped or only listed."""

from __future__ import annotations

from typing import Any

import pytest

from tools.core.schemas import TrainingBrief
from tools.intake.account import account_request
from tools.intake.brief import brief_from_dict, request_fields
from tools.intake.follow_up import follow_up_fields
from tools.intake.recipe_text import recipe_reads

MODELS = ["mistral-7b", "llama-3.1-8b"]


def _brief(fields: dict[str, Any]) -> TrainingBrief:
    return brief_from_dict({k: v for k, v in fields.items() if not k.startswith("_")})


@pytest.mark.parametrize(
    ("text", "qlora", "rank"),
    [
        ("fine-tune mistral-7b with QLoRA rank 64 on a single RTX 4090", True, 64),
        ("LoRA fine-tune llama-3.1-8b, r=16, on 8 A100", None, 16),
        ("qlora llama-3.1-8b on one A10G", True, None),
        ("train LoRA adapters (rank-8) for llama-3.1-8b on 2 L4", None, 8),
        ("LoRA on llama-3.1-8b with lora rank: 128", None, 128),
        ("LoRA fine-tune llama-3.1-8b on 2 A100 80GB in 4-bit", True, None),
        ("LoRA llama-3.1-8b over an NF4 base, r=32", True, 32),
        # Before, "r 16" after "lora" was listed as not understood (the default rank planned).
        ("lora r 8 alpha 32 on llama-3.1-8b, 1 x H100", None, 8),
        ("LoRA llama-3.1-8b with lora_r: 64 on 2 A100", None, 64),
    ],
)
def test_qlora_and_the_rank_are_read_into_the_recipe(
    text: str, qlora: bool | None, rank: int | None
) -> None:
    fields = request_fields(text, MODELS)
    assert fields["task"] == "lora"
    recipe = fields.get("recipe", {})
    assert recipe.get("qlora") == qlora and recipe.get("lora_rank") == rank
    brief = _brief(fields)
    account = account_request(text, fields, brief)
    assert not account.not_understood  # the rank and the 4-bit words are bound
    read = next(f for f in account.read if f.field == "recipe")
    assert read.quote and read.quote in text  # quoted from the request's own words


def test_rank_outside_a_lora_task_is_not_a_recipe() -> None:
    assert recipe_reads("pretrain llama-3.1-8b, rank 64 in the leaderboard", "pretrain") == []
    fields = request_fields("pretrain llama-3.1-8b on 8 H100 with rank 64 data", MODELS)
    assert "recipe" not in fields
    account = account_request(
        "pretrain llama-3.1-8b on 8 H100 with rank 64 data", fields, _brief(fields)
    )
    assert any("64" in q for q in account.not_understood)  # listed, never bound silently


def test_a_rank_out_of_bounds_is_left_not_understood() -> None:
    text = "LoRA fine-tune llama-3.1-8b with rank 99999"
    fields = request_fields(text, MODELS)
    assert "lora_rank" not in fields.get("recipe", {})
    account = account_request(text, fields, _brief(fields))
    assert any("99999" in q for q in account.not_understood)


def test_a_follow_up_rank_keeps_the_rest_of_the_recipe() -> None:
    brief = _brief(request_fields("QLoRA llama-3.1-8b rank 64 on one L40S", MODELS))
    changes = follow_up_fields("what if LoRA rank 16?", brief.model_dump(mode="json"), MODELS)
    assert changes["recipe"]["lora_rank"] == 16 and changes["recipe"]["qlora"] is True


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("fine-tune llama-3.1-8b on 8 A100 with gradient checkpointing", "full"),
        ("pretrain llama-3.1-8b on 8 H100 with activation checkpointing", "full"),
        ("LoRA llama-3.1-8b rank 8 on 2 L4, recompute everything", "full"),
        ("fine-tune llama-3.1-8b on 8 A100, no activation checkpointing", "none"),
    ],
)
def test_activation_checkpointing_words_are_the_recipes_recompute(text: str, policy: str) -> None:
    fields = request_fields(text, MODELS)
    assert fields["recipe"]["checkpointing"] == policy
    account = account_request(text, fields, _brief(fields))
    read = next(f for f in account.read if f.field == "recipe")
    assert "checkpointing" in read.quote or "recompute" in read.quote


def test_serving_words_set_no_recipe() -> None:
    fields = request_fields("serve llama-3.1-8b on 2 L4 with activation checkpointing", MODELS)
    assert "recipe" not in fields


@pytest.mark.parametrize(
    ("text", "precision", "recipe_precision", "quote"),
    [
        # Before, "pure bf16" planned mixed bf16 (fp32 masters) and "tf32" left no trace; now
        # the recipe names them, and the plan says the launch keeps fp32 masters / no TF32.
        ("fine-tune llama-3.1-8b on 8 A100 in pure bf16", "bf16", "pure-bf16", "pure bf16"),
        (
            "fine-tune llama-3.1-8b on 8 A100, bf16 without fp32 master weights",
            "bf16",
            "pure-bf16",
            "bf16 without fp32 master weights",
        ),
        ("fine-tune llama-3.1-8b on 8 A100 with tf32", "fp32", "tf32", "tf32"),
        # Mixed precision is the default's own run: read, with its words, not assumed.
        ("fine-tune llama-3.1-8b on 8 A100 with mixed precision", "auto", None, "mixed precision"),
        ("fine-tune llama-3.1-8b on 8 A100 with AMP", "auto", None, "AMP"),
        ("fine-tune llama-3.1-8b on 8 A100 with bf16 mixed precision", "bf16", None, "bf16"),
    ],
)
def test_precision_words_land_in_the_brief_and_its_recipe(
    text: str, precision: str, recipe_precision: str | None, quote: str
) -> None:
    fields = request_fields(text, MODELS)
    assert fields["precision"] == precision
    assert fields.get("recipe", {}).get("precision") == recipe_precision
    account = account_request(text, fields, _brief(fields))
    read = next(f for f in account.read if f.field == "precision")
    assert read.quote == quote
