"""A request that asks for fp8, planned by the CLI in process: the plan is for the job asked.

On H100 (FP8 tensor cores) the recipe trains fp8 linears on a launcher that applies them
(torchtitan for a model its flavors build, else Megatron-DeepSpeed for a GPT-3-style model in
its plain model) and the tokens/s are the fp8 path's; where no launch applies it, bf16's; on A100 the plan trains bf16 and says in one line why; with DeepSpeed pinned the
launch has no fp8 path, so the speed is priced as bf16 and the plan says fp8 is not applied.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from launch_checks import torchtitan_key_errors

from tools.artifacts.headline import FP8_NOT_APPLIED, headline_notes


def _plan(cli_main: Any, tmp_path: Path, request: str) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path / "plan"
    tmp_path.mkdir(exist_ok=True)
    res = cli_main("plan", request, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "plan.json").read_text()), out, res.stdout


def _wish(plan: dict[str, Any]) -> dict[str, Any]:
    return next(w for w in plan["request"]["wishes"] if w["wish"] == "technique:fp8")


def _fp8_lines(plan: dict[str, Any]) -> list[str]:
    return [n for n in headline_notes(plan) if "fp8" in n]


def test_fp8_on_h100_runs_on_torchtitan_which_applies_it(cli_main: Any, tmp_path: Path) -> None:
    plan, out, stdout = _plan(cli_main, tmp_path, "fine-tune llama-3.1-8b on 8 H100 with fp8")
    assert plan["brief"]["recipe"]["precision"] == "fp8"
    assert plan["framework"]["primary"] == "torchtitan"
    assert "fp8 linears" in plan["framework"]["rationale"]
    toml = tomllib.loads((out / "torchtitan.toml").read_text())
    assert torchtitan_key_errors(toml) == []
    assert toml["model"]["converters"] == ["quantize.linear.float8"]
    assert toml["quantize"]["linear"]["float8"]["filter_fqns"] == ["output"]
    speed = plan["speed"]
    assert speed["gemm_precision"] == "fp8" and speed["fp8_mfu"] is not None
    assert any(a.startswith("fp8 linears:") for a in plan["memory"]["assumptions"])
    wish = _wish(plan)
    assert wish["honoured"] is True and "torchtitan" in wish["how"]
    assert _fp8_lines(plan) == [] and "not as asked" not in stdout
    assert not any(n.startswith(FP8_NOT_APPLIED) for n in plan["launch"]["notes"])


def test_fp8_llama_3_is_priced_as_the_bf16_every_launch_would_run(
    cli_main: Any, tmp_path: Path
) -> None:
    # Megatron-DeepSpeed's Transformer Engine layers (its only fp8 path) are LayerNorm/GeLU/
    # multi-head, in its plain model only (tools/artifacts/megatron_fp8.py), and torchtitan has
    # no Llama 3 flavor: no launch applies fp8, so the plan is the bf16 one and says so once.
    plan, _, stdout = _plan(cli_main, tmp_path, "fine-tune llama-3-8b on 8 H100 with fp8")
    bf16, _, _ = _plan(cli_main, tmp_path / "bf16", "fine-tune llama-3-8b on 8 H100")
    assert plan["framework"]["primary"] == bf16["framework"]["primary"] != "megatron"
    assert plan["speed"]["gemm_precision"] is None
    assert plan["speed"]["tokens_per_s"] == bf16["speed"]["tokens_per_s"]
    lines = _fp8_lines(plan)
    assert len(lines) == 1 and "grouped-query attention" in lines[0]
    assert "priced as bf16" in lines[0]
    assert _wish(plan)["honoured"] is False
    assert sum(line.startswith("not as asked: fp8") for line in stdout.splitlines()) == 1


def test_fp8_gpt3_on_megatron_trains_the_plain_model_that_applies_it(
    cli_main: Any, tmp_path: Path
) -> None:
    # The fastest fp8 setup has pipeline stages (the pipeline model, no fp8 there): the plan
    # is searched again without them, so the fp8 priced is the fp8 the launch runs.
    plan, _, stdout = _plan(cli_main, tmp_path, "pretrain gpt3-6.7b on 16 H100 with fp8")
    assert plan["framework"]["primary"] == "megatron"
    assert plan["memory"]["pipeline_parallel"] == 1
    assert plan["speed"]["gemm_precision"] == "fp8"
    command = plan["launch"]["command"]
    assert "--fp8-hybrid" in command and "--no-pipeline-parallel" in command
    assert any("without pipeline stages" in a for a in plan["memory"]["assumptions"])
    assert _fp8_lines(plan) == [] and "not as asked" not in stdout
    assert _wish(plan)["honoured"] is True


def test_fp8_gpt3_that_needs_pipeline_stages_is_priced_as_the_bf16_it_runs(
    cli_main: Any, tmp_path: Path
) -> None:
    # 175B fits only with pipeline stages, whose pipeline model Transformer Engine never
    # builds: the plan trains and is priced bf16, and the brief, the wish, the headline and the
    # framework's rationale all say the same.
    plan, _, stdout = _plan(cli_main, tmp_path, "pretrain gpt3-175b on 8 nodes of 8 H100 with fp8")
    assert plan["memory"]["pipeline_parallel"] > 1
    assert plan["brief"]["recipe"]["precision"] == "bf16"
    assert plan["speed"]["gemm_precision"] is None
    assert "--fp8-hybrid" not in plan["launch"]["command"]
    lines = _fp8_lines(plan)
    assert len(lines) == 1 and "the pipeline model" in lines[0]
    assert "the plan is priced as bf16" in lines[0]
    wish = _wish(plan)
    assert wish["honoured"] is False and lines[0].startswith(wish["how"])
    assert "priced bf16" in plan["framework"]["rationale"]
    assert sum(line.startswith("not as asked: fp8") for line in stdout.splitlines()) == 1


def test_fp8_on_a100_plans_bf16_and_says_why_in_one_line(cli_main: Any, tmp_path: Path) -> None:
    plan, _, stdout = _plan(cli_main, tmp_path, "fine-tune llama-3-8b on 8 A100 with fp8")
    assert (plan["brief"].get("recipe") or {}).get("precision") != "fp8"
    assert plan["speed"]["gemm_precision"] is None
    wish = _wish(plan)
    assert wish["honoured"] is False
    gpu = plan["hardware"]["gpu"]["name"]
    assert "A100" in gpu
    lines = _fp8_lines(plan)
    assert len(lines) == 1 and "FP8 tensor cores (Hopper, Ada, Blackwell)" in lines[0]
    assert gpu in lines[0] and "bf16" in lines[0]
    said = [line for line in stdout.splitlines() if line.startswith("not as asked:")]
    assert len(said) == 1 and gpu in said[0]


def test_pinned_deepspeed_with_fp8_is_priced_as_the_bf16_it_runs(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, _, stdout = _plan(
        cli_main, tmp_path, "fine-tune llama-3-8b on 8 H100 with fp8 using deepspeed"
    )
    assert plan["framework"]["primary"] == "deepspeed"
    assert plan["speed"]["gemm_precision"] is None
    bf16, _, _ = _plan(
        cli_main, tmp_path / "bf16", "fine-tune llama-3-8b on 8 H100 using deepspeed"
    )
    assert plan["speed"]["tokens_per_s"] == bf16["speed"]["tokens_per_s"]
    lines = _fp8_lines(plan)
    assert len(lines) == 1 and lines[0].startswith(FP8_NOT_APPLIED)
    assert "DeepSpeed" in lines[0] and "priced as bf16" in lines[0]
    # The plan's own field says it too (a brief file has no wish to carry it).
    assert plan["memory"]["not_honoured"][0] == plan["memory"]["assumptions"][0]
    assert plan["memory"]["not_honoured"][0].startswith(FP8_NOT_APPLIED)
    wish = _wish(plan)
    assert wish["honoured"] is False and wish["how"] == plan["memory"]["not_honoured"][0]
    assert any(line.startswith("not as asked: fp8 linears") for line in stdout.splitlines())


def test_a_brief_that_states_fp8_on_a100_is_still_refused(cli_main: Any, tmp_path: Path) -> None:
    brief = tmp_path / "brief.yaml"
    brief.write_text(
        "model: llama-3-8b\ntask: finetune\nhardware: 1x8xA100-80GB\nsmoke: false\n"
        "recipe: {precision: fp8}\n"
    )
    res = cli_main("plan", "--brief", str(brief), "--no-smoke", "--out", str(tmp_path / "p"))
    assert res.returncode == 2
    assert "FP8 tensor cores" in res.stderr and "A100" in res.stderr
