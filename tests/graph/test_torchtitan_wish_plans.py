"""A request that names torchtitan, planned by the CLI in process: the plan is for the job asked.

Where one of torchtitan's llama3 flavors builds the model, the plan runs torchtitan's own launch
(torchtitan.toml, ``torchrun -m torchtitan.train``), priced with torchtitan's recipe, with fp8
linears when asked; where it cannot (Qwen, Llama 3 8B, a LoRA job), the plan runs PyTorch FSDP in
its place and says why in one line, the reason tools/research/titan_flavors.py gives; the wish's
status is in the plan's request account and the report.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from launch_checks import torchtitan_key_errors

from tools.artifacts.headline import FP8_NOT_APPLIED, headline_notes
from tools.research.model_catalog import lookup_model
from tools.research.titan_flavors import build_refusal

TITAN_WISH = "framework:torchtitan"


def _plan(cli_main: Any, tmp_path: Path, *argv: str) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path / "plan"
    tmp_path.mkdir(exist_ok=True)
    res = cli_main("plan", *argv, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "plan.json").read_text()), out, res.stdout


def _wish(plan: dict[str, Any], wish: str = TITAN_WISH) -> dict[str, Any]:
    return next(w for w in plan["request"]["wishes"] if w["wish"] == wish)


def _not_as_asked(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("not as asked:")]


def test_with_torchtitan_on_llama_31_runs_torchtitan_priced_as_torchtitan(
    cli_main: Any, tmp_path: Path
) -> None:
    request = "pretrain llama-3.1-8b on 8 H100 with torchtitan"
    plan, out, stdout = _plan(cli_main, tmp_path, request)
    assert plan["brief"]["framework"] == "torchtitan"
    assert plan["framework"]["primary"] == "torchtitan"
    assert plan["framework"]["not_honoured"] is None
    files = plan["launch"]["files"]
    assert {"torchtitan.toml", "TORCHTITAN.md"} <= set(files)
    assert not {"ds_config.json", "FSDP.md"} & set(files)
    command = plan["launch"]["command"]
    assert command[0] == "torchrun" and "torchtitan.train" in command
    toml = tomllib.loads((out / "torchtitan.toml").read_text())
    assert torchtitan_key_errors(toml) == []
    assert toml["model"]["flavor"] == "8B"
    # Priced with torchtitan's recipe: its memory differs from the FSDP plan the same request
    # got before torchtitan had launch files (FSDP2 under train.py).
    assert "memory priced for: torchtitan" in " ".join(plan["memory"]["assumptions"])
    fsdp, _, _ = _plan(cli_main, tmp_path / "fsdp", request.replace("torchtitan", "FSDP"))
    assert fsdp["framework"]["primary"] == "pytorch_fsdp"

    def total(p: dict[str, Any]) -> int:
        row = next(r for r in p["memory"]["strategies"] if r["label"] == "zero3")
        return int(row["per_gpu_bytes"]["total"])

    assert total(plan) != total(fsdp)
    wish = _wish(plan)
    assert wish["honoured"] is True and "torchtitan" in wish["how"]
    assert _not_as_asked(stdout) == []
    report = (out / "report.md").read_text()
    assert f"{TITAN_WISH} (from 'torchtitan'): {wish['how']}" in report


def test_with_torchtitan_and_fp8_applies_fp8_on_torchtitan(cli_main: Any, tmp_path: Path) -> None:
    plan, out, stdout = _plan(
        cli_main, tmp_path, "pretrain llama-3.1-8b on 8 H100 with torchtitan and fp8"
    )
    assert plan["framework"]["primary"] == "torchtitan"
    assert plan["brief"]["recipe"]["framework"] == "torchtitan"
    toml = tomllib.loads((out / "torchtitan.toml").read_text())
    assert toml["model"]["converters"] == ["quantize.linear.float8"]
    assert plan["speed"]["gemm_precision"] == "fp8"
    assert _wish(plan)["honoured"] is True
    assert _wish(plan, "technique:fp8")["honoured"] is True
    assert _not_as_asked(stdout) == []


def test_with_torchtitan_on_a_model_it_cannot_build_says_why_and_runs_fsdp(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, out, stdout = _plan(cli_main, tmp_path, "fine-tune qwen2.5-7b on 8 H100 with torchtitan")
    why = build_refusal(lookup_model("qwen2.5-7b", 2048))
    assert why is not None
    assert plan["framework"]["primary"] == "pytorch_fsdp"
    files = set(plan["launch"]["files"])
    assert "FSDP.md" in files and "torchtitan.toml" not in files
    line = plan["framework"]["not_honoured"]
    assert why in line and "\n" not in line
    assert line.endswith(
        "the plan runs on pytorch_fsdp (FSDP2, the sharding torchtitan builds on: train.py under torchrun)."
    )
    # Said once on the terminal, and the wish is marked refused with that line.
    said = _not_as_asked(stdout)
    assert len(said) == 1 and why in said[0]
    wish = _wish(plan)
    assert wish["honoured"] is False and line in wish["how"]
    assert "memory priced for: fsdp" in " ".join(plan["memory"]["assumptions"])
    report = (out / "report.md").read_text()
    assert f"{TITAN_WISH} (from 'torchtitan'): refused: {wish['how']}" in report


def test_with_torchtitan_and_fp8_on_llama_3_gives_the_reason_once(
    cli_main: Any, tmp_path: Path
) -> None:
    # Llama 3 8B has the 8B flavor's shape but not Llama 3.1's RoPE scaling.
    plan, _, stdout = _plan(
        cli_main, tmp_path, "pretrain llama-3-8b on 8 H100 with torchtitan and fp8"
    )
    why = build_refusal(lookup_model("llama-3-8b", 2048))
    assert why is not None and "RoPE scaling" in why
    assert plan["framework"]["primary"] == "pytorch_fsdp"
    assert plan["speed"]["gemm_precision"] is None
    notes = headline_notes(plan)
    assert sum(why in n for n in notes) == 1
    fp8 = [n for n in notes if n.startswith(FP8_NOT_APPLIED)]
    assert len(fp8) == 1 and "in its place" in fp8[0] and why not in fp8[0]
    assert len(_not_as_asked(stdout)) == 2
    assert _wish(plan)["honoured"] is False
    assert _wish(plan, "technique:fp8")["honoured"] is False


def test_a_lora_job_with_torchtitan_runs_fsdp_and_says_why(cli_main: Any, tmp_path: Path) -> None:
    plan, _, stdout = _plan(
        cli_main, tmp_path, "LoRA fine-tune llama-3.1-8b on 8 H100 with torchtitan"
    )
    assert plan["framework"]["primary"] == "pytorch_fsdp"
    said = _not_as_asked(stdout)
    assert len(said) == 1 and "LoRA" in said[0] and "torchtitan" in said[0]


def test_a_brief_with_framework_torchtitan_runs_torchtitan(cli_main: Any, tmp_path: Path) -> None:
    brief = tmp_path / "brief.yaml"
    brief.write_text(
        "goal: pretrain\nmodel: llama-3.1-8b\ntask: pretrain\nhardware: 1x8xH100-80GB\n"
        "framework: torchtitan\nsmoke: false\n"
    )
    plan, out, stdout = _plan(cli_main, tmp_path, "--brief", str(brief))
    assert plan["framework"]["primary"] == "torchtitan"
    assert (out / "torchtitan.toml").is_file()
    assert _wish(plan)["quote"] == "brief: framework" and _wish(plan)["honoured"] is True
    review = [f["message"] for f in plan["review"]["findings"] if f.get("check") == "wishes"]
    assert review and "as the brief asks" in review[0]
    assert _not_as_asked(stdout) == []
