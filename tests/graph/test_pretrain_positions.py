"""A learned position table is sized to seq_len when the run builds the model from scratch.

Pretraining builds the model from its config, so GPT-3 XL's 2048-row table can be 4096 rows;
a job that loads weights keeps the checkpoint's table and a longer seq_len is refused. Every
stage that looks the brief's model up (researcher, review contract, estimate, size) must agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COUNTS = Path(__file__).resolve().parents[2] / "knowledge" / "models" / "counts.json"
REQUEST = (
    "pretrain a 1.3B GPT on 300B tokens with 4 nodes of 8 H100, seq 4096, global batch 1M tokens"
)
NOTE = (
    "pretraining from scratch: gpt3-1.3b's learned position table sized to 4096 rows "
    "(its catalog config has 2048)"
)


def test_pretraining_a_gpt_past_its_table_plans_a_longer_table(
    cli_main: Any, tmp_path: Path
) -> None:
    out = tmp_path / "plan"
    done = cli_main("plan", REQUEST, "--no-smoke", "--out", out)
    assert done.returncode == 0, done.stderr
    plan = json.loads((out / "plan.json").read_text())
    model = plan["model"]
    assert (model["name"], model["seq_len"]) == ("gpt3-1.3b", 4096)
    assert model["notes"] == [NOTE]
    # Said in the terminal and the report's headline, not only in the JSON.
    assert f"note: {NOTE[0].upper()}{NOTE[1:]}." in done.stdout.splitlines()
    assert NOTE[1:] in (out / "report.md").read_text()
    # The reviewer recomputed the brief's model the same way: the contract holds.
    assert plan["review"]["verdict"] == "approved"
    contract = [f for f in plan["review"]["findings"] if f.get("check") == "brief_contract"]
    assert contract and all(f["severity"] == "info" for f in contract)
    # The launch builds the model from model_config.json: the table it builds has 4096 rows.
    config = json.loads((out / "model_config.json").read_text())
    assert config["n_positions"] == 4096 and config["n_ctx"] == 4096
    assert "train.py --model-config model_config.json" in (out / "launch.sh").read_text()
    # 2048 more rows of width 2048 than the catalog's count (knowledge/models/counts.json).
    catalog = json.loads(COUNTS.read_text())["models"]["gpt3-1.3b"]
    assert model["params"] == catalog["params"] + 2048 * 2048


def test_a_fine_tune_past_the_checkpoints_table_is_still_refused(
    cli_main: Any, tmp_path: Path
) -> None:
    done = cli_main(
        "plan", "fine-tune gpt2 on 8 A100 with seq 2048", "--no-smoke", "--out", tmp_path / "p"
    )
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert error == (
        "trainwright: error: seq_len: gpt2's checkpoint has learned position embeddings for 1024 "
        "tokens (a table of 1024 rows), which a job that loads its weights cannot grow: seq_len "
        "2048 is longer (use seq_len <= 1024; pretraining from scratch sizes the table to seq_len)"
    )
    assert not (tmp_path / "p" / "plan.json").exists()


def test_estimate_and_size_look_the_model_up_as_the_task_builds_it(
    cli_main: Any, tmp_path: Path
) -> None:
    args = ("--model", "gpt3-1.3b", "--hardware", "4x8xH100-80GB", "--seq-len", "4096")
    done = cli_main("estimate", *args, "--global-batch", "256", "--task", "pretrain",
                    "--json", tmp_path / "e.json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"  note: {NOTE}" in done.stdout.splitlines()
    assert NOTE in json.loads((tmp_path / "e.json").read_text())["assumptions"]
    refused = cli_main("estimate", *args, "--global-batch", "256", "--task", "finetune",
                       "--json", tmp_path / "f.json")  # fmt: skip
    assert refused.returncode == 2 and "checkpoint" in refused.stderr
    sized = cli_main("size", "--model", "gpt3-1.3b", "--task", "pretrain", "--seq-len", "4096",
                     "--tokens", "3e11", "--gpus", "H100-80GB", "--json", tmp_path / "s.json")  # fmt: skip
    assert sized.returncode == 0, sized.stderr
    assert NOTE in json.loads((tmp_path / "s.json").read_text())["notes"]
    assert f"  note: {NOTE}" in sized.stdout.splitlines()
