"""Strategy search: fastest setup that fits with headroom, no needless offload, reasons for the rest."""

from __future__ import annotations

import pytest

from tools.core.strategies import MIN_HEADROOM, OFFLOAD_STRATEGIES
from tools.intake.brief import brief_from_dict
from tools.planning import (
    SearchOptions,
    capacity_bytes,
    estimate_speed,
    estimate_strategy,
    model_parallel_setups,
    search_strategy,
)
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model
from tools.research.splits import setup_framework


def _search(model: str, hardware: str, seq_len: int, batch: int, task: str = "finetune"):
    brief = brief_from_dict(
        {
            "model": model,
            "hardware": hardware,
            "seq_len": seq_len,
            "global_batch_size": batch,
            "task": task,
        }
    )
    hw = parse_hardware(hardware)
    return search_strategy(lookup_model(model, seq_len), hw, brief), hw


def test_llama_8b_on_8_a100_picks_the_fastest_fitting_setup() -> None:
    plan, hw = _search("llama-3-8b", "1x8xA100-80GB", 4096, 64)
    rows = {s.label: s for s in plan.strategies}
    chosen = plan.chosen_row
    assert chosen is not None and plan.setup is not None
    cap = capacity_bytes(hw)
    assert chosen.per_gpu_bytes.total <= (1 - MIN_HEADROOM) * cap
    fitting = [s for s in plan.strategies if s.per_gpu_bytes.total <= (1 - MIN_HEADROOM) * cap]
    assert chosen.tokens_per_s == max(s.tokens_per_s or 0 for s in fitting)
    assert chosen.tokens_per_s == max(c.tokens_per_s or 0 for c in plan.candidates if c.fits)
    assert set(rows) - {plan.chosen_label} <= set(plan.why_not)
    # Offload competes on speed: it loses here by a margin, not by a rule.
    assert "slower" in plan.why_not["zero3_offload_all"]
    assert "does not fit" in plan.why_not["ddp"]
    assert plan.micro_batch_size * plan.gradient_accumulation_steps * plan.setup.data_parallel == 64


def test_offload_only_when_nothing_else_fits() -> None:
    plan, hw = _search("llama-3-8b", "1x1xRTX4090", 2048, 16, task="lora")
    cap = capacity_bytes(hw)
    if plan.chosen in OFFLOAD_STRATEGIES:
        assert all(
            s.per_gpu_bytes.total > (1 - MIN_HEADROOM) * cap
            for s in plan.strategies
            if s.name not in OFFLOAD_STRATEGIES
        )


def test_nothing_fits_says_why() -> None:
    plan, _ = _search("llama-3.1-405b", "8x8xH100-80GB", 8192, 512, task="pretrain")
    assert plan.assumptions[0].startswith("nothing fits")
    assert all("over 90%" in why for why in plan.why_not.values())


def test_forced_choices_are_respected() -> None:
    plan, _ = _search("llama-3-8b", "1x8xA100-80GB", 4096, 64)
    brief = brief_from_dict(
        {
            "model": "llama-3-8b",
            "hardware": "1x8xA100-80GB",
            "seq_len": 4096,
            "global_batch_size": 64,
        }
    )
    forced = search_strategy(
        lookup_model("llama-3-8b", 4096),
        parse_hardware("1x8xA100-80GB"),
        brief,
        SearchOptions(
            micro_batch_size=1,
            activation_checkpointing=True,
            strategies=["zero3", "zero3_offload_all"],
        ),
    )
    assert (
        forced.chosen == "zero3"
        and forced.micro_batch_size == 1
        and forced.activation_checkpointing
    )


def test_cpu_only_target_keeps_the_memory_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    # A CPU-only machine whatever this one has, and no driver tool started to find out.
    from tools.research import gpu_probe, hardware

    monkeypatch.setattr(gpu_probe, "probe_gpus", lambda: gpu_probe.GPUProbe())
    monkeypatch.setattr(hardware, "_torch_cuda", lambda: (False, 0, None))
    plan, _ = _search("gpt2", "local", 256, 8, task="pretrain")
    assert plan.why_not == {} and plan.chosen in {"ddp", "zero1", "zero2", "zero3"}


@pytest.mark.parametrize(
    ("model", "hardware", "seq", "batch", "task"),
    [
        ("gpt2", "1x1xT4", 1024, 32, "pretrain"),
        ("llama-3-8b", "1x8xA100-80GB", 4096, 64, "finetune"),
        ("llama-3-8b", "1x1xRTX4090", 2048, 16, "lora"),
        ("llama-2-13b", "1x1xA100-40GB", 4096, 32, "finetune"),
        ("llama-3-70b", "2x8xH100-80GB", 8192, 512, "pretrain"),
        ("llama-3.1-405b", "8x8xH100-80GB", 8192, 512, "pretrain"),
    ],
)
def test_six_reference_cases_give_a_complete_answer(model, hardware, seq, batch, task) -> None:
    plan, _ = _search(model, hardware, seq, batch, task)
    assert plan.chosen in {s.name for s in plan.strategies}
    assert plan.assumptions


