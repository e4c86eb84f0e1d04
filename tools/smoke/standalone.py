"""Where the standalone training scripts live: ``scripts/``, a folder copied whole.

They import nothing of ours (tests/unit/core/test_layers.py): ``train.py``, the job and the smoke run's
training script; ``parallel_train.py``, the torch-native stand-in for tensor/pipeline layouts;
``tf_train.py``, the TensorFlow worker (run in ``.venv-tf``).
"""

from __future__ import annotations

from pathlib import Path

SCRIPTS_DIR = Path(__file__).resolve().with_name("scripts")
TRAIN_SCRIPT = SCRIPTS_DIR / "train.py"
PARALLEL_SCRIPT = SCRIPTS_DIR / "parallel_train.py"
TF_SCRIPT = SCRIPTS_DIR / "tf_train.py"


def script_files() -> list[Path]:
    """Every file a copy of the folder holds: the scripts, the modules they import, the README."""
    return sorted(p for p in SCRIPTS_DIR.iterdir() if p.is_file() and p.suffix in (".py", ".md"))
