"""Recipe fields no launch here applies are priced as the launch runs, and named in one line."""

from __future__ import annotations

from typing import Any

import pytest

from tools.intake.brief import brief_from_dict
from tools.intake.recipe_fields import settle_recipe_fields
from tools.planning.recipe import recipe_from_brief


def _brief(recipe: dict[str, Any], **extra: Any):
    return brief_from_dict({"model": "llama-3.1-8b", "task": "finetune", "recipe": recipe, **extra})


@pytest.mark.parametrize(
    ("field", "value", "runs", "why"),
    [
        ("optimizer", "adam8bit", None, "steps AdamW"),
        ("optimizer", "paged-adam8bit", None, "steps AdamW"),
        ("optimizer", "sgd", None, "steps AdamW"),
        ("precision", "pure-bf16", "bf16", "fp32 master weights"),
        ("precision", "tf32", "fp32", "TF32 matmuls"),
        ("loss", "chunked", None, "standard cross-entropy"),
        ("activation_offload", True, False, "offloads activations"),
        ("optimizer_in_backward", True, False, "inside backward"),
        ("compile", True, False, "only torchtitan's launch compiles"),
    ],
)
def test_a_field_no_launch_applies_is_dropped_and_named(
    field: str, value: Any, runs: Any, why: str
) -> None:
    settled, note = settle_recipe_fields(_brief({field: value}))
    assert settled.recipe is not None and getattr(settled.recipe, field) == runs
    shown = str(value).lower() if isinstance(value, bool) else value
    assert note is not None and "\n" not in note
    assert f"recipe.{field} {shown} (" in note and why in note
    assert settle_recipe_fields(settled) == (settled, None)  # settled: nothing more to drop
    priced = recipe_from_brief(settled)
    assert priced is not None and getattr(priced, field) in (
        runs,
        "bf16",
        False,
        "adamw",
        "standard",
    )


def test_what_the_launches_apply_is_kept_without_a_word() -> None:
    recipe = {
        "optimizer": "adamw",
        "precision": "bf16",
        "loss": "standard",
        "checkpointing": "full",
    }
    brief = _brief({**recipe, "lora_rank": 16}, task="lora")
    assert settle_recipe_fields(brief) == (brief, None)
    titan = _brief({"framework": "torchtitan", "compile": True})
    assert settle_recipe_fields(titan) == (titan, None)
    named = _brief({"compile": True}, framework="torchtitan")
    assert settle_recipe_fields(named) == (named, None)


def test_several_fields_are_one_line_in_field_order() -> None:
    _, note = settle_recipe_fields(_brief({"loss": "chunked", "optimizer": "adafactor"}))
    assert note is not None and note.index("recipe.optimizer") < note.index("recipe.loss")


def test_serving_and_agent_briefs_settle_nothing() -> None:
    brief = _brief({"optimizer": "sgd"}, task="inference")
    assert settle_recipe_fields(brief) == (brief, None)