# --- tensor/pipeline parallelism when even ZeRO-3 does not fit --------------------------------


def _chosen_row(plan):
    """The chosen row: same-name rows differ by their tensor/pipeline degrees."""
    return next(
        s
        for s in plan.strategies
        if (s.name, s.tensor_parallel, s.pipeline_parallel)
        == (plan.chosen, plan.tensor_parallel, plan.pipeline_parallel)
    )


def test_70b_pretraining_on_32_h100_needs_tensor_and_pipeline_parallelism() -> None:
    """ZeRO-3 alone needs ~92 GB per GPU at seq 16384; a Megatron split fits, and beats offload."""
    # Llama 3.1 70B, the model torchtitan's flavor 70B builds (Llama 3 70B has no flavor:
    # tools/research/titan_flavors.py; without context parallelism its plan is ZeRO-3 offload).
    plan, hw = _search("llama-3.1-70b", "4x8xH100-80GB", 16384, 512, task="pretrain")
    model = lookup_model("llama-3.1-70b", 16384)
    tp, pp = plan.tensor_parallel, plan.pipeline_parallel
    setup = plan.setup
    assert setup is not None
    cp = setup.context_parallel
    dp = hw.world_size // (tp * pp * cp)
    assert tp * pp * cp > 1
    assert pp == 1 or plan.chosen in ("ddp", "zero1")  # a pipeline takes ZeRO-1 at most
    assert tp in (1, 2, 4, 8) and tp <= hw.gpus_per_node
    assert model.heads % tp == 0 and model.kv_heads % tp == 0 and model.layers % pp == 0
    assert dp == setup.data_parallel and dp * tp * pp * cp == hw.world_size
    assert plan.micro_batch_size * plan.gradient_accumulation_steps * dp == 512

    cap = capacity_bytes(hw)
    rows = {s.label: s for s in plan.strategies}
    chosen = _chosen_row(plan)
    assert chosen.fits and chosen.per_gpu_bytes.total <= (1 - MIN_HEADROOM) * cap
    # Even ZeRO-3 without offload does not fit; offload would, but is predicted slower.
    assert rows["zero3"].per_gpu_bytes.total > (1 - MIN_HEADROOM) * cap
    assert "does not fit" in plan.why_not["zero3"]
    assert rows["zero3_offload_optimizer"].fits
    assert "slower" in plan.why_not["zero3_offload_optimizer"]
    # Every other row says why it lost, keyed by its label.
    assert set(rows) - {chosen.label} <= set(plan.why_not)
    # The plan names what runs its split (tools/research/splits.py), one source for the sentence.
    runs = {"torchtitan": "runs on torchtitan", "deepspeed": "AutoTP"}
    named = runs.get(str(setup_framework(model, plan)), "Megatron-DeepSpeed")
    assert any(named in a for a in plan.assumptions), named

    # The row's numbers are the memory and speed models' for exactly this setup.
    brief = brief_from_dict(
        {"model": "llama-3.1-70b", "hardware": "4x8xH100-80GB", "seq_len": 16384,
         "global_batch_size": 512, "task": "pretrain"}
    )  # fmt: skip
    kw = {
        "micro_batch_size": plan.micro_batch_size,
        "activation_checkpointing": setup.checkpointing == "full",
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
    }
    again = estimate_strategy(
        model,
        hw,
        plan.chosen,
        task="pretrain",
        seq_len=16384 // cp,
        selective_recompute=setup.checkpointing == "selective",
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        **kw,
    )
    assert again.per_gpu_bytes == chosen.per_gpu_bytes
    speed = estimate_speed(
        model,
        hw,
        plan.chosen,
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        seq_len=16384,
        precision=brief.precision,
        recompute=setup.checkpointing,
        virtual_stages=setup.virtual_stages,
        context_parallel=cp,
        **kw,
    )
    assert chosen.tokens_per_s == pytest.approx(speed.tokens_per_s)
    assert setup.tokens_per_s == pytest.approx(speed.tokens_per_s)
    assert speed.tokens_per_step == 512 * 16384
    # Faster than the offload it replaces.
    assert chosen.tokens_per_s > rows["zero3_offload_optimizer"].tokens_per_s


