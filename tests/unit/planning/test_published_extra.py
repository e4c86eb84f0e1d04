"""The project's own published measurements (bench/calibration/published_extra) parse and map.

Memory rows (``memory.tsv``, ids ``XM``) name the throughput row of the same run and map
through it (bench/calibration/memory_linked.py).

Each row of ``throughput.tsv`` must become a pinned setup for the speed model or be skipped
with a stated reason (bench/calibration/published.py ``map_row``); the file keeps the shared
folder's column layout and its own ``X`` row ids so the two never collide. Mapping builds the
models with transformers on meta, so it runs once at collection, not inside a test's call.
"""

from __future__ import annotations

import csv
import re

import pytest

from bench.calibration.memory_linked import linked
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
from bench.calibration.published_memory import map_row as map_memory_row
from bench.calibration.published_memory import read_rows as read_memory_rows

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
    mapped = 0
    for row in moe:
        case = MAPPED[row["row_id"]]
        if isinstance(case, Skip):
            # Only a layout the bench cannot express (expert parallelism over TP x DP), or a row
            # contradicting itself (its tokens/s against its TFLOP/s), skips.
            assert "ep does not divide" in case.reason or "disagree" in case.reason, case.reason
            continue
        mapped += 1
        experts, top_k = (int(x) for x in re.findall(r"experts=(\d+) top_k=(\d+)", row["notes"])[0])
        assert case.model.active_params and case.model.active_params < case.model.params
        config = case.model.hf_config or {}
        assert config.get("num_local_experts", config.get("num_experts")) == experts
        assert case.model.hf_config["num_experts_per_tok"] == top_k
        assert case.setup.get("expert_parallel", 1) == int(row["ep"])
    assert mapped >= len(moe) - 2


def test_issue_thread_rows_are_named_by_their_repository_and_gpt2_maps_by_name() -> None:
    """ROCm/TransformerEngine issue rows: the source is the repository, GPT-2 XL a GPT-2 model."""
    from bench.calibration.published import source_of

    issue = {"source": "https://github.com/ROCm/TransformerEngine/issues/76"}
    assert source_of(issue) == "TransformerEngine"
    assert source_of({"source": "NVIDIA/Megatron-LM@abc:images/tables.tex"}) == "Megatron-LM"
    amd = [r for r in ROWS if "mi300x" in r["gpu"].lower()]
    assert amd
    for row in amd:
        case = MAPPED[row["row_id"]]
        assert isinstance(case, Case), getattr(case, "reason", "")
        assert case.hardware.gpu is not None and case.hardware.gpu.name.endswith("MI300X")
        expected = "gpt2" if "gpt-2" in row["model"].lower() else "llama"
        assert (case.model.hf_config or {})["model_type"] == expected


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


MEMORY_ROWS = read_memory_rows(EXTRA_DIR)
MEMORY_MAPPED = {row["row_id"]: map_memory_row(row, EXTRA_DIR) for row in MEMORY_ROWS}


def test_memory_rows_name_a_throughput_row_and_keep_their_own_ids() -> None:
    ids = {r["row_id"] for r in ROWS}
    assert MEMORY_ROWS and all(r["row_id"].startswith("XM") for r in MEMORY_ROWS)
    assert all(linked(r) in ids for r in MEMORY_ROWS)


@pytest.mark.parametrize("row_id", sorted(MEMORY_MAPPED))
def test_each_memory_row_maps_to_its_runs_setup_or_says_why_not(row_id: str) -> None:
    case = MEMORY_MAPPED[row_id]
    if isinstance(case, Skip):
        assert case.reason.strip()
        return
    # An "80 GB" card holds 80 GiB (81,920 MiB, knowledge/gpus.yaml conventions).
    assert case.quantity == "used" and 0 < case.measured <= case.capacity / 1e9 * 2**30
    recipe = case.kwargs["recipe"]
    assert recipe["framework"] in ("megatron", "deepspeed")
    assert case.kwargs["strategy"] in ("ddp", "zero1", "zero3")
    if recipe["framework"] == "megatron":
        # Megatron's DDP keeps the whole optimizer; its distributed optimizer is ZeRO-1.
        assert (case.kwargs["strategy"] == "zero1") == recipe["distributed_optimizer"]


def test_a_megatron_ddp_run_keeps_its_whole_optimizer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A run without --use-distributed-optimizer is priced with 12 bytes of states per parameter."""
    from bench.calibration.published_memory import predict

    rows = (EXTRA_DIR / "throughput.tsv").read_text().splitlines()
    row = next(r for r in MEMORY_ROWS if r["row_id"] == "XM0012")
    xid = linked(row)
    lines = [
        re.sub(r"\tMegatron distributed optimizer \([^\t]*\)\t", "\tMegatron DDP\t", line)
        if line.startswith(f"{xid}\t")
        else line
        for line in rows
    ]
    (tmp_path / "throughput.tsv").write_text("\n".join(lines) + "\n")
    plain = map_memory_row(row, tmp_path)
    dist = map_memory_row(row, EXTRA_DIR)
    assert not isinstance(dist, Skip) and not isinstance(plain, Skip)
    assert plain.kwargs["strategy"] == "ddp" and dist.kwargs["strategy"] == "zero1"
    predict(plain)
    predict(dist)
    assert any("not sharded" in n for n in plain.notes)
    assert any("sharded over 4 ranks" in n for n in dist.notes)


def test_a_memory_row_pointing_nowhere_is_skipped_with_the_reason() -> None:
    row = dict(MEMORY_ROWS[0], notes="throughput row X9999")
    skipped = map_memory_row(row, EXTRA_DIR)
    assert isinstance(skipped, Skip) and "X9999" in skipped.reason


def test_qwen3_moe_rows_carry_their_head_width_and_expert_width() -> None:
    qwen = [r for r in ROWS if r["model"].lower().startswith("qwen3")]
    assert qwen
    case = next(MAPPED[r["row_id"]] for r in qwen if isinstance(MAPPED[r["row_id"]], Case))
    assert isinstance(case, Case)
    config = case.model.hf_config or {}
    # 32 heads x 128 (30B) or 64 x 128 (235B): the attention is wider than the hidden size.
    assert config["head_dim"] == 128 and config["num_attention_heads"] * 128 > case.model.hidden
    assert config["moe_intermediate_size"] == int(next(r for r in qwen)["ffn_hidden"])
    dense = dict(qwen[0], model_type="dense")
    skipped = map_row(dense)
    assert isinstance(skipped, Skip) and "dense Qwen3" in skipped.reason
    no_head = dict(qwen[0], notes=re.sub(r"head_dim=\d+", "", qwen[0]["notes"]))
    skipped = map_row(no_head)
    assert isinstance(skipped, Skip) and "head_dim" in skipped.reason


def test_a_row_whose_tokens_and_tflops_disagree_is_skipped_and_named() -> None:
    skip = MAPPED["X0048"]
    assert isinstance(skip, Skip) and "tokens/s and TFLOP/s per GPU disagree" in skip.reason
    sibling = MAPPED["X0049"]  # the same model a container earlier: consistent, compared
    assert isinstance(sibling, Case)
    row = dict(next(r for r in ROWS if r["row_id"] == "X0049"))
    row["tflops_per_gpu"] = str(2 * float(row["tflops_per_gpu"]))
    doubled = map_row(row)
    assert isinstance(doubled, Skip) and "disagree" in doubled.reason
