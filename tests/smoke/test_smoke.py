"""The smoke-test runner: real DeepSpeed runs on 2 CPU ranks over gloo, plus its pure parts."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from specs import GPT2_TINY, tiny_spec

from tools.core.schemas import SmokeResult
from tools.core.settings import Settings
from tools.core.strategies import strategy_of
from tools.smoke import (
    DeepSpeedRun,
    SmokeSpec,
    TorchrunRun,
    adapt_ds_config,
    group_alive,
    llama_config_from_shape,
    run_smoke_test,
    scale_model_config,
)
from tools.smoke.outcome import Outcome
from tools.smoke.scale import CPU_BUDGET
from tools.smoke.verdict import run_verdict

ROOT = Path(__file__).resolve().parents[2]

LLAMA_TINY = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}
LLAMA3_8B = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}


def plan_ds_config(stage: int, **zero: Any) -> dict[str, Any]:
    """A config as a GPU plan would emit it: bf16, a fine-tuning lr, warm-up, accumulation."""
    return {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "weight_decay": 0.0}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage, "overlap_comm": True, **zero},
    }


def assert_learned(
    result: Any, settings: Settings, *, deepspeed: bool = True, mode: str | None = None
) -> None:
    assert result.status == "passed", result.reason
    assert result.world_size == 2
    assert result.device == "cpu"
    assert len(result.losses) == result.steps
    assert all(math.isfinite(x) for x in result.losses)
    first, last = result.losses[:5], result.losses[-5:]
    assert sum(last) / 5 <= 0.9 * sum(first) / 5
    assert result.step_time_s is not None and result.step_time_s > 0
    assert result.tokens_per_s is not None and result.tokens_per_s > 0
    assert result.peak_memory_bytes is not None and result.peak_memory_bytes > 0
    # The runner predicts the peak of the shape it ran and sets it beside the measurement.
    assert result.predicted_peak_memory_bytes is not None and result.predicted_peak_memory_bytes > 0
    assert result.memory_gap is not None
    run_dir = Path(result.run_dir)
    assert run_dir.parent == settings.runs_dir
    for rank in (0, 1):
        metrics = json.loads((run_dir / "metrics" / f"rank{rank}.json").read_text())
        assert metrics["world_size"] == 2 and metrics["status"] == "ok"
        assert metrics["mode"] == (mode or ("deepspeed" if deepspeed else "ddp"))
    if deepspeed:
        ds = json.loads((run_dir / "ds_config.json").read_text())
        assert "bf16" not in ds and ds["train_batch_size"] == 2
    else:
        assert not (run_dir / "ds_config.json").exists()


# --- real runs -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("hf_config", [GPT2_TINY, LLAMA_TINY], ids=["gpt2", "llama"])
def test_zero2_run_on_two_cpu_ranks_learns(hf_config: dict[str, Any], settings: Settings) -> None:
    lines: list[str] = []
    spec = SmokeSpec(mode=DeepSpeedRun(plan_ds_config(2)), steps=30)
    result = run_smoke_test(tiny_spec(hf_config), spec, settings, on_progress=lines.append)
    assert_learned(result, settings)
    assert result.strategy == "zero2"
    assert result.model_shape is not None
    assert result.model_shape["family"] == hf_config["model_type"]
    assert result.model_shape["params"] > 0 and result.model_shape["seq_len"] == 64
    assert result.wall_time_s is not None and result.wall_time_s > 0
    assert any(line.startswith("step 30/30 loss") for line in lines)


@pytest.mark.slow
def test_zero3_run_on_two_cpu_ranks_learns(settings: Settings) -> None:
    spec = SmokeSpec(mode=DeepSpeedRun(plan_ds_config(3)), steps=30)
    result = run_smoke_test(tiny_spec(LLAMA_TINY), spec, settings)
    assert_learned(result, settings)
    assert result.strategy == "zero3"


@pytest.mark.slow
def test_ddp_run_on_two_cpu_ranks_learns(settings: Settings) -> None:
    """A plan without DeepSpeed (a TorchrunRun) runs plain PyTorch DDP under torchrun."""
    lines: list[str] = []
    spec = SmokeSpec(mode=TorchrunRun(), steps=30)
    result = run_smoke_test(tiny_spec(LLAMA_TINY), spec, settings, on_progress=lines.append)
    assert_learned(result, settings, deepspeed=False)
    assert result.strategy == "ddp"
    assert "plain PyTorch DDP" in result.reason
    assert result.model_shape is not None and result.model_shape["family"] == "llama"
    assert any(line.startswith("step 30/30 loss") for line in lines)
    cmd = json.loads((Path(result.run_dir or "") / "launch.json").read_text())["commands"][0]
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nproc_per_node") + 1] == "2"
    assert "--deepspeed_config" not in cmd
    assert "deepspeed" not in (Path(result.run_dir or "") / "smoke.log").read_text().lower()


@pytest.mark.slow
@pytest.mark.parametrize("ds", [True, False], ids=["deepspeed", "ddp"])
def test_interrupt_stops_the_whole_group(settings: Settings, ds: bool) -> None:
    def interrupt(line: str) -> None:
        if line.startswith("step 2/"):
            raise KeyboardInterrupt

    run_dir = settings.runs_dir / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        mode = DeepSpeedRun(plan_ds_config(2)) if ds else TorchrunRun()
        run_smoke_test(
            tiny_spec(GPT2_TINY),
            SmokeSpec(mode=mode, steps=1_000_000, run_dir=run_dir),
            settings,
            on_progress=interrupt,
        )
    launch = json.loads((run_dir / "launch.json").read_text())
    assert all(group_alive(pgid) == [] for pgid in launch["pgids"])


@pytest.mark.slow
def test_invalid_config_is_a_crash_with_the_error(settings: Settings) -> None:
    spec = SmokeSpec(mode=DeepSpeedRun({"zero_optimization": {"stage": 7}}), steps=5)
    result = run_smoke_test(tiny_spec(GPT2_TINY), spec, settings)
    assert result.status == "failed" and result.failure_kind == "crash"
    assert result.reason.startswith("crash: exit code"), result.reason
    assert "DeepSpeedZeroConfig" in result.reason


@pytest.mark.slow
def test_exploding_weights_are_reported_as_nan(settings: Settings) -> None:
    exploding = {**GPT2_TINY, "initializer_range": 1e30}
    spec = SmokeSpec(mode=DeepSpeedRun(plan_ds_config(2)), steps=10)
    result = run_smoke_test(tiny_spec(exploding), spec, settings)
    assert result.status == "failed" and result.failure_kind == "nan"
    assert result.reason.startswith("nan"), result.reason


# --- pure parts ------------------------------------------------------------------------------

TORCHRUN_CRASH_LOG = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "scripts/train.py", line 2, in <module>
[rank1]: ValueError: boom on rank 1
E1129 19:47:57.462000 12413 torch/distributed/elastic/multiprocessing/api.py:1002] failed
Traceback (most recent call last):
  File "torch/distributed/launcher/api.py", line 383, in launch_agent
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
scripts/train.py FAILED
"""


