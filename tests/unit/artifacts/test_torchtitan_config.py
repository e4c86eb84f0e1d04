"""torchtitan plans: the flavor is the model, and every TOML key is one torchtitan 0.2.2 reads.

The keys are checked against torchtitan 0.2.2's own ``JobConfig`` dataclasses, copied from the
tagged release into tests/data/torchtitan_job_config.py (source URL and commit in its header)
and read with ``ast``: torchtitan's ConfigManager refuses a TOML key it does not know
(config/manager.py ``_dict_to_dataclass``), so an unknown key stops the job at start. torchtitan
itself is not installed here: it pulls ~1 GB of triton and needs protobuf >= 6.31, which
clashes with the main lock (DEVELOPERS.md), and 0.3.0, PyPI's newest, no longer reads a TOML.
"""

from __future__ import annotations

import ast
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from specs import model_parallel_plan

from tools.core.errors import ToolFailure
from tools.core.estimate_types import MemoryPlan, SetupCandidate
from tools.core.schemas import GPUSpec, HardwareSpec
from tools.intake.brief import brief_from_dict
from tools.research.model_catalog import lookup_model
from tools.research.titan_flavors import FLAVORS, flavor_refusal, torchtitan_flavor

JOB_CONFIG = Path(__file__).parents[2] / "data" / "torchtitan_job_config.py"
H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989)


def _dataclasses() -> dict[str, dict[str, Any]]:
    """Class name -> field name -> its annotation, evaluated (Literal, unions, lists)."""
    tree = ast.parse(JOB_CONFIG.read_text())
    names = {"Literal": Literal, "Any": Any}
    classes: dict[str, dict[str, Any]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {
                item.target.id: ast.unparse(item.annotation)
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
    for fields in classes.values():
        for key, text in fields.items():
            fields[key] = text if text in classes else eval(text, names)  # noqa: S307
    return classes


def _fits(value: Any, annotation: Any) -> bool:
    """Whether a TOML value is of the field's type (bool is not an int here)."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin in (typing.Union, __import__("types").UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(annotation))
    if origin is list:
        return isinstance(value, list)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _plan_files(tmp_path: Path, model: str, task: str, seq: int, memory) -> dict[str, Any]:
    from tools.artifacts.launch import emit_launch
    from tools.core.schemas import FrameworkChoice

    brief = brief_from_dict(
        {"model": model, "task": task, "seq_len": seq, "global_batch_size": 32, "goal": "x"}
    )
    hw = HardwareSpec(source="described", nodes=2, gpus_per_node=8, gpu=H100)
    choice = FrameworkChoice(primary="torchtitan", stack=["pytorch", "torchtitan"], rationale="x")
    out = tmp_path / model
    emit_launch(out, brief, hw, lookup_model(model, seq), choice, None, memory=memory)
    return {
        "toml": tomllib.loads((out / "torchtitan.toml").read_text()),
        "launch": (out / "launch.sh").read_text(),
        "guide": (out / "TORCHTITAN.md").read_text(),
    }


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
    classes = _dataclasses()
    sections = classes["JobConfig"]
    wrong = []
    for section, values in files["toml"].items():
        if section not in sections:
            wrong.append(f"[{section}] is no JobConfig section")
            continue
        fields = classes[sections[section]]
        for key, value in values.items():
            if key not in fields:
                wrong.append(f"[{section}] {key} is no {sections[section]} field")
            elif not _fits(value, fields[key]):
                wrong.append(f"[{section}] {key} = {value!r} is not {fields[key]}")
    assert not wrong, wrong
    assert files["toml"]["checkpoint"]["enable"] is True
    assert files["toml"]["model"]["flavor"] == torchtitan_flavor(lookup_model(model, seq))
    # The files name the release they are for, and launch.sh checks it before starting.
    assert "pip install torchtitan==0.2.2" in files["guide"]
    assert 'if [[ "$titan_version" != "0.2.2" ]]; then' in files["launch"]
    assert files["launch"].index("titan_version") < files["launch"].index("torchrun")


def test_the_checker_refuses_what_torchtitan_refuses() -> None:
    """The check itself: an unknown key and a value of the wrong type are caught."""
    classes = _dataclasses()
    assert "enable_checkpoint" not in classes["Checkpoint"] and "enable" in classes["Checkpoint"]
    assert not _fits("fp16", classes["Training"]["mixed_precision_param"])
    assert _fits("bfloat16", classes["Training"]["mixed_precision_param"])
    assert not _fits(True, classes["Training"]["local_batch_size"])
    assert _fits(None, classes["Checkpoint"]["initial_load_path"])


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
