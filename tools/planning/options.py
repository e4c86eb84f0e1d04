"""What one strategy search may consider: ``SearchOptions``, instead of a long argument list.

Every field left at None is searched (tools/planning/search.py); a value pins that dimension.
The estimate command's flags map onto these (tools/planning/estimate.py), the engineer's tool
arguments too (agents/toolkit.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from tools.planning.recipe import Recipe

Objective = Literal["speed", "memory"]


@dataclass(frozen=True)
class SearchOptions:
    """The pins and the objective of one search; None: searched.

    ``micro_batch_size``: only this micro-batch. ``activation_checkpointing``: only full
    recompute (True) or none (False). ``strategies``: only these strategies.
    ``objective``: ``speed`` (the fastest setup that fits with headroom) or ``memory`` (the
    simplest data-parallel strategy that fits, ignoring speed). ``tensor_parallel``,
    ``pipeline_parallel``, ``context_parallel``, ``expert_parallel``, ``recompute``: only this
    degree or policy.
    ``recipe``: the framework recipe memory is priced for (None: the brief's, DeepSpeed with
    its precision by default). ``replicating``: the plan's framework keeps a full model
    replica per GPU (PyTorch DDP, Horovod, TensorFlow's mirrored strategies: no ZeRO stage or
    tensor/pipeline split): the plan is the fastest DDP setup when replicas fit, and says how
    much faster the fastest searched setup would be on DeepSpeed.
    """

    micro_batch_size: int | None = None
    activation_checkpointing: bool | None = None
    strategies: Sequence[str] | None = None
    objective: Objective = "speed"
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    recompute: str | None = None
    context_parallel: int | None = None
    # The expert-parallel degree of a mixture of experts (1: none); None: searched.
    expert_parallel: int | None = None
    recipe: Recipe | None = None
    replicating: str | None = None
    # Search the splits only Megatron runs even for a model Megatron-DeepSpeed cannot build as
    # it is (tools/research/megatron_arch.py): set for pinned degrees and for the search run
    # when nothing else fits; the plan then says what differs.
    inexact_megatron: bool = False

    def but(self, **changes: Any) -> SearchOptions:
        """These options with ``changes`` (field=value) applied."""
        return replace(self, **changes)

    @property
    def searches_everything(self) -> bool:
        """Whether nothing is pinned: the search the researcher runs for the framework choice."""
        return self.but(replicating=None) == SearchOptions()
