"""A request's optimizer, schedule and evaluation words reach the plan's files, end to end.

Before, "weight decay 0.05", "betas 0.9, 0.95", "adam eps 1e-6", "clip grad norm 0.5", "10%
warmup" and "eval every 500 steps" were listed as not understood, "linear decay" was dropped
without a word and "min lr 3e-5" became the peak rate; every launch ran the task's recipe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def test_the_words_are_read_and_written_into_ds_config(cli_main: Any, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    text = (
        "pretrain llama-3-8b on 16 H100 for 5000 steps, weight decay 0.05, eval every 500 steps "
        "on a 1% holdout, clip grad norm 0.5, betas 0.9, 0.95, adam eps 1e-6, linear decay, "
        "min lr 3e-5, 10% warmup"
    )
    res = cli_main("plan", text, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    plan = json.loads((out / "plan.json").read_text())
    read = {r["field"]: r["quote"] for r in plan["request"]["read"]}
    assert read["min_lr"] == "min lr 3e-5" and "learning_rate" not in read
    assert read["lr_schedule"] == "linear decay" and read["warmup_ratio"] == "10% warmup"
    assert plan["request"]["not_understood"] == []
    assert plan["brief"]["weight_decay"] == 0.05 and plan["brief"]["eval_every"] == 500
    config = json.loads((out / "ds_config.json").read_text())
    assert config == plan["deepspeed_config"]
    params = config["optimizer"]["params"]
    assert (params["betas"], params["eps"], params["weight_decay"]) == ([0.9, 0.95], 1e-6, 0.05)
    assert config["gradient_clipping"] == 0.5
    scheduler = config["scheduler"]
    assert scheduler["type"] == "WarmupDecayLR"
    assert scheduler["params"]["warmup_min_lr"] == 3e-5
    assert scheduler["params"]["warmup_num_steps"] == 500  # 10% of 5000 steps
    # train.py under DeepSpeed evaluates every 500 steps on the last 1%: nothing "not as asked".
    said = [line for line in res.stdout.splitlines() if line.startswith("not as asked:")]
    assert not any("eval" in s.lower() for s in said), said
    assert "--eval-every 500 --eval-holdout 0.01" in (out / "launch.sh").read_text()
    assert "--eval-every 500 --eval-holdout 0.01" in (out / "train.sbatch").read_text()
    report = (out / "report.md").read_text()
    assert "- weight_decay: 0.05 (from 'weight decay 0.05')" in report  # under "What you asked"
