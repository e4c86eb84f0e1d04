"""The benchmark code's cheap parts, so that bench/ cannot silently rot (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import run as bench_run
from bench.common import BenchError, run_cmd
from bench.suite import choice_grid, latency, memory_accuracy, plan_cold

ROOT = Path(__file__).resolve().parents[2]


def test_estimator_grid_matches_deepspeed_where_the_formulas_agree() -> None:
    grid = memory_accuracy.estimator_grid(
        models=["gpt2"], hardware=[(1, 1), (1, 8)], strategies=["zero2", "zero3_offload_all"]
    )
    assert grid["n"] == 4
    for case in grid["cases"]:
        assert case["deepspeed_bytes"] > 0 and case["ours_bytes"] > 0
        assert case["error"] == pytest.approx(case["ours_bytes"] / case["deepspeed_bytes"] - 1)
    # ZeRO-2 without offload: both are 2 + 18/N bytes per parameter.
    assert all(abs(c["error"]) < 0.01 for c in grid["cases"] if c["strategy"] == "zero2")
    assert set(grid["by_strategy"]) == {"zero2", "zero3_offload_all"}


def test_gpu_rows_read_the_recorded_runs() -> None:
    gpu = memory_accuracy.gpu_cases()
    assert gpu["n"] >= 1 and gpu["measured_on"]
    row = gpu["cases"][0]
    assert row["measured_bytes"] > 0 and row["predicted_bytes"] > 0


def test_grid_entries_keep_the_global_batch() -> None:
    _, shape = choice_grid.smoke_model()
    entries = choice_grid.grid_entries(shape, ["ddp", "zero3"], [2, 8])
    assert [e["label"] for e in entries] == ["ddp mb2x4", "ddp mb8x1", "zero3 mb2x4", "zero3 mb8x1"]
    for entry in entries:
        cfg = entry["ds_config"]
        assert cfg["train_batch_size"] == choice_grid.GLOBAL_BATCH
        assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 2 == 16
        assert "bf16" not in cfg and "fp16" not in cfg  # fp32 on CPU ranks
    pick = choice_grid.planner_pick(shape)
    assert pick["strategy"] in ("ddp", "zero1", "zero2", "zero3")
    summary = choice_grid.summarize(
        [{"label": "a", "strategy": "ddp", "micro_batch": 8, "accumulation": 1, "status": "ok",
          "tokens_per_s": 10.0},
         {"label": "a", "strategy": "ddp", "micro_batch": 8, "accumulation": 1, "status": "ok",
          "tokens_per_s": 30.0},
         {"label": "b", "strategy": "zero3", "micro_batch": 8, "accumulation": 1,
          "status": "failed", "error": "x"}]
    )  # fmt: skip
    assert summary[0]["tokens_per_s"] == 20.0 and summary[1]["tokens_per_s"] is None


def test_parse_importtime_keeps_top_level_imports() -> None:
    text = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       100 |        100 |     _io\n"
        "import time:       500 |       1200 | argparse\n"
        "import time:        40 |         40 |   gettext\n"
    )
    rows = latency.parse_importtime(text)
    assert rows == [{"module": "argparse", "self_us": 500, "cumulative_us": 1200}]


def test_write_briefs_are_valid(tmp_path: Path) -> None:
    from tools.intake.brief import brief_from_dict

    for path in latency.write_briefs(tmp_path, 12):
        brief_from_dict(json.loads(path.read_text()))


def test_run_cmd_kills_the_group_on_timeout() -> None:
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    with pytest.raises(BenchError, match="timed out"):
        run_cmd([sys.executable, "-c", code], timeout=1)
    assert run_cmd([sys.executable, "-c", "print('hi')"], timeout=30).output.strip() == "hi"


def test_results_are_written_from_cheap_sections(tmp_path: Path) -> None:
    results = bench_run.run(quick=True, sections=["planner_cases", "memory_gpu"])
    assert not results["errors"], results["errors"]
    # The other sections' renderers, on canned figures of the same shape.
    results["sections"].update(_canned_sections())
    json_path, md_path = bench_run.write_results(results, tmp_path)
    data = json.loads(json_path.read_text())
    assert data["machine"]["nproc"] >= 1 and data["machine"]["torch"]
    text = md_path.read_text()
    assert text.startswith("# Benchmarks")
    for figure in ("Planner's pick vs best", "cold start", "Smoke run vs minimal", "GPU"):
        assert figure in text
    assert "| researcher | 2.00 |" in text and "Cold `app.py plan --no-smoke`, CPU" in text
    assert "researcher.search_knowledge 1.50 s, engineer.emit_launch 0.03 s." in text
    assert "| figure | value | how measured |" in text


def test_cpu_run_reads_the_childs_cpu_and_stops_it_at_the_timeout() -> None:
    env = dict(os.environ)
    burn = "import time\nwhile time.process_time() < 0.2: pass\nprint(time.process_time())"
    run = plan_cold.cpu_run([sys.executable, "-c", burn], env=env, timeout=60)
    assert run.returncode == 0 and run.cpu_s >= float(run.output.split()[-1]) >= 0.2
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    with pytest.raises(BenchError, match="timed out"):
        plan_cold.cpu_run([sys.executable, "-c", code], env=env, timeout=1)


def test_split_marks_gives_each_node_its_cpu_and_each_tool_its_share() -> None:
    marks = [
        ("start", 2.0),
        ("tool:researcher.lookup_model", 2.5),
        ("tool:researcher.search_knowledge", 2.75),
        ("tool:researcher.lookup_model", 4.0),
        ("researcher", 4.5),
        ("engineer", 5.0),
        ("finish", 5.25),
    ]
    phases, tools = plan_cold.split_marks(marks)
    # Tool marks do not cut the node: the researcher's 2.5 s include its tools'.
    assert phases == {"start": 2.0, "researcher": 2.5, "engineer": 0.5, "finish": 0.25}
    # A tool runs to the next mark, a tool called twice adds up.
    assert tools == {"researcher.lookup_model": 0.75, "researcher.search_knowledge": 1.25}


def test_run_cli_rejects_unknown_sections() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/run.py", "--quick", "--only", "nope"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "unknown section" in proc.stderr


def _canned_sections() -> dict[str, object]:
    config = {"label": "ddp mb8x1", "strategy": "ddp", "micro_batch": 8, "accumulation": 1,
              "rounds_tokens_per_s": [1000.0], "errors": [], "tokens_per_s": 1000.0}  # fmt: skip
    grid = memory_accuracy.estimator_grid(models=["gpt2"], hardware=[(1, 8)])
    return {
        "memory_grid": grid,
        "memory_smoke": {
            "what": "canned",
            "n": 1,
            "median_abs_error": 0.1,
            "max_abs_error": 0.1,
            "cases": [
                {
                    "strategy": "zero2",
                    "status": "passed",
                    "measured_bytes": 2**20,
                    "predicted_bytes": 2**20,
                    "error": 0.0,
                    "wall_s": 20.0,
                }
            ],
        },  # fmt: skip
        "choice": {
            "what": "canned",
            "model_source": "x",
            "ranks": 2,
            "global_batch": 16,
            "rounds": 1,
            "model": {"layers": 2, "hidden": 256, "vocab": 8192, "params": 6e6},
            "planner": {
                "strategy": "ddp",
                "micro_batch": 8,
                "accumulation": 1,
                "search_strategy_s": 0.001,
                "rule": "r",
            },
            "planner_cold_wall_s": 1.0,
            "grid_wall_s": 60.0,
            "grid_configs": 1,
            "configs": [config],
            "best": config,
            "pick_measured": config,
            "pick_rank": 1,
            "ratio_pick_over_best": 1.0,
            "grid_over_planner_wall": 60.0,
        },  # fmt: skip
        "latency": {
            "cold_start": {
                "what": "w",
                "repeats": 1,
                "app_help_median_s": 0.1,
                "python_pass_median_s": 0.05,
                "ratio": 2.0,
            },
            "app_imports": {
                "what": "w",
                "modules_imported": 80,
                "heavy_imported": [],
                "ours_imported": ["tools"],
                "non_stdlib_roots": ["tools"],
                "top_level": [{"module": "argparse", "cumulative_us": 1000}],
            },
            "plan_no_smoke": {
                "what": "`python app.py plan --brief examples/briefs/x.yaml --no-smoke`",
                "repeats": 1,
                "median_s": 5.0,
                "first_run_with_index_build_s": 9.0,
                "chosen": "zero1",
                "verdict": "approved",
            },
            "batch": {
                "what": "w",
                "briefs": 20,
                "jobs": 2,
                "per_brief_s": 1.0,
                "wall_s": 20.0,
                "report_folders": 20,
                "exit_code": 0,
            },
            "heavy_imports": {
                "what": "w",
                "repeats": 1,
                "modules": [
                    {
                        "module": "torch",
                        "import_median_s": 2.0,
                        "wall_median_s": 2.1,
                        "error": None,
                    },
                    {
                        "module": "crewai",
                        "import_median_s": None,
                        "wall_median_s": None,
                        "error": "ImportError",
                    },
                ],
            },
        },  # fmt: skip
        "plan_cold": {
            "plan": {
                "cpu_median_s": 5.0,
                "cpu_min_s": 4.5,
                "wall_median_s": 9.0,
                "runs": 3,
                "first_run_builds_index_cpu_s": 12.0,
                "target_cpu_s": 3.0,
            },
            "nodes": {
                "median_s": {"start": 1.5, "researcher": 2.0, "exit": 0.2},
                "tool_median_s": {"researcher.search_knowledge": 1.5, "engineer.emit_launch": 0.03},
                "cpu_median_s": 5.1,
                "search_strategy_calls": 2,
                "search_strategy_median_s": [0.04, 0.05],
            },
            "help": {
                "app_help_cpu_median_s": 0.05,
                "python_pass_cpu_median_s": 0.03,
                "ratio": 1.7,
                "wall_ratio": 1.8,
                "target_ratio": 2.0,
                "pairs": 5,
            },
        },  # fmt: skip
        "overhead": {
            "command": "c",
            "what": "w",
            "repeats": 1,
            "smoke_s": [20.0],
            "minimal_s": [16.0],
            "smoke_median_s": 20.0,
            "minimal_median_s": 16.0,
            "ratio": 1.25,
        },  # fmt: skip
    }
