"""ZeRO-3's terms over a step: what is live when the activations peak.

DeepSpeed's stage3.py allocates the flat 16-bit gradient partition with the optimizer, so it
is there in forward; partitioned_param_coordinator.py keeps the parameters of modules reused
within ``stage3_max_reuse_distance`` gathered, so at the forward/backward turn the last R/2
parameters (a whole model under R/2) are still gathered.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from specs import A100, GPT2, LLAMA3_8B

from tools.artifacts.deepspeed_config import zero_section
from tools.core.schemas import HardwareSpec
from tools.planning import estimate_strategy, model_state_bytes
from tools.planning.footprint import Terms
from tools.planning.overheads import buffer_bytes
from tools.planning.states import MAX_REUSE_DISTANCE, zero3_kept_gathered, zero_settings

EIGHT = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=A100)


def test_terms_peak_counts_a_resident_gradient_buffer_with_the_activations() -> None:
    # Activations dominate: the resident buffer adds to them, the other gradients do not.
    terms = Terms(params=10, optimizer=20, gradients=15, resident_gradients=5, activations=100)
    assert terms.peak() == 10 + 20 + 5 + 100
    # Gradients dominate: the resident buffer is one of them, counted once.
    terms.activations = 1
    assert terms.peak() == 10 + 20 + 15
    # Persistent gradients (accumulation) were live with the activations already: unchanged.
    kept = Terms(params=10, optimizer=20, gradients=15, activations=100, gradients_persistent=True)
    both = Terms(
        params=10, optimizer=20, gradients=15, resident_gradients=5, activations=100,
        gradients_persistent=True,
    )  # fmt: skip
    assert both.peak() == kept.peak() == 10 + 20 + 15 + 100


def test_zero3_gradient_partition_is_live_in_forward() -> None:
    # seq 4096 x 8 sequences: the activations dwarf the gradients, so the gradient partition
    # is what the peak adds beyond parameters, optimizer, activations and the buckets.
    est = estimate_strategy(LLAMA3_8B, EIGHT, "zero3", micro_batch_size=8, seq_len=4096)
    b = est.per_gpu_bytes
    grads16 = 2 * math.ceil(LLAMA3_8B.params / 8)
    buckets, _ = buffer_bytes(
        LLAMA3_8B, "zero3", world_size=8, precision="bf16", on_gpu=False, training=True
    )
    assert b.activations > b.gradients
    assert b.peak_allocated == b.params + b.optimizer + b.activations + grads16 + buckets
    assert any("16-bit gradient partition" in n for n in est.notes)


def test_zero2_gradients_still_trade_with_the_activations() -> None:
    est = estimate_strategy(LLAMA3_8B, EIGHT, "zero2", micro_batch_size=8, seq_len=4096)
    b = est.per_gpu_bytes
    buckets, _ = buffer_bytes(
        LLAMA3_8B, "zero2", world_size=8, precision="bf16", on_gpu=False, training=True
    )
    assert b.peak_allocated == b.params + b.optimizer + b.activations + buckets


@pytest.mark.parametrize(
    ("params", "expected"),
    [(124_000_000, 124_000_000), (1_000_000_000, 500_000_000), (8_000_000_000, 500_000_000)],
)
def test_kept_gathered_is_the_reuse_window_out_and_back(params: int, expected: int) -> None:
    assert zero3_kept_gathered(params, 1_000_000_000) == expected


@pytest.mark.parametrize(("model", "kept"), [(GPT2, GPT2.params), (LLAMA3_8B, 500_000_000)])
def test_zero3_params_term_holds_what_the_reuse_distance_keeps(model, kept) -> None:
    est = estimate_strategy(model, EIGHT, "zero3", seq_len=1024)
    partition = model_state_bytes(model.params, model.params, model.largest_layer_params, 8,
                                  "zero3").gpu["params"]  # fmt: skip
    largest = model.largest_layer_params
    # The 16-bit partition, the largest layer gathered, and the rest of the kept window.
    assert est.per_gpu_bytes.params == partition + 2 * largest + 2 * max(0, kept - largest)
    if kept > largest:
        assert any("stage3_max_reuse_distance" in n for n in est.notes)


def test_inference_keeps_no_backward_window() -> None:
    est = estimate_strategy(LLAMA3_8B, EIGHT, "zero3", task="inference", seq_len=1024)
    partition = 2 * math.ceil(LLAMA3_8B.params / 8)
    assert est.per_gpu_bytes.params == partition + 2 * LLAMA3_8B.largest_layer_params


def test_emitted_reuse_distance_is_the_one_priced() -> None:
    settings = zero_settings(LLAMA3_8B, "zero3")
    assert settings.max_reuse_distance == MAX_REUSE_DISTANCE
    section = zero_section(SimpleNamespace(chosen="zero3"), LLAMA3_8B)  # type: ignore[arg-type]
    assert section["stage3_max_reuse_distance"] == settings.max_reuse_distance