def test_torchrun_crash_names_the_rank_error(tmp_path: Path) -> None:
    base = SmokeResult(status="failed", world_size=2, steps=5, strategy="ddp")
    outcome = Outcome()
    outcome.returncode = 1
    outcome.log_text = TORCHRUN_CRASH_LOG
    result = run_verdict(base, outcome, tmp_path, 2, 5, [])
    assert result.failure_kind == "crash"
    assert result.reason.startswith("crash: exit code 1: ValueError: boom on rank 1"), result.reason


def test_torchrun_argument_error_is_a_launcher_error(tmp_path: Path) -> None:
    base = SmokeResult(status="failed", world_size=2, steps=5, strategy="ddp")
    outcome = Outcome()
    outcome.returncode = 2
    outcome.log_text = "run.py: error: unrecognized arguments: --bogus\n"
    result = run_verdict(base, outcome, tmp_path, 2, 5, [])
    assert result.failure_kind == "launcher_error"
    assert result.reason.startswith("launcher_error: launcher exited 2"), result.reason


def test_adapt_ds_config_for_cpu_ranks() -> None:
    plan = plan_ds_config(3, offload_param={"device": "nvme", "nvme_path": "/local_nvme"})
    plan["zero_optimization"]["stage3_prefetch_bucket_size"] = "auto"
    plan["wandb"] = {"enabled": True}
    cfg, notes = adapt_ds_config(plan, device="cpu", ranks=2, micro_batch_size=3)
    assert cfg["train_micro_batch_size_per_gpu"] == 3
    assert cfg["gradient_accumulation_steps"] == 1
    assert cfg["train_batch_size"] == 6
    assert "bf16" not in cfg and "fp16" not in cfg
    assert "scheduler" not in cfg and "wandb" not in cfg
    assert "stage3_prefetch_bucket_size" not in cfg["zero_optimization"]
    assert cfg["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert cfg["optimizer"]["params"]["torch_adam"] is True
    assert cfg["optimizer"]["params"]["lr"] > 2e-5
    assert any("nvme" in note for note in notes)
    assert plan["zero_optimization"]["offload_param"]["device"] == "nvme"  # input untouched


def test_adapt_ds_config_keeps_cpu_adam_for_optimizer_offload() -> None:
    plan = plan_ds_config(2, offload_optimizer={"device": "cpu"})
    cfg, _ = adapt_ds_config(plan, device="cpu", ranks=2, micro_batch_size=1)
    assert "torch_adam" not in cfg["optimizer"]["params"]
    assert strategy_of(plan) == "zero2_offload_optimizer"


def test_adapt_ds_config_keeps_bf16_on_gpu() -> None:
    cfg, _ = adapt_ds_config(plan_ds_config(2), device="cuda", ranks=4, micro_batch_size=2)
    assert cfg["bf16"] == {"enabled": True}
    assert cfg["train_batch_size"] == 8
    # torch.optim.AdamW on GPU too: the same states as FusedAdam without an nvcc JIT build.
    assert cfg["optimizer"]["params"]["torch_adam"] is True


def test_scale_model_config_shrinks_llama_and_keeps_its_family() -> None:
    config, shape = scale_model_config(LLAMA3_8B, seq_len=64)
    assert config["model_type"] == "llama"
    assert shape["scaled"] is True and "fallback" not in shape
    budget = CPU_BUDGET
    assert shape["layers"] <= budget["layers"] and shape["hidden"] <= budget["hidden"]
    assert shape["vocab"] <= budget["vocab"]
    assert shape["hidden"] % shape["heads"] == 0
    assert shape["heads"] // shape["kv_heads"] == 4  # grouped-query attention kept
    assert config["max_position_embeddings"] >= 64
    assert config["head_dim"] == shape["hidden"] // shape["heads"]
    assert 0 < shape["params"] < 10_000_000
    # The token embedding (or the untied head) is the largest single module.
    assert shape["largest_layer_params"] == budget["vocab"] * budget["hidden"]
    assert shape["original"]["layers"] == 32


def test_scale_model_config_keeps_a_tiny_model_full_size() -> None:
    config, shape = scale_model_config(GPT2_TINY, seq_len=64)
    assert shape["scaled"] is False
    assert (config["n_layer"], config["n_embd"], config["n_head"]) == (2, 64, 2)
    assert shape["params"] > 0


def test_model_without_hf_config_becomes_a_llama_of_its_shape() -> None:
    config, shape = scale_model_config(llama_config_from_shape(tiny_spec(None)), seq_len=64)
    assert config["model_type"] == "llama" and "fallback" not in shape
    assert (shape["layers"], shape["hidden"], shape["heads"], shape["vocab"]) == (2, 64, 2, 256)


def test_scale_model_config_falls_back_to_llama_for_unknown_family() -> None:
    odd = {"model_type": "not_a_model", "num_hidden_layers": 40, "hidden_size": 5120}
    config, shape = scale_model_config(odd, seq_len=64)
    assert config["model_type"] == "llama" and shape["family"] == "llama"
    assert "not_a_model" in shape["fallback"]
    assert shape["layers"] == CPU_BUDGET["layers"] and shape["hidden"] == CPU_BUDGET["hidden"]


def test_scaled_config_cache_returns_what_scaling_returns(tmp_path: Path) -> None:
    from tools.smoke.scale import scale_model_config_cached

    direct = json.loads(json.dumps(scale_model_config(LLAMA3_8B, seq_len=64)))
    kwargs: dict[str, Any] = {"seq_len": 64, "device": "cpu", "full_size": False}
    first = scale_model_config_cached(LLAMA3_8B, cache_dir=tmp_path, **kwargs)
    entries = list(tmp_path.glob("*.json"))
    assert len(entries) == 1
    second = scale_model_config_cached(LLAMA3_8B, cache_dir=tmp_path, **kwargs)
    assert list(first) == list(second) == direct
    # Another input is another entry, never the cached one.
    other = scale_model_config_cached(LLAMA_TINY, cache_dir=tmp_path, **kwargs)
    assert len(list(tmp_path.glob("*.json"))) == 2 and other != first
    # A damaged entry is recomputed, not trusted.
    entries[0].write_text("{not json")
    assert list(scale_model_config_cached(LLAMA3_8B, cache_dir=tmp_path, **kwargs)) == direct


def test_torch_may_see_gpus_agrees_with_the_torch_build() -> None:
    # In a fresh interpreter: the answer must come without importing torch, and match torch.
    code = (
        "import sys; from tools.research.gpu_probe import torch_may_see_gpus as f; answer = f(); "
        "assert 'torch' not in sys.modules; import torch; "
        "print(answer, bool(torch.version.cuda or torch.version.hip))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    answer, build = out.stdout.split()
    assert answer == build


@pytest.mark.slow
def test_relative_home_still_finds_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settings default to a relative home (.trainwright); the launcher must still find its files."""
    monkeypatch.chdir(tmp_path)
    rel = Settings(home=Path("rel-home"), out_dir=Path("out"), smoke_steps=12)
    result = run_smoke_test(
        tiny_spec(GPT2_TINY), SmokeSpec(mode=DeepSpeedRun(plan_ds_config(1))), rel
    )
    assert result.status == "passed", result.reason
    assert Path(result.run_dir).is_absolute()
