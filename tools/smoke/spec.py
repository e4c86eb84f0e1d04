"""What one smoke run runs: a spec with one mode per framework, and the knobs all runs share.

``run_smoke_test(model, spec, settings)`` takes a ``SmokeSpec`` instead of a long argument
list (torchtitan gives each component a config dataclass for the same reason). The mode says
which launcher runs and carries only what that launcher reads:

- ``DeepSpeedRun``: DeepSpeed's launcher with the plan's config, adapted to the local ranks;
- ``TorchrunRun``: train.py under torchrun, plain DDP or FSDP2 (a sharding, and offload);
- ``LayoutRun``: parallel_train.py, the torch-native stand-in for a tensor x pipeline layout;
- ``TensorFlowRun``: tf_train.py's MultiWorkerMirroredStrategy workers in ``.venv-tf``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.core.errors import InputError
from tools.core.settings import SMOKE_FAULTS, SMOKE_LOCAL_RANKS_MAX
from tools.core.setup import Setup
from tools.core.smoke_types import FsdpSharding, PipelineSchedule, RunMode

FSDP_SHARDINGS: tuple[FsdpSharding, ...] = ("full", "grad-op", "hybrid")
PP_SCHEDULES: tuple[PipelineSchedule, ...] = ("1f1b", "gpipe")


@dataclass(frozen=True)
class DeepSpeedRun:
    """DeepSpeed's launcher running train.py with ``config`` (adapted to the local ranks).

    The run recomputes activations as the config says.
    """

    config: dict[str, Any]

    def run_mode(self) -> RunMode:
        """How the result records this mode."""
        return RunMode(launcher="deepspeed")


@dataclass(frozen=True)
class TorchrunRun:
    """train.py under torchrun: plain DDP (``fsdp`` None) or FSDP2 with the ``fsdp`` sharding.

    ``fsdp``: ``full`` (ZeRO-3-like), ``grad-op`` (ZeRO-2-like) or ``hybrid`` (shard within a
    node, replicate across nodes). ``offload``: FSDP2's CPUOffloadPolicy. ``recompute``: every
    layer re-run in backward. ``plan_command``: the plan's launch command, whose
    ``--lr-schedule`` and ``--warmup-steps`` the run scales to its steps (schedule.py); without
    one the rate is constant.
    """

    fsdp: FsdpSharding | None = None
    offload: bool = False
    recompute: bool = False
    plan_command: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.fsdp is not None and self.fsdp not in FSDP_SHARDINGS:
            raise InputError("fsdp", f"choose one of {', '.join(FSDP_SHARDINGS)}")
        if self.offload and self.fsdp is None:
            raise InputError("fsdp_offload", "offload needs an FSDP sharding")

    def run_mode(self) -> RunMode:
        """How the result records this mode."""
        if self.fsdp is None:
            return RunMode(launcher="ddp")
        return RunMode(launcher="fsdp", fsdp_sharding=self.fsdp, offload=self.offload)


@dataclass(frozen=True)
class LayoutRun:
    """The torch-native stand-in (parallel_train.py) for a tensor x pipeline (x data) layout.

    ``setup``'s tp x pp x dp CPU ranks run DTensor tensor parallelism,
    ``torch.distributed.pipelining`` with ``schedule``, and ZeRO-1 over dp > 1; each rank checks
    it holds the parameter share the layout gives it. Needs a Llama-style model.
    """

    setup: Setup
    schedule: PipelineSchedule = "1f1b"

    def __post_init__(self) -> None:
        s = self.setup
        if s.world > SMOKE_LOCAL_RANKS_MAX:
            raise InputError(
                "layout",
                f"tp x pp x dp must start at most {SMOKE_LOCAL_RANKS_MAX} ranks together, "
                f"got {s.tp} x {s.pp} x {s.dp}",
            )
        if self.schedule not in PP_SCHEDULES:
            raise InputError("pp_schedule", f"must be one of {', '.join(PP_SCHEDULES)}")

    @classmethod
    def of(cls, tp: int, pp: int, dp: int = 1, schedule: PipelineSchedule = "1f1b") -> LayoutRun:
        """The stand-in for ``tp`` x ``pp`` x ``dp``: ZeRO-1 over dp > 1, else DDP."""
        for name, value in (("tp", tp), ("pp", pp), ("dp", dp)):
            if value < 1:
                raise InputError("layout", f"{name} must be at least 1, got {value}")
        return cls(Setup("zero1" if dp > 1 else "ddp", tp=tp, pp=pp, dp=dp), schedule)

    def run_mode(self) -> RunMode:
        """How the result records this mode."""
        s = self.setup
        return RunMode(
            launcher="layout",
            tensor_parallel=s.tp,
            pipeline_parallel=s.pp,
            data_parallel=s.dp,
            pp_schedule=self.schedule,
        )


@dataclass(frozen=True)
class TensorFlowRun:
    """tf_train.py's workers (MultiWorkerMirroredStrategy); ``workers`` None: the CPU ranks."""

    workers: int | None = None

    def __post_init__(self) -> None:
        if self.workers is not None and not 1 <= self.workers <= SMOKE_LOCAL_RANKS_MAX:
            raise InputError("workers", f"must be between 1 and {SMOKE_LOCAL_RANKS_MAX}")


SmokeMode = DeepSpeedRun | TorchrunRun | LayoutRun | TensorFlowRun


@dataclass(frozen=True)
class SmokeSpec:
    """One smoke run: its mode, and what every mode shares.

    ``steps``, ``timeout_s``, ``stall_s`` and ``memory_cap`` None take the settings'
    (``smoke_steps``, ``smoke_timeout_s``, ``smoke_stall_s``, ``smoke_memory_cap``, else
    ``default_memory_cap()``; a stall limit or cap of 0 turns it off). ``world_size`` caps the local GPUs used (CPU runs use ``smoke_cpu_ranks``).
    ``strategy`` is the name recorded (None: the mode's). ``nodes``: that many "nodes" on this
    machine through the real multi-node mechanism. ``inject``: a fault (``SMOKE_FAULTS``) made
    for real at ``inject_step``. ``task``: the planned task, for the memory prediction.
    ``run_dir`` None: a new folder under the settings' runs folder; ``force`` runs in a folder
    holding files trainwright did not write (never touching them).
    """

    mode: SmokeMode = field(default_factory=TorchrunRun)
    steps: int | None = None
    micro_batch_size: int = 1
    seq_len: int | None = None
    world_size: int | None = None
    strategy: str | None = None
    nodes: int = 1
    inject: str | None = None
    inject_step: int = 3
    timeout_s: float | None = None
    stall_s: float | None = None
    task: str = "pretrain"
    attn_implementation: str | None = None
    memory_cap: int | None = None
    run_dir: Path | None = None
    force: bool = False

    def __post_init__(self) -> None:
        if self.inject is not None and self.inject not in SMOKE_FAULTS:
            raise InputError(
                "inject", f"must be one of {', '.join(SMOKE_FAULTS)}, got {self.inject!r}"
            )
        if isinstance(self.mode, (LayoutRun, TensorFlowRun)) and self.nodes != 1:
            raise InputError("nodes", "a tp/pp or TensorFlow run is one node of CPU ranks")

    @property
    def ds_config(self) -> dict[str, Any] | None:
        """The DeepSpeed config of a DeepSpeed run (None for the other modes)."""
        return self.mode.config if isinstance(self.mode, DeepSpeedRun) else None
