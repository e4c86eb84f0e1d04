"""FSDP.md says what launch.sh runs: FSDP2 with the plan's sharding, or plain DDP (NO_SHARD).

"fine-tune gpt2 on this machine with fsdp" (and on 2 A100 80GB) planned strategy ddp, so
launch.sh ran train.py without `--fsdp` while FSDP.md's first line said it ran "its FSDP2 mode
(`--fsdp`, with the plan's sharding)".
"""

from __future__ import annotations

import pytest
from specs import GPT2

from tools.artifacts.guides import fsdp_md
from tools.core.schemas import HardwareSpec
from tools.core.strategies import train_py_fsdp

HARDWARE = HardwareSpec(source="described", nodes=1, gpus_per_node=2)


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "zero3_offload", None])
def test_the_guide_names_the_mode_launch_sh_runs(strategy: str | None) -> None:
    sharding, _ = train_py_fsdp(strategy, HARDWARE.nodes)
    command = ["torchrun", "trainer/train.py"]
    command += [] if sharding is None else ["--fsdp", "--fsdp-sharding", sharding]
    guide = fsdp_md(command, HARDWARE, GPT2, "bf16", "trainer/train.py", strategy_name=strategy)
    first = guide.split("\n\n")[1]
    if sharding is None:
        assert "plain DDP mode, without `--fsdp`" in first and "FSDP2 mode" not in first
        assert "./launch.sh --fsdp --fsdp-sharding full" in first
    else:
        assert "in its FSDP2 mode (`--fsdp`" in first and "plain DDP" not in first
