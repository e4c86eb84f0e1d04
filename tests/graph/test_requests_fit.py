"""When it does not fit, offer what would (issue 16 part 6), and the low-efficiency warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inproc import run_main

from tools.core.schemas import FrameworkChoice
from tools.intake.brief import brief_from_dict
from tools.planning import SearchOptions, search_strategy
from tools.planning.alternatives import fit_line, qlora_base_saving
from tools.planning.states import lora_adapter_params
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model
from tools.review.checks import check_efficiency, check_memory

ROOT = Path(__file__).resolve().parents[2]
DEEPSPEED = FrameworkChoice(primary="deepspeed", stack=["pytorch", "deepspeed"], rationale="")


def _plan(model: str, hardware: str, task: str = "finetune", batch: int = 32, **extra):
    brief = brief_from_dict(
        {"model": model, "hardware": hardware, "task": task, "global_batch_size": batch, **extra}
    )
    hw = parse_hardware(hardware, extra.get("interconnect"))
    return search_strategy(lookup_model(model, brief.seq_len), hw, brief), hw


# (model, hardware, task, binding starts with, options that fit, options that do not)
REQUESTS = [
    (
        "mistral-7b",
        "1x2xRTX3090",
        "finetune",
        "host RAM for offload",
        {"LoRA", "QLoRA", "more GPUs", "larger GPU"},
        {"8-bit Adam", "offload"},
    ),
    (
        "llama-3-70b",
        "1x1xA100-80GB",
        "finetune",
        "host RAM for offload",
        {"QLoRA", "more GPUs"},
        {"LoRA", "8-bit Adam"},
    ),
    ("llama-3-70b", "1x1xA100-80GB", "lora", "host RAM for offload", {"QLoRA", "more GPUs"}, set()),
    (
        "llama-3-8b",
        "1x1xRTX4090",
        "finetune",
        "host RAM for offload",
        {"QLoRA", "more GPUs"},
        {"LoRA", "8-bit Adam"},
    ),
    ("qwen2.5-7b", "1x1xT4", "finetune", "host RAM for offload", {"QLoRA", "more GPUs"}, {"LoRA"}),
    (
        "llama-3.1-405b",
        "1x8xH100-80GB",
        "finetune",
        "host RAM for offload",
        {"more GPUs"},
        {"LoRA", "QLoRA", "8-bit Adam"},
    ),
    # Pretraining: no adapters to offer, only hardware.
    (
        "mistral-7b",
        "1x2xRTX3090",
        "pretrain",
        "host RAM for offload",
        {"more GPUs"},
        {"8-bit Adam"},
    ),
]


@pytest.mark.parametrize(("model", "hardware", "task", "binds", "fit", "no_fit"), REQUESTS)
def test_no_fit_names_the_binding_resource_and_what_would_fit(
    model: str, hardware: str, task: str, binds: str, fit: set[str], no_fit: set[str]
) -> None:
    plan, _ = _plan(model, hardware, task)
    assert not plan.chosen_row.fits
    assert plan.binding is not None and plan.binding.startswith(binds)
    options = {o.name: o for o in plan.fit_options}
    assert {n for n, o in options.items() if o.fits} >= fit
    assert not {n for n, o in options.items() if o.fits} & no_fit
    for name in ("LoRA", "QLoRA", "8-bit Adam"):
        if name in options:
            assert options[name].gb_per_gpu and options[name].gb_per_gpu > 0
    if task == "pretrain":
        assert "LoRA" not in options and "QLoRA" not in options
    if task == "lora":
        assert "LoRA" not in options  # already LoRA: QLoRA is the next step
    line = fit_line(plan.binding, plan.fit_options)
    assert "\n" not in line and line.startswith("does not fit: ")
    assert len(line) < 700


def test_3090_request_offers_lora_and_qlora_with_figures_and_the_ram_offload_needs() -> None:
    plan, hw = _plan("mistral-7b", "1x2xRTX3090")
    options = {o.name: o for o in plan.fit_options}
    # QLoRA's 4-bit base is far smaller than LoRA's bf16 one; both under 90% of 24 GB.
    assert options["QLoRA"].gb_per_gpu < options["LoRA"].gb_per_gpu <= 0.9 * 24
    # The host RAM offload needs is more than the 96 GB assumed (2 x 48 GB of GPU memory).
    assert options["offload"].host_ram_gb > 96
    assert "96 GB (assumed" in plan.binding
    # More GPUs of the same type: the smallest count that fits, not a jump to a cluster.
    assert options["more GPUs"].setup.startswith("1x") and options["more GPUs"].setup.endswith(
        "RTX3090"
    )
    finding = check_memory(plan, DEEPSPEED)[0]
    assert finding.severity == "error"
    assert finding.message.startswith("does not fit: host RAM for offload")
    assert "LoRA (" in finding.message and "QLoRA (" in finding.message
    assert "GB/GPU" in finding.message


def test_enough_host_ram_makes_offload_fit_so_no_alternatives() -> None:
    # With offload's host RAM given, mistral-7b on 2 RTX 3090 fits; the plan offers nothing.
    brief = brief_from_dict({"model": "mistral-7b", "hardware": "1x2xRTX3090"})
    hw = parse_hardware("1x2xRTX3090").model_copy(update={"ram_gb": 512})
    plan = search_strategy(lookup_model("mistral-7b", brief.seq_len), hw, brief)
    assert plan.chosen_row.fits and plan.binding is None and plan.fit_options == []


def test_lora_adapter_count_llama3_8b_rank16_all_projections_by_hand() -> None:
    model = lookup_model("llama-3-8b", 2048)
    h, kv, i, r, layers = 4096, 1024, 14336, 16, 32
    per_layer = r * (
        (h + h)  # q
        + (h + kv)  # k (8 KV heads of 128)
        + (h + kv)  # v
        + (h + h)  # o
        + (h + i)  # gate
        + (h + i)  # up
        + (i + h)  # down
    )
    assert lora_adapter_params(model, 16) == layers * per_layer == 41_943_040
    assert lora_adapter_params(model, 16, ("q", "k", "v", "o")) == 32 * 16 * (6 * h + 2 * kv)


def test_gpt_style_mlp_has_no_gate_adapter() -> None:
    model = lookup_model("gpt2", 1024)
    h, r = 768, 16
    assert lora_adapter_params(model, r, ("gate",)) == 0
    assert lora_adapter_params(model, r, ("up", "down")) == 12 * r * 2 * (h + 4 * h)


def test_qlora_base_is_about_half_a_byte_per_quantized_weight() -> None:
    model = lookup_model("llama-3-70b", 2048)
    kept = 2 * model.vocab * model.hidden  # untied embeddings and LM head stay bf16
    saving = qlora_base_saving(model)
    # 2 bytes -> 4 bits plus double-quantized constants (0.127 bits, QLoRA sec. 3) per
    # quantized weight, less one dequantized h x i weight.
    nf4 = (4 + 0.127) / 8
    assert saving == int((2 - nf4) * (model.params - kept)) - 2 * model.hidden * model.intermediate


def test_comm_bound_plan_gets_a_low_efficiency_warning_and_a_healthy_one_does_not() -> None:
    # ZeRO-3 across 16 nodes on 25 GbE Ethernet with a small global batch.
    brief = brief_from_dict(
        {"model": "llama-3-8b", "hardware": "16x8xA100-80GB", "global_batch_size": 128}
    )
    hw = parse_hardware("16x8xA100-80GB", "eth25")
    bad = search_strategy(
        lookup_model("llama-3-8b", 2048),
        hw,
        brief,
        SearchOptions(strategies=["zero3"], tensor_parallel=1, pipeline_parallel=1),
    )
    findings = check_efficiency(bad, hw)
    assert len(findings) == 1
    warning = findings[0]
    assert warning.severity == "warning" and warning.check == "efficiency"
    assert "communication-bound" in warning.message
    assert "larger global batch" in warning.fix and "fewer nodes" in warning.fix
    assert "ZeRO++ hpZ" in warning.fix and "tensor parallelism inside a node" in warning.fix
    # The search's own choice there avoids most of the traffic (model parallelism inside the
    # nodes shrinks what crosses the Ethernet): faster than the pinned ZeRO-3, and any warning
    # left carries the ZeRO-3-only fix only for ZeRO-3.
    chosen, hw = _plan("llama-3-8b", "16x8xA100-80GB", batch=128, interconnect="eth25")
    assert chosen.speed is not None and bad.speed is not None
    assert chosen.speed.tokens_per_s > bad.speed.tokens_per_s
    for finding in check_efficiency(chosen, hw):
        assert chosen.chosen == "zero3" or "hpZ" not in finding.fix
    healthy, hw = _plan("llama-3-8b", "1x8xH100-80GB", batch=64)
    assert healthy.speed is not None and healthy.speed.mfu >= 0.15
    assert check_efficiency(healthy, hw) == []


def test_cli_plan_of_the_3090_request_names_host_ram_and_offers_lora(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    proc = run_main(
        "plan",
        "we have 2 RTX 3090 and want to fine-tune mistral-7b",
        "--no-smoke",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("does not fit: ")]
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("does not fit: host RAM for offload")
    assert "LoRA (" in lines[0] and "QLoRA (" in lines[0]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["memory"]["binding"].startswith("host RAM for offload")
    assert {o["name"] for o in plan["memory"]["fit_options"] if o["fits"]} >= {"LoRA", "QLoRA"}
    report = (out / "report.md").read_text()
    assert "What would fit instead" in report and "- QLoRA: fits (" in report
    messages = [f["message"] for f in plan["review"]["findings"]]
    assert any(m.startswith("does not fit: host RAM for offload") for m in messages)
