"""Layout, optimizer, batch and brief-goal words reach the plan, or one line says why not.

Before, "data parallelism only, no sharding" and "with Adafactor" were dropped without a word,
"bs=32" was listed as not understood, and a brief's goal "in JAX with seq 8192" was ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def test_layout_optimizer_and_batch_words_end_to_end(cli_main: Any, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    text = "fine-tune llama-3-8b on 8 H100, data parallelism only, no sharding, Adafactor, bs=32"
    res = cli_main("plan", text, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    plan = json.loads((out / "plan.json").read_text())
    pins = plan["brief"]["pins"]
    assert (pins["zero_stage"], pins["tensor_parallel"], pins["pipeline_parallel"]) == (0, 1, 1)
    assert plan["brief"]["global_batch_size"] == 32
    assert plan["request"]["not_understood"] == []
    said = [line for line in res.stdout.splitlines() if line.startswith("not as asked:")]
    assert any(s.startswith("not as asked: Adafactor not planned") for s in said), said
    # DDP replicas of an 8B model do not fit 80 GB: the pinned choice is refused out loud.
    assert any("ZeRO stage 0" in s and "does not fit" in s for s in said), said
    report = (out / "report.md").read_text()
    assert "'bs=32' read as the global batch" in report  # under "What I assumed"


def test_a_brief_goal_s_unapplied_words_are_said(cli_main: Any, tmp_path: Path) -> None:
    brief = tmp_path / "b.yaml"
    brief.write_text(
        "goal: pretrain in JAX on 8 H100 with seq 8192\n"
        "model: llama-3.2-1b\ntask: pretrain\nhardware: 1x8xH100-80GB\n"
    )
    out = tmp_path / "plan"
    res = cli_main("plan", "--brief", str(brief), "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    plan = json.loads((out / "plan.json").read_text())
    (goal,) = [a for a in plan["request"]["assumed"] if a["field"] == "goal"]
    assert "'JAX', 'seq 8192'" in goal["why"] and plan["brief"]["seq_len"] == 2048
