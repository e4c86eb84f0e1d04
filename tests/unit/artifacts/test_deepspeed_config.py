"""DeepSpeed config emission, validated by DeepSpeed's own DeepSpeedConfig at the target size."""

from __future__ import annotations

import copy

import pytest
from specs import A100, CPU_BOX, GPT2, LLAMA3_8B, V100

from tools.artifacts.deepspeed_config import (
    HF_AUTO_KEYS,
    ConfigError,
    emit_deepspeed_config,
    hf_trainer_config,
    planned_total_steps,
)
from tools.artifacts.ds_validate import validate_deepspeed_config
from tools.core.errors import ToolFailure
from tools.core.schemas import HardwareSpec, MemoryPlan, TrainingBrief
from tools.core.strategies import STRATEGY_ORDER
from tools.planning import SearchOptions, data_parallel_size, search_strategy

EIGHT_A100 = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=A100)
BRIEF = TrainingBrief(
    model="llama-3-8b",
    seq_len=4096,
    global_batch_size=64,
    precision="bf16",
    hardware="1x8xA100-80GB",
)


@pytest.fixture(scope="module")
def llama_plan() -> MemoryPlan:
    return search_strategy(LLAMA3_8B, EIGHT_A100, BRIEF, SearchOptions(objective="memory"))


def walk(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from walk(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from walk(item, (*path, index))
    else:
        yield path, value


def test_llama_config_accepted_at_world_size_8(llama_plan: MemoryPlan) -> None:
    config = emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, BRIEF)
    validate_deepspeed_config(config, 8)

    micro = config["train_micro_batch_size_per_gpu"]
    accumulation = config["gradient_accumulation_steps"]
    assert config["train_batch_size"] == micro * accumulation * 8 == 64
    assert micro == llama_plan.micro_batch_size
    stage = {"zero1": 1, "zero2": 2, "zero3": 3}[llama_plan.chosen]
    assert config["zero_optimization"]["stage"] == stage
    assert config["bf16"] == {"enabled": True} and "fp16" not in config
    assert config["optimizer"]["type"] == "AdamW"
    assert config["gradient_clipping"] == 1.0
    assert config["wall_clock_breakdown"] is False
    assert ("activation_checkpointing" in config) == llama_plan.activation_checkpointing
    assert not any(value == "auto" for _, value in walk(config))


@pytest.mark.parametrize("strategy", STRATEGY_ORDER)
def test_every_strategy_emits_a_config_deepspeed_accepts(
    llama_plan: MemoryPlan, strategy: str
) -> None:
    plan = llama_plan.model_copy(update={"chosen": strategy})
    config = emit_deepspeed_config(plan, LLAMA3_8B, EIGHT_A100, BRIEF)
    validate_deepspeed_config(config, 8)

    zero = config["zero_optimization"]
    expected_stage = {"ddp": 0, "zero1": 1, "zero2": 2}.get(strategy, 3)
    if strategy == "zero2_offload_optimizer":
        expected_stage = 2
    assert zero["stage"] == expected_stage
    assert ("offload_optimizer" in zero) == ("offload" in strategy)
    assert ("offload_param" in zero) == (strategy == "zero3_offload_all")
    for path, value in walk(zero):
        if path[-1].endswith(("_size", "_parameters", "_threshold", "_distance")):
            assert isinstance(value, int) and value > 0, path
    if expected_stage == 3:
        # The Hugging Face integration's values, from the hidden size.
        assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 4096 * 4096)
        assert zero["stage3_param_persistence_threshold"] == 10 * 4096
        assert zero["reduce_bucket_size"] == 4096 * 4096


def test_world_size_is_really_applied(llama_plan: MemoryPlan) -> None:
    config = emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, BRIEF)
    # 8 = 2 * 4 * 1 holds on one GPU, not on eight.
    wrong = dict(
        config, train_batch_size=8, train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=4
    )
    validate_deepspeed_config(wrong, 1)
    with pytest.raises(ConfigError, match="8 != 2 \\* 4 \\* 8"):
        validate_deepspeed_config(wrong, 8)


