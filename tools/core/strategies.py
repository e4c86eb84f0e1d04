"""The strategy vocabulary, defined once: names, their order, ZeRO stages, headroom.

Every other module (planner, config emitter, smoke runner, reviewer, report) speaks these
names; the plan JSON's memory.strategies use the same seven.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from tools.core.errors import InputError

StrategyName = Literal[
    "ddp",
    "zero1",
    "zero2",
    "zero3",
    "zero2_offload_optimizer",
    "zero3_offload_optimizer",
    "zero3_offload_all",
]
# Preference order of the memory-only choice: communication volume and step time grow along it
# (ZeRO paper sec. 7: stages 1-2 move as much data as DDP, stage 3 1.5x; offload adds PCIe).
STRATEGY_ORDER: tuple[StrategyName, ...] = get_args(StrategyName)
OFFLOAD_STRATEGIES: frozenset[str] = frozenset(
    {"zero2_offload_optimizer", "zero3_offload_optimizer", "zero3_offload_all"}
)
ZERO_STAGE: dict[str, int] = {
    "ddp": 0,
    "zero1": 1,
    "zero2": 2,
    "zero3": 3,
    "zero2_offload_optimizer": 2,
    "zero3_offload_optimizer": 3,
    "zero3_offload_all": 3,
}
# What each strategy saves over the one before it in STRATEGY_ORDER.
STRATEGY_GAIN = {
    "zero1": "ZeRO-1 shards the optimizer states",
    "zero2": "ZeRO-2 also shards the gradients",
    "zero3": "ZeRO-3 also shards the parameters",
    "zero2_offload_optimizer": "the optimizer states move to CPU RAM",
    "zero3_offload_optimizer": "ZeRO-3 with the optimizer states in CPU RAM",
    "zero3_offload_all": "parameters and optimizer states in CPU RAM",
}
# The share of GPU memory a chosen setup must leave free: allocator spikes and fragmentation
# beyond the estimate's own margin. The search keeps it, the reviewer warns below it, and the
# smoke runner runs a model at full size only when it leaves this much.
MIN_HEADROOM = 0.10
# The headroom below which the fit check says "fits" without qualification: the memory model's
# worst under-prediction on the published peak-memory runs it maps (bench/calibration/published_memory.py
# "margin needed": 70B with TP 8, measured 1.23x the prediction, so 1 - 1/1.23 = 19%), the one
# exception being a torchtune LoRA row whose recipe the table does not distinguish from one
# that measured half as much. Between MIN_HEADROOM and this the check says "tight".
SAFE_HEADROOM = 0.19


# Activation recomputation policies, as the frameworks implement them: none; selective
# (Korthikanti et al. 2022 sec. 5: only the attention core is re-run; torchtitan's per-op
# "selective" saves matmul outputs and re-runs the cheap ops between them); full (every layer's
# forward is re-run in backward, keeping only its input).
Recompute = Literal["none", "selective", "full"]
RECOMPUTE_POLICIES: tuple[Recompute, ...] = get_args(Recompute)


def check_recompute(policy: str, field: str = "checkpointing") -> Recompute:
    """``policy`` as a Recompute; InputError (naming ``field``) for any other string."""
    if policy not in RECOMPUTE_POLICIES:
        raise InputError(
            field, f"unknown policy {policy!r}; choose from {', '.join(RECOMPUTE_POLICIES)}"
        )
    return policy  # type: ignore[return-value]


def check_strategy(strategy: str, field: str = "strategy") -> StrategyName:
    """``strategy`` as a StrategyName; InputError (naming ``field``) for any other string."""
    if strategy not in STRATEGY_ORDER:
        raise InputError(
            field, f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGY_ORDER)}"
        )
    return strategy  # type: ignore[return-value]


def base_strategy(strategy: str) -> str:
    """The ZeRO stage a strategy runs, as a name: ``zero3_offload_all`` -> ``zero3``."""
    return "zero3" if strategy.startswith("zero3") else strategy.split("_", 1)[0]


def strategy_of(ds_config: dict[str, Any]) -> str:
    """Name the strategy a DeepSpeed config describes (``zero3_offload_param`` is not ours)."""
    zero = ds_config.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0) or 0)
    if stage == 0:
        return "ddp"
    name = f"zero{stage}"
    offload_opt = (zero.get("offload_optimizer") or {}).get("device", "none") != "none"
    offload_param = (zero.get("offload_param") or {}).get("device", "none") != "none"
    if offload_opt and offload_param:
        return f"{name}_offload_all"
    if offload_opt:
        return f"{name}_offload_optimizer"
    if offload_param:
        return f"{name}_offload_param"
    return name


# The FSDP sharding that holds at most what the plan's chosen strategy counts per GPU: the
# memory plan's rows are ZeRO terms (above), and FSDP's modes map onto them
# (PyTorch FSDP docs, ShardingStrategy). ZeRO-3 and the offload rows shard everything.
_FSDP_SHARDING = {"ddp": "NO_SHARD", "zero1": "SHARD_GRAD_OP", "zero2": "SHARD_GRAD_OP"}


# FSDP1's sharding strategies as FSDP2 (fully_shard) expresses them in train.py --fsdp-sharding;
# NO_SHARD is DDP, train.py's plain mode.
FSDP2_SHARDING = {"FULL_SHARD": "full", "SHARD_GRAD_OP": "grad-op", "HYBRID_SHARD": "hybrid"}


def train_py_fsdp(strategy: str | None, nodes: int) -> tuple[str | None, bool]:
    """train.py's ``--fsdp-sharding`` for the plan's strategy (None: plain DDP), and offload."""
    sharding, offload = fsdp_sharding(strategy, nodes)
    return FSDP2_SHARDING.get(sharding), offload


def fsdp_sharding(strategy: str | None, nodes: int) -> tuple[str, bool]:
    """FSDP's sharding mode and whether parameters go to the CPU, for the plan's strategy.

    Without a memory plan: HYBRID_SHARD on several nodes, FULL_SHARD on one. An offload row
    becomes FULL_SHARD with ``CPUOffload(offload_params=True)`` (FSDP offloads parameters and
    gradients together and steps the optimizer on the CPU).
    """
    if strategy is None:
        return ("HYBRID_SHARD" if nodes > 1 else "FULL_SHARD"), False
    return _FSDP_SHARDING.get(strategy, "FULL_SHARD"), "offload" in strategy
