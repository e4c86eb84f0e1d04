"""FSDP CPU offload's host RAM: the shards FSDP keeps there, not DeepSpeed's offload buffers."""

from __future__ import annotations

import pytest

from tools.planning.memory import estimate_strategy
from tools.planning.recipe import Recipe
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model


def _host(framework: str, task: str = "finetune", precision: str = "bf16") -> tuple[int, list[str]]:
    model = lookup_model("llama-2-13b", 4096)
    est = estimate_strategy(
        model,
        parse_hardware("1x8xA100-40GB"),
        "zero3_offload_all",
        recipe=Recipe(framework=framework, precision=precision),
        micro_batch_size=1,
        seq_len=4096,
        task=task,
    )
    return est.cpu_bytes_per_node, est.notes


def test_fsdp_offload_holds_fp32_params_grads_adam_and_the_step_temporary() -> None:
    host, notes = _host("fsdp")
    params = lookup_model("llama-2-13b", 4096).params
    # fp32 parameter shard 4 + fp32 gradient shard 4 + Adam moments 8 + the foreach step's
    # sqrt temporary 4 = 20 bytes per parameter over the node's 8 ranks, no buffer factor.
    assert host == pytest.approx(20 * params, rel=0.002)
    line = next(n for n in notes if n.startswith("CPU per node"))
    assert "FSDP CPU offload" in line and "x1.5" not in line


def test_deepspeed_offload_keeps_its_own_pricing_above_fsdps() -> None:
    fsdp, _ = _host("fsdp")
    ds, notes = _host("deepspeed")
    assert ds > 1.3 * fsdp
    assert any("additional_buffer_factor" in n for n in notes)


def test_fsdp_lora_offload_holds_the_frozen_base_in_16_bit_and_few_trained_states() -> None:
    full, _ = _host("fsdp")
    lora, _ = _host("fsdp", task="lora")
    params = lookup_model("llama-2-13b", 4096).params
    assert 2 * params <= lora < 2.2 * params < full
