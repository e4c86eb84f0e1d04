"""A LoRA request, planned by the CLI in process: data parallel only, and the plan says why.

DeepSpeed 0.19 AutoTP drops a PEFT model's adapters (tools/research/splits.py
``lora_split_refusal``: run on 2 CPU ranks, it replaces each adapted projection with a plain
sharded linear), so the search prices no tensor split for LoRA, as it prices no torchtitan or
Megatron split (those launches train every weight). Before, llama-3.1-8b at 32k tokens on 8
A100-80GB was planned as ddp+tp8 on AutoTP; a data-parallel setup fits there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tools.research.splits import LORA_AUTOTP_REFUSAL


def _plan(cli_main: Any, tmp_path: Path, request: str) -> tuple[dict[str, Any], Path]:
    out = tmp_path / "plan"
    res = cli_main("plan", request, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "plan.json").read_text()), out


def _not_searched(plan: dict[str, Any]) -> str:
    lines = [a for a in plan["memory"]["assumptions"] if a.startswith("not searched")]
    assert len(lines) == 1, plan["memory"]["assumptions"]
    return lines[0]


def test_a_lora_plan_keeps_tensor_parallel_1_and_says_autotp_drops_the_adapters(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, out = _plan(
        cli_main, tmp_path, "LoRA fine-tune llama-3.1-8b with 32768-token sequences on 8 A100 80GB"
    )
    memory = plan["memory"]
    assert not any(a.startswith("nothing fits") for a in memory["assumptions"])
    assert memory["tensor_parallel"] == 1 == memory["pipeline_parallel"]
    assert all(row["tensor_parallel"] == 1 for row in memory["strategies"])
    line = _not_searched(plan)
    assert "deepspeed" in line and LORA_AUTOTP_REFUSAL in line
    assert "search: " in " ".join(memory["assumptions"])
    assert any("x tensor [1] x pipeline [1]" in a for a in memory["assumptions"])
    ds_config = json.loads((out / "ds_config.json").read_text())
    assert "tensor_parallel" not in ds_config
    assert "--lora-rank" in (out / "launch.sh").read_text()
    assert plan["review"]["verdict"] == "approved", plan["review"]
    # The report says it too (its markdown escapes the leading underscore of _replace_module).
    assert LORA_AUTOTP_REFUSAL.split(" (")[0] in (out / "report.md").read_text()


def test_a_lora_plan_nothing_fits_says_the_splits_were_not_searched(
    cli_main: Any, tmp_path: Path
) -> None:
    # 128k tokens of llama-3.1-8b: only a split would fit, and LoRA runs none; the plan was
    # ddp+tp4 on AutoTP, and with the refusal it was told "2x8xH100-80GB would fit".
    plan, _ = _plan(
        cli_main, tmp_path, "LoRA fine-tune llama-3.1-8b with 131072-token sequences on 8 H100"
    )
    memory = plan["memory"]
    assert memory["tensor_parallel"] == 1 == memory["pipeline_parallel"]
    assert memory["smallest_fitting_hardware"] is None
    assert LORA_AUTOTP_REFUSAL in _not_searched(plan)
    first = next(a for a in memory["assumptions"] if a.startswith("nothing fits"))
    assert "data parallelism alone" in first and "would fit at" not in first


def test_a_lora_request_that_pins_tp_is_told_why_it_runs_data_parallel(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, _ = _plan(
        cli_main,
        tmp_path,
        "LoRA fine-tune llama-3.1-8b with 32768-token sequences on 8 A100 80GB with TP 4",
    )
    assert plan["memory"]["tensor_parallel"] == 1
    (missed,) = [n for n in plan["memory"]["not_honoured"] if "tensor parallel 4" in n]
    assert LORA_AUTOTP_REFUSAL in missed


def test_a_batch_smaller_than_the_gpus_is_named_not_called_a_pin(
    cli_main: Any, tmp_path: Path
) -> None:
    # 512 GPUs and a global batch of 256: no data-parallel-only layout, and LoRA runs no split
    # here. The refusal read "no searched strategy runs with the pinned degrees" though the
    # request pinned none; it now names the batch and what to change.
    res = cli_main(
        "plan",
        "LoRA fine-tune llama-3-8b on 64 nodes of 8 H100, global batch 256",
        "--no-smoke",
        "--out",
        str(tmp_path / "plan"),
        cwd=tmp_path,
    )
    assert res.returncode == 2
    line = res.stderr.strip().splitlines()[-1]
    assert "pinned" not in line and "a global batch of 256 sequences" in line
    assert line.endswith("raise the global batch to 512 or more, or plan on 256 GPUs or fewer")


def test_a_split_pinned_on_a_lora_plan_is_not_as_asked(cli_main: Any, tmp_path: Path) -> None:
    # The chooser runs LoRA on DDP; the DDP plan ran with the brief's pins overridden and said
    # "pinned by the request: pipeline parallel 2" for a pipeline of 1, with nothing under "Not
    # as asked".
    plan, _ = _plan(cli_main, tmp_path, "LoRA fine-tune llama-3-8b on 8 H100, pipeline parallel 2")
    memory = plan["memory"]
    assert memory["setup"]["pipeline_parallel"] == 1
    assert not [a for a in memory["assumptions"] if a.startswith("pinned by the request")]
    said = [n for n in memory["not_honoured"] if n.startswith("the pinned choice (pipeline")]
    assert len(said) == 1 and said[0].endswith(
        f"planned ddp on {plan['framework']['primary']} (replicas) instead"
    )