def test_validation_leaves_deepspeed_comm_untouched(llama_plan: MemoryPlan) -> None:
    from deepspeed import comm
    from deepspeed.runtime import config as config_module

    config = emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, BRIEF)
    validate_deepspeed_config(config, 8)
    with pytest.raises(ConfigError):
        validate_deepspeed_config(dict(config, train_batch_size=7), 8)
    assert config_module.dist is comm


def test_unknown_top_level_key_rejected(llama_plan: MemoryPlan) -> None:
    config = emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, BRIEF)
    misspelt = dict(config, zero_optimisation={"stage": 3})
    with pytest.raises(ConfigError) as err:
        validate_deepspeed_config(misspelt, 8)
    assert err.value.key == "zero_optimisation"


def test_unknown_nested_key_rejected(llama_plan: MemoryPlan) -> None:
    config = copy.deepcopy(emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, BRIEF))
    config["zero_optimization"]["reduce_bucket"] = 1000
    with pytest.raises(ConfigError, match="reduce_bucket"):
        validate_deepspeed_config(config, 8)


@pytest.mark.parametrize(
    "path",
    [
        ("train_micro_batch_size_per_gpu",),
        ("zero_optimization", "reduce_bucket_size"),
        ("optimizer", "params", "lr"),
    ],
)
def test_auto_values_rejected(llama_plan: MemoryPlan, path: tuple[str, ...]) -> None:
    config = copy.deepcopy(emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, BRIEF))
    target = config
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = "auto"
    with pytest.raises(ConfigError) as err:
        validate_deepspeed_config(config, 8)
    assert err.value.key == ".".join(path)
    assert isinstance(err.value, ToolFailure)


def test_deepspeed_type_errors_surface(llama_plan: MemoryPlan) -> None:
    config = copy.deepcopy(emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, BRIEF))
    config["zero_optimization"]["stage"] = 7
    with pytest.raises(ConfigError, match="DeepSpeed rejects"):
        validate_deepspeed_config(config, 8)


def test_scheduler_checked(llama_plan: MemoryPlan) -> None:
    config = emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, BRIEF, total_steps=500)
    assert config["scheduler"]["type"] == "WarmupCosineLR"
    assert config["scheduler"]["params"]["total_num_steps"] == 500
    validate_deepspeed_config(config, 8)
    broken = copy.deepcopy(config)
    del broken["scheduler"]["params"]["total_num_steps"]
    with pytest.raises(ConfigError, match="total_num_steps"):
        validate_deepspeed_config(broken, 8)
    with pytest.raises(ConfigError):
        validate_deepspeed_config(dict(config, scheduler={"type": "Cosine", "params": {}}), 8)


