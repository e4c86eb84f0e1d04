"""tools/artifacts/ds_rules.py gives DeepSpeed's own verdict on every config the planner writes.

The engineer checks its config with ``check_deepspeed_rules`` (no torch import) instead of
DeepSpeedConfig (``validate_deepspeed_config``); these tests prove the two agree on the grid of
emitted configs (every strategy on 8 A100s in bf16, fp16 on V100s, fp32 on a CPU box, DeepSpeed
AutoTP and a tensor/pipeline split, with and without a planned schedule, resized for a launch)
and on mutations of each, those DeepSpeed accepts as well as those it refuses, and re-record
the rules' key sets from the installed DeepSpeed.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import pytest
from specs import A100, CPU_BOX, GPT2, LLAMA3_8B, V100

from tools.artifacts.deepspeed_config import ConfigError, emit_deepspeed_config, with_run_steps
from tools.artifacts.ds_rules import (
    BLOCK_KEYS,
    OFFLOAD_KEYS,
    SCHEDULER_PARAMS,
    ZERO_KEYS,
    check_deepspeed_rules,
)
from tools.artifacts.ds_validate import validate_deepspeed_config
from tools.core.schemas import HardwareSpec, TrainingBrief
from tools.core.strategies import STRATEGY_ORDER
from tools.planning import SearchOptions, data_parallel_size, search_strategy
from tools.planning.batch_layout import deepspeed_batch_ranks

EIGHT_A100 = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=A100)
V100S = HardwareSpec(source="described", nodes=2, gpus_per_node=4, gpu=V100)
LLAMA_BRIEF = TrainingBrief(
    model="llama-3-8b", seq_len=4096, global_batch_size=64, precision="bf16",
    hardware="1x8xA100-80GB",
)  # fmt: skip


def _model_keys(model: Any) -> frozenset[str]:
    return frozenset(
        {name for name in model.model_fields}
        | {f.alias for f in model.model_fields.values() if f.alias}
    )


def test_key_sets_are_the_installed_deepspeeds() -> None:
    from deepspeed.runtime import lr_schedules
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    models = {
        "zero": DeepSpeedZeroConfig,
        "offload_param": DeepSpeedZeroOffloadParamConfig,
        "offload_optimizer": DeepSpeedZeroOffloadOptimizerConfig,
        "bf16": DeepSpeedBF16Config,
        "fp16": DeepSpeedFP16Config,
        "tensor_parallel": TPTrainingConfig,
    }
    assert all(m.model_config.get("extra") == "forbid" for m in models.values())
    assert _model_keys(models["zero"]) == ZERO_KEYS
    for name in OFFLOAD_KEYS:
        assert _model_keys(models[name]) == OFFLOAD_KEYS[name], name
    for name in BLOCK_KEYS:
        assert _model_keys(models[name]) == BLOCK_KEYS[name], name
    assert set(lr_schedules.VALID_LR_SCHEDULES) == set(SCHEDULER_PARAMS)
    for name, (accepted, required) in SCHEDULER_PARAMS.items():
        params = list(inspect.signature(getattr(lr_schedules, name).__init__).parameters.values())
        assert [p.name for p in params[:2]] == ["self", "optimizer"]
        assert {p.name for p in params[2:]} == accepted, name
        assert {p.name for p in params[2:] if p.default is inspect.Parameter.empty} == required


def _emitted() -> list[tuple[str, dict[str, Any], int]]:
    """(case, config, data-parallel size) for the grid of configs the emitter writes."""
    cases: list[tuple[str, dict[str, Any], int]] = []
    base = search_strategy(LLAMA3_8B, EIGHT_A100, LLAMA_BRIEF, SearchOptions(objective="memory"))
    for strategy in STRATEGY_ORDER:
        plan = base.model_copy(update={"chosen": strategy})
        for steps in (None, 500):
            config = emit_deepspeed_config(
                plan, LLAMA3_8B, EIGHT_A100, LLAMA_BRIEF, total_steps=steps
            )
            cases.append((f"llama-8xA100-{strategy}-{steps}", config, 8))
        cases.append((f"llama-8xA100-{strategy}-launch", with_run_steps(config, 120), 8))
    tp_plan = search_strategy(
        LLAMA3_8B, EIGHT_A100, LLAMA_BRIEF, SearchOptions(tensor_parallel=2, strategies=["zero1"])
    )
    dp = data_parallel_size(EIGHT_A100, tp_plan.tensor_parallel, tp_plan.pipeline_parallel)
    for autotp in (True, False):
        config = emit_deepspeed_config(tp_plan, LLAMA3_8B, EIGHT_A100, LLAMA_BRIEF, autotp=autotp)
        # AutoTP: DeepSpeed checks the batch at every rank (deepspeed_batch_ranks).
        cases.append((f"llama-tp2-autotp-{autotp}", config, deepspeed_batch_ranks(config, dp)))
    fp16_brief = LLAMA_BRIEF.model_copy(update={"precision": "auto", "seq_len": 1024})
    gpt2_plan = search_strategy(GPT2, V100S, fp16_brief, SearchOptions(objective="memory"))
    cases.append(("gpt2-v100-fp16", emit_deepspeed_config(gpt2_plan, GPT2, V100S, fp16_brief), 8))
    cpu_brief = TrainingBrief(model="gpt2", seq_len=1024, global_batch_size=32, task="pretrain")
    cpu_plan = search_strategy(GPT2, CPU_BOX, cpu_brief, SearchOptions(objective="memory"))
    cases.append(("gpt2-cpu-fp32", emit_deepspeed_config(cpu_plan, GPT2, CPU_BOX, cpu_brief), 1))
    serve = LLAMA_BRIEF.model_copy(update={"task": "inference"})
    serve_plan = search_strategy(LLAMA3_8B, EIGHT_A100, serve, SearchOptions(objective="memory"))
    cases.append(
        ("llama-inference", emit_deepspeed_config(serve_plan, LLAMA3_8B, EIGHT_A100, serve), 8)
    )
    return cases


EMITTED = _emitted()


def _accepts(
    check: Callable[[dict[str, Any], int], None], config: dict[str, Any], world: int
) -> bool:
    try:
        check(config, world)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize(("case", "config", "world"), EMITTED, ids=[c[0] for c in EMITTED])
def test_every_emitted_config_passes_both(case: str, config: dict[str, Any], world: int) -> None:
    validate_deepspeed_config(config, world)
    check_deepspeed_rules(config, world)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(config: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = config
        for key in parents:
            target = target.setdefault(key, {})
        target[last] = value

    return mutate


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(config: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = config
        for key in parents:
            target = target[key]
        target.pop(last, None)

    return mutate


# Each rule broken, and changes DeepSpeed accepts (a batch size it completes, legal blocks).
MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "unknown top-level key": _set("zero_optimisation", {"stage": 3}),
    "removed top-level key": _set("amp", {"enabled": True}),
    "auto value": _set("gradient_clipping", "auto"),
    "batch identity": _set("train_batch_size", 7),
    "zero micro batch": _set("train_micro_batch_size_per_gpu", 0),
    "no accumulation (completed)": _drop("gradient_accumulation_steps"),
    "no micro batch (completed)": _drop("train_micro_batch_size_per_gpu"),
    "no batch at all": lambda c: [
        c.pop(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu")
    ],
    "unknown zero key": _set("zero_optimization.reduce_bucket", 1000),
    "zero stage 7": _set("zero_optimization.stage", 7),
    "zero stage 3": _set("zero_optimization.stage", 3),
    "offload to nvme": _set(
        "zero_optimization.offload_optimizer", {"device": "nvme", "nvme_path": "/nvme"}
    ),
    "offload to disk": _set("zero_optimization.offload_optimizer", {"device": "disk"}),
    "unknown offload key": _set(
        "zero_optimization.offload_param", {"device": "cpu", "pinned": True}
    ),
    "unknown bf16 key": _set("bf16.enable", True),
    "fp16 and bf16": lambda c: c.update(bf16={"enabled": True}, fp16={"enabled": True}),
    "fp16 only": lambda c: (c.pop("bf16", None), c.update(fp16={"enabled": True})),
    "unknown tensor_parallel key": _set("tensor_parallel", {"autotp": 2}),
    "unknown scheduler": _set("scheduler", {"type": "Cosine", "params": {}}),
    "misspelt scheduler param": _set(
        "scheduler", {"type": "WarmupLR", "params": {"warmup_steps": 10}}
    ),
    "missing total steps": _set(
        "scheduler", {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 10}}
    ),
    "zero warm-up steps": _set(
        "scheduler",
        {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 0}},
    ),
    "warmup decay": _set(
        "scheduler",
        {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}},
    ),
    "no scheduler": _drop("scheduler"),
}
BASES = [
    c
    for c in EMITTED
    if c[0] in ("llama-8xA100-zero2-500", "llama-8xA100-zero3_offload_all-None", "gpt2-v100-fp16")
]


assert len(BASES) == 3


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutated_configs_get_deepspeeds_verdict(mutation: str) -> None:
    verdicts = set()
    for case, config, world in BASES:
        changed = copy.deepcopy(config)
        MUTATIONS[mutation](changed)
        theirs = _accepts(validate_deepspeed_config, changed, world)
        assert _accepts(check_deepspeed_rules, changed, world) == theirs, (case, mutation)
        verdicts.add(theirs)
    assert len(verdicts) == 1  # the mutation means the same on each base


def test_world_size_is_applied() -> None:
    _, config, _ = BASES[0]
    with pytest.raises(ConfigError, match="64 != 1 \\* 8 \\* 16") as err:
        check_deepspeed_rules(config, 16)
    assert err.value.key == "train_batch_size"
    with pytest.raises(ConfigError, match="at least 1"):
        check_deepspeed_rules(config, 0)
