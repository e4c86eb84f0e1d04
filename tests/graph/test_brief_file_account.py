"""A brief file's account quotes the fields the file states, and lists the defaults as assumed.

Before, ``plan --brief`` and ``report`` handed intake every field of the loaded brief: the
report said "seq_len: 2048 (from 'brief: seq_len')" for a file that named no sequence length,
and "I assumed: nothing".
"""

from __future__ import annotations

import json
from pathlib import Path

from inproc import run_main

BRIEF = "model: gpt2\ntask: finetune\nhardware: 1x1xA100-80GB\nseq_len: 1024\nsmoke: false\n"


def test_a_brief_file_quotes_only_its_own_fields(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(BRIEF, encoding="utf-8")
    done = run_main(
        "plan", "--brief", tmp_path / "b.yaml", "--out", tmp_path / "out",
        "--json", tmp_path / "plan.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    request = json.loads((tmp_path / "plan.json").read_text(encoding="utf-8"))["request"]
    read = {f["field"]: f["quote"] for f in request["read"]}
    assert read == {
        "model": "brief: model",
        "task": "brief: task",
        "hardware": "brief: hardware",
        "seq_len": "brief: seq_len",
        "smoke": "brief: smoke",
    }
    assumed = {a["field"] for a in request["assumed"]}
    assert {"precision", "global_batch_size"} <= assumed
