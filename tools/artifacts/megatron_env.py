"""The DeepSpeed a Megatron-DeepSpeed launch needs, checked before torchrun starts.

Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed at 4efb479d, 2025-07, its newest) imports
``from deepspeed.compression.compress import init_compression, redundancy_clean`` at the top of
megatron/training.py, which pretrain_gpt.py and tools/hf2megads_weight_converter.py import.
DeepSpeed removed its compression library in 0.19.7 (deepspeedai/DeepSpeed#8490; 0.19.6's
sdist holds deepspeed/compression/compress.py, 0.19.7's and 0.19.8's do not), so under a
current DeepSpeed every rank stopped at import with 'No module named
deepspeed.compression.compress' (bench/results/2026-12-06-launch-parsers.md). launch.sh,
train.sbatch and convert_checkpoint.sh of a Megatron plan import it first and stop with one
line naming the release to install; MEGATRON.md says so.
"""

from __future__ import annotations

# The last DeepSpeed release that has deepspeed.compression.compress.
DEEPSPEED_FOR_MEGATRON = "0.19.6"
_PROBE = "import deepspeed.compression.compress"
_VERSION = "import importlib.metadata as m; print(m.version('deepspeed'))"


def deepspeed_check() -> list[str]:
    """Script lines that stop (exit 2) unless the Python has what Megatron-DeepSpeed imports."""
    return [
        f'if ! "${{PYTHON:-python3}}" -c "{_PROBE}" > /dev/null 2>&1; then',
        f'    ds_version=$("${{PYTHON:-python3}}" -c "{_VERSION}" 2>/dev/null || echo none)',
        '    echo "Megatron-DeepSpeed imports deepspeed.compression, which DeepSpeed 0.19.7 '
        "removed; found deepspeed $ds_version in ${PYTHON:-python3}: "
        f'pip install deepspeed=={DEEPSPEED_FOR_MEGATRON} (MEGATRON.md)" >&2',
        "    exit 2",
        "fi",
    ]


def deepspeed_note() -> str:
    """MEGATRON.md's sentence on the DeepSpeed release."""
    return (
        f"Install DeepSpeed {DEEPSPEED_FOR_MEGATRON} or earlier in its Python "
        f"(`pip install deepspeed=={DEEPSPEED_FOR_MEGATRON}`): Megatron-DeepSpeed imports "
        "`deepspeed.compression`, which DeepSpeed 0.19.7 removed, and launch.sh, train.sbatch "
        "and convert_checkpoint.sh stop with one line when it is missing."
    )
