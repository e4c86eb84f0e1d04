"""bench/calibration/published.py on made-up rows in the published layout (no published row is used here)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import run as bench_run
from bench.calibration import published as pub

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = [
    "row_id", "source", "locator", "framework", "version_or_date", "model", "model_type",
    "params", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len",
    "gpu", "n_gpus", "dp", "dp_sharding", "tp", "pp", "vpp", "cp", "ep", "act_ckpt",
    "micro_batch", "grad_accum", "global_batch_seqs", "global_batch_tokens", "precision",
    "tokens_per_s_total", "tokens_per_s_per_gpu", "samples_per_s", "tflops_per_gpu", "mfu_pct",
    "hfu_pct", "peak_mem_per_gpu", "status", "notes",
]  # fmt: skip
FOUNDRY = "mosaicml/llm-foundry@0000000:scripts/train/benchmarking/README.md"
TITAN = "pytorch/torchtitan@0000000:docs/performance.md"
MEGATRON = "NVIDIA/Megatron-LM@0000000:README.md"


def mpt_row(row_id: str, **over: str) -> dict[str, str]:
    """A small made-up MPT row (4 layers, width 256) in llm-foundry's layout."""
    row = dict.fromkeys(COLUMNS, "")
    row.update({
        "row_id": row_id, "source": FOUNDRY, "framework": "llm-foundry/Composer (PyTorch FSDP1)",
        "model": "MPT-tiny", "model_type": "dense", "n_layers": "4", "hidden": "256",
        "n_heads": "4", "n_kv_heads": "4", "ffn_hidden": "1024", "vocab": "1024",
        "seq_len": "512", "gpu": "a100_80gb", "n_gpus": "8", "dp": "8",
        "dp_sharding": "FSDP FULL_SHARD (~ZeRO-3)", "tp": "1", "pp": "1", "cp": "1",
        "act_ckpt": "none", "micro_batch": "4", "grad_accum": "1", "global_batch_seqs": "32",
        "precision": "amp_bf16 (MP mode DEFAULT)", "tokens_per_s_per_gpu": "1000",
        "status": "published",
    })  # fmt: skip
    row.update(over)
    return row


def titan_row(row_id: str, **over: str) -> dict[str, str]:
    """A small made-up Llama row in torchtitan's layout."""
    row = mpt_row(row_id, source=TITAN, framework="torchtitan (FSDP2/DTensor)")
    row.update({
        "model": "Llama tiny", "n_kv_heads": "2", "ffn_hidden": "704", "dp_sharding": "FSDP2",
        "gpu": "H100 SXM 96GB HBM2e, 500W cap (Grand Teton)", "grad_accum": "",
        "global_batch_seqs": "", "precision": "BF16",
    })  # fmt: skip
    row.update(over)
    return row


