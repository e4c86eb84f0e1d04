"""A report never contradicts its plan (issue 28, item 6): every sentence that names the
framework, the recompute policy or the launcher says what the plan's fields say; the speed and
peak memory error bands (issue 30, item 6) are in the plan JSON and the report.

Plans are built in process from the planner functions the agents call (search, framework
choice, DeepSpeed config, launch files, review checks) over a table of briefs: data parallel,
DeepSpeed AutoTP, Megatron, torchtitan, FSDP with and without a refusal, a recipe that
recomputes, LoRA, offload. No graph, no smoke run: the report is rendered from the plan.
Before the fix the FSDP brief's report said "memory priced for: fsdp, ..., recompute none"
beside a setup that recomputes, and the AutoTP plan's said "tensor/pipeline parallelism needs
Megatron-DeepSpeed".
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tools.artifacts.deepspeed_config import emit_deepspeed_config, planned_total_steps
from tools.artifacts.launch import emit_launch
from tools.artifacts.report import md_text, render_markdown
from tools.core.schemas import Review, SmokeResult, TrainingPlan
from tools.intake.brief import brief_from_dict
from tools.planning import SearchOptions, search_strategy
from tools.planning.batch import resolve_batch
from tools.research.framework import (
    DEEPSPEED_FRAMEWORKS,
    REPLICATING_FRAMEWORKS,
    select_framework,
)
from tools.research.hardware import hardware_for_brief
from tools.research.model_catalog import lookup_model
from tools.review import check_contract, check_plan, decide

BRIEFS: dict[str, dict[str, Any]] = {
    # FSDP at 8k tokens recomputes; the recipe's default says none.
    "fsdp-8k": {
        "model": "llama-3-8b",
        "hardware": "1x8xA100-80GB",
        "seq_len": 8192,
        "global_batch_size": 64,
        "framework": "pytorch_fsdp",
        "avoid_frameworks": ["deepspeed"],
    },
    # The same without a wish: DeepSpeed AutoTP, tensor parallel 2.
    "autotp-8k": {
        "model": "llama-3-8b",
        "hardware": "1x8xA100-80GB",
        "seq_len": 8192,
        "global_batch_size": 64,
    },
    "megatron-asked": {"model": "llama-3-8b", "hardware": "1x8xH100-80GB", "framework": "megatron"},
    "llama70b-2nodes": {
        "model": "llama-3-70b",
        "hardware": "2x8xH100-80GB",
        "seq_len": 4096,
        "global_batch_size": 64,
        "interconnect": "ib400",
    },
    "llama70b-no-deepspeed": {
        "model": "llama-3-70b",
        "hardware": "2x8xH100-80GB",
        "seq_len": 4096,
        "global_batch_size": 64,
        "avoid_frameworks": ["deepspeed"],
    },
    "fsdp-fallback-32k": {
        "model": "llama-3-8b",
        "hardware": "1x8xA100-40GB",
        "seq_len": 32768,
        "framework": "pytorch_fsdp",
    },
    "torchtitan-recipe": {
        "model": "llama-3-8b",
        "hardware": "1x8xH100-80GB",
        "seq_len": 8192,
        "recipe": {"framework": "torchtitan"},
    },
    "qwen-offload": {
        "model": "qwen2.5-7b",
        "hardware": "1x2xA100-80GB",
        "seq_len": 8192,
        "global_batch_size": 16,
    },
    "gpt2-ddp": {"model": "gpt2", "hardware": "1x8xA100-80GB", "seq_len": 1024},
    "llama70b-lora": {"model": "llama-3-70b", "hardware": "1x8xA100-80GB", "task": "lora"},
}
# The command each framework's plan starts with.
LAUNCHERS = {
    "deepspeed": "deepspeed",
    "pytorch_fsdp": "torchrun",
    "pytorch_ddp": "torchrun",
    "megatron": "torchrun",
    "torchtitan": "torchrun",
}


def _plan(fields: dict[str, Any], out: Path) -> TrainingPlan:
    """The plan the agents assemble, from the same tool functions (offline, no smoke run)."""
    brief = brief_from_dict({"smoke": False, **fields})
    hw = hardware_for_brief(brief)
    model = lookup_model(brief.model, brief.seq_len)  # type: ignore[arg-type]
    brief, _ = resolve_batch(brief, model, hw)
    searched = search_strategy(model, hw, brief)
    framework = select_framework(brief, hw, model, searched)
    # As the engineer does (agents/toolkit.py plan_parallelism): the researcher's search reused,
    # a replicating framework's DDP setup chosen within it.
    replicating = framework.primary if framework.primary in REPLICATING_FRAMEWORKS else None
    memory = search_strategy(
        model, hw, brief, SearchOptions(replicating=replicating), searched=searched
    )
    config = (
        emit_deepspeed_config(
            memory,
            model,
            hw,
            brief,
            total_steps=planned_total_steps(brief),
            autotp=framework.primary == "deepspeed",
        )
        if framework.primary in DEEPSPEED_FRAMEWORKS
        else None
    )
    launch = emit_launch(out, brief, hw, model, framework, config, memory=memory)
    smoke = SmokeResult(status="skipped", reason="the brief turns smoke runs off")
    findings = check_plan(brief, hw, framework, memory, config, smoke)
    findings += check_contract(brief, hw, model, memory, config, launch, smoke)
    review: Review = decide(findings, 1, 3)
    return TrainingPlan(
        brief=brief,
        hardware=hw,
        model=model,
        framework=framework,
        memory=memory,
        deepspeed_config=config,
        launch=launch,
        smoke_test=smoke,
        review=review,
        speed=memory.speed,
    )


def _framework_sentences(plan: TrainingPlan, report: str) -> list[str]:
    """Each sentence naming the framework the plan runs on, checked against ``primary``."""
    primary, wrong = plan.framework.primary, []
    patterns = (
        r"\*\*Framework:\*\* (\w+)\.",
        r"the plan runs on (\w+)",
        r"The framework is (\w+), as the request asks",
        r"planned \S+ on (\w+) instead",
    )
    for pattern in patterns:
        wrong += [f"{m.group(0)!r}" for m in re.finditer(pattern, report) if m[1] != primary]
    return wrong


def _recompute_sentences(plan: TrainingPlan, report: str) -> list[str]:
    """The recompute policy the report states for the chosen setup, against its row."""
    memory = plan.memory
    assert memory is not None and memory.chosen_row is not None
    policy, wrong = memory.chosen_row.checkpointing, []
    for m in re.finditer(r"memory priced for: [^\n]*?recompute ([\w-]+)", report):
        if m[1].replace("selective-op", "selective") != policy:
            wrong.append(f"{m.group(0)!r} beside a setup with recompute {policy}")
    stated = re.findall(r"^- recompute (\w+) \(", report, re.M)
    if stated != ([policy] if policy != "none" else []):
        wrong.append(f"the assumptions state recompute {stated}, the setup has {policy}")
    headline = next(line for line in report.splitlines() if line.startswith("**Verdict:**"))
    if ("activation checkpointing" in headline) != memory.activation_checkpointing:
        wrong.append(f"the headline's activation checkpointing is not the plan's: {headline!r}")
    return wrong


def _launcher_sentences(plan: TrainingPlan, report: str) -> list[str]:
    """Every sentence naming what launches or implements the split, against the plan's files."""
    primary, config, wrong = plan.framework.primary, plan.deepspeed_config or {}, []
    autotp = bool((config.get("tensor_parallel") or {}).get("autotp_size"))
    for line in report.splitlines():
        # The LoRA refusal names AutoTP as what the plan does not run (lora_split_refusal).
        if "AutoTP" in line and not autotp and "AutoTP replaces each PEFT" not in line:
            wrong.append(f"names AutoTP, the plan's config has none: {line[:160]!r}")
        if "needs Megatron-DeepSpeed" in line and primary != "megatron":
            wrong.append(f"says Megatron-DeepSpeed, the plan runs on {primary}: {line[:160]!r}")
        if "runs on torchtitan" in line and primary != "torchtitan":
            wrong.append(f"says torchtitan, the plan runs on {primary}: {line[:160]!r}")
    if plan.launch.command[0] != LAUNCHERS[primary]:
        wrong.append(f"{primary} plan launched with {plan.launch.command[0]}")
    shown = re.search(r"## Launch\n\n```(?:bash)?\n(\S+)", report)
    if shown is not None and shown[1] != plan.launch.command[0]:
        wrong.append(f"the launch section starts {shown[1]}, the plan {plan.launch.command[0]}")
    return wrong


