"""A brief's recipe framework and its framework describe one run: settled, or refused when they clash."""

from __future__ import annotations

from typing import Any

import pytest

from tools.core.errors import InputError
from tools.core.schemas import RECIPE_LAUNCH, RECIPE_PRECISION_BASE, RECIPES_OF, TrainingBrief
from tools.intake.account import account_brief
from tools.intake.brief import brief_from_dict
from tools.intake.follow_up import follow_up_fields
from tools.intake.recipe_framework import (
    MEGATRON_LORA_NOT_USED,
    TORCHTUNE_NOT_USED,
    settle_recipe,
)
from tools.planning.recipe import recipe_from_brief
from tools.research.model_catalog import lookup_model


def _data(recipe: str | None, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"model": "llama-3.1-8b", "task": "pretrain", **extra}
    if recipe is not None:
        data["recipe"] = {"framework": recipe, "optimizer": "adamw"}
    return data


def _brief(recipe: str | None, **extra: Any) -> TrainingBrief:
    return brief_from_dict(_data(recipe, **extra))


@pytest.mark.parametrize(
    ("recipe", "framework", "priced"),
    [
        ("torchtitan", "torchtitan", "torchtitan"),
        ("fsdp", "pytorch_fsdp", "fsdp"),
        ("megatron", "megatron", "megatron"),
        ("deepspeed", "deepspeed", "deepspeed"),
    ],
)
def test_a_recipe_framework_with_a_launch_is_the_plans_framework(
    recipe: str, framework: str, priced: str
) -> None:
    settled, note = settle_recipe(_brief(recipe))
    assert settled.framework == framework and note is None
    assert settled.recipe is not None and settled.recipe.framework == priced
    assert settle_recipe(settled) == (settled, None)  # settling again changes nothing


def test_torchtune_runs_on_fsdp_priced_as_fsdp_and_says_so() -> None:
    settled, note = settle_recipe(_brief("torchtune"))
    assert settled.framework == "pytorch_fsdp"
    assert settled.recipe is not None and settled.recipe.framework == "fsdp"
    assert settled.recipe.optimizer == "adamw"  # the rest of the recipe is kept
    assert note == TORCHTUNE_NOT_USED and "\n" not in note
    # Beside its own launch (FSDP), torchtune is no contradiction: replaced the same way.
    kept, said = settle_recipe(_brief("torchtune", framework="pytorch_fsdp"))
    assert kept.framework == "pytorch_fsdp" and said == TORCHTUNE_NOT_USED


@pytest.mark.parametrize("framework", [None, "pytorch_ddp"])
def test_nanotron_has_no_launch_its_recipe_is_dropped_and_said(framework: str | None) -> None:
    settled, note = settle_recipe(_brief("nanotron", framework=framework))
    assert settled.framework == framework
    assert settled.recipe is not None and settled.recipe.framework is None
    assert note is not None and note.startswith("recipe.framework nanotron not used")
    assert (framework or "chosen as for a recipe that names none") in note
    # Priced as the plan's own framework runs (DeepSpeed's when it names none).
    priced = recipe_from_brief(settled)
    assert priced is not None and priced.framework == ("fsdp" if framework else "deepspeed")


def test_no_recipe_framework_or_no_training_settles_nothing() -> None:
    for brief in (
        _brief(None),
        brief_from_dict({"model": "llama-3.1-8b", "recipe": {"optimizer": "sgd"}}),
        _brief("torchtitan", task="inference"),
    ):
        assert settle_recipe(brief) == (brief, None)


@pytest.mark.parametrize(
    ("framework", "recipe"),
    [
        ("deepspeed", "torchtitan"),
        ("pytorch_fsdp", "megatron"),
        ("torchtitan", "fsdp"),
        ("megatron", "deepspeed"),
        ("horovod", "fsdp"),
    ],
)
def test_a_brief_whose_two_frameworks_disagree_is_one_line(framework: str, recipe: str) -> None:
    with pytest.raises(InputError) as err:
        _brief(recipe, framework=framework)
    line = str(err.value)
    assert "\n" not in line and line.startswith("brief")
    assert f"recipe.framework {recipe} contradicts framework {framework}" in line
    assert f"drop framework to plan on {RECIPE_LAUNCH[recipe]}" in line
    for agree in RECIPES_OF.get(framework, ()):
        assert agree in line


def test_every_brief_framework_with_a_launch_agrees_with_its_own_recipe() -> None:
    for framework, recipes in RECIPES_OF.items():
        for recipe in recipes:
            assert _brief(recipe, framework=framework).framework == framework


def test_a_recipe_whose_launch_is_refused_is_one_line() -> None:
    with pytest.raises(InputError) as err:
        _brief("fsdp", avoid_frameworks=["pytorch_fsdp"])
    assert "plans on pytorch_fsdp, which avoid_frameworks refuses" in str(err.value)


def test_the_recipes_framework_is_the_requests_framework_wish() -> None:
    data = _data("torchtitan")
    account = account_brief(data, brief_from_dict(data))
    wish = account.wish("framework:torchtitan")
    assert wish is not None and wish.quote == "brief: recipe.framework"
    named = _data("torchtitan", framework="torchtitan")
    wishes = account_brief(named, brief_from_dict(named)).wishes
    assert [(w.wish, w.quote) for w in wishes] == [("framework:torchtitan", "brief: framework")]


