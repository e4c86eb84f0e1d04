"""torchtitan plans: the flavor is the model, and every TOML key is one torchtitan 0.2.2 reads.

The keys are checked against torchtitan 0.2.2's own ``JobConfig`` dataclasses, copied from the
tagged release into tests/data/torchtitan_job_config.py (source URL and commit in its header)
and read with ``ast``: torchtitan's ConfigManager refuses a TOML key it does not know
(config/manager.py ``_dict_to_dataclass``), so an unknown key stops the job at start. torchtitan
itself is not installed here: it pulls ~1 GB of triton and needs protobuf >= 6.31, which
clashes with the main lock (DEVELOPERS.md), and 0.3.0, PyPI's newest, no longer reads a TOML.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from launch_checks import job_config_classes, toml_value_fits, torchtitan_key_errors
from specs import model_parallel_plan

from tools.core.errors import ToolFailure
from tools.core.estimate_types import MemoryPlan, SetupCandidate
from tools.core.schemas import GPUSpec, HardwareSpec
from tools.intake.brief import brief_from_dict
from tools.research.model_catalog import lookup_model
from tools.research.titan_flavors import FLAVORS, flavor_refusal, torchtitan_flavor

H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989)


def _plan_files(
    tmp_path: Path, model: str, task: str, seq: int, memory, precision: str = "bf16"
) -> dict[str, Any]:
    from tools.artifacts.launch import emit_launch
    from tools.core.schemas import FrameworkChoice

    brief = brief_from_dict(
        {"model": model, "task": task, "seq_len": seq, "global_batch_size": 32, "goal": "x",
         "recipe": {"framework": "torchtitan", "precision": precision}}
    )  # fmt: skip
    hw = HardwareSpec(source="described", nodes=2, gpus_per_node=8, gpu=H100)
    choice = FrameworkChoice(primary="torchtitan", stack=["pytorch", "torchtitan"], rationale="x")
    out = tmp_path / model
    spec = emit_launch(out, brief, hw, lookup_model(model, seq), choice, None, memory=memory)
    return {
        "toml": tomllib.loads((out / "torchtitan.toml").read_text()),
        "launch": (out / "launch.sh").read_text(),
        "guide": (out / "TORCHTITAN.md").read_text(),
        "notes": spec.notes,
    }


@pytest.mark.parametrize("strategy", ["zero1", "ddp"])
def test_fp8_linears_are_torchtitan_0_2_2_float8_keys(tmp_path: Path, strategy: str) -> None:
    memory = model_parallel_plan(strategy, 2, 2, 1, 4)
    files = _plan_files(tmp_path, "llama-3.1-8b", "pretrain", 8192, memory, precision="fp8")
    toml = files["toml"]
    assert not torchtitan_key_errors(toml), torchtitan_key_errors(toml)
    assert toml["model"]["converters"] == ["quantize.linear.float8"]
    table = toml["quantize"]["linear"]["float8"]
    assert table["filter_fqns"] == ["output"]  # the output layer stays bf16, as priced
    assert "recipe_name" not in table  # torchtitan refuses it with the float8 all-gather
    sharded = strategy != "ddp"  # FSDP shards the weights: they are gathered in fp8
    assert table["enable_fsdp_float8_all_gather"] is sharded
    assert table["precompute_float8_dynamic_scale_for_fsdp"] is sharded
    assert toml["compile"]["enable"] is True
    # launch.sh stops on a GPU without FP8 tensor cores, before torchrun.
    launch = files["launch"]
    assert "get_device_capability() >= (8, 9)" in launch
    assert launch.index("get_device_capability") < launch.index("torchrun")
    assert "quantize.linear.float8" in files["guide"] and "filter_fqns" in files["guide"]
    assert not any("fp8" in note for note in files["notes"])  # applied, so nothing to say


def test_a_bf16_torchtitan_job_has_no_float8_keys(tmp_path: Path) -> None:
    files = _plan_files(tmp_path, "llama-3.1-8b", "pretrain", 8192,
                        model_parallel_plan("zero1", 2, 2, 1, 4))  # fmt: skip
    assert "converters" not in files["toml"]["model"] and "quantize" not in files["toml"]
    assert "get_device_capability" not in files["launch"]
    assert "converters" not in files["guide"]


def test_the_checker_reads_nested_tables() -> None:
    bad = {"quantize": {"linear": {"float8": {"enable_fsdp_float8_all_gather": "yes"}}}}
    assert torchtitan_key_errors(bad) == [
        "[quantize.linear.float8] enable_fsdp_float8_all_gather = 'yes' is not <class 'bool'>"
    ]
    assert torchtitan_key_errors({"quantize": {"linear": {"fp8": {}}}}) == [
        "[quantize.linear] fp8 is no QuantizedLinear field"
    ]


def _long_context() -> MemoryPlan:
    """Tensor 2 x context 4 x data 2 on 16 GPUs, one 128k sequence per micro-batch."""
    setup = SetupCandidate(
        strategy="zero1",
        tensor_parallel=2,
        context_parallel=4,
        data_parallel=2,
        gradient_accumulation_steps=8,
        checkpointing="full",
        per_gpu_bytes={"total": 1},
        fits=True,
    )
    plan = model_parallel_plan("zero1", 2, 1, accumulation=8)
    return plan.model_copy(update={"setup": setup})


PLANS = {
    "dense llama 3.1 8B": (
        "llama-3.1-8b",
        "pretrain",
        8192,
        model_parallel_plan("zero1", 2, 2, 1, 4),
    ),
    "long context 128k": ("llama-3.1-8b", "pretrain", 131072, _long_context()),
    "fine-tune 70B": ("llama-3.1-70b", "finetune", 4096, model_parallel_plan("zero1", 8, 2, 1, 4)),
}


@pytest.mark.parametrize("case", list(PLANS))
def test_every_toml_key_is_a_torchtitan_0_2_2_field_of_its_type(tmp_path: Path, case: str) -> None:
    model, task, seq, memory = PLANS[case]
    files = _plan_files(tmp_path, model, task, seq, memory)
    wrong = torchtitan_key_errors(files["toml"])
    assert not wrong, wrong
    assert files["toml"]["checkpoint"]["enable"] is True
    assert files["toml"]["model"]["flavor"] == torchtitan_flavor(lookup_model(model, seq))
    # The files name the release they are for, and launch.sh checks it before starting.
    assert "pip install torchtitan==0.2.2" in files["guide"]
    assert 'if [[ "$titan_version" != "0.2.2" ]]; then' in files["launch"]
    assert files["launch"].index("titan_version") < files["launch"].index("torchrun")


def test_the_checker_refuses_what_torchtitan_refuses() -> None:
    """The check itself: an unknown key and a value of the wrong type are caught."""
    classes = job_config_classes()
    assert "enable_checkpoint" not in classes["Checkpoint"] and "enable" in classes["Checkpoint"]
    assert not toml_value_fits("fp16", classes["Training"]["mixed_precision_param"])
    assert toml_value_fits("bfloat16", classes["Training"]["mixed_precision_param"])
    assert not toml_value_fits(True, classes["Training"]["local_batch_size"])
    assert toml_value_fits(None, classes["Checkpoint"]["initial_load_path"])


# torchtitan v0.2.2's flavors are Llama 3.1 (vocabulary 128256, rope theta 500000, llama3 RoPE
# scaling x8 from 8192, SwiGLU width from multiple_of and ffn_dim_multiplier, eps 1e-5).
FLAVOR_TABLE = [
    ("llama-3.1-8b", "8B"),
    ("llama-3.1-70b", "70B"),
    ("llama-3.1-405b", "405B"),
    ("llama-3-8b", None),  # no RoPE scaling
    ("llama-3-70b", None),  # no RoPE scaling
    ("llama-2-70b", None),  # vocabulary 32000, rope theta 10000
    ("llama-2-7b", None),  # another shape
    ("mistral-7b", None),  # not a llama
]


@pytest.mark.parametrize(("model", "flavor"), FLAVOR_TABLE)
def test_a_flavor_only_for_the_model_it_builds(model: str, flavor: str | None) -> None:
    spec = lookup_model(model, 4096)
    assert torchtitan_flavor(spec) == flavor
    if model in ("llama-3-8b", "llama-3-70b", "llama-2-70b"):
        refusal = flavor_refusal(spec)
        assert refusal is not None and "RoPE scaling none" in refusal
        if model == "llama-2-70b":
            assert "vocabulary 32000" in refusal and "rope theta 10000" in refusal
    else:
        assert flavor_refusal(spec) is None


def test_flavor_mlp_widths_are_the_models() -> None:
    """torchtitan's FeedForward width from (dim, multiple_of, ffn_dim_multiplier) per flavor."""
    assert {f.name: f.ffn_hidden for f in FLAVORS} == {"8B": 14336, "70B": 28672, "405B": 53248}


