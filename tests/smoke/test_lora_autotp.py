"""Why a LoRA plan searches no tensor split: DeepSpeed AutoTP drops a PEFT model's adapters.

tests/lora_autotp_probe.py wraps a 2-layer Llama with peft LoRA on every linear projection (as
the plan's train.py does) and hands it to ``deepspeed.initialize`` with ``autotp_size`` 2 on 2
CPU gloo ranks, ZeRO 0 (under ZeRO 1/2 initialize itself stops, with a KeyError in
stage_1_and_2's ``_create_param_mapping``). AutoTP shards the base projections, but through
the model's Hugging Face tp_plan it replaces each peft ``lora.Linear`` whole with a plain
``LinearLayer``: no lora_A/lora_B remain, nothing requires grad, and the first backward fails.
tools/research/splits.py ``lora_split_refusal`` is this finding; when this test fails, a
DeepSpeed release keeps the adapters: check they shard consistently and train, then lift the
refusal (``runs_setup``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.core.settings import TELEMETRY_OFF
from tools.smoke import free_port

PROBE = Path(__file__).parents[1] / "lora_autotp_probe.py"
RANKS = 2
MODEL_CONFIG = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
    "zero_optimization": {"stage": 0},
    "tensor_parallel": {"autotp_size": RANKS},
}
Q_PROJ = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.slow
def test_autotp_replaces_the_lora_projections_and_nothing_trains(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    pytest.importorskip("peft")
    (tmp_path / "model.json").write_text(json.dumps(MODEL_CONFIG))
    (tmp_path / "ds.json").write_text(json.dumps(DS_CONFIG))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cmd = [
        sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(tmp_path / "none"),
        "--num_gpus", str(RANKS), "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(PROBE), "--model-config", str(tmp_path / "model.json"),
        "--deepspeed_config", str(tmp_path / "ds.json"), "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    env = {**os.environ, **TELEMETRY_OFF, "DS_ACCELERATOR": "cpu", "TMPDIR": str(tmp)}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(RANKS):
        report = json.loads((tmp_path / "out" / f"rank{rank}.json").read_text())
        before, after = report["before"], report["after"]
        # peft added adapters, trainable, and froze the base.
        assert before[f"{Q_PROJ}.lora_A.default.weight"] == [[4, 64], True]
        assert before[f"{Q_PROJ}.base_layer.weight"] == [[64, 64], False]
        # AutoTP sharded the base (64 query rows over 2 ranks) ...
        assert report["modules"][Q_PROJ] == "LinearLayer"
        assert after[f"{Q_PROJ}.weight"] == [[32, 64], False]
        # ... and the adapters are gone: nothing trains.
        assert not [n for n in after if "lora_" in n]
        assert not [n for n, (_, grad) in after.items() if grad]
        assert report["initialized"] and report["loss_requires_grad"] is False
        assert report["stepped"] is False
