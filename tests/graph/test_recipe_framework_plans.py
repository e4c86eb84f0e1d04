"""A brief's recipe framework, planned by the CLI in process: the numbers are for the run launched.

A brief that names only ``recipe.framework`` plans on the launch that runs it (torchtitan where
one of its flavors builds the model, else FSDP in its place; torchtune's recipe on PyTorch FSDP;
Megatron-DeepSpeed), memory priced as that launch runs; a recipe framework with no launch here
(nanotron) or none of its own (torchtune) is said in one line; a brief whose ``framework`` and
``recipe.framework`` disagree is one line and exit 2. Before, ``recipe: {framework: torchtitan}``
planned a DeepSpeed launch priced as torchtitan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.intake.recipe_framework import MEGATRON_LORA_NOT_USED, TORCHTUNE_NOT_USED
from tools.research.model_catalog import lookup_model
from tools.research.splits import MEGATRON_LORA
from tools.research.titan_flavors import build_refusal

# The recipe framework memory is priced with for each plan framework (tools/planning/recipe.py).
PRICED = {"torchtitan": "torchtitan", "pytorch_fsdp": "fsdp", "megatron": "megatron"}
# A recipe that names none: DeepSpeed's, PyTorch's unsharded path for DDP replicas.
UNNAMED = {"deepspeed": "deepspeed", "pytorch_ddp": "fsdp", **PRICED}


def _brief(
    tmp_path: Path, model: str, recipe: str, extra: str = "", task: str = "pretrain"
) -> Path:
    brief = tmp_path / "brief.yaml"
    brief.write_text(
        f"goal: train\nmodel: {model}\ntask: {task}\nhardware: 1x8xH100-80GB\n"
        f"recipe: {{framework: {recipe}}}\nsmoke: false\n{extra}"
    )
    return brief


def _plan(cli_main: Any, tmp_path: Path, brief: Path) -> tuple[dict[str, Any], str]:
    out = tmp_path / "plan"
    res = cli_main("plan", "--brief", str(brief), "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "plan.json").read_text()), res.stdout


def _priced(plan: dict[str, Any]) -> str:
    line = next(a for a in plan["memory"]["assumptions"] if a.startswith("memory priced for: "))
    return line.removeprefix("memory priced for: ").split(",", 1)[0]


def _not_as_asked(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("not as asked:")]


@pytest.mark.parametrize(
    ("model", "recipe", "primary", "files"),
    [
        ("llama-3.1-8b", "torchtitan", "torchtitan", {"torchtitan.toml", "TORCHTITAN.md"}),
        # Llama 3 (no RoPE scaling): Megatron-DeepSpeed builds it exactly, nothing to say.
        ("llama-3-8b", "megatron", "megatron", {"MEGATRON.md"}),
    ],
)
def test_a_recipe_framework_with_a_launch_plans_on_it_priced_as_it_runs(
    cli_main: Any, tmp_path: Path, model: str, recipe: str, primary: str, files: set[str]
) -> None:
    plan, stdout = _plan(cli_main, tmp_path, _brief(tmp_path, model, recipe))
    assert plan["framework"]["primary"] == primary
    assert files <= set(plan["launch"]["files"])
    assert "ds_config_hf.json" not in plan["launch"]["files"]
    assert plan["launch"]["command"][0] == "torchrun"
    assert _priced(plan) == PRICED[primary] == recipe
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == f"framework:{primary}")
    assert wish["quote"] == "brief: recipe.framework" and wish["honoured"] is True
    assert _not_as_asked(stdout) == []


def test_a_torchtitan_recipe_torchtitan_cannot_run_is_fsdp_priced_as_fsdp(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, stdout = _plan(cli_main, tmp_path, _brief(tmp_path, "qwen2.5-7b", "torchtitan"))
    why = build_refusal(lookup_model("qwen2.5-7b", 2048))
    assert why is not None
    assert plan["framework"]["primary"] == "pytorch_fsdp"
    files = set(plan["launch"]["files"])
    assert "FSDP.md" in files and not {"torchtitan.toml", "ds_config.json"} & files
    assert _priced(plan) == "fsdp"
    said = _not_as_asked(stdout)
    assert len(said) == 1 and why in said[0]
    assert "the plan runs on pytorch_fsdp (FSDP2" in said[0]
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == "framework:torchtitan")
    assert wish["honoured"] is False and wish["quote"] == "brief: recipe.framework"


def test_a_torchtune_recipe_runs_fsdp_priced_as_fsdp_and_says_so(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, stdout = _plan(cli_main, tmp_path, _brief(tmp_path, "llama-3.1-8b", "torchtune"))
    assert plan["framework"]["primary"] == "pytorch_fsdp"
    assert plan["launch"]["command"][0] == "torchrun" and "--fsdp" in plan["launch"]["command"]
    assert _priced(plan) == "fsdp"
    said = _not_as_asked(stdout)
    assert len(said) == 1 and TORCHTUNE_NOT_USED in said[0]
    assert TORCHTUNE_NOT_USED in plan["memory"]["not_honoured"]


def test_a_nanotron_recipe_is_priced_as_the_plans_framework_and_says_so(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, stdout = _plan(cli_main, tmp_path, _brief(tmp_path, "llama-3.1-8b", "nanotron"))
    primary = plan["framework"]["primary"]
    assert _priced(plan) == UNNAMED[primary]
    said = _not_as_asked(stdout)
    assert len(said) == 1 and "recipe.framework nanotron not used" in said[0]


def test_a_megatron_recipe_of_a_lora_job_is_priced_as_the_launch_that_runs_it(
    cli_main: Any, tmp_path: Path
) -> None:
    brief = _brief(tmp_path, "llama-3.1-8b", "megatron", task="lora")
    plan, stdout = _plan(cli_main, tmp_path, brief)
    primary = plan["framework"]["primary"]
    assert primary != "megatron" and "MEGATRON.md" not in plan["launch"]["files"]
    assert "trainer/train.py" in plan["launch"]["command"]
    assert _priced(plan) == UNNAMED[primary]
    said = _not_as_asked(stdout)
    assert len(said) == 1 and MEGATRON_LORA_NOT_USED in said[0]


def test_framework_megatron_on_a_lora_job_runs_the_hugging_face_job_and_says_why(
    cli_main: Any, tmp_path: Path
) -> None:
    brief = _brief(tmp_path, "llama-3.1-8b", "megatron", "framework: megatron\n", task="lora")
    plan, stdout = _plan(cli_main, tmp_path, brief)
    primary = plan["framework"]["primary"]
    assert primary != "megatron" and "trainer/train.py" in plan["launch"]["command"]
    assert _priced(plan) == UNNAMED[primary]
    said = _not_as_asked(stdout)
    assert len(said) == 1 and MEGATRON_LORA in said[0] and "megatron was asked for" in said[0]
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == "framework:megatron")
    assert wish["honoured"] is False


def test_a_brief_whose_framework_and_recipe_framework_disagree_is_refused(
    cli_main: Any, tmp_path: Path
) -> None:
    brief = _brief(tmp_path, "llama-3.1-8b", "torchtitan", "framework: deepspeed\n")
    out = tmp_path / "plan"
    res = cli_main("plan", "--brief", str(brief), "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "recipe.framework torchtitan contradicts framework deepspeed" in lines[0]
    assert not (out / "plan.json").exists()


def test_a_recipe_precision_is_what_the_launch_trains_in(cli_main: Any, tmp_path: Path) -> None:
    brief = tmp_path / "brief.yaml"
    brief.write_text(
        "goal: train\nmodel: llama-3.1-8b\ntask: finetune\nhardware: 1x8xA100-80GB\n"
        "recipe: {precision: fp16}\nsmoke: false\n"
    )
    plan, _ = _plan(cli_main, tmp_path, brief)
    ds = json.loads((tmp_path / "plan" / "ds_config.json").read_text())
    assert ds["fp16"]["enabled"] is True and not ds.get("bf16", {}).get("enabled")
    assert plan["brief"]["precision"] == "fp16"
    assert _priced(plan) == "deepspeed" and "fp16" in next(
        a for a in plan["memory"]["assumptions"] if a.startswith("memory priced for: ")
    )
    brief.write_text(brief.read_text() + "precision: bf16\n")
    res = cli_main("plan", "--brief", str(brief), "--no-smoke", "--out", str(tmp_path / "p2"))
    assert res.returncode == 2 and not (tmp_path / "p2").exists()
    assert "recipe.precision fp16 contradicts precision bf16" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_recipe_fields_no_launch_applies_are_priced_as_it_runs_and_said(
    cli_main: Any, tmp_path: Path
) -> None:
    brief = tmp_path / "brief.yaml"
    brief.write_text(
        "goal: train\nmodel: llama-3.1-8b\ntask: finetune\nhardware: 1x8xA100-80GB\n"
        "recipe: {optimizer: adam8bit, loss: chunked}\nsmoke: false\n"
    )
    plan, stdout = _plan(cli_main, tmp_path, brief)
    said = [line for line in _not_as_asked(stdout) if "not applied by the launch" in line.lower()]
    assert len(said) == 1 and "recipe.optimizer adam8bit" in said[0]
    assert "recipe.loss chunked" in said[0]
    priced = next(a for a in plan["memory"]["assumptions"] if a.startswith("memory priced for: "))
    assert "adamw" in priced and "standard loss" in priced
    ds = json.loads((tmp_path / "plan" / "ds_config.json").read_text())
    assert ds["optimizer"]["type"] == "AdamW"


def test_a_compiling_torchtitan_recipe_runs_compiled(cli_main: Any, tmp_path: Path) -> None:
    brief = _brief(tmp_path, "llama-3.1-8b", "torchtitan")
    brief.write_text(
        brief.read_text().replace(
            "{framework: torchtitan}", "{framework: torchtitan, compile: true}"
        )
    )
    plan, stdout = _plan(cli_main, tmp_path, brief)
    assert plan["framework"]["primary"] == "torchtitan"
    assert not [line for line in _not_as_asked(stdout) if "recipe.compile" in line]
    config = (tmp_path / "plan" / "torchtitan.toml").read_text()
    assert "[compile]" in config and "enable = true" in config.split("[compile]", 1)[1]
