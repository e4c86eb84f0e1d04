"""A pretraining plan says how its corpus becomes token shards, and passes them to the job.

launch.sh (and train.sbatch) of a pretraining plan name the prepare_data.py command with the
model's tokenizer and use the prepared folder when DATA is unset; the report has the same two
steps. A fine-tune's data path is unchanged: the job tokenizes its dataset itself.
"""

from __future__ import annotations

from pathlib import Path

from tools.artifacts.launch import emit_launch
from tools.artifacts.report import render_markdown
from tools.core.schemas import (
    FrameworkChoice,
    HardwareSpec,
    Review,
    SmokeResult,
    TrainingBrief,
    TrainingPlan,
)
from tools.research.model_catalog import lookup_model

DDP = FrameworkChoice(primary="pytorch_ddp", stack=["pytorch", "pytorch_ddp"], rationale="x")
HARDWARE = HardwareSpec(source="described", nodes=1, gpus_per_node=8)
PREPARE = "python trainer/prepare_data.py YOUR_CORPUS --out data/tokens --tokenizer "
DEFAULT = '[[ -n "${DATA:-}" || ! -f data/tokens/index.json ]] || DATA=data/tokens'


def _plan(out: Path, task: str) -> TrainingPlan:
    spec = lookup_model("llama-3-8b", 2048)
    brief = TrainingBrief(goal="g", model="llama-3-8b", task=task, seq_len=2048)  # type: ignore[arg-type]
    launch = emit_launch(out, brief, HARDWARE, spec, DDP, None, steps=100)
    return TrainingPlan(
        brief=brief,
        hardware=HARDWARE,
        model=spec,
        framework=DDP,
        memory=None,
        deepspeed_config=None,
        launch=launch,
        smoke_test=SmokeResult(status="skipped", reason="test"),
        review=Review(verdict="approved"),
    )


def test_a_pretraining_plan_ships_prepare_data_and_passes_its_shards(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "pretrain")
    assert "trainer/prepare_data.py" in plan.launch.files
    launch = (tmp_path / "launch.sh").read_text()
    assert f"{PREPARE}meta-llama/Meta-Llama-3-8B ; then DATA=data/tokens ./launch.sh" in launch
    # The prepared folder is the job's data when DATA is unset, on a cluster too.
    for script in ("launch.sh", "train.sbatch"):
        lines = (tmp_path / script).read_text().splitlines()
        job_line = next(i for i, line in enumerate(lines) if "trainer/train.py" in line)
        assert DEFAULT in lines[:job_line], script
    report = render_markdown(plan)
    assert "## Pretraining data" in report
    assert f"{PREPARE}meta-llama/Meta-Llama-3-8B\nDATA=data/tokens ./launch.sh\n" in report


def test_a_fine_tune_keeps_its_data_path(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "finetune")
    launch = (tmp_path / "launch.sh").read_text()
    assert "prepare_data.py YOUR_CORPUS" not in launch and DEFAULT not in launch
    assert "## Pretraining data" not in render_markdown(plan)
