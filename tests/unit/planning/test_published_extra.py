"""The project's own published measurements (bench/calibration/published_extra) parse and map.

Each row of ``throughput.tsv`` must become a pinned setup for the speed model or be skipped
with a stated reason (bench/calibration/published.py ``map_row``); the file keeps the shared
folder's column layout and its own ``X`` row ids so the two never collide. Mapping builds the
models with transformers on meta, so it runs once at collection, not inside a test's call.
"""

from __future__ import annotations

import csv
import re

import pytest

from bench.calibration.published import (
    EXTRA_DIR,
    REQUIRED_COLUMNS,
    TSV,
    Case,
    Skip,
    main,
    map_row,
    read_rows,
    split_of,
)

ROWS = read_rows(EXTRA_DIR)
MAPPED = {row["row_id"]: map_row(row) for row in ROWS}


def test_the_file_keeps_the_layout_and_its_own_ids() -> None:
    with (EXTRA_DIR / TSV).open(encoding="utf-8") as fh:
        header = next(csv.reader(fh, delimiter="\t"))
    assert set(REQUIRED_COLUMNS) <= set(header)
    assert ROWS and all(r["row_id"].startswith("X") for r in ROWS)
    assert all(r["source"] and r["locator"] for r in ROWS), "every row names where it is printed"
    assert {split_of(r["row_id"]) for r in ROWS} == {"fit", "held-out"}


@pytest.mark.parametrize("row_id", sorted(MAPPED))
def test_each_row_maps_or_says_why_not(row_id: str) -> None:
    mapped = MAPPED[row_id]
    if isinstance(mapped, Skip):
        assert mapped.reason.strip(), f"{row_id} skipped without a reason"
        return
    assert isinstance(mapped, Case) and mapped.measured > 0
    assert mapped.hardware.world_size >= 1 and mapped.setup["seq_len"] >= 1


def test_mixture_of_experts_rows_carry_their_experts_and_expert_parallelism() -> None:
    moe = [r for r in ROWS if r["model_type"] == "moe"]
    assert moe
    for row in moe:
        case = MAPPED[row["row_id"]]
        assert isinstance(case, Case), getattr(case, "reason", "")
        experts, top_k = (int(x) for x in re.findall(r"experts=(\d+) top_k=(\d+)", row["notes"])[0])
        assert case.model.active_params and case.model.active_params < case.model.params
        assert case.model.hf_config and case.model.hf_config["num_local_experts"] == experts
        assert case.model.hf_config["num_experts_per_tok"] == top_k
        assert case.setup.get("expert_parallel", 1) == int(row["ep"])


def test_a_moe_row_without_expert_counts_is_skipped_with_the_reason() -> None:
    row = dict(next(r for r in ROWS if r["model_type"] == "moe"))
    row["notes"] = "no counts"
    skipped = map_row(row)
    assert isinstance(skipped, Skip) and "experts=E top_k=K" in skipped.reason


def test_the_folder_flag_reads_another_folder(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--folder", str(tmp_path / "absent")]) == 0
    assert "no folder at" in capsys.readouterr().out
    (tmp_path / TSV).write_text("row_id\tsource\n")
    assert main(["--folder", str(tmp_path)]) == 2