def test_no_torchtitan_files_for_a_model_no_flavor_builds(tmp_path: Path) -> None:
    with pytest.raises(ToolFailure, match="RoPE scaling none"):
        _plan_files(tmp_path, "llama-3-70b", "pretrain", 4096, model_parallel_plan("zero1", 8, 2))


@pytest.mark.parametrize("model", ["llama-2-70b", "llama-3-70b"])
def test_a_llama_of_a_flavors_shape_runs_on_megatron_and_the_plan_says_why(model: str) -> None:
    from tools.core.schemas import FrameworkChoice
    from tools.research.framework import follow_setup

    deepspeed = FrameworkChoice(primary="deepspeed", stack=["pytorch", "deepspeed"], rationale="x")
    moved = follow_setup(deepspeed, lookup_model(model, 4096), model_parallel_plan("zero1", 8, 2))
    assert moved.primary == "megatron"
    assert "Not torchtitan: torchtitan's llama3 flavor 70B" in moved.rationale
    assert "RoPE scaling none" in moved.rationale
    llama31 = follow_setup(
        deepspeed, lookup_model("llama-3.1-70b", 4096), model_parallel_plan("zero1", 8, 2)
    )
    assert llama31.primary == "torchtitan" and "Not torchtitan" not in llama31.rationale