def test_a_torchtitan_recipe_torchtitan_cannot_run_is_priced_as_the_fsdp_in_its_place() -> None:
    qwen = lookup_model("qwen2.5-7b", 2048)
    settled, _ = settle_recipe(_brief("torchtitan", model="qwen2.5-7b"))
    recipe = recipe_from_brief(settled, qwen)
    assert settled.framework == "torchtitan" and recipe is not None and recipe.framework == "fsdp"
    flavor = recipe_from_brief(
        settle_recipe(_brief("torchtitan"))[0], lookup_model("llama-3.1-8b", 2048)
    )
    assert flavor is not None and flavor.framework == "torchtitan"


def test_a_follow_up_naming_another_framework_drops_the_recipes_own() -> None:
    brief = _brief("torchtitan").model_dump(mode="json")
    changes = follow_up_fields("what if with deepspeed?", brief, ["llama-3.1-8b"])
    assert changes["framework"] == "deepspeed"
    assert "framework" not in changes["recipe"]
    assert changes["recipe"]["optimizer"] == "adamw"
    merged = brief_from_dict({**brief, **changes})  # no contradiction left
    assert merged.framework == "deepspeed"
    # A follow-up that changes nothing of the framework keeps the recipe as it is.
    assert "recipe" not in follow_up_fields("with seq len 8192", brief, ["llama-3.1-8b"])


def test_a_megatron_recipe_of_a_lora_job_is_not_megatrons_launch_and_says_so() -> None:
    settled, note = settle_recipe(_brief("megatron", task="lora"))
    assert settled.framework is None
    assert settled.recipe is not None and settled.recipe.framework is None
    assert note == MEGATRON_LORA_NOT_USED and "\n" not in note
    data = _data("megatron", task="lora")
    assert account_brief(data, brief_from_dict(data)).wishes == []
    # A full-weight job keeps Megatron's launch.
    assert settle_recipe(_brief("megatron", task="finetune"))[0].framework == "megatron"


def test_beside_framework_megatron_a_lora_jobs_megatron_recipe_goes() -> None:
    settled, note = settle_recipe(_brief("megatron", task="lora", framework="megatron"))
    assert settled.framework == "megatron" and note is None  # the framework's line says it
    assert settled.recipe is not None and settled.recipe.framework is None
    priced = recipe_from_brief(settled)
    assert priced is not None and priced.framework == "deepspeed"
    # Without a recipe block, framework: megatron prices Megatron's recipe for a full-weight job
    # only.
    assert recipe_from_brief(_brief(None, task="lora", framework="megatron")) is None
    full = recipe_from_brief(_brief(None, task="finetune", framework="megatron"))
    assert full is not None and full.framework == "megatron"


def _precise(precision: str | None, recipe: str | None) -> dict[str, Any]:
    data: dict[str, Any] = {"model": "llama-3.1-8b", "task": "finetune"}
    if precision is not None:
        data["precision"] = precision
    if recipe is not None:
        data["recipe"] = {"precision": recipe}
    return data


@pytest.mark.parametrize(
    ("precision", "recipe"),
    [("bf16", "fp16"), ("fp16", "bf16"), ("fp32", "pure-bf16"), ("fp16", "fp8"), ("bf16", "fp32")],
)
def test_a_brief_whose_two_precisions_disagree_is_one_line(precision: str, recipe: str) -> None:
    with pytest.raises(InputError) as err:
        brief_from_dict(_precise(precision, recipe))
    line = str(err.value)
    assert "\n" not in line and line.startswith("brief")
    assert f"recipe.precision {recipe} contradicts precision {precision}" in line
    assert f"set precision to {RECIPE_PRECISION_BASE[recipe]} or auto" in line


@pytest.mark.parametrize("recipe", sorted(RECIPE_PRECISION_BASE))
def test_a_recipe_precision_is_the_launchs_when_the_brief_leaves_it_auto(recipe: str) -> None:
    base = RECIPE_PRECISION_BASE[recipe]
    assert brief_from_dict(_precise(base, recipe)).precision == base  # agreeing pairs are read
    settled, note = settle_recipe(brief_from_dict(_precise(None, recipe)))
    assert settled.precision == base and note is None
    assert settled.recipe is not None and settled.recipe.precision == recipe
    assert settle_recipe(settled)[0] == settled
    data = _precise(None, recipe)
    assumed = {a.field: a for a in account_brief(data, brief_from_dict(data)).assumed}
    if "precision" in assumed:  # a brief file's fields are read, not assumed
        assert f"recipe.precision {recipe}" in assumed["precision"].why


def test_a_brief_precision_without_a_recipe_precision_is_left_as_it_is() -> None:
    for precision in ("auto", "fp16"):
        settled, _ = settle_recipe(brief_from_dict(_precise(precision, None)))
        assert settled.precision == precision
    plain = brief_from_dict({"model": "llama-3.1-8b", "task": "finetune"})
    assert settle_recipe(plain)[0].precision == "auto"


def test_a_follow_up_naming_another_precision_drops_the_recipes_own() -> None:
    brief = brief_from_dict(_precise(None, "bf16")).model_dump(mode="json")
    changes = follow_up_fields("what if in fp16?", brief, ["llama-3.1-8b"])
    assert changes["precision"] == "fp16" and "precision" not in changes["recipe"]
    assert brief_from_dict({**brief, **changes}).precision == "fp16"
    same = follow_up_fields("what if in bf16?", brief, ["llama-3.1-8b"])
    assert "recipe" not in same
