"""A training setup: the one type every stage speaks, and its one spelling.

A setup is a strategy (DDP, a ZeRO stage, an offload strategy; the smoke run's stand-ins add
``fsdp``) over tensor x pipeline x context parallel ranks (Megatron-LM's t x p x c, Narayanan
et al. 2021), with interleaved virtual pipeline stages, an expert-parallel degree, the
data-parallel degree that the world leaves, and how one optimizer step runs: micro-batch,
accumulation and recompute. torchtitan keeps one ``ParallelismConfig`` for the same reason:
planning, artifacts, the smoke run, the review and the report read one object, never a tuple
in one module and a string in another.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tools.core.strategies import RECOMPUTE_POLICIES, Recompute

# The label's order: the strategy, then the degrees from the innermost split outwards, as
# Megatron-Core nests its groups (tensor inside pipeline; context and expert parallel beside
# data parallel). A degree of 1 is left out, so data-parallel setups read as their strategy.
LABEL_AXES = ("tp", "pp", "vpp", "cp", "ep")


@dataclass(frozen=True, slots=True)
class Setup:
    """One training setup: the strategy, its parallel degrees, and how one step runs."""

    strategy: str = "ddp"  # a layout with no strategy named replicates its states (DDP)
    tp: int = 1
    pp: int = 1
    vpp: int = 1  # interleaved (virtual) pipeline stages per GPU
    cp: int = 1
    ep: int = 1  # expert parallel: the experts split over ranks of the data-parallel group
    dp: int = 1
    micro_batch: int = 1
    accumulation: int = 1
    recompute: Recompute = "none"
    # Transformer layers on each pipeline stage, first to last, when the pipeline degree does
    # not divide the layers (``pipeline_split``: the first stages one layer longer); () when
    # every stage holds the same number.
    stage_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "vpp", "cp", "ep", "dp", "micro_batch", "accumulation"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Setup.{name} must be a whole number >= 1, got {value!r}")
        if self.recompute not in RECOMPUTE_POLICIES:
            raise ValueError(f"Setup.recompute must be one of {RECOMPUTE_POLICIES}")
        if self.stage_layers and (len(self.stage_layers) != self.pp or min(self.stage_layers) < 1):
            raise ValueError(
                f"Setup.stage_layers must give {self.pp} stages at least one layer each, "
                f"got {self.stage_layers!r}"
            )

    def label(self) -> str:
        """The setup's name, e.g. ``zero1``, ``zero3+tp8``, ``zero1+tp8+pp16+vpp2+cp2+ep8``.

        The one place a setup is spelled: plan rows, reasons, reports and the review use it.
        A pipeline of uneven stages says their sizes after its degree:
        ``zero1+tp8+pp16(7-8 layers)``.
        """
        parts = [self.strategy]
        for axis in LABEL_AXES:
            if getattr(self, axis) > 1:
                parts.append(f"{axis}{getattr(self, axis)}")
                if axis == "pp" and self.uneven:
                    parts[-1] += f"({min(self.stage_layers)}-{max(self.stage_layers)} layers)"
        return "+".join(parts)

    @property
    def uneven(self) -> bool:
        """Whether the pipeline's stages hold different numbers of layers."""
        return len(set(self.stage_layers)) > 1

    @property
    def split(self) -> int:
        """GPUs one model replica spans: t x p x c."""
        return self.tp * self.pp * self.cp

    @property
    def model_parallel(self) -> bool:
        """Whether the model is split (tensor, pipeline or context parallel)."""
        return self.split > 1

    @property
    def world(self) -> int:
        """GPUs the setup runs on: t x p x c x d."""
        return self.split * self.dp

    @property
    def per_rank(self) -> int:
        """Sequences one data-parallel rank takes per optimizer step: micro x accumulation."""
        return self.micro_batch * self.accumulation

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro x accumulation x data parallel."""
        return self.per_rank * self.dp

    def family(self) -> Setup:
        """The family the search ranks a setup in: its strategy and model-parallel degrees."""
        return Setup(
            self.strategy,
            tp=self.tp,
            pp=self.pp,
            cp=self.cp,
            ep=self.ep,
            stage_layers=self.stage_layers,
        )

    def but(self, **changes: Any) -> Setup:
        """This setup with ``changes`` (field=value) applied."""
        return replace(self, **changes)
