"""A plan on Megatron-DeepSpeed says what its launch does not build of the model asked for.

"pretrain deepseek-v2-lite on 16 H100s with megatron" ran pretrain_gpt.py without multi-head
latent attention or shared experts and said "What I could not do: nothing" (only MEGATRON.md
knew). Without the wish, the plan keeps off Megatron and trains the Hugging Face model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _plan(cli_main: Any, tmp_path: Path, request: str) -> tuple[dict[str, Any], str, str]:
    out = tmp_path / "plan"
    res = cli_main("plan", request, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    plan = json.loads((out / "plan.json").read_text())
    return plan, res.stdout, (out / "report.md").read_text()


def test_megatron_asked_for_a_model_it_cannot_build_says_what_differs(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, stdout, report = _plan(
        cli_main, tmp_path, "pretrain deepseek-v2-lite on 16 H100s with megatron"
    )
    assert plan["framework"]["primary"] == "megatron"
    said = [line for line in stdout.splitlines() if line.startswith("not as asked:")]
    assert len(said) == 1
    assert "multi-head latent attention" in said[0] and "its shared experts" in said[0]
    assert "the launch does not train the model as it is" in said[0]
    assert "multi-head latent attention" in report.split("## Brief")[0]


def test_without_the_wish_the_plan_keeps_off_megatron_and_says_why(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, stdout, _ = _plan(cli_main, tmp_path, "pretrain deepseek-v2-lite on 16 H100s")
    assert plan["framework"]["primary"] != "megatron"
    assert not [line for line in stdout.splitlines() if line.startswith("not as asked:")]
    line = next(a for a in plan["memory"]["assumptions"] if a.startswith("not searched:"))
    assert "multi-head latent attention" in line
