"""tools/smoke/scripts/parallel_train.py: the torch-native TP x PP x DP smoke run agrees with one process.

A tiny Llama-style model (4 layers, hidden 64, 4 heads over 2 KV heads, vocab 256, seq 32) is
trained for 5 steps under tensor parallel 2, pipeline parallel 2 (GPipe), TP 2 x PP 2 (1F1B) and
DP 2 x TP 2 (plain DP, and ZeRO-1: optimizer states sharded over the dp group), on gloo CPU ranks launched by torchrun, and once unsplit on one process
(``--reference``) from the same seed on the same global batches. Each rank must hold the share
of parameters the layout gives it (checked against numbers worked out by hand below), and
every step's loss must match the reference's within LOSS_RTOL (fp32; measured: about 1e-7
relative, the reductions' summation order). Injected crash and NaN faults end the run as the
supervisor expects.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import parallel_layout as pl
import parallel_train as pt
import pytest

from tools.smoke.commands import free_port
from tools.smoke.supervise import PROGRESS_LINE

SCRIPT = Path(pt.__file__)
CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "initializer_range": 0.02,
}
STEPS = 5
COMMON = ["--steps", str(STEPS), "--seq-len", "32", "--micro-batch", "2", "--microbatches", "2"]
LOSS_RTOL = 1e-4
TIMEOUT_S = 150
# By hand for CONFIG (H 64, q 64, k/v 32 each, intermediate 128, vocab 256):
# a layer's sharded weights are 64*64 + 2*64*32 + 64*64 + 3*64*128 = 36,864, its norms 128;
# the embedding and the head are 256*64 = 16,384 each, the final norm 64.
LAYER_SHARDED, LAYER_NORMS, VOCAB_MATRIX, FINAL_NORM = 36_864, 128, 16_384, 64
WHOLE_MODEL = 4 * (LAYER_SHARDED + LAYER_NORMS) + 2 * VOCAB_MATRIX + FINAL_NORM  # 180,800


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(CONFIG))
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _run(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd`` in its own process group; kill the whole group at the timeout."""
    proc = subprocess.Popen(
        cmd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {TIMEOUT_S}s:\n{out[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out


def _launch(nproc: int, config: Path, metrics: Path, extra: list[str]) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    cmd += ["--master_port", str(free_port()), str(SCRIPT), "--model-config", str(config)]
    return _run(cmd + ["--metrics-dir", str(metrics), *COMMON, *extra])


def _ranks(metrics: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(metrics.glob("rank*.json"))]


@pytest.fixture(scope="module")
def references(config_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    """The unsplit run's rank0.json, for 1 and 2 data-parallel ranks' batches per step."""
    out: dict[int, Any] = {}
    for dp in (1, 2):
        metrics = tmp_path_factory.mktemp(f"ref{dp}")
        rc, log = _run(
            [sys.executable, str(SCRIPT), "--model-config", str(config_path), "--reference"]
            + ["--data-parallel", str(dp), "--metrics-dir", str(metrics), *COMMON]
        )
        assert rc == 0, log[-4000:]
        out[dp] = _ranks(metrics)[0]
    return out


def test_expected_share_by_hand() -> None:
    shape = pl.ModelShape(CONFIG)
    half = LAYER_SHARDED // 2 + LAYER_NORMS
    assert pl.expected_local_params(shape, 1, 1, 0) == WHOLE_MODEL
    assert pl.expected_local_params(shape, 2, 1, 0) == 4 * half + VOCAB_MATRIX + FINAL_NORM
    assert pl.expected_local_params(shape, 1, 2, 0) == 2 * (LAYER_SHARDED + 128) + VOCAB_MATRIX
    assert pl.expected_local_params(shape, 2, 2, 1) == 2 * half + VOCAB_MATRIX // 2 + FINAL_NORM
    assert [list(pl.stage_layers(5, 2, s)) for s in (0, 1)] == [[0, 1, 2], [3, 4]]
    # The model the script builds holds exactly the config's count.
    assert pl.local_param_count(pl.build_stage(shape, 0, 1, 0)) == WHOLE_MODEL
    with pytest.raises(pt.UsageError, match="divisible"):
        shape.check_layout(3, 1)


# (processes, arguments, data-parallel degree, each rank's expected parameter count)
LAYOUTS = {
    "tp2": (2, ["--tp", "2"], 1, [4 * (LAYER_SHARDED // 2 + 128) + VOCAB_MATRIX + 64] * 2),
    "pp2": (
        2,
        ["--pp", "2", "--pp-schedule", "gpipe"],
        1,
        [2 * (LAYER_SHARDED + 128) + VOCAB_MATRIX, 2 * (LAYER_SHARDED + 128) + VOCAB_MATRIX + 64],
    ),
    "tp2xpp2": (
        4,
        ["--tp", "2", "--pp", "2", "--pp-schedule", "1f1b"],
        1,
        [2 * (LAYER_SHARDED // 2 + 128) + VOCAB_MATRIX // 2] * 2
        + [2 * (LAYER_SHARDED // 2 + 128) + VOCAB_MATRIX // 2 + 64] * 2,
    ),
    "dp2xtp2": (4, ["--tp", "2"], 2, [4 * (LAYER_SHARDED // 2 + 128) + VOCAB_MATRIX + 64] * 4),
    "dp2xtp2-zero1": (
        4,
        ["--tp", "2", "--zero1"],
        2,
        [4 * (LAYER_SHARDED // 2 + 128) + VOCAB_MATRIX + 64] * 4,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_reference(
    name: str, config_path: Path, references: dict[int, Any], tmp_path: Path
) -> None:
    nproc, extra, dp, shares = LAYOUTS[name]
    rc, log = _launch(nproc, config_path, tmp_path, extra)
    assert rc == 0, log[-4000:]
    ranks = _ranks(tmp_path)
    assert [m["rank"] for m in ranks] == list(range(nproc))
    assert [m["local_param_count"] for m in ranks] == shares
    assert all(m["expected_local_param_count"] == m["local_param_count"] for m in ranks)
    assert all(m["dp"] == dp and m["status"] == "ok" for m in ranks)
    zero1 = "--zero1" in extra
    assert all(m["zero1"] is zero1 for m in ranks)
    for m in ranks:
        # ZeRO-1: the dp ranks of one TP shard split its optimizer states between them.
        peers = [
            o for o in ranks if o["tp_rank"] == m["tp_rank"] and o["pp_stage"] == m["pp_stage"]
        ]
        held = (
            sum(o["optimizer_state_params"] for o in peers)
            if zero1
            else m["optimizer_state_params"]
        )
        assert held == m["local_param_count"]
        assert not zero1 or m["optimizer_state_params"] < m["local_param_count"]
    reference = references[dp]["losses"]
    assert len(reference) == STEPS
    for m in ranks:
        assert m["losses"] == ranks[0]["losses"]  # every rank records the global loss
    diffs = [abs(a - b) / abs(b) for a, b in zip(ranks[0]["losses"], reference, strict=True)]
    print(f"{name}: max relative loss difference {max(diffs):.2e}")
    assert max(diffs) < LOSS_RTOL, (ranks[0]["losses"], reference)
    assert reference[-1] < reference[0]  # the model learns
    progress = [line for line in log.splitlines() if PROGRESS_LINE.match(line)]
    assert len(progress) == STEPS and "tokens/s" in progress[-1] and "GiB" in progress[-1]


@pytest.mark.slow
def test_injected_crash_and_nan(config_path: Path, tmp_path: Path) -> None:
    rc, log = _launch(2, config_path, tmp_path / "crash", ["--tp", "2", "--inject", "crash"])
    assert rc != 0 and "injected crash on rank 1 at step 3" in log, log[-4000:]
    rc, log = _launch(2, config_path, tmp_path / "nan", ["--pp", "2", "--inject", "nan"])
    assert rc != 0, log[-4000:]
    ranks = _ranks(tmp_path / "nan")
    assert [m["status"] for m in ranks] == ["nan", "nan"]
    assert all(len(m["losses"]) == 3 and m["losses"][-1] != m["losses"][-1] for m in ranks)
