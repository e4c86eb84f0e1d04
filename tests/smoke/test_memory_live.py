"""The memory model against what a live DeepSpeed engine holds, per rank, term by term.

Each stage launches ``tests/live_states_probe.py`` on 2 CPU ranks (gloo, fp32) with the
DeepSpeed launcher: a llama-style model (hidden 256, 4 layers, vocab 1024, ~3.7M parameters),
AdamW (``torch_adam``), and the ZeRO section tools/artifacts/deepspeed_config.py emits for the strategy
(its bucket sizes, overlap_comm, contiguous_gradients), adapted for CPU as tools/smoke/ds_adapt.py
adapts it. ZeRO-3 builds the model under ``deepspeed.zero.Init``, as tools/planning/memory.py assumes.
The probe runs one full step, then the forward and backward of a second, and counts the
storages the engine holds (each storage once): the working weights, the fp32 master
partition, Adam's exp_avg/exp_avg_sq and the gradients. These must agree with
``tools.memory.model_state_bytes`` (world size 2, fp32: what ``resolve_precision`` gives a
machine without a GPU) within 5%, per term and in total (params + grads + optimizer).

What is compared with what, and why:

- Params, master params, optimizer moments: held once backward has ended (the peak: all
  model states are alive then). In fp32 DeepSpeed still clones the master partition:
  ``stage_1_and_2.py`` ``single_partition_of_fp32_groups`` (``.clone()``), and ZeRO-3's
  ``fp32_partitioned_groups_flat`` is a separate copy of ``fp16_partitioned_groups_flat`` on
  the CPU accelerator (measured: no storage is shared), so the model's 4 bytes/param master
  term holds in fp32 too.
- Gradients, ZeRO-2/3: the reduced gradient partition held for ``step()``
  (``averaged_gradients``; ZeRO-3's ``grad_partitions_flat_buffer``), after backward.
- Gradients, ZeRO-1: the model counts full gradients (4 bytes x every parameter). DeepSpeed
  0.19 keeps them only until the backward epilogue (``independent_gradient_partition_epilogue``)
  reduces them, then holds a 1/N partition (``averaged_gradients``), so after backward a rank
  holds ~half the model's figure. The full gradients are what ZeRO-1 peaks with, so the probe
  also counts on entry to that epilogue, and the ZeRO-1 gradient term is compared there as
  the bytes of every ``param.grad`` (numel x element size: with contiguous_gradients they are
  views into the reduce bucket, whose storage is a buffer, not a model state). Here the
  emitted bucket (min(2e8, params) elements) holds the whole model, so every full gradient
  is alive at the epilogue (asserted below). With a bucket smaller than the model, DeepSpeed
  may reduce and free gradients during backward (not measured here); ZeRO-1 would then hold
  less than the model's full-gradient term, so the model errs high, on the safe side.
- ZeRO-2 rank 0 may hold a little more than 1/N of the gradients: its ``averaged_gradients``
  storage is one flat tensor a few hundred KB over the partition here (+3.5% of the term).
- ZeRO-3's ``gathered_params`` / ``gathered_grads`` (one module's full weights and gradients,
  gathered for its forward/backward) are transient working sets, not held between steps; they
  are not compared. Persistent small parameters (below ``stage3_param_persistence_threshold``,
  10 x hidden: the RMSNorm weights) stay gathered and are counted in the measured params.

Communication buckets, the batch and other tensors are reported by the probe as ``other``
and are not compared here (the model's buffer term covers them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tools.artifacts.deepspeed_config import zero_section
from tools.core.schemas import HardwareSpec, ModelSpec
from tools.core.settings import TELEMETRY_OFF
from tools.planning import estimate_strategy, model_state_bytes, resolve_precision
from tools.research.model_catalog import lookup_model
from tools.smoke import adapt_ds_config, free_port, group_alive

PROBE = Path(__file__).parents[1] / "live_states_probe.py"
RANKS = 2
SEQ_LEN = 32
TIMEOUT_S = 240
TOLERANCE = 0.05
MODEL_CONFIG = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}
HARDWARE = HardwareSpec(source="local", nodes=1, gpus_per_node=RANKS, gpu=None)
STRATEGIES = ("zero1", "zero2", "zero3")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL, the launcher's process group (its own session)."""
    pgid = proc.pid
    if proc.poll() is None or group_alive(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (proc.poll() is None or group_alive(pgid)):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if proc.poll() is None or group_alive(pgid):
                os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _run_probe(spec: ModelSpec, strategy: str, run_dir: Path) -> list[dict[str, Any]]:
    """Launch the probe on RANKS CPU ranks with the emitted ZeRO section; return each rank's JSON."""
    config = {
        "train_batch_size": RANKS,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero_section(SimpleNamespace(chosen=strategy), spec),  # type: ignore[arg-type]
        "optimizer": {"type": "AdamW", "params": {"weight_decay": 0.0}},
    }
    ds_config, _ = adapt_ds_config(config, device="cpu", ranks=RANKS, micro_batch_size=1)
    assert ds_config["optimizer"]["params"]["torch_adam"] is True
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "model.json").write_text(json.dumps(MODEL_CONFIG))
    (run_dir / "ds_config.json").write_text(json.dumps(ds_config))
    # A copy of the script makes the run dir a self-contained reproduction (as tools/smoke/runner.py).
    script = run_dir / PROBE.name
    shutil.copyfile(PROBE, script)
    out = run_dir / "out"
    cmd = [
        sys.executable,
        "-m",
        "deepspeed.launcher.runner",
        "--hostfile",
        str(run_dir / "no-hostfile"),
        "--num_gpus",
        str(RANKS),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(script),
        "--model-config",
        str(run_dir / "model.json"),
        "--deepspeed_config",
        str(run_dir / "ds_config.json"),
        "--out",
        str(out),
        "--seq-len",
        str(SEQ_LEN),
    ]
    tmp = run_dir / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {
        **os.environ,
        **TELEMETRY_OFF,
        "DS_ACCELERATOR": "cpu",
        "TMPDIR": str(tmp),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // RANKS)),
    }
    log_path = run_dir / "probe.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=run_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        _kill_group(proc)
    assert group_alive(proc.pid) == []
    tail = log_path.read_text(errors="replace")[-3000:]
    assert proc.returncode == 0, f"probe exited {proc.returncode}:\n{tail}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return lookup_model(dict(MODEL_CONFIG), seq_len=SEQ_LEN)


