"""A split only Megatron-DeepSpeed runs is kept off a model its launch would not train as it is.

"pretrain deepseek-v2-lite on 16 H100s" planned zero1+ep8 on Megatron-DeepSpeed, whose GPT has
no multi-head latent attention, shared experts or dense first layer: a plan for another model,
said only inside MEGATRON.md ("What I could not do: nothing"). A job that loads the weights
needs the model exactly and a converter that loads them (Megatron-DeepSpeed's maps dense Llama
weights only); pretraining from scratch needs the same architecture, a detail (RoPE scaling,
biases on q/k/v only, a query/key norm) is said in the launch notes instead.
"""

from __future__ import annotations

import pytest

from tools.core.schemas import TrainingBrief
from tools.research.megatron_arch import megatron_differs, megatron_excluded, unexpressed
from tools.research.model_catalog import lookup_model
from tools.research.splits import runs_setup, split_framework


@pytest.mark.parametrize(
    ("model", "task", "excluded"),
    [
        ("deepseek-v2-lite", "pretrain", "multi-head latent attention"),
        ("gemma-2-2b", "pretrain", "Gemma's gated GELU MLP"),
        ("falcon-7b", "pretrain", "parallel attention and MLP blocks"),
        ("qwen2.5-7b", "pretrain", None),  # biases on q/k/v only: a detail, said
        ("llama-3.2-1b", "pretrain", None),  # RoPE scaling: a detail, said
        ("qwen2.5-7b", "finetune", "its weights cannot be loaded"),
        ("llama-3.2-1b", "finetune", "RoPE scaling"),  # the loaded weights expect it
        ("gpt2", "finetune", "the converter maps dense Llama"),
        ("llama-3-8b", "finetune", None),
        ("mixtral-8x7b", "pretrain", None),
    ],
)
def test_megatron_is_excluded_for_what_its_launch_would_not_train(
    model: str, task: str, excluded: str | None
) -> None:
    spec = lookup_model(model, 512, from_scratch=task == "pretrain")
    why = megatron_excluded(spec, loads_weights=task != "pretrain")
    if excluded is None:
        assert why is None
    else:
        assert why is not None and excluded in why and model in why


def test_deepseek_is_built_llama_style_and_its_additions_are_named() -> None:
    gaps = unexpressed(lookup_model("deepseek-v2-lite", 512))
    # Its MLP is gated SiLU (DeepseekV2MLP), which --swiglu builds: not a gap.
    assert not any("MLP" in g for g in gaps)
    assert (
        "its shared experts" in gaps
        and "its dense first layer (experts in every layer here)" in gaps
    )


def test_a_model_given_by_shape_has_nothing_megatron_cannot_build() -> None:
    spec = lookup_model("llama-3-8b", 512).model_copy(update={"hf_config": None})
    assert megatron_excluded(spec, loads_weights=True) is None
    assert megatron_differs(spec, loads_weights=True) is None


def test_an_expert_split_of_deepseek_runs_only_where_megatron_is_asked_for_or_lifted() -> None:
    model = lookup_model("deepseek-v2-lite", 2048)
    plain = TrainingBrief(model="deepseek-v2-lite", hardware="2x8xH100-80GB")
    assert split_framework(model, "zero1", ep=8) == "megatron"
    assert not runs_setup(plain, model, "zero1", 1, 1, 1, 8)
    assert runs_setup(plain, model, "zero1", 1, 1, 1, 8, exact=False)
    named = plain.model_copy(update={"framework": "megatron"})
    assert runs_setup(named, model, "zero1", 1, 1, 1, 8)
    assert runs_setup(plain, model, "zero3", 1, 1, 1)  # data parallel: the HF model itself


def test_a_tensor_split_of_a_torchtitan_llama_runs_on_torchtitan_not_megatron() -> None:
    # ZeRO-3 x TP is FSDP2 x TP on torchtitan, which builds Llama 3.1 with its RoPE scaling.
    model = lookup_model("llama-3.1-8b", 2048)
    assert split_framework(model, "zero3", tp=2) == "torchtitan"
    assert split_framework(model, "zero1", tp=2) == "deepspeed"  # AutoTP, the HF model


def test_a_sliding_window_shorter_than_the_sequence_is_a_gap_megatron_cannot_build() -> None:
    # Mistral 7B v0.1 attends over a 4096-token window; Megatron-DeepSpeed's attention has no
    # window, so at 8192 tokens it trains full attention (a detail for a from-scratch run, a
    # different model for a fine-tune).
    long = lookup_model("mistral-7b", 8192)
    assert any("sliding-window attention (4096 tokens)" in g for g in unexpressed(long))
    assert megatron_excluded(long, loads_weights=False) is None
    assert "sliding-window" in (megatron_excluded(long, loads_weights=True) or "")
    assert unexpressed(lookup_model("mistral-7b", 4096)) == []