def write_tsv(folder: Path, rows: list[dict[str, str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / pub.TSV).open("w", newline="") as fh:
        writer = csv.DictWriter(fh, COLUMNS, delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)
    return folder


def mapped(row: dict[str, str]) -> pub.Case:
    case = pub.map_row(row)
    assert isinstance(case, pub.Case), case
    return case


def test_setup_mapping_strategy_recompute_and_batch() -> None:
    full = mapped(mpt_row("A1", act_ckpt="full"))
    assert full.setup["strategy"] == "zero3" and full.setup["recompute"] == "full"
    assert full.model.family == "mpt" and full.model.layers == 4 and full.model.hidden == 256
    grad_op = mapped(mpt_row("A2", dp_sharding="FSDP SHARD_GRAD_OP (~ZeRO-2)"))
    assert grad_op.setup["strategy"] == "zero2" and grad_op.setup["recompute"] == "none"
    # grad_accum empty: global batch 64 / (micro 4 x dp 8) = 2.
    derived = mapped(mpt_row("A3", grad_accum="", global_batch_seqs="64"))
    assert derived.setup["gradient_accumulation_steps"] == 2
    assert any("global_batch_seqs" in n for n in derived.notes)
    skip = pub.map_row(mpt_row("A4", grad_accum="", global_batch_seqs="60"))
    assert isinstance(skip, pub.Skip) and "divide" in skip.reason

    sac = mapped(titan_row("B1", act_ckpt="selective (per-op)", tp="2", dp="4"))
    assert sac.setup["recompute"] == "selective" and sac.setup["tensor_parallel"] == 2
    assert sac.model.family == "llama" and sac.model.kv_heads == 2
    assert sac.model.hf_config and sac.model.hf_config["hidden_act"] == "silu"
    assert sac.setup["gradient_accumulation_steps"] == 1  # torchtitan: none unless stated
    default = mapped(titan_row("B2", act_ckpt=""))
    assert default.setup["recompute"] == "selective"
    assert any("torchtitan" in n and "selective" in n for n in default.notes)
    assert any("no derate" in n for n in default.notes)
    assert getattr(default.hardware.gpu, "id", None) == "H100-80GB"
    # A pipeline's local batch runs as micro-batches of one (torchtitan's default).
    piped = mapped(titan_row("B3", pp="2", dp="4", micro_batch="local bs 8"))
    assert piped.setup["micro_batch_size"] == 1
    assert piped.setup["gradient_accumulation_steps"] == 8


def test_nodes_of_eight_and_networks() -> None:
    two = mapped(mpt_row("C1", n_gpus="16", dp="16", global_batch_seqs="64"))
    assert (two.hardware.nodes, two.hardware.gpus_per_node) == (2, 8)
    small = mapped(mpt_row("C2", n_gpus="4", dp="4"))
    assert (small.hardware.nodes, small.hardware.gpus_per_node) == (1, 4)
    # The brief's network is left unset: the speed model's per-node default applies.
    assert two.hardware.nics_per_node is None and two.hardware.nic_gbps is None
    odd = pub.map_row(mpt_row("C3", n_gpus="12", dp="12"))
    assert isinstance(odd, pub.Skip) and "nodes of 8" in odd.reason
    mega = mpt_row(
        "C4", source=MEGATRON, framework="Megatron-LM (2021)", model="GPT tiny",
        gpu="A100 80GB (Selene DGX A100)", n_gpus="16", dp="8", tp="2", dp_sharding="DDP",
        act_ckpt="", grad_accum="", global_batch_seqs="64", precision="FP16 mixed (per paper)",
    )  # fmt: skip
    case = mapped(mega)
    assert case.model.family == "gpt2" and case.setup["strategy"] == "ddp"
    assert case.setup["precision"] == "fp16" and case.setup["recompute"] == "full"
    assert (case.hardware.nics_per_node, case.hardware.nic_gbps) == (8, 200.0)
    # A model-parallel size without its TP x PP split is not a setup.
    unsplit = pub.map_row({**mega, "tp": "model-parallel size 2 = TP x PP (split in Table 1)"})
    assert isinstance(unsplit, pub.Skip) and unsplit.reason == "tp not stated as a number"
    blackwell = mapped(titan_row("C5", gpu="NVIDIA Blackwell (not named)", n_gpus="4", dp="4"))
    assert getattr(blackwell.hardware.gpu, "id", None) == "B200"
    assert any("not named" in n for n in blackwell.notes)


def test_fp8_rows_map_to_the_fp8_path_and_fp4_rows_are_skipped() -> None:
    for precision in ("amp_fp8 (MP mode DEFAULT)", "BF16 + Float8 linears", "MXFP8",
                      "float8 rowwise", "mxfp8_cublas"):  # fmt: skip
        case = mapped(titan_row("D1", precision=precision))
        assert case.setup["precision"] == "fp8", precision
        assert "fp8_all_gather" not in case.setup
    gathered = mapped(titan_row("D5", precision="BF16 + Float8 linears (fsdp float8 all-gather)"))
    assert gathered.setup["fp8_all_gather"] is True
    for precision in ("NVFP4 (bf16 tail)", "MXFP4"):
        skip = pub.map_row(titan_row("D6", precision=precision))
        assert isinstance(skip, pub.Skip) and skip.reason.startswith("fp4"), precision


def test_unknown_rows_are_skipped_with_reasons() -> None:
    no_arch = pub.map_row(titan_row("D2", n_heads="", ffn_hidden=""))
    assert isinstance(no_arch, pub.Skip) and "n_heads" in no_arch.reason
    moe = pub.map_row(mpt_row("D3", model_type="moe"))
    assert isinstance(moe, pub.Skip) and "experts" in moe.reason
    gpu = pub.map_row(mpt_row("D4", gpu="tpu_v5"))
    assert isinstance(gpu, pub.Skip) and "GPU" in gpu.reason


def test_measured_value_is_read_or_derived() -> None:
    assert mapped(mpt_row("E1")).measured == 1000
    total = mapped(mpt_row("E2", tokens_per_s_per_gpu="", tokens_per_s_total="16000"))
    assert total.measured == 2000 and "(derived)" in total.measured_how
    samples = mapped(mpt_row("E3", tokens_per_s_per_gpu="", samples_per_s="32"))
    assert samples.measured == 32 * 512 / 8 and "(derived)" in samples.measured_how
    mega = mpt_row(
        "E5", source=MEGATRON, model="GPT tiny", tokens_per_s_per_gpu="", tflops_per_gpu="1",
        dp_sharding="DDP",
    )  # fmt: skip
    # Narayanan et al. eq. 3 per token: 96 l h^2 (1 + s/6h + V/16lh) = 35,127,296 FLOPs here.
    assert mapped(mega).measured == pytest.approx(1e12 / 35_127_296)
    assert "(derived)" in mapped(mega).measured_how
    none = pub.map_row(mpt_row("E4", tokens_per_s_per_gpu=""))
    assert isinstance(none, pub.Skip) and "no measured" in none.reason


def test_split_is_fixed_by_the_row_id(tmp_path: Path) -> None:
    ids = [f"X{i:04d}" for i in range(400)]
    rows = [mpt_row(i) for i in ids]
    write_tsv(tmp_path / "a", rows)
    write_tsv(tmp_path / "b", list(reversed(rows)))
    fit_a = {r["row_id"] for r in pub.fit_rows(tmp_path / "a")}
    fit_b = {r["row_id"] for r in pub.fit_rows(tmp_path / "b")}
    held = {r["row_id"] for r in pub.held_out_rows(tmp_path / "a")}
    assert fit_a == fit_b and not fit_a & held and fit_a | held == set(ids)
    assert 60 <= len(fit_a) <= 140  # one in four, by hash
    # The documented rule, computed independently.
    rule = {i for i in ids if int(hashlib.sha256(i.encode()).hexdigest(), 16) % 4 == 0}
    assert fit_a == rule


class _Fake:
    def __init__(self, tokens_per_s: float) -> None:
        self.tokens_per_s = tokens_per_s


def _fixed_ratio(ratios: dict[str, tuple[float, float]]) -> Any:
    """An estimator whose prediction is measured x ratio, keyed by model name."""

    def estimator(model: Any, hardware: Any, strategy: str, **kwargs: Any) -> _Fake:
        measured, ratio = ratios[model.name]
        return _Fake(measured * ratio * hardware.world_size)

    return estimator


def test_error_figures_from_controlled_predictions() -> None:
    ratios = {"m1": 1.05, "m2": 0.85, "m3": 1.5, "m4": 2.0}
    rows = [
        mpt_row(f"F{i}", model=name, tokens_per_s_per_gpu=str(100 * i))
        for i, name in enumerate(ratios, 1)
    ]
    est = _fixed_ratio({n: (100 * i, r) for i, (n, r) in enumerate(ratios.items(), 1)})
    result = pub.evaluate([*rows, mpt_row("F9", precision="NVFP4")], "all", est)
    stats = result["errors"]["all"]["llm-foundry"]
    assert stats["n"] == 4 and stats["n_skipped"] == 1
    assert stats["median_abs_error"] == pytest.approx((0.15 + 0.5) / 2)
    assert stats["within_10pct"] == pytest.approx(0.25)
    assert stats["within_20pct"] == pytest.approx(0.5)
    assert stats["off_by_2x"] == 1
    assert stats["worst_over"] == pytest.approx(2.0)
    assert stats["worst_under"] == pytest.approx(0.85)
    assert list(stats["skip_reasons"].values()) == [1]
    # By precision: the four 16-bit rows, no fp8 row (the NVFP4 one is skipped).
    assert result["errors"]["all"]["16-bit"]["n"] == 4 and result["errors"]["all"]["fp8"]["n"] == 0
    # Each row lands in its own split, and the splits add up to all.
    n_fit = result["errors"]["fit"]["all"]["n"]
    assert n_fit + result["errors"]["held-out"]["all"]["n"] == 4


def test_grid_ranking_pick_and_spearman() -> None:
    measured = {"4": 900.0, "8": 1000.0, "2": 700.0}

    def rows(prefix: str) -> list[dict[str, str]]:
        return [
            mpt_row(f"{prefix}{mb}", micro_batch=mb, grad_accum="1", global_batch_seqs="",
                    tokens_per_s_per_gpu=str(v))
            for mb, v in measured.items()
        ]  # fmt: skip

    def by_micro(sign: float) -> Any:
        def estimator(model: Any, hardware: Any, strategy: str, **kw: Any) -> _Fake:
            return _Fake((1000 + sign * kw["micro_batch_size"]) * hardware.world_size)

        return estimator

    good = pub.evaluate(rows("G"), "all", by_micro(+1))["ranking"]["all"]
    assert good["n_grids"] == 1 and good["share_pick_within_5pct"] == 1.0
    assert good["median_pick_over_best"] == 1.0 and good["median_spearman"] == pytest.approx(1)
    bad = pub.evaluate(rows("H"), "all", by_micro(-1))["ranking"]["all"]
    assert bad["share_pick_within_5pct"] == 0.0
    assert bad["median_pick_over_best"] == pytest.approx(0.7)
    assert bad["median_spearman"] == pytest.approx(-1)
    # One setup measured twice is not a grid.
    twice = [mpt_row("I1"), mpt_row("I2", tokens_per_s_per_gpu="1100")]
    assert pub.evaluate(twice, "all", by_micro(+1))["ranking"]["all"]["n_grids"] == 0


def test_real_speed_model_on_made_up_rows_keeps_relations() -> None:
    rows = [mpt_row("J1", act_ckpt="none"), mpt_row("J2", act_ckpt="full")]
    result = pub.evaluate(rows, "all")
    cases = {c.row_id: c for c in result["_cases"]}
    assert set(cases) == {"J1", "J2"}
    assert all(c.predicted and c.predicted > 0 for c in cases.values())
    # Recomputing every layer runs the forward twice: never faster.
    assert cases["J2"].predicted is not None and cases["J1"].predicted is not None
    assert cases["J2"].predicted < cases["J1"].predicted


def _cli(env_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, pub.ENV_VAR: str(env_dir)}
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "calibration" / "published.py"), *args],
        capture_output=True, text=True, env=env, timeout=300, cwd=ROOT,
    )  # fmt: skip


