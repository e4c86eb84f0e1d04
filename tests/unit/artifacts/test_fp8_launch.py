"""A plan with fp8 linears: the launchers with an fp8 path apply it, the others say they do not.

torchtitan's TOML is checked key by key in test_torchtitan_config.py and Megatron's flags by
its own parser in test_megatron_flags.py; here, what each launch does with the recipe.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.artifacts.deepspeed_config import emit_deepspeed_config
from tools.artifacts.launch import emit_launch
from tools.core.estimate_types import MemoryPlan, SetupCandidate
from tools.core.schemas import FrameworkChoice, GPUSpec, HardwareSpec
from tools.intake.brief import brief_from_dict
from tools.research.model_catalog import lookup_model

H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989, fp8_tflops=1979)


def _emit(
    tmp_path: Path,
    launcher: str,
    strategy: str,
    tp: int,
    pp: int,
    precision: str,
    name: str = "llama-3-8b",
):  # type: ignore[no-untyped-def]
    hardware = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=H100)
    model = lookup_model(name, 2048)
    dp = 8 // (tp * pp)
    brief = brief_from_dict(
        {"goal": "x", "model": name, "task": "pretrain", "seq_len": 2048,
         "global_batch_size": 4 * dp, "recipe": {"precision": precision}}
    )  # fmt: skip
    setup = SetupCandidate(
        strategy=strategy, tensor_parallel=tp, pipeline_parallel=pp, data_parallel=dp,  # type: ignore[arg-type]
        micro_batch_size=1, gradient_accumulation_steps=4, checkpointing="full",
        per_gpu_bytes={"total": 1}, fits=True,
    )  # fmt: skip
    memory = MemoryPlan(
        strategies=[], chosen=strategy, micro_batch_size=1, gradient_accumulation_steps=4,  # type: ignore[arg-type]
        activation_checkpointing=True, tensor_parallel=tp, pipeline_parallel=pp, setup=setup,
    )  # fmt: skip
    framework = FrameworkChoice(primary=launcher, stack=["pytorch"], rationale="x")  # type: ignore[arg-type]
    config = None
    if launcher in ("deepspeed", "megatron"):
        config = emit_deepspeed_config(memory, model, hardware, brief, autotp=False)
    return emit_launch(tmp_path, brief, hardware, model, framework, config, memory=memory)


@pytest.mark.parametrize(("launcher", "strategy"), [("deepspeed", "zero2"), ("pytorch", "ddp")])
def test_a_launcher_without_an_fp8_path_says_so_in_one_line(
    tmp_path: Path, launcher: str, strategy: str
) -> None:
    spec = _emit(tmp_path, launcher, strategy, 1, 1, "fp8")
    said = [n for n in spec.notes if "fp8" in n]
    assert len(said) == 1 and said[0].startswith("fp8 linears are not applied")
    assert "trains bf16" in said[0]
    assert not any("fp8" in str(arg) for arg in spec.command)
    bf16 = _emit(tmp_path / "bf16", launcher, strategy, 1, 1, "bf16")
    assert not any("fp8" in n for n in bf16.notes)


def test_megatron_applies_fp8_through_transformer_engine(tmp_path: Path) -> None:
    # A GPT-3-style model (LayerNorm, GeLU, biases, full multi-head attention) as the plain
    # model: the Transformer Engine layer Megatron-DeepSpeed builds is this model.
    spec = _emit(tmp_path, "megatron", "zero1", 2, 1, "fp8", name="gpt3-1.3b")
    assert "--fp8-hybrid" in spec.command and "--no-pipeline-parallel" in spec.command
    assert spec.command[spec.command.index("--transformer-impl") + 1] == "transformer_engine"
    assert not any("fp8" in n for n in spec.notes)
    guide = (tmp_path / "MEGATRON.md").read_text()
    assert "--fp8-hybrid" in guide and "Transformer Engine" in guide


@pytest.mark.parametrize(
    ("tp", "pp", "why"),
    [
        (2, 2, "the pipeline model"),  # GPTModelPipe's layers are Megatron's own
        (2, 1, "grouped-query attention"),  # the plain model asserts no GQA under TE
    ],
)
def test_megatron_passes_no_fp8_flags_where_transformer_engine_builds_another_model(
    tmp_path: Path, tp: int, pp: int, why: str
) -> None:
    # Llama 3: GQA, RMSNorm, SwiGLU, no biases; Megatron-DeepSpeed's TE layer has none of them.
    spec = _emit(tmp_path, "megatron", "zero1", tp, pp, "fp8")
    assert not any("fp8" in str(arg) or arg == "--transformer-impl" for arg in spec.command)
    said = [n for n in spec.notes if "fp8" in n]
    assert len(said) == 1 and said[0].startswith("fp8 linears are not applied"), spec.notes
    assert why in said[0] and "RMSNorm" in said[0] and "SwiGLU" in said[0]
    assert "trains bf16" in said[0]
    assert "--fp8-hybrid" not in (tmp_path / "MEGATRON.md").read_text()


def test_an_unapplied_fp8_is_in_the_headline_not_as_asked(tmp_path: Path) -> None:
    from tools.artifacts.headline import headline_notes

    spec = _emit(tmp_path, "deepspeed", "zero2", 1, 1, "fp8")
    notes = headline_notes({"launch": {"notes": spec.notes}})
    assert len(notes) == 1
    assert notes[0].startswith("fp8 linears are not applied") and notes[0].endswith(".")
    assert headline_notes({"launch": {"notes": [n for n in spec.notes if "fp8" not in n]}}) == []