@pytest.fixture(scope="module", params=STRATEGIES)
def live(
    request: pytest.FixtureRequest, spec: ModelSpec, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, list[dict[str, Any]]]:
    strategy = request.param
    return strategy, _run_probe(spec, strategy, tmp_path_factory.mktemp(f"live-{strategy}"))


def _measured(strategy: str, report: dict[str, Any]) -> dict[str, int]:
    held = report["after_backward"]
    grads = report["end_of_backward"]["param_grad_bytes"] if strategy == "zero1" else held["grads"]
    return {
        "params": held["params"],
        "grads": grads,
        "master_params": held["master_params"],
        "optimizer_moments": held["optimizer_moments"],
    }


def _estimated(spec: ModelSpec, strategy: str) -> dict[str, int]:
    states = model_state_bytes(
        spec.params,
        spec.params,
        spec.largest_layer_params,
        HARDWARE.world_size,
        strategy,  # type: ignore[arg-type]
        precision=resolve_precision("auto", HARDWARE),
    )
    gpu = states.gpu
    assert states.cpu_per_rank == {}
    assert "grads_fp32" not in gpu  # fp32: no separate fp32 gradient copy
    return {key: gpu[key] for key in ("params", "grads", "master_params", "optimizer_moments")}


def _close(measured: int, estimated: int) -> bool:
    return abs(measured - estimated) <= TOLERANCE * estimated


@pytest.mark.slow
def test_live_engine_holds_what_the_memory_model_estimates(
    live: tuple[str, list[dict[str, Any]]], spec: ModelSpec
) -> None:
    strategy, reports = live
    assert resolve_precision("auto", HARDWARE) == "fp32"
    estimated = _estimated(spec, strategy)
    # On CPU ranks estimate_strategy reports tools/planning/host_ranks.py's terms: the same
    # master partition and moments, and the working weights as a rank holds them (ZeRO-3: its
    # partition plus every parameter gathered at the end of the forward pass).
    per_gpu = estimate_strategy(spec, HARDWARE, strategy, precision="auto").per_gpu_bytes  # type: ignore[arg-type]
    assert per_gpu.optimizer == estimated["master_params"] + estimated["optimizer_moments"]
    gathered = 4 * spec.params if strategy == "zero3" else 0
    assert per_gpu.params == estimated["params"] + gathered

    lines = [f"{strategy}: term, rank, measured, estimated, diff"]
    failures = []
    for report in reports:
        assert report["world_size"] == RANKS
        assert report["stage"] == int(strategy[-1])
        assert report["param_dtype"] == "torch.float32"
        # The model the estimate describes is the model that ran.
        assert report["params_numel"] == spec.params
        assert report["largest_layer_params"] == spec.largest_layer_params
        measured = _measured(strategy, report)
        measured["total"] = sum(measured.values())
        expected = {**estimated, "total": sum(estimated.values())}
        for term, value in measured.items():
            diff = value / expected[term] - 1
            lines.append(f"  {term}, {report['rank']}, {value:,}, {expected[term]:,}, {diff:+.2%}")
            if not _close(value, expected[term]):
                failures.append(f"{term} rank {report['rank']}: {value:,} vs {expected[term]:,}")
    print("\n".join(lines))
    assert not failures, "\n".join([*failures, *lines])


@pytest.mark.slow
def test_live_engine_partitions_as_zero_says(
    live: tuple[str, list[dict[str, Any]]], spec: ModelSpec
) -> None:
    """What each stage partitions, in bytes: the facts the per-term comparison rests on."""
    strategy, reports = live
    full, half = 4 * spec.params, 4 * -(-spec.params // RANKS)
    for report in reports:
        held = report["after_backward"]
        # Nothing counted twice: no model-state storage is shared between terms in fp32.
        assert held["aliased"] == {}
        # Master weights and Adam's two moments: 1/N of the model on every ZeRO stage.
        assert _close(held["master_params"], half)
        assert _close(held["optimizer_moments"], 2 * half)
        # After backward every stage keeps only its gradient partition (ZeRO-1 included).
        assert _close(held["grads"], half)
        if strategy == "zero3":
            assert _close(held["params"], half)
        else:
            assert _close(held["params"], full)
        if strategy == "zero1":
            # ZeRO-1 holds every parameter's full gradient when backward ends.
            assert report["end_of_backward"]["param_grad_bytes"] == full
        # step() consumes the gradient partition (ZeRO-3 keeps its flat buffer).
        assert report["after_step"]["grads"] == (held["grads"] if strategy == "zero3" else 0)
