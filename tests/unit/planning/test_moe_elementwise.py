"""A mixture of experts' activation runs over the top-k routed copies of each token (issue 30).

Each token passes through k routed experts, and each expert applies its activation to the gate
and up outputs of the tokens routed to it (Megatron-Core ``TEGroupedMLP.forward``): k x the
expert's width per token, plus the shared experts'. Mixtral's and GPT-OSS's configs name the
expert's width ``intermediate_size``, so pricing the activation at that width counted one expert
of k (GPT-OSS: one of four).
"""

from __future__ import annotations

from specs import LLAMA3_8B

from tools.planning import estimate_speed
from tools.planning.activations import mlp_bytes_per_width
from tools.planning.experts import activation_width, expert_shape
from tools.research.hardware import parse_hardware


def _moe(intermediate: int, top_k: int = 2, **extra: object):  # type: ignore[no-untyped-def]
    config = {
        "model_type": "mixtral",
        "num_local_experts": 8,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": 14336,
        **extra,
    }
    return LLAMA3_8B.model_copy(update={"hf_config": config, "intermediate": intermediate})


def _compute_s(model) -> float:  # type: ignore[no-untyped-def]
    est = estimate_speed(
        model,
        parse_hardware("1x8xH100-80GB"),
        "zero1",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        seq_len=4096,
    )
    assert est.compute_time_s is not None
    return est.compute_time_s


def test_activation_width_is_top_k_experts_plus_the_shared_ones() -> None:
    mixtral = expert_shape(_moe(14336))
    assert activation_width(mixtral, 14336, 32) == 2 * 14336
    shared = expert_shape(_moe(14336, shared_expert_intermediate_size=4096))
    assert activation_width(shared, 14336, 32) == 2 * 14336 + 4096
    # DeepSeek's first dense layer keeps the dense width: 1 of 4 layers dense here.
    first_dense = expert_shape(
        _moe(14336, first_k_dense_replace=1).model_copy(update={"layers": 4})
    )
    assert first_dense is not None and first_dense.moe_layers == 3
    assert activation_width(first_dense, 14336, 4) == 0.75 * 2 * 14336 + 0.25 * 14336
    assert activation_width(None, 14336, 32) == 14336


def test_all_moe_layers_price_the_activation_from_the_experts_not_the_dense_width() -> None:
    # Every layer is a mixture: the dense intermediate_size runs nowhere, so it costs nothing.
    assert _compute_s(_moe(14336)) == _compute_s(_moe(2 * 14336))
    # More routed copies per token: more activation work (and more expert GEMMs).
    assert _compute_s(_moe(14336, top_k=4)) > _compute_s(_moe(14336, top_k=2))


def test_gpt_oss_experts_are_a_gated_mlp() -> None:
    # transformers GptOssExperts: gate_up_proj of 2 x the expert width, a clamped SwiGLU.
    gpt_oss = LLAMA3_8B.model_copy(update={"hf_config": {"model_type": "gpt_oss"}})
    gpt2 = LLAMA3_8B.model_copy(update={"hf_config": {"model_type": "gpt2"}})
    assert mlp_bytes_per_width(gpt_oss) == 8
    assert mlp_bytes_per_width(gpt2) == 4