# Scheduler params each DeepSpeed scheduler accepts or refuses (a missing, misspelt, mistyped or
# out-of-range value), for the stand-in optimizer and for a real SGD alike.
SCHEDULER_CASES = [
    ("WarmupLR", {}),
    ("WarmupLR", {"warmup_min_lr": 0, "warmup_max_lr": 1e-4, "warmup_num_steps": 10}),
    ("WarmupLR", {"warmup_max_lr": [1e-4, 2e-4]}),
    ("WarmupLR", {"warmup_type": "cubic"}),
    ("WarmupLR", {"warmup_steps": 10}),
    ("WarmupDecayLR", {"total_num_steps": 100, "warmup_num_steps": 10}),
    ("WarmupDecayLR", {"warmup_num_steps": 10}),
    ("WarmupDecayLR", {"total_num_steps": 5, "warmup_num_steps": 10}),
    ("WarmupCosineLR", {"total_num_steps": 100, "warmup_num_steps": 10}),
    ("WarmupCosineLR", {"total_num_steps": 100, "cos_min_ratio": "x"}),
    ("OneCycle", {"cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3}),
    ("OneCycle", {"cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3, "cycle_momentum": True}),
    ("OneCycle", {"cycle_min_lr": [1e-5, 1e-5], "cycle_max_lr": 1e-3}),
    ("OneCycle", {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-5}),
    ("LRRangeTest", {"lr_range_test_min_lr": 1e-5, "lr_range_test_step_size": 10}),
    ("LRRangeTest", {"lr_range_test_min_lr": [1e-5, 1e-5]}),
]


def _scheduler_outcome(optimizer, name, params):
    from deepspeed.runtime import lr_schedules

    try:
        scheduler = getattr(lr_schedules, name)(optimizer, **params)
    except (TypeError, ValueError, AssertionError) as exc:
        return type(exc).__name__, str(exc)
    groups = [{k: v for k, v in g.items() if k in ("lr", "betas")} for g in optimizer.param_groups]
    return "ok", groups, getattr(scheduler, "_last_lr", None)


@pytest.mark.parametrize(("name", "params"), SCHEDULER_CASES)
def test_scheduler_probe_answers_as_a_real_optimizer(name, params) -> None:
    import torch

    from tools.artifacts.ds_validate import scheduler_probe

    sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
    assert _scheduler_outcome(scheduler_probe(), name, params) == _scheduler_outcome(
        sgd, name, params
    )


def test_fp16_with_dynamic_loss_scaling_on_v100() -> None:
    hardware = HardwareSpec(source="described", nodes=2, gpus_per_node=4, gpu=V100)
    brief = BRIEF.model_copy(update={"precision": "auto", "seq_len": 1024})
    plan = search_strategy(GPT2, hardware, brief, SearchOptions(objective="memory"))
    config = emit_deepspeed_config(plan, GPT2, hardware, brief)
    assert config["fp16"]["enabled"] and config["fp16"]["loss_scale"] == 0
    assert "bf16" not in config
    validate_deepspeed_config(config, 8)


def test_gpt2_cpu_config() -> None:
    brief = TrainingBrief(model="gpt2", seq_len=1024, global_batch_size=32, task="pretrain")
    plan = search_strategy(GPT2, CPU_BOX, brief, SearchOptions(objective="memory"))
    config = emit_deepspeed_config(plan, GPT2, CPU_BOX, brief)
    assert "bf16" not in config and "fp16" not in config
    assert config["optimizer"]["params"]["torch_adam"] is True
    # GPT-3 Table 2.1's 6e-4 for 125M at 0.5M tokens, x sqrt(32 x 1024 / 0.5M) for this
    # batch (tools/planning/lr_schedule.py).
    assert config["optimizer"]["params"]["lr"] == pytest.approx(6e-4 * (32 * 1024 / 0.5e6) ** 0.5)
    assert config["train_batch_size"] == 32
    validate_deepspeed_config(config, 1)


def test_inference_config_has_no_optimizer() -> None:
    brief = BRIEF.model_copy(update={"task": "inference"})
    plan = search_strategy(LLAMA3_8B, EIGHT_A100, brief, SearchOptions(objective="memory"))
    config = emit_deepspeed_config(plan, LLAMA3_8B, EIGHT_A100, brief)
    assert "optimizer" not in config and "scheduler" not in config
    validate_deepspeed_config(config, 8)


def test_plan_inconsistent_with_brief_is_refused(llama_plan: MemoryPlan) -> None:
    brief = BRIEF.model_copy(update={"global_batch_size": 128})
    with pytest.raises(ConfigError) as err:
        emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, brief)
    assert err.value.key == "train_batch_size"


# --- the Hugging Face Trainer flavour (ds_config_hf.json) -----------------------------------


def resolve_autos(flavour, strict, path=()):
    """Replace each "auto" with the strict config's value at the same path."""
    if flavour == "auto":
        return strict
    if isinstance(flavour, dict):
        return {
            key: resolve_autos(item, strict[key], (*path, key)) for key, item in flavour.items()
        }
    if isinstance(flavour, list):
        return [resolve_autos(item, strict[i], (*path, i)) for i, item in enumerate(flavour)]
    return flavour


def auto_keys(config) -> set[str]:
    return {".".join(map(str, path)) for path, value in walk(config) if value == "auto"}


@pytest.mark.parametrize("total_steps", [None, 500])
@pytest.mark.parametrize("strategy", STRATEGY_ORDER)
def test_hf_flavour_round_trips_to_the_strict_config(
    llama_plan: MemoryPlan, strategy: str, total_steps: int | None
) -> None:
    plan = llama_plan.model_copy(update={"chosen": strategy})
    strict = emit_deepspeed_config(plan, LLAMA3_8B, EIGHT_A100, BRIEF, total_steps=total_steps)
    before = copy.deepcopy(strict)
    flavour = hf_trainer_config(strict)
    assert strict == before  # the strict config is not touched

    assert resolve_autos(flavour, strict) == strict
    autos = auto_keys(flavour)
    assert autos <= set(HF_AUTO_KEYS)
    expected = {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "optimizer.params.lr",
        "optimizer.params.betas",
        "optimizer.params.eps",
        "optimizer.params.weight_decay",
        "scheduler.params.warmup_num_steps",
        # WarmupCosineLR spans a run of known length (the default one without total_steps).
        "scheduler.params.total_num_steps",
        "bf16.enabled",
    }
    zero = flavour["zero_optimization"]
    if zero["stage"] == 3:
        expected |= {
            "zero_optimization.reduce_bucket_size",
            "zero_optimization.stage3_prefetch_bucket_size",
            "zero_optimization.stage3_param_persistence_threshold",
        }
    assert autos == expected
    # What the Trainer does not fill stays as we planned it.
    for key in ("stage", "overlap_comm", "contiguous_gradients", "offload_optimizer"):
        assert zero.get(key) == strict["zero_optimization"].get(key)
    assert flavour.get("activation_checkpointing") == strict.get("activation_checkpointing")
    assert flavour["optimizer"]["type"] == "AdamW"
    assert flavour["scheduler"]["type"] == strict["scheduler"]["type"]

    # The strict validator refuses the flavour on purpose; resolved, it is the strict config.
    with pytest.raises(ConfigError, match="Hugging Face"):
        validate_deepspeed_config(flavour, 8)
    validate_deepspeed_config(resolve_autos(flavour, strict), 8)


def test_hf_flavour_fp16_keeps_loss_scaling() -> None:
    hardware = HardwareSpec(source="described", nodes=2, gpus_per_node=4, gpu=V100)
    brief = BRIEF.model_copy(update={"precision": "auto", "seq_len": 1024})
    strict = emit_deepspeed_config(
        search_strategy(GPT2, hardware, brief, SearchOptions(objective="memory")),
        GPT2,
        hardware,
        brief,
    )
    flavour = hf_trainer_config(strict)
    assert flavour["fp16"] == dict(strict["fp16"], enabled="auto")
    assert "bf16" not in flavour
    assert resolve_autos(flavour, strict) == strict


def test_hf_flavour_without_optimizer_or_half_precision() -> None:
    brief = TrainingBrief(model="gpt2", seq_len=1024, global_batch_size=32, task="inference")
    strict = emit_deepspeed_config(
        search_strategy(GPT2, CPU_BOX, brief, SearchOptions(objective="memory")),
        GPT2,
        CPU_BOX,
        brief,
    )
    flavour = hf_trainer_config(strict)
    # Absent sections are not invented: the Trainer only fills keys that are there.
    assert auto_keys(flavour) == {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    }
    assert resolve_autos(flavour, strict) == strict


def test_hf_auto_keys_are_ones_transformers_resolves() -> None:
    """Each key is named in the integration that fills "auto" (HfTrainerDeepSpeedConfig)."""
    import inspect

    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    source = inspect.getsource(HfTrainerDeepSpeedConfig)
    for key in HF_AUTO_KEYS:
        assert f'"{key}"' in source, key


# --- scheduler steps from the dataset, and tensor/pipeline-parallel plans ----------------


def test_dataset_tokens_set_the_schedulers_total_steps(llama_plan: MemoryPlan) -> None:
    brief = BRIEF.model_copy(update={"dataset_tokens": 1e9})
    # ceil(1e9 tokens / (64 sequences x 4096 tokens)) = ceil(3814.7) optimizer steps.
    assert planned_total_steps(brief) == 3815
    assert planned_total_steps(BRIEF) is None
    config = emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, brief)
    assert config["scheduler"]["type"] == "WarmupCosineLR"
    assert config["scheduler"]["params"]["total_num_steps"] == 3815
    # 3% of the run (tools/planning/lr_schedule.py): floor(0.03 x 3815).
    assert config["scheduler"]["params"]["warmup_num_steps"] == 114
    validate_deepspeed_config(config, 8)
    # An explicit step count still wins; without dataset_tokens the schedule spans the default
    # run (1000 steps), and still decays.
    assert (
        emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, brief, total_steps=10)[
            "scheduler"
        ]["params"]["total_num_steps"]
        == 10
    )
    default = emit_deepspeed_config(llama_plan, LLAMA3_8B, EIGHT_A100, BRIEF)["scheduler"]
    assert default["type"] == "WarmupCosineLR"
    assert default["params"]["total_num_steps"] == 1000
    # The Hugging Face flavour leaves the count to the Trainer, which computes its own.
    flavour = hf_trainer_config(config)
    assert flavour["scheduler"]["params"]["total_num_steps"] == "auto"


def test_tensor_pipeline_plan_counts_data_parallel_ranks() -> None:
    """train_batch_size = micro x accumulation x world / (t x p), validated at that size."""
    from tools.intake.brief import brief_from_dict
    from tools.planning import search_strategy
    from tools.research.hardware import parse_hardware
    from tools.research.model_catalog import lookup_model

    brief = brief_from_dict(
        {
            "model": "llama-3-70b",
            "hardware": "4x8xH100-80GB",
            "seq_len": 16384,
            "global_batch_size": 512,
            "task": "pretrain",
            "dataset_tokens": 2e10,
        }
    )
    hw = parse_hardware("4x8xH100-80GB")
    model = lookup_model("llama-3-70b", 16384)
    # Context parallelism runs on torchtitan, not DeepSpeed: this checks the DeepSpeed split.
    plan = search_strategy(model, hw, brief, SearchOptions(pipeline_parallel=2, context_parallel=1))
    tp, pp = plan.tensor_parallel, plan.pipeline_parallel
    assert tp * pp > 1
    dp = data_parallel_size(hw, tp, pp)
    config = emit_deepspeed_config(plan, model, hw, brief)
    micro, accum = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    assert config["train_batch_size"] == micro * accum * dp == 512
    assert config["zero_optimization"]["stage"] == 1
    assert config["activation_checkpointing"]["partition_activations"] is (tp > 1)
    assert config["scheduler"]["params"]["total_num_steps"] == -(-2e10 // (512 * 16384))
    validate_deepspeed_config(config, dp)
    # At the full world size the batch arithmetic is wrong, and DeepSpeed says so.
    with pytest.raises(ConfigError, match="DeepSpeed rejects"):
        validate_deepspeed_config(config, hw.world_size)
    # ZeRO-2/3 cannot run under DeepSpeed's pipeline engine.
    zero3_pipeline = plan.model_copy(
        update={
            "chosen": "zero3",
            "tensor_parallel": 4,
            "pipeline_parallel": 2,
            "micro_batch_size": 1,
            "gradient_accumulation_steps": 512 // data_parallel_size(hw, 4, 2),
        }
    )
    with pytest.raises(ConfigError) as err:
        emit_deepspeed_config(zero3_pipeline, model, hw, brief)
    assert err.value.key == "zero_optimization.stage"