def test_cli_missing_folder_one_line_exit_0(tmp_path: Path) -> None:
    done = _cli(tmp_path / "absent")
    assert done.returncode == 0
    assert done.stdout.strip().count("\n") == 0 and "skipped" in done.stdout
    assert str(tmp_path / "absent") in done.stdout
    assert pub.measure(tmp_path / "absent")["skipped"]


def test_cli_bad_input_exit_2(tmp_path: Path) -> None:
    bad_split = _cli(tmp_path, "--split", "train")
    assert bad_split.returncode == 2 and bad_split.stderr.strip().count("\n") == 0
    assert "split" in bad_split.stderr
    (tmp_path / "empty").mkdir()
    no_tsv = _cli(tmp_path / "empty")
    assert no_tsv.returncode == 2 and pub.TSV in no_tsv.stderr
    (tmp_path / "wrong").mkdir()
    (tmp_path / "wrong" / pub.TSV).write_text("row_id\tmodel\nZ1\tx\n")
    wrong = _cli(tmp_path / "wrong")
    assert wrong.returncode == 2 and "column" in wrong.stderr
    assert wrong.stderr.strip().count("\n") == 0


def test_cli_json_holds_aggregates_only(tmp_path: Path) -> None:
    folder = write_tsv(tmp_path / "pub", [
        mpt_row("K1", tokens_per_s_per_gpu="1234.5"),
        mpt_row("K2", micro_batch="8", grad_accum="1", global_batch_seqs="",
                tokens_per_s_per_gpu="2345.5"),
    ])  # fmt: skip
    out = tmp_path / "agg.json"
    done = _cli(folder, "--split", "all", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "K1" in done.stdout or "K2" in done.stdout  # worst rows by id on stdout
    text = out.read_text()
    data = json.loads(text)
    assert data["errors"]["all"]["llm-foundry"]["n"] == 2
    assert "ranking" in data and "split_rule" in data
    for secret in ("K1", "K2", "1234.5", "2345.5", "1234", "2345"):
        assert secret not in text


def test_bench_run_has_a_published_section(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert "published" in bench_run.SECTIONS
    monkeypatch.setenv(pub.ENV_VAR, str(tmp_path / "absent"))
    results = bench_run.run(True, ["published"])
    assert not results["errors"] and "skipped" in results["sections"]["published"]
    assert "vs published throughputs" in bench_run.render_markdown(results)
    folder = write_tsv(tmp_path / "pub", [mpt_row("L1"), mpt_row("L2", act_ckpt="full")])
    monkeypatch.setenv(pub.ENV_VAR, str(folder))
    results = bench_run.run(True, ["published"])
    assert not results["errors"], results["errors"]
    rows = bench_run.summary_rows(results)
    assert any("published" in figure.lower() for figure, _, _ in rows)
    markdown = bench_run.render_markdown(results)
    assert "llm-foundry" in markdown and "L1" not in markdown
