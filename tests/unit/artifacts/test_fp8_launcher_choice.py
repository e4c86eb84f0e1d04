"""Where an fp8 recipe runs (tools/artifacts/fp8_launch.py), and the wish marked from the plan.

torchtitan for the Llama 3.1 shapes its flavors build, else Megatron-DeepSpeed where its
Transformer Engine layers build the model (GPT-3-style, plain model); a pinned launcher without an fp8 path, a LoRA job or a model neither builds
trains bf16 and says why in one line. The torchtitan launch also runs an fp8 plan's data
parallelism (FSDP2), ZeRO-1/2 rows without resharding after forward.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from tools.artifacts.fp8_launch import fp8_launch, mark_fp8_wish, setup_refusal
from tools.artifacts.headline import FP8_NOT_APPLIED
from tools.artifacts.launch import emit_launch
from tools.core.estimate_types import MemoryPlan, SetupCandidate
from tools.core.request_account import RequestAccount, Wish
from tools.core.schemas import FrameworkChoice, GPUSpec, HardwareSpec
from tools.intake.brief import brief_from_dict
from tools.research.model_catalog import lookup_model

H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989, fp8_tflops=1979)


def _brief(model: str, **extra: Any):  # type: ignore[no-untyped-def]
    recipe = {"precision": "fp8", **extra.pop("recipe", {})}
    return brief_from_dict(
        {
            "goal": "x",
            "model": model,
            "task": "finetune",
            "seq_len": 2048,
            "recipe": recipe,
            **extra,
        }
    )


def test_torchtitan_for_its_flavors_megatron_for_what_its_te_layers_build() -> None:
    titan = fp8_launch(_brief("llama-3.1-8b"), lookup_model("llama-3.1-8b", 2048))
    assert titan is not None and titan.framework == "torchtitan" and titan.note is None
    # A GPT-3-style model (LayerNorm, GeLU, biases, full multi-head attention) pretrained:
    # Megatron-DeepSpeed's Transformer Engine layers build it, so its fp8 applies.
    gpt3 = lookup_model("gpt3-6.7b", 2048)
    megatron = fp8_launch(_brief("gpt3-6.7b", task="pretrain"), gpt3)
    assert megatron is not None and megatron.framework == "megatron"
    # Llama 3 8B is not torchtitan's flavor (Llama 3.1's RoPE scaling), and Megatron's GPT
    # builds it but not in Transformer Engine's layers: no launch applies fp8, priced bf16.
    llama3 = lookup_model("llama-3-8b", 2048)
    for task in ("pretrain", "finetune"):
        none = fp8_launch(_brief("llama-3-8b", task=task), llama3)
        assert none is not None and none.framework is None and none.note is not None
        assert none.note.startswith(FP8_NOT_APPLIED) and "priced as bf16" in none.note
        assert "grouped-query attention" in none.note and "a SwiGLU MLP" in none.note
        assert ("pipeline model" in none.note) == (task == "finetune")
    # Refusing DeepSpeed rules Megatron out.
    no_ds = fp8_launch(_brief("gpt3-6.7b", task="pretrain", avoid_frameworks=["deepspeed"]), gpt3)
    assert no_ds is not None and no_ds.framework is None
    assert no_ds.note is not None and "refuses deepspeed" in no_ds.note
    # No fp8 asked: nothing to decide.
    assert fp8_launch(_brief("llama-3-8b", recipe={"precision": "bf16"}), llama3) is None


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"framework": "deepspeed"}, "asks for DeepSpeed"),
        ({"recipe": {"framework": "fsdp"}}, "asks for PyTorch FSDP"),
        ({"task": "lora"}, "LoRA adapters"),
    ],
)
def test_no_fp8_launch_trains_bf16_and_says_why_in_one_line(
    extra: dict[str, Any], said: str
) -> None:
    launch = fp8_launch(_brief("llama-3.1-8b", **extra), lookup_model("llama-3.1-8b", 2048))
    assert launch is not None and launch.framework is None and launch.note is not None
    assert launch.note.startswith(FP8_NOT_APPLIED) and said in launch.note
    assert "priced as bf16" in launch.note and "\n" not in launch.note


def test_pinned_megatron_needs_te_layers_and_pinned_torchtitan_needs_a_flavor() -> None:
    gpt3 = lookup_model("gpt3-6.7b", 2048)
    kept = fp8_launch(_brief("gpt3-6.7b", task="pretrain", framework="megatron"), gpt3)
    assert kept is not None and kept.framework == "megatron"
    llama3 = lookup_model("llama-3-8b", 2048)
    bf16 = fp8_launch(_brief("llama-3-8b", task="pretrain", framework="megatron"), llama3)
    assert bf16 is not None and bf16.framework is None and bf16.note is not None
    assert bf16.note.startswith(FP8_NOT_APPLIED) and "plan is priced as bf16" in bf16.note
    assert "Transformer Engine" in bf16.note and "\n" not in bf16.note
    titan = fp8_launch(_brief("llama-3-8b", recipe={"framework": "torchtitan"}), llama3)
    assert titan is not None and titan.framework is None
    assert (
        titan.note is not None
        and "torchtitan was asked for and cannot run llama-3-8b" in titan.note
    )
    assert "differs in RoPE scaling" in titan.note  # titan_flavors.py's reason, quoted
    # The framework wish runs FSDP in torchtitan's place, and its own line says why: this one
    # says only that the launch that runs has no fp8 path.
    wished = fp8_launch(_brief("llama-3-8b", framework="torchtitan"), llama3)
    assert wished is not None and wished.framework is None and wished.note is not None
    assert "PyTorch FSDP (torchrun), which runs in its place, has no fp8 path" in wished.note
    assert "RoPE" not in wished.note
    # A LoRA job: torchtitan's launch trains every weight.
    llama31 = lookup_model("llama-3.1-8b", 2048)
    lora = fp8_launch(_brief("llama-3.1-8b", task="lora", framework="torchtitan"), llama31)
    assert lora is not None and lora.framework is None
    flavor = fp8_launch(_brief("llama-3.1-8b", framework="torchtitan"), llama31)
    assert flavor is not None and flavor.framework == "torchtitan"


def _account(honoured: bool | None = None) -> dict[str, Any]:
    wish = Wish(wish="technique:fp8", quote="fp8", honoured=honoured)
    return RequestAccount(wishes=[wish]).model_dump(mode="json")


def test_the_wish_is_marked_from_the_plan_made() -> None:
    def mark(**kw: Any) -> dict[str, Any]:
        args = {"primary": "torchtitan", "gemm_precision": "fp8", "launch_notes": []}
        args |= {"precision_note": None, **kw}
        marked = mark_fp8_wish(_account(), **args)
        assert marked is not None
        return RequestAccount.model_validate(marked).wishes[0].model_dump()

    honoured = mark()
    assert honoured["honoured"] is True and "torchtitan" in honoured["how"]
    note = f"{FP8_NOT_APPLIED}: the request asks for DeepSpeed"
    assert mark(gemm_precision=None, precision_note=note) | {"quote": "fp8"} == {
        "wish": "technique:fp8", "quote": "fp8", "honoured": False, "how": note
    }  # fmt: skip
    launch_said = mark(launch_notes=["other", note])
    assert launch_said["honoured"] is False and launch_said["how"] == note
    # Decided at intake (no FP8 tensor cores): kept as it was.
    assert mark_fp8_wish(
        _account(False), primary="x", gemm_precision=None, launch_notes=[], precision_note=None
    ) == _account(False)


def test_torchtitan_runs_an_fp8_plans_data_parallelism(tmp_path: Path) -> None:
    hardware = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=H100)
    model = lookup_model("llama-3.1-8b", 2048)
    brief = brief_from_dict(
        {"goal": "x", "model": "llama-3.1-8b", "task": "finetune", "seq_len": 2048,
         "global_batch_size": 32, "recipe": {"precision": "fp8", "framework": "torchtitan"}}
    )  # fmt: skip
    for strategy, reshard in (("zero2", "never"), ("zero3", None)):
        setup = SetupCandidate(
            strategy=strategy, tensor_parallel=1, pipeline_parallel=1, data_parallel=8,  # type: ignore[arg-type]
            micro_batch_size=2, gradient_accumulation_steps=2, checkpointing="none",
            per_gpu_bytes={"total": 1}, fits=True,
        )  # fmt: skip
        memory = MemoryPlan(
            strategies=[], chosen=strategy, micro_batch_size=2, gradient_accumulation_steps=2,  # type: ignore[arg-type]
            activation_checkpointing=False, setup=setup,
        )  # fmt: skip
        framework = FrameworkChoice(primary="torchtitan", stack=["pytorch"], rationale="x")
        out = tmp_path / strategy
        spec = emit_launch(out, brief, hardware, model, framework, None, memory=memory)
        assert not any(n.startswith(FP8_NOT_APPLIED) for n in spec.notes)
        toml = tomllib.loads((out / "torchtitan.toml").read_text())
        assert toml["model"]["converters"] == ["quantize.linear.float8"]
        assert toml["parallelism"]["data_parallel_shard_degree"] == 8
        assert toml["parallelism"].get("fsdp_reshard_after_forward") == reshard


def test_refusing_torchtitan_leaves_a_llama_3_1_without_an_fp8_launch() -> None:
    # "no torchtitan" reads as refusing FSDP (tools/intake/wishes.py); Megatron-DeepSpeed cannot
    # express Llama 3.1's RoPE scaling, so neither launch runs it: bf16, said with both reasons.
    model = lookup_model("llama-3.1-8b", 2048)
    launch = fp8_launch(_brief("llama-3.1-8b", avoid_frameworks=["pytorch_fsdp"]), model)
    assert launch is not None and launch.framework is None and launch.note is not None
    assert "torchtitan (the request refuses it)" in launch.note
    assert "RoPE scaling" in launch.note


def _memory(pp: int = 1, cp: int = 1) -> MemoryPlan:
    setup = SetupCandidate(
        strategy="zero1", pipeline_parallel=pp, context_parallel=cp, data_parallel=4,
        per_gpu_bytes={"total": 1}, fits=True,
    )  # fmt: skip
    return MemoryPlan(strategies=[], chosen="zero1", pipeline_parallel=pp, setup=setup)


def test_the_searched_setup_can_rule_megatron_fp8_out() -> None:
    # Pipeline stages build the pipeline model, context parallelism is DeepSpeed-Ulysses
    # around Megatron's attention: neither runs Transformer Engine's fp8 layers.
    gpt3 = lookup_model("gpt3-6.7b", 2048)
    brief = _brief("gpt3-6.7b", task="pretrain", recipe={"framework": "megatron"})
    assert setup_refusal(brief, gpt3, _memory()) is None
    for memory, said in ((_memory(pp=2), "the pipeline model"), (_memory(cp=2), "Ulysses")):
        why = setup_refusal(brief, gpt3, memory)
        assert why is not None and why.startswith(FP8_NOT_APPLIED) and said in why
        assert why.endswith("the plan is priced as bf16")
    # Not fp8 on Megatron: nothing to decide.
    titan = _brief("gpt3-6.7b", task="pretrain", recipe={"framework": "torchtitan"})
    assert setup_refusal(titan, gpt3, _memory(pp=2)) is None
