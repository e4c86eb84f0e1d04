"""Uneven pipeline stages: layers that the pipeline degree does not divide (issue 30, item 4).

Llama 3.1 405B has 126 layers: no power of two above 2 divides them, yet it is trained with 16
pipeline stages (Dubey et al. 2024, Llama 3 sec. 3.3.2). The stages take 8 or 7 layers; the
heaviest one sets the pipeline's pace and the memory check.
"""

from __future__ import annotations

import pytest

from tools.core.setup import Setup
from tools.intake.brief import brief_from_dict
from tools.planning import SearchOptions, search_strategy
from tools.planning.compute import micro_batch_compute
from tools.planning.kernels import Device
from tools.planning.parallel import heaviest_stage_layers, model_parallel_params, pipeline_split
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model


@pytest.mark.parametrize(
    ("layers", "stages", "split"),
    [
        (126, 16, (8,) * 14 + (7,) * 2),
        (126, 8, (16,) * 6 + (15,) * 2),
        (30, 4, (8, 8, 7, 7)),
        (80, 4, ()),  # equal stages: nothing to say
        (32, 1, ()),
    ],
)
def test_the_first_stages_take_the_extra_layers(
    layers: int, stages: int, split: tuple[int, ...]
) -> None:
    assert pipeline_split(layers, stages) == split
    if split:
        assert sum(split) == layers and max(split) == heaviest_stage_layers(layers, stages)


def test_the_label_says_the_stage_sizes_and_a_wrong_split_is_refused() -> None:
    setup = Setup("zero1", tp=8, pp=16, stage_layers=pipeline_split(126, 16))
    assert setup.label() == "zero1+tp8+pp16(7-8 layers)"
    assert setup.family().label() == setup.label()
    assert Setup("zero1", tp=8, pp=4).label() == "zero1+tp8+pp4"
    with pytest.raises(ValueError, match="stage_layers"):
        Setup("zero1", pp=4, stage_layers=(8, 8, 7))


def test_the_heaviest_stage_is_priced_in_memory_and_speed() -> None:
    model = lookup_model("llama-3.1-405b", 8192)
    embedding = model.vocab * model.hidden
    # Untied embeddings: the body the stages share holds neither the input embedding (first
    # stage) nor the output layer (last stage).
    body = model.params - 2 * embedding
    params, _ = model_parallel_params(model, 1, 16)
    # 8 of the 126 layers' weights and the embedding, not 126/16 = 7.875 layers' worth.
    assert params == -(-body * 8 // 126) + embedding
    even = lookup_model("llama-3-70b", 8192)
    e_body = even.params - 2 * even.vocab * even.hidden
    assert model_parallel_params(even, 1, 4)[0] == -(-e_body // 4) + even.vocab * even.hidden
    gpu = parse_hardware("64x8xH100-80GB").gpu
    assert gpu is not None
    device = Device.of(gpu, gpu.bf16_tflops)
    mb = micro_batch_compute(
        model, device, micro=1, seq=8192, tp=8, pp=16, cp=1, recompute="full",
        attention="sdpa", sequence_parallel=True, bytes_per=2,
    )  # fmt: skip
    assert mb.layers == 8


def test_405b_on_64_nodes_of_h100_runs_tp8_x_pp16_with_uneven_stages() -> None:
    hw = parse_hardware("64x8xH100-80GB")
    brief = brief_from_dict(
        {
            "model": "llama-3.1-405b",
            "hardware": "64x8xH100-80GB",
            "seq_len": 8192,
            "global_batch_size": 512,
            "task": "pretrain",
        }
    )
    model = lookup_model("llama-3.1-405b", 8192)
    plan = search_strategy(model, hw, brief, SearchOptions(tensor_parallel=8, pipeline_parallel=16))
    assert plan.chosen_label.startswith("zero1+tp8+pp16(7-8 layers)")
    assert plan.setup is not None and plan.setup.fits
    assert plan.setup.stage_layers == [8] * 14 + [7] * 2
    assert plan.setup.data_parallel == 4
    row = plan.chosen_row
    assert row is not None and row.stage_layers == plan.setup.stage_layers
    # The pipeline is now in the search without a pin: the 16-stage layout is priced and
    # ranked (the why-not line says how it compares), not left out as it was.
    searched = search_strategy(model, hw, brief)
    assert any(label.startswith("zero1+tp8+pp16(7-8 layers)") for label in searched.why_not) or (
        searched.chosen_label.startswith("zero1+tp8+pp16")
    )


def test_a_megatron_pipeline_is_priced_without_interleaving() -> None:
    """Megatron-DeepSpeed's pipeline is DeepSpeed's 1F1B; only torchtitan's interleaves."""

    def candidates(model: str, hardware: str):
        brief = brief_from_dict(
            {"model": model, "hardware": hardware, "seq_len": 8192,
             "global_batch_size": 32, "task": "pretrain"}
        )  # fmt: skip
        options = SearchOptions(pipeline_parallel=4)
        plan = search_strategy(lookup_model(model, 8192), parse_hardware(hardware), brief, options)
        return plan.candidates

    qwen = candidates("qwen2.5-32b", "2x8xH100-80GB")  # no torchtitan flavor: Megatron
    assert qwen and all(c.virtual_stages == 1 for c in qwen)
    llama = candidates("llama-3.1-70b", "4x8xH100-80GB")  # torchtitan's 70B flavor
    assert any(c.virtual_stages > 1 for c in llama)


def test_the_first_stage_holds_the_input_embedding_but_not_an_untied_output_layer() -> None:
    """Megatron's GPTModel builds the embedding on the first stage, the output layer on the last.

    Llama 3 8B (untied, 32 layers of 218,112,000 parameters, V x h = 525,336,576) under p = 2:
    the first stage holds 16 layers and the input embedding, 4.015 B, not 4.28 B (the untied
    output layer counted in the body overstated it by V x h / p; issue 30, FlagPerf XM0001).
    A tied model's single matrix is the embedding itself: its body is params - V x h.
    """
    untied = lookup_model("llama-3.1-8b", 8192)
    embedding = untied.vocab * untied.hidden
    layer = 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096
    params, _ = model_parallel_params(untied, 1, 2)
    assert params == -(-(untied.params - 2 * embedding) * 16 // 32) + embedding
    assert abs(params - (16 * layer + embedding)) < 4096  # the final norm's share, rounding
    tied = lookup_model("llama-3.2-3b", 8192)
    assert (tied.hf_config or {}).get("tie_word_embeddings") is True
    t_embedding = tied.vocab * tied.hidden
    t_layers = tied.layers
    t_params, _ = model_parallel_params(tied, 1, 2)
    assert t_params == -(-(tied.params - t_embedding) * (t_layers // 2) // t_layers) + t_embedding
