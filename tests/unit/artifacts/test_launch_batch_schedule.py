"""Every launcher's files state one batch and one schedule (issue 29, items 2 and 4).

A table of layouts (tensor x pipeline x context x data parallel, micro-batch x accumulation,
DP 1 at 128k context among them) is emitted for each launcher (DeepSpeed, AutoTP, torchrun DDP,
FSDP, Megatron, torchtitan); the test reads the generated files back as each framework reads
them (torchtitan's accumulation = global / (local x dp), Megatron's micro-batches = global /
(micro x dp), DeepSpeed's three keys) and checks global = micro x accumulation x data parallel
with the plan's own numbers. The schedule in each file warms up over less than a tenth of the
run, reaches its peak and decays: DeepSpeed's own WarmupCosineLR and train.py's own
``schedule_factor`` are stepped through the run; Megatron's and torchtitan's keys are checked
against the curve their docs give.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from specs import LLAMA3_8B

from tools.artifacts.deepspeed_config import emit_deepspeed_config
from tools.artifacts.ds_validate import validate_deepspeed_config
from tools.artifacts.launch import emit_launch
from tools.core.schemas import (
    FrameworkChoice,
    GPUSpec,
    HardwareSpec,
    MemoryPlan,
    ModelSpec,
    SetupCandidate,
    TrainingBrief,
)
from tools.planning.batch_layout import (
    BatchLayout,
    autotp_degree,
    deepspeed_batch_ranks,
    torchtitan_layout,
)
from tools.research.model_catalog import lookup_model

H100 = GPUSpec(name="H100-80GB", memory_gb=80, bf16_tflops=989)


@dataclass(frozen=True)
class Case:
    launcher: str  # the plan's framework
    strategy: str
    nodes: int
    tp: int
    pp: int
    cp: int
    micro: int
    accumulation: int
    seq_len: int = 4096
    task: str = "pretrain"

    @property
    def world(self) -> int:
        return self.nodes * 8

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)

    @property
    def batch(self) -> int:
        return self.micro * self.accumulation * self.dp

    def __str__(self) -> str:
        return (
            f"{self.launcher}-{self.strategy}-tp{self.tp}pp{self.pp}cp{self.cp}dp{self.dp}"
            f"-m{self.micro}a{self.accumulation}-s{self.seq_len}-{self.task}"
        )


CASES = [
    Case("deepspeed", "zero2", 1, 1, 1, 1, 2, 4),
    Case("deepspeed", "zero3", 2, 1, 1, 1, 1, 2, task="finetune"),
    Case("deepspeed", "zero1", 1, 2, 1, 1, 1, 4, task="lora"),  # AutoTP, DP 4
    Case("pytorch", "ddp", 1, 1, 1, 1, 1, 8),
    Case("pytorch_fsdp", "zero3", 2, 1, 1, 1, 2, 2, task="finetune"),
    Case("megatron", "zero1", 1, 2, 2, 1, 1, 8),
    Case("megatron", "zero1", 1, 4, 2, 1, 1, 16, task="finetune"),  # DP 1
    Case("torchtitan", "zero1", 1, 2, 2, 1, 1, 4),
    Case("torchtitan", "zero1", 1, 4, 2, 1, 2, 8),  # DP 1, pipeline micro-batches
    Case("torchtitan", "zero3", 1, 8, 1, 1, 1, 8, seq_len=131_072),  # DP 1, 128k context
    Case("torchtitan", "zero3", 1, 4, 1, 2, 1, 8, seq_len=131_072),  # context parallel 2
]


def _plan(case: Case) -> MemoryPlan:
    setup = SetupCandidate(
        strategy=case.strategy,  # type: ignore[arg-type]
        tensor_parallel=case.tp,
        pipeline_parallel=case.pp,
        context_parallel=case.cp,
        data_parallel=case.dp,
        micro_batch_size=case.micro,
        gradient_accumulation_steps=case.accumulation,
        checkpointing="full",
        per_gpu_bytes={"total": 1},
        fits=True,
    )
    return MemoryPlan(
        strategies=[],
        chosen=case.strategy,  # type: ignore[arg-type]
        micro_batch_size=case.micro,
        gradient_accumulation_steps=case.accumulation,
        activation_checkpointing=True,
        tensor_parallel=case.tp,
        pipeline_parallel=case.pp,
        setup=setup,
    )


@functools.cache
def _llama31_8b() -> ModelSpec:
    return lookup_model("llama-3.1-8b", 4096)


def _emit(
    case: Case,
    out: Path,
    steps: int | None,
    lr: float | None = None,
    warmup: int | None = None,
    **brief_fields: Any,
) -> tuple[dict[str, Any], Any]:
    """The plan's launch files in ``out``: returns ds_config.json (or {}) and the LaunchSpec."""
    hardware = HardwareSpec(source="described", nodes=case.nodes, gpus_per_node=8, gpu=H100)
    # torchtitan builds Llama 3.1 (its llama3 flavors), not Llama 3 (tools/research/titan_flavors.py).
    model = _llama31_8b() if case.launcher == "torchtitan" else LLAMA3_8B
    brief = TrainingBrief(
        goal="x",
        model=model.name,
        task=case.task,  # type: ignore[arg-type]
        seq_len=case.seq_len,
        global_batch_size=case.batch,
        precision="bf16",
        learning_rate=lr,
        warmup_steps=warmup,
        **brief_fields,
    )
    memory = _plan(case)
    framework = FrameworkChoice(primary=case.launcher, stack=["pytorch"], rationale="x")  # type: ignore[arg-type]
    config = None
    if case.launcher in ("deepspeed", "megatron"):
        config = emit_deepspeed_config(
            memory, model, hardware, brief, autotp=case.launcher == "deepspeed"
        )
        validate_deepspeed_config(config, deepspeed_batch_ranks(config, case.dp))
    spec = emit_launch(out, brief, hardware, model, framework, config, memory=memory, steps=steps)
    written = out / "ds_config.json"
    return (json.loads(written.read_text()) if written.exists() else {}), spec


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def _files_layout(case: Case, out: Path, config: dict[str, Any], command: list[str]) -> BatchLayout:
    """The batch layout as the framework reads its generated files."""
    if case.launcher == "torchtitan":
        toml = tomllib.loads((out / "torchtitan.toml").read_text())
        par, training = toml["parallelism"], toml["training"]
        dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
        assert (
            dp
            * par["tensor_parallel_degree"]
            * par["pipeline_parallel_degree"]
            * par["context_parallel_degree"]
            == case.world
        )
        return torchtitan_layout(
            training["local_batch_size"],
            training["global_batch_size"],
            par["pipeline_parallel_microbatch_size"],
            dp,
            par["pipeline_parallel_degree"],
        )
    if case.launcher == "megatron":
        micro = int(_flag(command, "--micro-batch-size"))
        total = int(_flag(command, "--global-batch-size"))
        dp = case.world // (
            int(_flag(command, "--tensor-model-parallel-size"))
            * int(_flag(command, "--pipeline-model-parallel-size"))
        )
        assert total % (micro * dp) == 0
        layout = BatchLayout(micro, total // (micro * dp), dp, case.pp)
        assert BatchLayout.of_deepspeed(config, case.pp) == layout  # ds_config.json agrees
        return layout
    if config:
        layout = BatchLayout.of_deepspeed(config)
        # AutoTP: DeepSpeed counts every rank, the tensor ranks share sequences.
        assert config["train_batch_size"] == layout.global_batch * autotp_degree(config)
        assert int(_flag(command, "--micro-batch")) == layout.micro  # train.py's own flag
        return layout
    # torchrun DDP / FSDP: train.py's flags; the world is torchrun's nodes x procs per node.
    world = int(_flag(command, "--nnodes")) * int(_flag(command, "--nproc_per_node"))
    return BatchLayout(
        int(_flag(command, "--micro-batch")), int(_flag(command, "--grad-accum")), world
    )


@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_launcher_writes_global_as_micro_x_accumulation_x_data_parallel(
    case: Case, tmp_path: Path
) -> None:
    config, spec = _emit(case, tmp_path, steps=None)
    layout = _files_layout(case, tmp_path, config, spec.command)
    expected = BatchLayout(case.micro, case.accumulation, case.dp, case.pp)
    assert (layout.micro, layout.accumulation, layout.data_parallel) == (
        expected.micro,
        expected.accumulation,
        expected.data_parallel,
    ), f"{case}: files say {layout.describe()}, the plan {expected.describe()}"
    assert layout.global_batch == case.batch
    assert any(expected.describe() in note for note in spec.notes)


def _deepspeed_curve(scheduler: dict[str, Any], peak: float, steps: int) -> list[float]:
    """The rates DeepSpeed's own scheduler gives over ``steps`` optimizer steps."""
    import torch
    from deepspeed.runtime import lr_schedules

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    kind = getattr(lr_schedules, scheduler["type"])
    sched = kind(optimizer, **scheduler["params"])
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        sched.step()
    return rates


def _torchrun_curve(command: list[str]) -> tuple[list[float], int]:
    """train.py's rates (its own ``schedule_factor``) and its warm-up, from the command."""
    from tools.smoke.scripts.job_torch import schedule_factor

    args = argparse.Namespace(
        steps=int(_flag(command, "--steps")),
        warmup_steps=int(_flag(command, "--warmup-steps")),
        lr_schedule=_flag(command, "--lr-schedule"),
        min_lr_ratio=float(_flag(command, "--min-lr-ratio")) if "--min-lr-ratio" in command else 0,
    )
    peak = float(_flag(command, "--lr"))
    return [peak * schedule_factor(args, s) for s in range(args.steps)], args.warmup_steps


def _check_curve(rates: list[float], peak: float, warmup: int, steps: int, what: str) -> None:
    assert len(rates) == steps
    assert 1 <= warmup < 0.1 * steps, f"{what}: warm-up {warmup} of {steps} steps"
    top = max(rates)
    assert top == pytest.approx(peak, rel=1e-3), f"{what}: peaks at {top}, not {peak}"
    assert rates.index(top) <= warmup + 1, f"{what}: peaks after the warm-up"
    assert rates[-1] < 0.5 * peak, f"{what}: ends at {rates[-1]}, no decay from {peak}"
    after = rates[rates.index(top) :]
    assert all(b <= a + 1e-12 for a, b in zip(after, after[1:], strict=False)), what


@pytest.mark.parametrize("case", CASES[::2] + CASES[5:6], ids=str)
@pytest.mark.parametrize("steps", [None, 400])
def test_every_launchers_schedule_warms_up_briefly_peaks_and_decays(
    case: Case, steps: int | None, tmp_path: Path
) -> None:
    config, spec = _emit(case, tmp_path, steps=steps)
    total = steps or 1000  # no dataset size: the default run, said in the notes
    assert any(f"{total} optimizer steps" in note for note in spec.notes)
    assert any("GPT-3" in n or "Alpaca" in n or "QLoRA" in n for n in spec.notes)
    command = spec.command
    if config:
        params = config["scheduler"]["params"]
        peak = config["optimizer"]["params"]["lr"]
        assert params["total_num_steps"] == total
        rates = _deepspeed_curve(config["scheduler"], peak, total)
        _check_curve(rates, peak, params["warmup_num_steps"], total, f"{case} ds_config.json")
    if case.launcher == "megatron":
        peak = float(_flag(command, "--lr"))
        warmup = int(_flag(command, "--lr-warmup-iters"))
        assert int(_flag(command, "--train-iters")) == total
        assert int(_flag(command, "--lr-decay-iters")) == total
        assert _flag(command, "--lr-decay-style") == "cosine"
        assert 1 <= warmup < 0.1 * total and 0 <= float(_flag(command, "--min-lr")) < peak
        assert peak == pytest.approx(config["optimizer"]["params"]["lr"], rel=1e-5)
    elif case.launcher == "torchtitan":
        toml = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
        sched = toml["lr_scheduler"]
        assert toml["training"]["steps"] == total
        assert 1 <= sched["warmup_steps"] < 0.1 * total
        assert sched["decay_type"] == "cosine" and "decay_ratio" not in sched
        assert 0 <= sched["min_lr_factor"] < 1 and toml["optimizer"]["lr"] > 0
    elif not config:
        rates, warmup = _torchrun_curve(command)
        _check_curve(rates, float(_flag(command, "--lr")), warmup, total, f"{case} train.py")
    launch = (tmp_path / "launch.sh").read_text()
    assert (
        shlex.join(["--steps", str(total)]) in launch
        or "--train-iters" in launch
        or ("torchtitan" in launch)
    )


@pytest.mark.parametrize("case", CASES[::2], ids=str)
def test_the_requests_learning_rate_and_warmup_are_every_launchers(
    case: Case, tmp_path: Path
) -> None:
    config, spec = _emit(case, tmp_path, steps=200, lr=3.5e-5, warmup=17)
    assert any("peak 3.5e-05 (the request's rate; the rule gives" in n for n in spec.notes)
    assert any(
        "over 17 of 200 steps (the request's 17 steps; the rule gives 6)" in n for n in spec.notes
    )
    if config:
        assert config["optimizer"]["params"]["lr"] == pytest.approx(3.5e-5)
        assert config["scheduler"]["params"]["warmup_num_steps"] == 17
    if case.launcher == "megatron":
        assert float(_flag(spec.command, "--lr")) == pytest.approx(3.5e-5)
        assert int(_flag(spec.command, "--lr-warmup-iters")) == 17
    elif case.launcher == "torchtitan":
        toml = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
        assert toml["optimizer"]["lr"] == pytest.approx(3.5e-5)
        assert toml["lr_scheduler"]["warmup_steps"] == 17
    elif not config:
        assert float(_flag(spec.command, "--lr")) == pytest.approx(3.5e-5)
        assert int(_flag(spec.command, "--warmup-steps")) == 17


@pytest.mark.parametrize("case", CASES[::2], ids=str)
def test_the_requests_checkpoint_interval_reaches_every_launcher(
    case: Case, tmp_path: Path
) -> None:
    config, spec = _emit(case, tmp_path, steps=300, save_every=70, keep_checkpoints=2)
    command = spec.command
    if case.launcher == "megatron":
        assert int(_flag(command, "--save-interval")) == 70
        assert any(n.startswith("keep_checkpoints 2 not applied") for n in spec.notes)
    elif case.launcher == "torchtitan":
        toml = tomllib.loads((tmp_path / "torchtitan.toml").read_text())
        assert toml["checkpoint"]["interval"] == 70 and toml["checkpoint"]["keep_latest_k"] == 2
    else:
        launch = (tmp_path / "launch.sh").read_text()
        assert "--save-every 70" in launch and "--keep-checkpoints 2" in launch
