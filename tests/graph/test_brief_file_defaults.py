"""A brief file gets the defaults a request gets from its model, named as assumed.

A file with ``model: gpt2`` and no ``seq_len`` was refused (the brief's 2048 is past gpt2's
1024 learned positions) while the request "fine-tune gpt2 on 1 A100" planned 1024.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def test_a_brief_file_without_seq_len_takes_the_models_position_limit(
    cli_main: Any, tmp_path: Path
) -> None:
    brief = tmp_path / "brief.yaml"
    brief.write_text("model: gpt2\ntask: finetune\nhardware: 1x1xA100-80GB\nsmoke: false\n")
    out = tmp_path / "plan"
    res = cli_main("plan", "--brief", str(brief), "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert plan["brief"]["seq_len"] == 1024
    (assumed,) = [a for a in plan["request"]["assumed"] if a["field"] == "seq_len"]
    assert assumed["value"] == 1024 and "position limit" in assumed["why"]
