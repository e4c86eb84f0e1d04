"""Strategy search: the fastest setup that fits, by the memory and speed models, in milliseconds.

DeepSpeed's autotuner finds a configuration by running it on the target GPUs; this search runs
nothing. Over strategy x micro-batch x activation checkpointing it keeps the candidates whose
estimated peak leaves at least ``MIN_HEADROOM`` of the GPU free, never offloads when a
non-offload strategy fits (offload trades GPU memory for PCIe traffic and CPU time), and picks
the highest estimated tokens/s. Every other strategy gets the reason it lost.
"""

from __future__ import annotations

from tools.errors import InputError
from tools.memory import (
    MICRO_BATCH_CANDIDATES,
    OFFLOAD_STRATEGIES,
    STRATEGY_ORDER,
    capacity_bytes,
    estimate_strategy,
    plan_memory,
    resolve_precision,
)
from tools.schemas import HardwareSpec, MemoryPlan, ModelSpec, StrategyEstimate, TrainingBrief
from tools.speed import estimate_speed

# The share of GPU memory a chosen setup must leave free: allocator spikes and fragmentation
# beyond the estimate's own margin (the reviewer warns below the same line).
MIN_HEADROOM = 0.10
# How far the search scales a cluster out, in nodes, to name hardware on which something fits.
MAX_NODES_SUGGESTED = 64


def search_strategy(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    *,
    micro_batch_size: int | None = None,
    activation_checkpointing: bool | None = None,
    strategies: list[str] | None = None,
) -> MemoryPlan:
    """Choose strategy, micro-batch and checkpointing by estimated throughput among setups that fit.

    Args:
        model: The architecture, with exact sizes.
        hardware: The target machine or cluster.
        brief: The training brief (task, seq_len, global_batch_size, precision).
        micro_batch_size: Only consider this micro-batch.
        activation_checkpointing: Only consider checkpointing on (True) or off (False).
        strategies: Only consider these strategies.

    Returns:
        The memory plan with one row per strategy (its fastest fitting setup, else its smallest),
        the choice, and ``why_not`` for every strategy that lost.
    """
    # plan_memory validates the batch arithmetic and gives the memory-only choice, which stands
    # where the speed model cannot run (no GPU) or nothing fits with headroom.
    base = plan_memory(
        model,
        hardware,
        brief,
        micro_batch_size=micro_batch_size,
        activation_checkpointing=activation_checkpointing,
        strategies=strategies,
    )
    if hardware.gpu is None:
        return base
    capacity = capacity_bytes(hardware) or 0
    per_rank = brief.global_batch_size // hardware.world_size
    micros = (
        [micro_batch_size]
        if micro_batch_size
        else [m for m in MICRO_BATCH_CANDIDATES if per_rank % m == 0]
    )
    ckpts = [activation_checkpointing] if activation_checkpointing is not None else [False, True]
    precision = resolve_precision(brief.precision, hardware)
    names = [s.name for s in base.strategies]

    best: dict[str, StrategyEstimate] = {}
    smallest: dict[str, StrategyEstimate] = {}
    for name in names:
        for micro in micros:
            for ckpt in ckpts:
                est = estimate_strategy(
                    model,
                    hardware,
                    name,
                    task=brief.task,
                    precision=precision,
                    micro_batch_size=micro,
                    activation_checkpointing=ckpt,
                    seq_len=brief.seq_len,
                ).model_copy(update={"activation_checkpointing": ckpt})
                if (
                    name not in smallest
                    or est.per_gpu_bytes.total < smallest[name].per_gpu_bytes.total
                ):
                    smallest[name] = est
                if est.per_gpu_bytes.total > (1 - MIN_HEADROOM) * capacity:
                    continue
                speed = estimate_speed(
                    model,
                    hardware,
                    name,
                    micro_batch_size=micro,
                    gradient_accumulation_steps=per_rank // micro,
                    activation_checkpointing=ckpt,
                    precision=precision,
                    seq_len=brief.seq_len,
                )
                est = est.model_copy(update={"tokens_per_s": speed.tokens_per_s})
                if name not in best or (est.tokens_per_s or 0) > (best[name].tokens_per_s or 0):
                    best[name] = est

    rows = [best.get(n) or smallest[n] for n in names]
    plain = [n for n in best if n not in OFFLOAD_STRATEGIES]
    pool = plain or list(best)
    if not pool:
        why = {
            n: f"needs {smallest[n].per_gpu_bytes.total / 1e9:.1f} GB at best, over "
            f"{(1 - MIN_HEADROOM):.0%} of {capacity / 1e9:.0f} GB"
            for n in names
        }
        bigger = _smallest_fitting(model, hardware, brief)
        note = (
            f"nothing fits with {MIN_HEADROOM:.0%} headroom; the same GPU would fit at {bigger}"
            if bigger
            else f"nothing fits with {MIN_HEADROOM:.0%} headroom, and more GPUs of this type do not help "
            "up to 64 nodes: data parallelism does not shrink per-GPU activations, so this needs tensor/"
            "sequence parallelism (Megatron-LM), memory-efficient attention, or a shorter sequence"
        )
        return base.model_copy(
            update={
                "why_not": why,
                "smallest_fitting_hardware": bigger,
                "assumptions": [note, *base.assumptions],
            }
        )
    # Fastest wins; on a tie the simpler strategy (less communication) does.
    chosen = max(pool, key=lambda n: (best[n].tokens_per_s or 0, -STRATEGY_ORDER.index(n)))
    win = best[chosen]
    why_not: dict[str, str] = {}
    for n in names:
        if n == chosen:
            continue
        if n not in best:
            why_not[n] = (
                f"does not fit with {MIN_HEADROOM:.0%} headroom at any micro-batch "
                f"(smallest {smallest[n].per_gpu_bytes.total / 1e9:.1f} GB of {capacity / 1e9:.0f} GB)"
            )
        elif n in OFFLOAD_STRATEGIES and plain:
            why_not[n] = "offload not needed: a strategy without offload fits"
        elif (best[n].tokens_per_s or 0) >= (win.tokens_per_s or 0):
            why_not[n] = (
                f"no faster than {chosen} ({win.tokens_per_s or 0:,.0f} tokens/s), which is simpler"
            )
        else:
            why_not[n] = (
                f"slower: {best[n].tokens_per_s or 0:,.0f} tokens/s vs {win.tokens_per_s or 0:,.0f} "
                f"(micro-batch {best[n].micro_batch_size}"
                f"{', checkpointing' if best[n].activation_checkpointing else ''})"
            )
    assumptions = [
        a
        for a in base.assumptions
        if not a.startswith(("data-parallel world size", "activation checkpointing is needed"))
    ]
    assumptions.insert(
        0,
        f"search: {len(names)} strategies x micro-batch {micros} x checkpointing {ckpts}; the fastest "
        f"estimated setup with at least {MIN_HEADROOM:.0%} memory headroom, never offloading when "
        "a non-offload strategy fits",
    )
    assumptions.append(
        f"data-parallel world size {hardware.world_size}; seq_len {brief.seq_len}; global batch "
        f"{brief.global_batch_size} = micro {win.micro_batch_size} x accumulation "
        f"{per_rank // win.micro_batch_size} x {hardware.world_size}"
    )
    return base.model_copy(
        update={
            "strategies": rows,
            "chosen": chosen,
            "micro_batch_size": win.micro_batch_size,
            "gradient_accumulation_steps": per_rank // win.micro_batch_size,
            "activation_checkpointing": win.activation_checkpointing,
            "assumptions": assumptions,
            "why_not": why_not,
        }
    )