def _split_plan(tp: int, pp: int, dp: int, virtual: int, stage_layers: list[int]) -> MemoryPlan:
    """A tensor x pipeline plan whose setup records virtual stages and the stages' layers."""
    setup = SetupCandidate(
        strategy="zero1",
        tensor_parallel=tp,
        pipeline_parallel=pp,
        data_parallel=dp,
        virtual_stages=virtual,
        gradient_accumulation_steps=2 * pp,
        checkpointing="full",
        stage_layers=stage_layers,
        per_gpu_bytes={"total": 1},
        fits=True,
    )
    plan = model_parallel_plan("zero1", tp, pp, accumulation=2 * pp)
    return plan.model_copy(update={"setup": setup})


@pytest.mark.parametrize(
    ("model", "tp", "pp", "virtual", "split"),
    [
        # 126 layers over 16 stages (dp 1 on 2 x 8 GPUs at tp 1): 14 of 8, then 2 of 7.
        ("llama-3.1-405b", 1, 16, 1, [8] * 14 + [7] * 2),
        # 80 layers, 4 ranks x 2 virtual stages: 8 chunks of 10, chunk s on rank s mod 4.
        ("llama-3.1-70b", 2, 4, 2, []),
    ],
)
def test_the_stages_torchtitan_builds_are_the_plans(
    tmp_path: Path, model: str, tp: int, pp: int, virtual: int, split: list[int]
) -> None:
    """``module_fqns_per_model_part`` is the plan's split, one list per (virtual) stage.

    torchtitan 0.2.2 (distributed/pipeline_parallel.py ``pipeline_module_split``) builds one
    stage per list and needs their number to divide by the pipeline degree; a single-stage
    schedule (1F1B) takes one per rank, a looped one (Interleaved1F1B) two or more. Without
    the lists, ``pipeline_parallel_layers_per_stage`` = L/(p x v) gave ceil((L + 2)/(L/(p x v)))
    stages, which p does not divide, and torchtitan stopped.
    """
    dp = 16 // (tp * pp)
    files = _plan_files(tmp_path, model, "pretrain", 4096, _split_plan(tp, pp, dp, virtual, split))
    par = files["toml"]["parallelism"]
    parts = par["module_fqns_per_model_part"]
    layers = lookup_model(model, 4096).layers
    assert "pipeline_parallel_layers_per_stage" not in par
    assert len(parts) == pp * virtual and len(parts) % par["pipeline_parallel_degree"] == 0
    assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if virtual > 1 else "1F1B")
    # Every layer once, in order; the embedding first, the norm and output layer last.
    names = [name for part in parts for name in part]
    assert names == ["tok_embeddings", *(f"layers.{i}" for i in range(layers)), "norm", "output"]
    counts = [sum(n.startswith("layers.") for n in part) for part in parts]
    assert counts == (split or [layers // (pp * virtual)] * (pp * virtual))
    guide = files["guide"]
    assert ("do not divide evenly" in guide) == bool(split)
