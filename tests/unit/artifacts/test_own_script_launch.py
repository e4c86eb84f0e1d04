"""A model train.py cannot train launches the user's own script, never train.py.

trainer/train.py builds ``AutoModelForCausalLM`` and trains on token batches: for an image
model (ResNet, ViT) or an encoder-decoder it stops with transformers' "Unrecognized
configuration class" on every rank. So its launch scripts run ``$TRAIN_SCRIPT`` (the model's
own training loop, which gets the same arguments) and stop with one line naming the model
while it is unset; a causal language model's scripts run trainer/train.py as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.artifacts.launch import emit_launch
from tools.core.schemas import FrameworkChoice, HardwareSpec, TrainingBrief
from tools.research.model_catalog import lookup_model

DDP = FrameworkChoice(primary="pytorch_ddp", stack=["pytorch", "pytorch_ddp"], rationale="x")
HARDWARE = HardwareSpec(source="described", nodes=2, gpus_per_node=8)


def _scripts(out: Path, name: str, seq_len: int) -> dict[str, list[str]]:
    model = lookup_model(name, seq_len)
    brief = TrainingBrief(goal="g", model=name, task="finetune", seq_len=seq_len)
    emit_launch(out, brief, HARDWARE, model, DDP, None, steps=100)
    return {s: (out / s).read_text().splitlines() for s in ("launch.sh", "train.sbatch")}


@pytest.mark.parametrize(("name", "seq_len"), [("resnet-50", 224), ("vit-base", 197)])
def test_an_image_model_runs_the_users_script_not_train_py(
    tmp_path: Path, name: str, seq_len: int
) -> None:
    for script, lines in _scripts(tmp_path, name, seq_len).items():
        job = next(i for i, line in enumerate(lines) if "torchrun " in line)
        assert "trainer/train.py" not in lines[job], f"{script} runs train.py on {name}"
        assert '"$TRAIN_SCRIPT"' in lines[job], script
        guard = [line for line in lines[:job] if "TRAIN_SCRIPT to its own" in line]
        assert guard and name in guard[0], f"{script} does not stop while TRAIN_SCRIPT is unset"
        assert any(line.startswith('if [[ -z "${TRAIN_SCRIPT:-}" ]]') for line in lines[:job])


def test_a_causal_lm_still_runs_train_py(tmp_path: Path) -> None:
    for script, lines in _scripts(tmp_path, "llama-3-8b", 2048).items():
        assert any("torchrun " in line and "trainer/train.py" in line for line in lines), script
        assert not any("TRAIN_SCRIPT" in line for line in lines), script
