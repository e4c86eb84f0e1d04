"""`smoke` builds its model from the config: a learned position table is sized to --seq-len.

Before, `smoke --model gpt2 --seq-len 2048` was refused with "a job that loads its weights
cannot grow" the table, though a smoke run never loads weights. The CLI runs in process with
the run itself replaced (its setup probes the machine, so this is not a unit test).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app import main
from tools.core.schemas import ModelSpec, SmokeResult


def test_a_smoke_run_past_gpt2s_position_table_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import tools.smoke

    seen: list[ModelSpec] = []

    def run(model: ModelSpec, spec: Any, *_args: object, **_kwargs: object) -> SmokeResult:
        seen.append(model)
        return SmokeResult(status="passed", device="cpu", world_size=2, steps=3, run_dir=".")

    monkeypatch.setattr(tools.smoke, "run_smoke_test", run)
    monkeypatch.chdir(tmp_path)
    assert main(["smoke", "--model", "gpt2", "--seq-len", "2048", "--steps", "3"]) == 0
    assert seen and seen[0].seq_len == 2048
    assert (seen[0].hf_config or {}).get("n_positions", 0) >= 2048, capsys.readouterr()