def _band_sentences(plan: TrainingPlan, report: str) -> list[str]:
    """The plan's speed and peak memory bands (issue 30 item 6) are in its JSON and report."""
    dumped = plan.model_dump(mode="json")
    bands = {b["quantity"]: b for b in (dumped["memory"] or {}).get("error_bands", [])}
    wrong = []
    if set(bands) != {"tokens_per_s", "peak_memory"}:
        wrong.append(f"plan JSON memory.error_bands holds {sorted(bands)}")
    speed_band = (dumped["speed"] or {}).get("error_band")
    if speed_band != bands.get("tokens_per_s"):
        wrong.append(f"plan JSON speed.error_band is {speed_band}")
    for band in bands.values():
        if md_text(band["text"]) not in report:
            wrong.append(f"the report lacks the band {band['text']!r}")
    return wrong


@pytest.mark.parametrize("name", sorted(BRIEFS))
def test_report_sentences_follow_the_plan(name: str, tmp_path: Path) -> None:
    plan = _plan(BRIEFS[name], tmp_path / name)
    report = render_markdown(plan)
    wrong = [
        *_framework_sentences(plan, report),
        *_recompute_sentences(plan, report),
        *_launcher_sentences(plan, report),
        *_band_sentences(plan, report),
    ]
    assert not wrong, f"{name} ({plan.framework.primary}, {plan.memory.chosen_label}): {wrong}"  # type: ignore[union-attr]


def test_the_table_covers_every_launcher(tmp_path: Path) -> None:
    """The table reaches DeepSpeed (AutoTP), Megatron, torchtitan, FSDP and DDP plans."""
    seen = {
        _plan(BRIEFS[name], tmp_path / name).framework.primary
        for name in ("autotp-8k", "megatron-asked", "fsdp-8k", "gpt2-ddp")
    }
    assert seen == {"deepspeed", "megatron", "pytorch_fsdp", "pytorch_ddp"}
