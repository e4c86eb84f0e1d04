"""Expert parallelism for a mixture of experts (issue 30, item 4): searched, priced, launched.

DeepSpeed-MoE (Rajbhandari et al. 2022) on Megatron-DeepSpeed (``--moe-expert-parallel-size``):
e ranks of the data-parallel group split the routed experts; each holds 1/e of their weights
and gradients, ZeRO shards their optimizer states over the d/e ranks holding the same experts,
and every MoE layer pays all-to-alls to route tokens to their experts and back.
"""

from __future__ import annotations

import pytest

from tools.core.errors import InputError
from tools.intake.brief import brief_from_dict
from tools.planning import SearchOptions, estimate_strategy, search_strategy
from tools.planning.parallel import expert_params, routed_experts
from tools.planning.speed import estimate_speed
from tools.research.framework import setup_framework
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model

HW = "4x8xH100-80GB"


def _mixtral():
    return lookup_model("mixtral-8x7b", 4096)


def test_mixtral_experts_are_most_of_its_weights() -> None:
    model = _mixtral()
    assert routed_experts(model) == 8
    assert expert_params(model) == 32 * 8 * 3 * 4096 * 14336
    assert expert_params(lookup_model("llama-3-8b", 4096)) == 0


def test_expert_weights_and_gradients_are_split_and_their_states_sharded() -> None:
    model, hw = _mixtral(), parse_hardware(HW)

    def est(ep: int):
        return estimate_strategy(
            model, hw, "zero1", task="pretrain", micro_batch_size=1,
            activation_checkpointing=True, seq_len=4096, expert_parallel=ep,
        )  # fmt: skip

    one, eight = est(1), est(8)
    experts = expert_params(model)
    # 16-bit weights: 2 bytes x the 7/8 of the experts this GPU no longer holds.
    assert one.per_gpu_bytes.params - eight.per_gpu_bytes.params == 2 * (experts - experts // 8)
    assert eight.per_gpu_bytes.gradients < one.per_gpu_bytes.gradients
    # ZeRO-1 states: experts/8 over 32/8 ranks = experts over 32, as before.
    assert abs(eight.per_gpu_bytes.optimizer - one.per_gpu_bytes.optimizer) < 1e6
    assert eight.label == "zero1+ep8" and eight.expert_parallel == 8
    assert any("expert parallel 8" in n for n in eight.notes)
    with pytest.raises(InputError) as err:
        estimate_strategy(model, hw, "zero1", task="pretrain", expert_parallel=3)
    assert err.value.field == "expert_parallel"
    with pytest.raises(InputError):
        estimate_strategy(model, hw, "zero3", task="pretrain", expert_parallel=2)


def test_all_to_alls_are_priced_on_the_critical_path() -> None:
    model, hw = _mixtral(), parse_hardware(HW)

    def speed(ep: int):
        return estimate_speed(
            model, hw, "zero2", micro_batch_size=1, gradient_accumulation_steps=8,
            precision="bf16", seq_len=4096, recompute="none", expert_parallel=ep,
        )  # fmt: skip

    one, eight = speed(1), speed(8)
    assert any("all-to-alls" in a and "expert parallel 8" in a for a in eight.assumptions)
    assert not any("expert parallel" in a for a in one.assumptions)
    # Less gradient traffic (each rank reduces 1/8 of the experts), plus the all-to-alls.
    assert eight.exposed_comm_time_s > 0


def test_a_mixtral_plan_searches_expert_parallelism_on_megatron() -> None:
    model, hw = _mixtral(), parse_hardware(HW)
    brief = brief_from_dict(
        {"model": "mixtral-8x7b", "hardware": HW, "seq_len": 4096,
         "global_batch_size": 256, "task": "pretrain"}
    )  # fmt: skip
    plan = search_strategy(model, hw, brief)
    searched = [*plan.candidates, *(r for r in plan.strategies)]
    assert any(c.expert_parallel > 1 for c in searched) or any("+ep" in k for k in plan.why_not)
    for c in plan.candidates:
        if c.expert_parallel > 1:
            assert c.tensor_parallel * c.pipeline_parallel * c.context_parallel == 1
            assert c.strategy in ("ddp", "zero1", "zero2") and 8 % c.expert_parallel == 0
    pinned = search_strategy(model, hw, brief, SearchOptions(expert_parallel=4))
    assert pinned.setup is not None and pinned.setup.expert_parallel == 4
    assert setup_framework(model, pinned) == "megatron"
    assert pinned.chosen_label.endswith("+ep4")
    with pytest.raises(InputError) as err:
        search_strategy(
            lookup_model("llama-3-8b", 4096), hw,
            brief.model_copy(update={"model": "llama-3-8b"}), SearchOptions(expert_parallel=2),
        )  # fmt: skip
    assert err.value.field == "expert_parallel"
    # A dense model is offered none.
    dense = search_strategy(
        lookup_model("llama-3-8b", 4096), hw, brief.model_copy(update={"model": "llama-3-8b"})
    )
    assert all(c.expert_parallel == 1 for c in dense.candidates)


def test_expert_parallelism_under_another_recipe_is_left_out_and_said() -> None:
    """Its states are priced as DeepSpeed's ZeRO shards them; another recipe is not guessed."""
    model, hw = _mixtral(), parse_hardware(HW)
    brief = brief_from_dict(
        {"model": "mixtral-8x7b", "hardware": HW, "seq_len": 4096, "global_batch_size": 256,
         "task": "pretrain", "recipe": {"framework": "megatron"}}
    )  # fmt: skip
    plan = search_strategy(model, hw, brief)
    assert all(c.expert_parallel == 1 for c in plan.candidates)
    assert any(a.startswith("expert parallelism not searched") for a in plan.assumptions)


def test_megatron_named_for_a_mixture_of_experts_searches_expert_parallelism() -> None:
    """Megatron-DeepSpeed runs DeepSpeed-MoE under the DeepSpeed engine's ZeRO: priced so.

    "pretrain mixtral-8x7b on 4 nodes of 8 H100 with megatron" was priced with Megatron-LM's
    own recipe, for which expert parallelism is not priced, so the one launcher that runs it
    got no expert split (ddp+tp2+pp8, while the same request without the wish got zero2+ep8).
    """
    model, hw = _mixtral(), parse_hardware(HW)
    brief = brief_from_dict(
        {"model": "mixtral-8x7b", "hardware": HW, "seq_len": 4096, "global_batch_size": 256,
         "task": "pretrain", "framework": "megatron"}
    )  # fmt: skip
    plan = search_strategy(model, hw, brief)
    assert any(c.expert_parallel > 1 for c in plan.candidates)
    assert not any(a.startswith("expert parallelism not searched") for a in plan.assumptions)


def test_tensor_parallelism_for_a_mixture_of_experts_is_not_autotp() -> None:
    """AutoTP splits nn.Linear layers; transformers 5 holds Mixtral's experts as fused tensors.

    The experts would stay whole on every tensor-parallel rank (deepspeed/module_inject/
    auto_tp.py replaces nn.Linear and embeddings only), so a MoE's tensor split runs on
    Megatron-DeepSpeed, while a dense Hugging Face model of the same shape keeps AutoTP.
    """
    from tools.research.splits import autotp_shards, split_framework

    mixtral = lookup_model("mixtral-8x7b", 4096)
    dense = lookup_model("mistral-7b", 4096)
    assert not autotp_shards(mixtral) and autotp_shards(dense)
    assert split_framework(mixtral, "zero1", tp=2) == "megatron"
    assert split_framework(dense, "zero1", tp=2) == "deepspeed"
    brief = brief_from_dict(
        {
            "goal": "x",
            "model": "mixtral-8x7b",
            "seq_len": 4096,
            "global_batch_size": 256,
            "hardware": "4x8xH100-80GB",
            "framework": "deepspeed",
            "pins": {"tensor_parallel": 2},
        }
    )
    plan = search_strategy(mixtral, parse_hardware("4x8xH100-80GB"), brief)
    assert plan.tensor_parallel == 1  # the pin is refused, saying why
    assert any("AutoTP does not split a mixture of experts" in n for n in plan.not_honoured)


def test_pipeline_stages_hold_their_share_of_the_experts() -> None:
    # A stage holds ceil(L/p) of the layers' experts: with p = 4 the stage's parameters less
    # its experts stay positive (the whole model's experts were subtracted before).
    from tools.planning.parallel import params_per_rank, stage_expert_params

    model = _mixtral()
    experts = expert_params(model)
    assert stage_expert_params(model, 1, 4) == experts // 4
    assert stage_expert_params(model, 2, 1) == -(-experts // 2)
    here = params_per_rank(model, 1, 4, 8)
    assert 0 < here < params_per_rank(model, 1, 4, 1)
    assert (
        params_per_rank(model, 1, 4, 8)
        == params_per_rank(model, 1, 4) - experts // 4 + (experts // 4) // 8
    )


def test_expert_parallel_runs_fewer_taller_expert_gemms_at_the_same_flops() -> None:
    from tools.planning.experts import expert_gemms, expert_shape

    shape = expert_shape(_mixtral())
    assert shape is not None

    def flops(gemms):  # type: ignore[no-untyped-def]
        return sum(2 * m * n * k * count for (m, n, k), count in gemms[1:])

    one, eight = expert_gemms(shape, 4096, 4096, 1), expert_gemms(shape, 4096, 4096, 1, ep=8)
    assert one[1][1] == 2 * 8 and eight[1][1] == 2 * 1  # gate and up: E experts vs E/e
    assert eight[1][0][0] == 8 * one[1][0][0]  # e times the rows each
    assert flops(eight) == flops(one)


def test_a_pipeline_stage_holds_its_own_layers_share_of_the_experts() -> None:
    """Under pipeline 2 a stage holds 16 of Mixtral's 32 layers' experts, 1/e of them per GPU.

    The memory path subtracted the whole model's experts from a stage's parameters, which went
    negative under pipelining (issue 30); counted by hand from the config here.
    """
    from tools.planning.parallel import params_per_rank

    model, hw = _mixtral(), parse_hardware(HW)
    est = estimate_strategy(
        model, hw, "zero1", task="pretrain", micro_batch_size=1, activation_checkpointing=True,
        seq_len=4096, pipeline_parallel=2, expert_parallel=2,
    )  # fmt: skip
    h, i, layers, vocab = 4096, 14336, 32, 32000
    embedding = vocab * h
    # Untied: the output layer sits on the last stage only, not in the body the stages share.
    stage = -(-(model.params - 2 * embedding) * (layers // 2) // layers) + embedding
    stage_experts = (layers // 2) * 8 * 3 * h * i
    held = stage - stage_experts + stage_experts // 2
    assert held > 0 and held == params_per_rank(model, 1, 2, 2)
    # ZeRO-1 keeps every 16-bit weight it holds: 2 bytes each.
    assert est.per_gpu_bytes.params == 2 * held
    assert est.per_gpu_bytes.gradients > 0 and est.per_gpu_bytes.optimizer > 0
    assert any(f"of the stage's {stage_experts:,} expert parameters" in n for n in est.notes)


@pytest.mark.parametrize(
    ("framework", "pins", "degree"),
    [("horovod", {"expert_parallel": 4}, "ep"), ("pytorch_ddp", {"context_parallel": 4}, "cp")],
)
def test_pins_a_replicating_framework_cannot_run_are_kept_on_the_one_that_can(
    framework: str, pins: dict[str, int], degree: str
) -> None:
    """Horovod and DDP run no expert or context split: the plan keeps the pinned degree and
    names the framework that runs it, instead of dropping the pin for another layout."""
    name, seq = ("deepseek-v2-lite", 4096) if degree == "ep" else ("llama-3-8b", 32768)
    hw = parse_hardware("1x8xH100-80GB")
    brief = brief_from_dict(
        {"model": name, "hardware": "1x8xH100-80GB", "seq_len": seq, "global_batch_size": 64,
         "task": "pretrain", "framework": framework, "pins": pins}
    )  # fmt: skip
    plan = search_strategy(lookup_model(name, seq), hw, brief)
    assert getattr(plan.chosen_setup, degree) == 4, plan.chosen_label
    assert plan.assumptions[0].startswith("pinned by the request:")
    assert any(
        a.startswith(f"{framework} runs no setup with the pinned degrees") for a in plan.assumptions
    )
    assert not any("does not fit" in line for line in plan.not_honoured), plan.not_honoured