@pytest.mark.parametrize(
    ("model", "hardware", "seq", "batch", "task"),
    [
        ("llama-3-8b", "1x8xA100-80GB", 4096, 64, "finetune"),
        ("llama-3-70b", "4x8xH100-80GB", 2048, 512, "pretrain"),
    ],
)
def test_model_parallelism_is_chosen_only_when_predicted_faster(
    model, hardware, seq, batch, task
) -> None:
    plan, hw = _search(model, hardware, seq, batch, task)
    assert plan.setup is not None and plan.candidates[0] == plan.setup
    best = plan.setup.tokens_per_s or 0
    split = plan.setup.tensor_parallel * plan.setup.pipeline_parallel > 1
    plain = [
        c
        for c in plan.candidates
        if c.fits and c.tensor_parallel * c.pipeline_parallel * c.context_parallel == 1
    ]
    # The search covered both kinds, and a split wins only by being faster (ties go to the
    # simpler data-parallel setup).
    assert plain and any(c.tensor_parallel * c.pipeline_parallel > 1 for c in plan.candidates)
    assert all(
        (c.tokens_per_s or 0) < best if split else (c.tokens_per_s or 0) <= best for c in plain
    )


def test_model_parallel_setups_respect_megatron_constraints() -> None:
    model = lookup_model("llama-3-70b", 8192)
    hw = parse_hardware("4x8xH100-80GB")
    setups = model_parallel_setups(model, hw, ["zero1", "zero2", "zero3"])
    assert setups and all(tp * pp > 1 for _, tp, pp in setups)
    for name, tp, pp in setups:
        assert tp <= 8 and 64 % tp == 0 and 8 % tp == 0 and pp <= 80
        assert 32 % (tp * pp) == 0
        assert pp == 1 or name == "zero1"
    assert ("zero3", 8, 1) in setups and ("zero1", 8, 4) in setups
    assert not any(name == "zero3" and pp > 1 for name, _, pp in setups)
    # 405B has 126 layers: no power of two above 2 divides them, and uneven stages (the first
    # ones a layer longer) give it the pipelines it is trained with (Llama 3: PP 16).
    big = lookup_model("llama-3.1-405b", 8192)
    assert {
        pp for _, _, pp in model_parallel_setups(big, parse_hardware("8x8xH100-80GB"), ["zero1"])
    } == {1, 2, 4, 8, 16, 32, 64}


def test_405b_on_64_h100_still_does_not_fit_and_names_a_cluster_that_does() -> None:
    plan, _ = _search("llama-3.1-405b", "8x8xH100-80GB", 8192, 512, task="pretrain")
    assert any("+tp" in label for label in plan.why_not)
    assert all("over 90%" in why for why in plan.why_not.values())
    assert plan.smallest_fitting_hardware is not None
    nodes = int(plan.smallest_fitting_hardware.split("x")[0])
    assert nodes > 8 and plan.smallest_fitting_hardware.endswith("x8xH100-80GB")


# --- offload and the node's CPU RAM ----------------------------------------------------------


def test_offload_that_overflows_the_nodes_ram_loses_with_a_reason() -> None:
    # 13B full fine-tune on one 40 GB GPU: ZeRO-3 offload keeps ~390 GB on the host (DeepSpeed's
    # estimate_zero3_model_states_mem_needs figure), more than the assumed 80 GB node.
    plan, hw = _search("llama-2-13b", "1x1xA100-40GB", 4096, 32)
    assert plan.assumptions[0].startswith("nothing fits")
    assert "CPU RAM" in plan.why_not["zero3_offload_all"]
    assert "(assumed)" in plan.why_not["zero3_offload_all"]
    assert any("node RAM not given: assumed 80 GB" in a for a in plan.assumptions)
    # A node with 1 TB of RAM holds it: the same offload now fits and is chosen.
    brief = brief_from_dict(
        {"model": "llama-2-13b", "hardware": "1x1xA100-40GB", "seq_len": 4096,
         "global_batch_size": 32}
    )  # fmt: skip
    big_host = hw.model_copy(update={"ram_gb": 1024})
    roomy = search_strategy(lookup_model("llama-2-13b", 4096), big_host, brief)
    assert roomy.chosen in OFFLOAD_STRATEGIES
    row = _chosen_row(roomy)
    assert row.fits and row.cpu_bytes_per_node <= 0.9 * 1024e9


def test_the_chosen_tensor_pipeline_row_is_the_first_of_its_name() -> None:
    """Readers that look the choice up by name (report, reviewer, narrative) find its row."""
    plan, _ = _search("llama-3.1-70b", "4x8xH100-80GB", 16384, 512, task="pretrain")
    first = next(s for s in plan.strategies if s.name == plan.chosen)
    assert first is _chosen_row(plan) and first.tensor_parallel == plan.tensor_parallel
    assert sum(s.name == plan.chosen for s in plan.strategies) == 2  # and the data-parallel one
