"""The launch files run the job plan.json describes (bench/suite/launch_agreement.py, per launcher).

One request per launcher the planner writes (DeepSpeed ZeRO on one node and across nodes,
DeepSpeed AutoTP, Megatron-DeepSpeed tensor x pipeline, torchtitan with pipeline stages, FSDP
under torchrun), planned by the CLI in process; every value a launch file passes (world size,
tensor/pipeline/context degrees, micro-batch, accumulation, global batch, sequence length,
steps, learning rate) must be the plan's. The bench runs the same check over a sweep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.suite.launch_agreement import Check, compare

REQUESTS = {
    "zero": "fine-tune llama-3-8b on 8 H100, seq len 4096, global batch 64, lr 2e-5",
    "multinode": "pretrain llama-3.1-70b on 4 nodes of 8 H100 with seq 8192",
    "autotp": "fine-tune mistral-7b on 8 H100 with deepspeed tensor parallel 2",
    "megatron": "pretrain gpt-3-6.7b on 2 nodes of 8 A100 with megatron tensor parallel 2 pipeline 2",
    "torchtitan": "continue pretraining llama-3.1-8b on 16 nodes of 8 H100, lr 1e-4, pipeline parallel 2",
    "fsdp": "fine-tune mistral-7b on 2 nodes of 8 A100 40GB with fsdp, seq 2048, micro batch 1",
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from inproc import run_main

    root = tmp_path_factory.mktemp("agreement")
    out = {}
    for name, text in REQUESTS.items():
        done = run_main("plan", text, "--no-smoke", "--out", str(root / name), cwd=root)
        assert done.returncode == 0, (name, done.stderr)
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", list(REQUESTS))
def test_every_launch_value_is_the_plans(plans: dict[str, Path], name: str) -> None:
    folder = plans[name]
    plan = json.loads((folder / "plan.json").read_text())
    check = Check(REQUESTS[name], name)
    compare(folder, plan, check)
    assert check.findings == [], check.findings
    # Each launch passes the world size, micro-batch and sequence length itself.
    assert not {"world", "mb", "seq"} & set(check.unpassed), check.unpassed


def test_the_launchers_planned_are_the_ones_named(plans: dict[str, Path]) -> None:
    primary = {
        n: json.loads((f / "plan.json").read_text())["framework"]["primary"]
        for n, f in plans.items()
    }
    assert primary["megatron"] == "megatron" and primary["torchtitan"] == "torchtitan"
    assert primary["fsdp"] == "pytorch_fsdp" and primary["zero"] == "deepspeed"
    autotp = json.loads((plans["autotp"] / "ds_config.json").read_text())
    assert primary["autotp"] == "deepspeed" and autotp["tensor_parallel"]["autotp_size"] == 2


def test_a_launch_value_that_differs_is_found(plans: dict[str, Path], tmp_path: Path) -> None:
    # The check can fail: a ds_config.json whose batch is not the plan's is named.
    folder = tmp_path / "zero"
    folder.mkdir()
    for f in plans["zero"].iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "ds_config.json").read_text())
    cfg["train_batch_size"] *= 2
    (folder / "ds_config.json").write_text(json.dumps(cfg))
    check = Check("", "zero")
    compare(folder, json.loads((folder / "plan.json").read_text()), check)
    assert any(f.startswith("ds_config.json: gbs") for f in check.findings), check.findings


def test_each_part_of_a_request_is_planned_or_said(plans: dict[str, Path], tmp_path: Path) -> None:
    # bench/suite/request_honour.py: the model, GPUs and each grid word are in the plan or under
    # "Not as asked"; a LoRA plan with a pinned pipeline (dropped without a word before) says so.
    from inproc import run_main

    from bench.suite.request_honour import silent_parts

    text = "LoRA fine-tune llama-3-8b on 8 H100, pipeline parallel 2, for 300 steps"
    done = run_main("plan", text, "--no-smoke", "--out", str(tmp_path / "lora"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = json.loads((tmp_path / "lora" / "plan.json").read_text())
    words = ["pipeline parallel 2", "for 300 steps"]
    assert silent_parts(plan, "llama-3-8b", "8 H100", words) == []
    # The check can fail: the same plan with its "not as asked" lines and step count gone.
    plan["memory"]["not_honoured"], plan["brief"]["dataset_tokens"] = [], None
    assert silent_parts(plan, "llama-3-8b", "8 H100", words) == [
        "'pipeline parallel 2' neither planned nor said",
        "'for 300 steps' neither planned nor said",
    ]
    assert silent_parts(plan, "llama-3-8b", "2 nodes of 8 H100", []) == [
        "2 nodes of 8 H100: planned 1x8"
    ]
