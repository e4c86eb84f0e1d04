"""Heads of an explicit width: attention is heads x head_dim wide, not always the hidden size.

openai/gpt-oss-120b runs 64 heads of 64 (4096) on a hidden size of 2880, Qwen3-30B-A3B 32 of
128 (4096) on 2048, Gemma 2 2B 8 of 256 on 2304 (each config.json). The speed model prices the
q/k/v/o projections, the attention core, rotary embedding and PaLM's attention FLOPs from that
width; a config without ``head_dim`` keeps hidden / heads.
"""

from __future__ import annotations

from specs import LLAMA3_8B

from tools.planning import estimate_speed, training_flops_per_token
from tools.planning.inference import kv_bytes_per_token
from tools.planning.states import head_dim
from tools.research.hardware import parse_hardware

SEQ = 4096


def _with_head_dim(value: int | None):  # type: ignore[no-untyped-def]
    config = {"model_type": "llama"}
    if value is not None:
        config["head_dim"] = value
    return LLAMA3_8B.model_copy(update={"hf_config": config})


def _speed(model):  # type: ignore[no-untyped-def]
    return estimate_speed(
        model,
        parse_hardware("1x8xH100-80GB"),
        "zero1",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        seq_len=SEQ,
    )


def test_head_dim_comes_from_the_config_else_hidden_over_heads() -> None:
    assert head_dim(LLAMA3_8B) == 4096 // 32
    assert head_dim(_with_head_dim(256)) == 256
    t5 = LLAMA3_8B.model_copy(update={"hf_config": {"model_type": "t5", "d_kv": 64}})
    assert head_dim(t5) == 64
    # A config value that is no positive whole number is not a width.
    assert head_dim(_with_head_dim(0)) == 128
    bad = LLAMA3_8B.model_copy(update={"hf_config": {"head_dim": True}})
    assert head_dim(bad) == 128


def test_palm_attention_flops_follow_the_attention_width() -> None:
    plain = training_flops_per_token(_with_head_dim(None), SEQ, activation_checkpointing=False)
    wide = training_flops_per_token(_with_head_dim(256), SEQ, activation_checkpointing=False)
    # 12·L·(H·Q)·s: 32 heads x 256 = 8192 wide against 4096.
    assert wide - plain == 12 * 32 * (32 * 256 - 4096) * SEQ


def test_wider_heads_cost_step_time_and_the_same_width_costs_nothing() -> None:
    base = _speed(_with_head_dim(None))
    same = _speed(_with_head_dim(128))
    wide = _speed(_with_head_dim(256))
    assert same.compute_time_s == base.compute_time_s
    # The q and o projections and the attention core double; the MLP does not change.
    assert wide.compute_time_s > base.compute_time_s * 1.1
    assert wide.tokens_per_s < base.tokens_per_s


def test_serving_kv_cache_uses_the_same_width() -> None:
    assert kv_bytes_per_token(_with_head_dim(256)) == 2 * kv_bytes_per_token(LLAMA3_8B)
