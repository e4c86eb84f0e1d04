"""A plan never launches Megatron's pretrain_gpt.py for a model that is no GPT.

Before: "train a ViT-L/16 on ImageNet on 8 V100 32GB ..." ran pretrain_gpt.py with ViT-L's
widths on a pipeline split, and "pretrain bert-large on 8 A100 with Megatron" a GPT of BERT's
shape, both without a word.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _plan(cli_main: Any, tmp_path: Path, text: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "plan"
    res = cli_main("plan", text, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "plan.json").read_text()), res.stdout


def test_a_vit_runs_the_vision_job_not_a_gpt(cli_main: Any, tmp_path: Path) -> None:
    plan, _ = _plan(
        cli_main,
        tmp_path,
        "train a ViT-L/16 on ImageNet on 8 V100 32GB for 90 epochs, batch 4096, fp16",
    )
    assert plan["framework"]["primary"] != "megatron"
    assert not any("pretrain_gpt.py" in str(a) for a in plan["launch"]["command"])
    # train.py builds a causal LM, which a ViT is not: the launch runs the user's own script
    # (tools/artifacts/launch.py ``own_script_guard``), never train.py or pretrain_gpt.py.
    assert '"$TRAIN_SCRIPT"' in plan["launch"]["command"]
    assert "trainer/train.py" not in plan["launch"]["command"]


def test_megatron_asked_for_bert_is_refused_out_loud(cli_main: Any, tmp_path: Path) -> None:
    plan, stdout = _plan(cli_main, tmp_path, "pretrain bert-large on 8 A100 with Megatron")
    assert plan["framework"]["primary"] != "megatron"
    assert not any("pretrain_gpt.py" in str(a) for a in plan["launch"]["command"])
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == "framework:megatron")
    assert wish["honoured"] is False and "no decoder-only language model" in wish["how"]
    assert any(
        line.startswith("not as asked:") and "bert-large is no decoder-only" in line
        for line in stdout.splitlines()
    )
