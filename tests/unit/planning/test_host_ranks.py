"""CPU ranks' memory terms (tools/planning/host_ranks.py) and their hook in estimate_strategy."""

from __future__ import annotations

import math

import pytest
from specs import GPT2

from tools.core.schemas import GPUSpec, HardwareSpec
from tools.planning.host_ranks import (
    FIRST_STEP_BYTES,
    ZERO_IMPORT_BYTES,
    host_rank_terms,
)
from tools.planning.memory import estimate_strategy
from tools.smoke.predict import predict_peak_bytes

ACT = 8 * 2**20


def cpu_ranks(n: int) -> HardwareSpec:
    return HardwareSpec(source="local", nodes=1, gpus_per_node=n, gpu=None, ram_gb=64)


def test_zero3_partitions_shrink_with_ranks_and_the_rest_does_not() -> None:
    two = host_rank_terms(GPT2, "zero3", 2, ACT)
    eight = host_rank_terms(GPT2, "zero3", 8, ACT)
    assert two is not None and eight is not None
    full = 4 * GPT2.params
    for name in ("params", "master_params", "gradient_partition"):
        assert two.terms[name] == math.ceil(GPT2.params / 2) * 4
        assert eight.terms[name] == math.ceil(GPT2.params / 8) * 4
    assert eight.terms["optimizer_moments"] == 2 * eight.terms["master_params"]
    # Gathered parameters, the code import and the first step do not shrink with ranks.
    for t in (two, eight):
        assert t.terms["gathered_params"] == full
        assert t.terms["zero_import"] == ZERO_IMPORT_BYTES
        assert t.terms["first_step"] == FIRST_STEP_BYTES
    # The forward's end, with every parameter gathered, is the peak.
    assert two.peak_phase == "forward"
    assert two.peak - eight.peak == 5 * (two.terms["params"] - eight.terms["params"])


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_zero12_keep_the_flat_buffer_and_whole_gradients_of_their_partition(strategy: str) -> None:
    full = 4 * GPT2.params
    largest = 4 * GPT2.largest_layer_params
    two = host_rank_terms(GPT2, strategy, 2, ACT)
    eight = host_rank_terms(GPT2, strategy, 8, ACT)
    assert two is not None and eight is not None
    assert two.terms["params"] == eight.terms["params"] == full
    part2, part8 = two.terms["master_params"], eight.terms["master_params"]
    assert part8 < part2
    # One partition boundary per rank on 2 ranks, two for a middle rank of 8; never above P.
    assert two.terms["gradients_in_partition"] == min(full, part2 + largest)
    assert eight.terms["gradients_in_partition"] == min(full, part8 + 2 * largest)
    assert "gradients_in_partition" in two.phases["backward"]
    assert "gradients_in_partition" not in two.phases["step"]
    assert "zero_import" in two.phases["step"]


def test_ddp_holds_five_copies_and_no_zero_import() -> None:
    t = host_rank_terms(GPT2, "ddp", 2, ACT)
    assert t is not None
    full = 4 * GPT2.params
    assert "zero_import" not in t.terms
    assert t.peak == 5 * full + FIRST_STEP_BYTES
    single = host_rank_terms(GPT2, "ddp", 1, ACT)
    assert single is not None and single.terms["ddp_buckets"] == 0


def test_other_strategies_fall_back_to_the_generic_model() -> None:
    assert host_rank_terms(GPT2, "zero3_offload_all", 2, ACT) is None


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3"])
def test_estimate_strategy_uses_the_host_terms_on_cpu_only(strategy: str) -> None:
    est = estimate_strategy(GPT2, cpu_ranks(2), strategy, task="pretrain", precision="fp32")  # type: ignore[arg-type]
    b = est.per_gpu_bytes
    assert any("host_ranks.py" in n for n in est.notes)
    assert (
        b.total
        == b.params + b.gradients + b.optimizer + b.activations + b.buffers - b.not_concurrent
    )
    terms = host_rank_terms(GPT2, strategy, 2, b.activations)
    assert terms is not None and b.total - b.margin == terms.peak
    if strategy != "ddp":
        assert b.buffers - b.margin == ZERO_IMPORT_BYTES + FIRST_STEP_BYTES
    gpu = HardwareSpec(
        source="local", nodes=1, gpus_per_node=2, gpu=GPUSpec(name="A100-80GB", memory_gb=80)
    )
    on_gpu = estimate_strategy(GPT2, gpu, strategy, task="pretrain", precision="fp32")  # type: ignore[arg-type]
    assert not any("host_ranks.py" in n for n in on_gpu.notes)
    # LoRA on CPU keeps the generic terms (the host model describes full training only).
    lora = estimate_strategy(GPT2, cpu_ranks(2), strategy, task="lora", precision="fp32")  # type: ignore[arg-type]
    assert not any("host_ranks.py" in n for n in lora.notes)


def test_smoke_prediction_on_cpu_is_the_host_peak() -> None:
    shape = {
        "family": "gpt2", "params": 3_709_952, "layers": 2, "hidden": 256, "heads": 4,
        "vocab": 8192, "seq_len": 64, "largest_layer_params": 2_097_152,
    }  # fmt: skip
    predicted = {s: predict_peak_bytes(shape, s, "cpu", 2) for s in ("ddp", "zero1", "zero3")}
    full = 4 * shape["params"]
    part = full // 2
    # ZeRO-3: three partitions, the moments, every parameter gathered, the import and first step.
    assert predicted["zero3"] > 5 * part + full + ZERO_IMPORT_BYTES + FIRST_STEP_BYTES
    # ZeRO-1 after backward: flat buffer, master, moments and S plus the straddling embedding.
    zero1_backward = full + 3 * part + min(full, part + 4 * 2_097_152)
    assert predicted["zero1"] >= zero1_backward + ZERO_IMPORT_BYTES + FIRST_STEP_BYTES
    assert predicted["ddp"] >= 5 * full + FIRST_STEP_BYTES
