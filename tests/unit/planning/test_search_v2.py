"""The full search (issue 17): every layout searched, pins filled, the ``estimate`` contract.

The speed model's figures change as it is refined; these tests check relations (orderings,
divisibility, exit codes, keys), not its numbers.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from inproc import run_main

from tools.core.errors import InputError
from tools.core.strategies import MIN_HEADROOM, OFFLOAD_STRATEGIES, RECOMPUTE_POLICIES
from tools.intake.brief import brief_from_dict
from tools.intake.network_text import network_fields
from tools.planning import SearchOptions, capacity_bytes, estimate_strategy, search_strategy
from tools.research.hardware import hardware_for_brief, parse_hardware
from tools.research.model_catalog import lookup_model

ROOT = Path(__file__).resolve().parents[3]
CANDIDATE_KEYS = {
    "strategy",
    "tensor_parallel",
    "pipeline_parallel",
    "data_parallel",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "checkpointing",
    "per_gpu_bytes",
    "fits",
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "virtual_stages",
    "context_parallel",
    # The DESIGN.md contract's three memory quantities.
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "device_used_bytes",
    # Layers per pipeline stage where the pipeline degree does not divide them ([] else).
    "stage_layers",
    # Ranks a mixture of experts' routed experts are split over (1: none).
    "expert_parallel",
}
BYTES_KEYS = {"params", "gradients", "optimizer", "activations", "buffers", "total"}
# What the estimate JSON held before this search; every key stays.
OLD_KEYS = {
    "strategies",
    "chosen",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "activation_checkpointing",
    "capacity_bytes",
    "assumptions",
    "why_not",
    "smallest_fitting_hardware",
    "binding",
    "fit_options",
    "tensor_parallel",
    "pipeline_parallel",
}


def _estimate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_main("estimate", *args, cwd=cwd)


def _brief(model: str, hardware: str, seq: int, batch: int, task: str = "pretrain", **extra):
    return brief_from_dict(
        {
            "model": model,
            "hardware": hardware,
            "seq_len": seq,
            "global_batch_size": batch,
            "task": task,
            **extra,
        }
    )


def _plan(model: str, hardware: str, seq: int, batch: int, task: str = "pretrain", **pins):
    brief = _brief(model, hardware, seq, batch, task)
    hw = parse_hardware(hardware)
    return search_strategy(lookup_model(model, seq), hw, brief, SearchOptions(**pins)), hw


def test_estimate_json_keeps_its_keys_and_gains_setup_and_ranked_candidates(
    tmp_path: Path,
) -> None:
    out = tmp_path / "e.json"
    res = _estimate(
        "--model", "llama-3-8b", "--hardware", "1x8xA100-80GB", "--task", "finetune",
        "--seq-len", "4096", "--global-batch", "64", "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    assert OLD_KEYS | {"setup", "candidates"} <= set(data)
    cands = data["candidates"]
    assert len(cands) > 1
    for c in [data["setup"], *cands]:
        assert set(c) == CANDIDATE_KEYS
        assert set(c["per_gpu_bytes"]) == BYTES_KEYS
        assert c["checkpointing"] in RECOMPUTE_POLICIES
        assert c["tensor_parallel"] * c["pipeline_parallel"] * c["data_parallel"] == 8
        assert c["micro_batch_size"] * c["gradient_accumulation_steps"] * c["data_parallel"] == 64
    # Best first, the chosen setup on top, and it is the plan's choice.
    top = [c["tokens_per_s"] for c in cands[:10]]
    assert top == sorted(top, reverse=True)
    assert cands[0] == data["setup"] and data["setup"]["fits"]
    assert data["setup"]["strategy"] == data["chosen"]
    assert data["setup"]["tensor_parallel"] == data["tensor_parallel"]
    # Cluster tokens/s: one optimizer step's tokens over its step time.
    s = data["setup"]
    assert s["tokens_per_s"] == pytest.approx(64 * 4096 / s["step_time_s"], rel=1e-6)
    # The runners-up are listed on the terminal too, with their margin to the best.
    assert "best setups searched" in res.stdout and "margin" in res.stdout


def test_every_family_that_lost_says_why_with_a_margin() -> None:
    plan, _ = _plan("llama-3-8b", "1x8xA100-80GB", 4096, 64, "finetune")
    assert plan.why_not
    for label, why in plan.why_not.items():
        assert label != plan.chosen_label
        assert ("% slower" in why or "no faster than" in why) or (
            "does not fit" in why and "GB >" in why and "usable" in why
        ), (label, why)
    # Model-parallel families are searched even though data parallelism fits.
    assert any("+tp" in label for label in plan.why_not)
    assert any("+pp" in label for label in plan.why_not)


def test_all_five_pins_give_exactly_that_setup() -> None:
    pins = {
        "strategies": ["zero1"],
        "tensor_parallel": 2,
        "pipeline_parallel": 2,
        "micro_batch_size": 2,
        "recompute": "selective",
    }
    plan, hw = _plan("llama-3-8b", "1x8xA100-80GB", 4096, 64, "finetune", **pins)
    s = plan.setup
    assert s is not None
    assert (s.strategy, s.tensor_parallel, s.pipeline_parallel) == ("zero1", 2, 2)
    assert (s.micro_batch_size, s.checkpointing, s.data_parallel) == (2, "selective", 2)
    assert s.gradient_accumulation_steps == 64 // (2 * 2)
    assert {(c.strategy, c.tensor_parallel, c.pipeline_parallel) for c in plan.candidates} == {
        ("zero1", 2, 2)
    }
    assert {(c.micro_batch_size, c.checkpointing) for c in plan.candidates} == {(2, "selective")}
    # The memory is the memory model's for exactly that setup.
    again = estimate_strategy(
        lookup_model("llama-3-8b", 4096), hw, "zero1", task="finetune", seq_len=4096,
        micro_batch_size=2, selective_recompute=True, tensor_parallel=2, pipeline_parallel=2,
        gradient_accumulation_steps=16,
    )  # fmt: skip
    assert s.per_gpu_bytes["total"] == again.per_gpu_bytes.total


def test_partial_pins_are_kept_and_the_rest_is_searched() -> None:
    plan, _ = _plan("llama-3-8b", "1x8xA100-80GB", 4096, 64, "finetune", tensor_parallel=2)
    assert plan.setup is not None and plan.setup.tensor_parallel == 2
    assert {c.tensor_parallel for c in plan.candidates} == {2}
    # Strategy, pipeline degree and micro-batch were all searched.
    assert len({c.strategy for c in plan.candidates}) > 1
    assert len({c.pipeline_parallel for c in plan.candidates}) > 1
    assert len({c.micro_batch_size for c in plan.candidates}) > 1
    pinned, _ = _plan("llama-3-8b", "1x8xA100-80GB", 4096, 64, "finetune", recompute="full")
    assert {c.checkpointing for c in pinned.candidates} == {"full"}


def test_the_briefs_pins_reach_the_same_search() -> None:
    brief = _brief("llama-3-8b", "1x8xA100-80GB", 4096, 64, "finetune", pins={"tensor_parallel": 4})
    hw = hardware_for_brief(brief)
    plan = search_strategy(lookup_model("llama-3-8b", 4096), hw, brief)
    assert plan.tensor_parallel == 4 and plan.setup is not None
    assert {c.tensor_parallel for c in plan.candidates} == {4}
    assert plan.assumptions[0].startswith("pinned by the request")


def test_global_batch_divides_by_the_data_parallel_degree_not_the_world(tmp_path: Path) -> None:
    # 256 sequences on 512 GPUs: data parallel 128 at TP 2 x PP 2.
    plan, _ = _plan(
        "llama-3-70b", "64x8xH100-80GB", 4096, 256, tensor_parallel=2, pipeline_parallel=2
    )
    s = plan.setup
    assert s is not None and (s.tensor_parallel, s.pipeline_parallel, s.data_parallel) == (
        2,
        2,
        128,
    )
    assert s.micro_batch_size * s.gradient_accumulation_steps == 2
    # Unpinned, only the layouts whose data-parallel degree divides 256 are searched.
    free, hw = _plan("llama-3-70b", "64x8xH100-80GB", 4096, 256)
    assert free.candidates
    for c in free.candidates:
        assert c.tensor_parallel * c.pipeline_parallel * c.data_parallel == hw.world_size
        assert 256 % c.data_parallel == 0 and c.data_parallel < hw.world_size
    out = tmp_path / "e.json"
    res = _estimate(
        "--model", "llama-3-70b", "--hardware", "64x8xH100-80GB", "--seq-len", "4096",
        "--global-batch", "256", "--task", "pretrain", "--tp", "2", "--pp", "2",
        "--strategy", "zero1", "--micro-batch", "1", "--checkpointing", "full",
        "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    setup = json.loads(out.read_text())["setup"]
    assert (setup["tensor_parallel"], setup["pipeline_parallel"], setup["data_parallel"]) == (
        2,
        2,
        128,
    )
    assert (setup["micro_batch_size"], setup["gradient_accumulation_steps"]) == (1, 2)


@pytest.mark.parametrize(
    ("flags", "flag", "words"),
    [
        (["--tp", "16"], "--tp", "exceeds the 8 GPUs of one node"),
        (["--tp", "3"], "--tp", "attention heads"),
        (["--pp", "3"], "--pp", "must divide the 16 GPUs"),
        # Stages need not divide the layers (uneven stages), but each needs one.
        (["--pp", "33"], "--pp", "exceed the 32 layers"),
    ],
)
def test_a_setup_that_cannot_run_is_exit_2_naming_the_flag(
    tmp_path: Path, flags: list[str], flag: str, words: str
) -> None:
    res = _estimate(
        "--model", "llama-3-8b", "--hardware", "2x8xH100-80GB", "--seq-len", "2048",
        "--global-batch", "64", *flags, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{flag}:" in lines[0] and words in lines[0], lines


def test_bad_pins_in_the_library_name_their_field() -> None:
    model, hw = lookup_model("llama-3-8b", 2048), parse_hardware("2x8xH100-80GB")
    brief = _brief("llama-3-8b", "2x8xH100-80GB", 2048, 64)
    cases = [
        ({"tensor_parallel": 16}, "tensor_parallel"),
        ({"pipeline_parallel": 5}, "pipeline_parallel"),
        ({"pipeline_parallel": 32}, "pipeline_parallel"),  # 32 does not divide the 16 GPUs
        ({"tensor_parallel": 2, "pipeline_parallel": 2, "strategies": ["zero3"]}, "strategy"),
        ({"recompute": "some"}, "checkpointing"),
    ]
    for pins, fld in cases:
        with pytest.raises(InputError) as err:
            search_strategy(model, hw, brief, SearchOptions(**pins))
        assert err.value.field == fld, (pins, err.value)
    # 20 sequences do not split over the 8 data-parallel ranks of TP 2 on 16 GPUs.
    odd = _brief("llama-3-8b", "2x8xH100-80GB", 2048, 20)
    with pytest.raises(InputError) as err:
        search_strategy(model, hw, odd, SearchOptions(tensor_parallel=2))
    assert err.value.field == "global_batch_size" and "data-parallel degree 8" in err.value.message


def test_405b_on_16x8_h100_finds_a_fitting_tensor_x_pipeline_x_data_setup() -> None:
    plan, hw = _plan("llama-3.1-405b", "16x8xH100-80GB", 8192, 128)
    limit = (1 - MIN_HEADROOM) * capacity_bytes(hw)
    split = [
        c
        for c in plan.candidates
        if c.fits
        and c.tensor_parallel * c.pipeline_parallel >= 8
        and c.strategy not in OFFLOAD_STRATEGIES
    ]
    assert split, [(c.strategy, c.tensor_parallel, c.pipeline_parallel) for c in plan.candidates]
    for c in split:
        assert c.per_gpu_bytes["total"] <= limit
        assert c.tensor_parallel * c.pipeline_parallel * c.data_parallel == 128
        assert c.tensor_parallel <= 8 and 126 % c.pipeline_parallel == 0
    assert plan.setup is not None and plan.setup.fits


def test_recompute_is_searched_and_chosen_when_none_does_not_fit() -> None:
    # LoRA on llama-3-8b at 8k tokens on one 80 GB GPU: without recompute the activations of
    # one sequence do not fit; the search picks a recompute policy rather than giving up.
    plan, hw = _plan("llama-3-8b", "1x1xA100-80GB", 8192, 8, "lora")
    assert plan.setup is not None and plan.setup.fits
    assert plan.setup.checkpointing in ("selective", "full")
    assert plan.activation_checkpointing
    limit = (1 - MIN_HEADROOM) * capacity_bytes(hw)
    bare = estimate_strategy(
        lookup_model("llama-3-8b", 8192), hw, plan.chosen, task="lora", seq_len=8192,
        micro_batch_size=1, gradient_accumulation_steps=8,
    )  # fmt: skip
    assert bare.per_gpu_bytes.total > limit
    assert all(c.checkpointing != "none" for c in plan.candidates)


def test_selective_recompute_only_where_the_launcher_runs_it() -> None:
    """Hugging Face gradient checkpointing re-runs whole layers: data-parallel and AutoTP plans
    get none or full; pipeline plans (torchtitan, Megatron) may get selective; a pin is kept."""

    from tools.core.setup import Setup
    from tools.planning.ranking import recompute_policies

    every = list(RECOMPUTE_POLICIES)
    assert recompute_policies(every, Setup()) == ["none", "full"]
    assert recompute_policies(every, Setup(tp=4)) == ["none", "full"]
    assert recompute_policies(every, Setup(pp=2)) == every
    assert recompute_policies(["selective"], Setup()) == ["selective"]
    plan, _ = _plan("llama-3-8b", "1x8xH100-80GB", 8192, 64, "pretrain")
    for c in plan.candidates:
        if c.pipeline_parallel == 1:
            assert c.checkpointing != "selective", c
    brief = _brief("llama-3-8b", "1x8xH100-80GB", 8192, 64, "pretrain")
    hw = parse_hardware("1x8xH100-80GB")
    pinned = search_strategy(
        lookup_model("llama-3-8b", 8192), hw, brief, SearchOptions(recompute="selective", tensor_parallel=1, pipeline_parallel=1),
    )  # fmt: skip
    assert pinned.setup is not None and pinned.setup.checkpointing == "selective"


def test_offload_is_chosen_when_it_is_the_only_fit() -> None:
    brief = _brief("llama-2-13b", "1x1xA100-40GB", 4096, 32, "finetune")
    hw = parse_hardware("1x1xA100-40GB").model_copy(update={"ram_gb": 1024})
    plan = search_strategy(lookup_model("llama-2-13b", 4096), hw, brief)
    assert plan.chosen in OFFLOAD_STRATEGIES and plan.setup is not None and plan.setup.fits
    assert all(c.strategy in OFFLOAD_STRATEGIES for c in plan.candidates)
    for name in ("ddp", "zero1", "zero2", "zero3"):
        assert "does not fit" in plan.why_not[name]


def test_interconnect_flag_reads_names_counts_and_rates_per_gpu(tmp_path: Path) -> None:
    assert network_fields("ib200", 8) == {"interconnect": "ib200"}
    assert network_fields("8x400G", 8) == {"nics_per_node": 8, "nic_gbps": 400.0}
    assert network_fields("400Gbps per GPU", 8) == {"nics_per_node": 8, "nic_gbps": 400.0}
    assert network_fields("200G per node", 8) == {"nics_per_node": 1, "nic_gbps": 200.0}
    with pytest.raises(InputError) as err:
        network_fields("fast", 8)
    assert err.value.field == "--interconnect"
    common = ["--model", "llama-3-8b", "--hardware", "4x8xH100-80GB", "--seq-len", "2048"]
    common += ["--global-batch", "256", "--task", "pretrain", "--strategy", "ddp", "--tp", "1"]
    common += ["--pp", "1", "--micro-batch", "1", "--checkpointing", "none"]
    speeds = {}
    for net in ("eth25", "8x400G"):
        out = tmp_path / f"{net}.json"
        res = _estimate(*common, "--interconnect", net, "--json", str(out), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        speeds[net] = json.loads(out.read_text())["setup"]["tokens_per_s"]
    # Eight 400 Gb/s cards per node move DDP's gradients faster than one 25 GbE link.
    assert speeds["8x400G"] > speeds["eth25"]
    bad = _estimate(*common, "--interconnect", "fast", cwd=tmp_path)
    assert bad.returncode == 2 and "--interconnect:" in bad.stderr


def test_context_parallel_runs_where_a_launcher_runs_it() -> None:
    """Ring attention over CP ranks runs on torchtitan (its Llama models); DeepSpeed has none.

    Other models get DeepSpeed-Ulysses on Megatron-DeepSpeed, beside data parallelism only.
    """
    from tools.artifacts.deepspeed_config import ConfigError, emit_deepspeed_config
    from tools.research.framework import setup_framework

    # A Mistral model at 32k tokens: no torchtitan flavor, so Ulysses, never with a t x p split.
    plan, _ = _plan("mistral-7b", "1x8xH100-80GB", 32768, 8, "pretrain")
    ulysses = [c for c in plan.candidates if c.context_parallel > 1]
    assert all(c.tensor_parallel * c.pipeline_parallel == 1 for c in ulysses)
    mistral = lookup_model("mistral-7b", 32768)
    if plan.context_parallel > 1:
        assert setup_framework(mistral, plan) == "megatron"
    # Llama 3.1 8B at 64k tokens with CP pinned: torchtitan runs it; a DeepSpeed config refuses.
    # (Llama 3 8B was here: torchtitan's flavor 8B is Llama 3.1, RoPE scaling and all, so
    # torchtitan would train another model; tests/unit/artifacts/test_torchtitan_config.py.)
    brief = _brief("llama-3.1-8b", "1x8xH100-80GB", 65536, 8, "pretrain")
    hw = parse_hardware("1x8xH100-80GB")
    model = lookup_model("llama-3.1-8b", 65536)
    cp = search_strategy(model, hw, brief, SearchOptions(context_parallel=2, tensor_parallel=1, pipeline_parallel=1))  # fmt: skip
    assert cp.setup is not None and cp.setup.context_parallel == 2 and cp.context_parallel == 2
    assert cp.setup.data_parallel == 4
    assert setup_framework(model, cp) == "torchtitan"
    with pytest.raises(ConfigError) as err:
        emit_deepspeed_config(cp, model, hw, brief)
    assert err.value.key == "context_parallel"
