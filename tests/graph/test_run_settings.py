"""The request's seed, W&B project and data path reach the launch, or the plan says why not.

Before, "seed 1234" was not understood and "log to wandb" / "dataset at PATH" were dropped
without a word; train.py takes all three (--seed, --wandb, --data).
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from launch_checks import megatron_parser


def _plan(cli_main: Any, tmp_path: Path, text: str) -> tuple[dict[str, Any], Path]:
    out = tmp_path / "plan"
    res = cli_main("plan", text, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "plan.json").read_text()), out


def test_train_py_gets_the_seed_the_project_and_the_data(cli_main: Any, tmp_path: Path) -> None:
    plan, out = _plan(
        cli_main,
        tmp_path,
        "SFT llama-3.2-1b on 2 RTX 4090, dataset at /data/sft/train.jsonl, seed 1234, "
        "wandb logging to project sft-runs",
    )
    command = plan["launch"]["command"]
    assert command[command.index("--seed") + 1] == "1234"
    assert command[command.index("--wandb") + 1] == "sft-runs"
    launch = (out / "launch.sh").read_text()
    assert '[[ -n "${DATA:-}" ]] || DATA=/data/sft/train.jsonl' in launch
    read = {r["field"]: r for r in plan["request"]["read"]}
    assert read["data_path"]["quote"] == "dataset at /data/sft/train.jsonl"
    assert plan["request"]["not_understood"] == []


def test_a_launch_without_them_says_so(cli_main: Any, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = cli_main(
        "plan",
        "fine-tune llama-3-8b on 8 H100 with Megatron, tp 2, log to wandb, data in /data/chat",
        "--no-smoke",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    plan = json.loads((out / "plan.json").read_text())
    assert plan["framework"]["primary"] == "megatron"
    command = plan["launch"]["command"]
    assert command[command.index("--wandb-project") + 1] == "trainwright"
    refused = [line for line in res.stdout.splitlines() if line.startswith("not as asked:")]
    assert [r for r in refused if "not applied" in r] == [
        "not as asked: Data '/data/chat' not applied: the megatron launch reads the dataset its "
        "guide says to name (train.py's --data reads the path as given)."
    ]


def test_megatron_and_torchtitan_take_the_seed(
    cli_main: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan, _ = _plan(
        cli_main,
        tmp_path,
        "pretrain llama-3-8b on 8 H100 with Megatron, tp 2, seed 99, log to wandb project pt",
    )
    command = [str(a) for a in plan["launch"]["command"]]
    at = next(i for i, a in enumerate(command) if a.rstrip('"').endswith("pretrain_gpt.py"))
    argv = [a for a in command[at + 1 :] if "${" not in a]
    parser = megatron_parser()
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
    args = parser.parse_args()
    assert (args.seed, args.wandb_project) == (99, "pt")
    (tmp_path / "tt").mkdir()
    plan, out = _plan(
        cli_main, tmp_path / "tt", "pretrain llama-3.1-8b on 8 H100 with torchtitan, seed 5"
    )
    assert plan["framework"]["primary"] == "torchtitan"
    assert tomllib.loads((out / "torchtitan.toml").read_text())["debug"] == {"seed": 5}


def test_a_lora_alpha_reaches_train_py(cli_main: Any, tmp_path: Path) -> None:
    plan, _ = _plan(
        cli_main, tmp_path, "LoRA fine-tune qwen2.5-7b on a single A100 80GB, rank 16, alpha 32"
    )
    command = plan["launch"]["command"]
    assert command[command.index("--lora-alpha") + 1] == "32"
    assert command[command.index("--lora-rank") + 1] == "16"
    assert plan["request"]["not_understood"] == []