def _smallest_fitting(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> str | None:
    """Scale the cluster out (same GPU) until some strategy fits with headroom; None if never."""
    if hardware.gpu is None:
        return None
    gpus = max(hardware.gpus_per_node, 8) if hardware.gpus_per_node < 8 else hardware.gpus_per_node
    nodes = 1 if gpus > hardware.gpus_per_node else hardware.nodes * 2
    while nodes <= MAX_NODES_SUGGESTED:
        bigger = hardware.model_copy(update={"nodes": nodes, "gpus_per_node": gpus})
        world = bigger.world_size
        batch = max(world, -(-brief.global_batch_size // world) * world)
        trial = brief.model_copy(update={"global_batch_size": batch})
        try:
            plan = plan_memory(
                model, bigger, trial, micro_batch_size=1, activation_checkpointing=True
            )
        except InputError:
            plan = None
        if plan is not None:
            capacity = capacity_bytes(bigger) or 0
            if any(s.per_gpu_bytes.total <= (1 - MIN_HEADROOM) * capacity for s in plan.strategies):
                return f"{nodes}x{gpus}x{_gpu_id(hardware.gpu.name)}"
        nodes *= 2
    return None


def _gpu_id(name: str) -> str:
    """The catalog id of a GPU (what a hardware spec names), from its display name."""
    from tools.hardware import find_gpu

    try:
        return str(getattr(find_gpu(name), "id", name))
    except InputError:
        return name
