"""serve.sh only for a plan that fits, in the plan's weight format (issue 29, item 7).

A plan in which not one sequence fits gets no serve.sh (the plan and the launch notes say why,
and the reviewer takes that as right); a plan that fits carries vLLM's flags for its formats:
``--dtype``, ``--kv-cache-dtype auto`` and the ``--quantization`` that loads the weights at the
bytes the plan counted (fp8, bitsandbytes 4-bit, compressed-tensors INT8). The reviewer catches
a command whose flags do not match the plan's format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tools.artifacts.serving import emit_serving
from tools.core.schemas import SmokeResult, TrainingBrief
from tools.planning.inference import plan_inference
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model
from tools.review.inference import check_inference

SKIPPED = SmokeResult(status="skipped", reason="inference plan: no training smoke run")


def _plan(hardware: str, **brief: Any) -> tuple[Any, Any, Any]:
    model = lookup_model("llama-3-70b", 8192)
    hw = parse_hardware(hardware)
    return (
        plan_inference(model, hw, TrainingBrief(model="llama-3-70b", task="inference", **brief)),
        model,
        hw,
    )


def _flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def test_a_plan_where_nothing_fits_gets_no_serve_sh_and_says_why(tmp_path: Path) -> None:
    # 70B in bf16 is 141 GB of weights: nothing fits on one 80 GB GPU.
    plan, model, hw = _plan("1x1xH100-80GB", weight_dtype="bf16")
    assert plan.max_concurrency < 1
    launch = emit_serving(tmp_path, plan)
    assert not (tmp_path / "serve.sh").exists() and launch.files == {} and not launch.command
    why = next(n for n in launch.notes if n.startswith("no serve.sh"))
    assert "in bf16" in why and "what would fit: " in why and "GPUs" in why
    assert why in plan.assumptions
    findings = check_inference(plan, launch, SKIPPED, model, hw, None)
    agrees = [f for f in findings if f.check == "launch_agrees"]
    assert agrees and agrees[0].severity == "info" and agrees[0].message == why
    # The memory check still says nothing fits (an error): the plan is not approved.
    assert any(f.severity == "error" for f in findings if f.check == "inference_memory")


@pytest.mark.parametrize(
    ("dtype", "quantization", "act"),
    [
        ("bf16", None, "bfloat16"),
        ("fp16", None, "float16"),
        ("fp8", "fp8", "bfloat16"),
        ("int8", "compressed-tensors", "bfloat16"),
        ("int4", "bitsandbytes", "bfloat16"),
    ],
)
def test_serve_sh_loads_the_weights_in_the_plans_format(
    tmp_path: Path, dtype: str, quantization: str | None, act: str
) -> None:
    plan, model, hw = _plan("1x8xH100-80GB", weight_dtype=dtype)
    assert plan.max_concurrency >= 1
    launch = emit_serving(tmp_path, plan)
    script = (tmp_path / "serve.sh").read_text()
    command = launch.command
    assert _flag(command, "--quantization") == quantization
    assert _flag(command, "--dtype") == act
    assert _flag(command, "--kv-cache-dtype") == "auto"  # 16-bit KV, as the plan counts it
    assert f"{dtype} weights" in script
    if dtype == "int8":
        assert any("llm-compressor" in a for a in plan.assumptions)
        assert "llm-compressor" in script  # serve.sh says which checkpoint it needs
    findings = check_inference(plan, launch, SKIPPED, model, hw, None)
    assert not [f for f in findings if f.severity == "error"], findings


def test_the_reviewer_catches_a_command_in_another_format(tmp_path: Path) -> None:
    plan, model, hw = _plan("1x8xH100-80GB", weight_dtype="fp8")
    launch = emit_serving(tmp_path, plan)
    # The command without its quantization: vLLM would load 16-bit weights, twice the plan's.
    i = plan.command.index("--quantization")
    unquantized = plan.command[:i] + plan.command[i + 2 :]
    bad = plan.model_copy(update={"command": unquantized})
    tampered = launch.model_copy(update={"command": unquantized})
    findings = check_inference(bad, tampered, SKIPPED, model, hw, None)
    errors = [f.message for f in findings if f.check == "launch_agrees" and f.severity == "error"]
    assert errors and "--quantization is None" in errors[0] and "fp8" in errors[0]
