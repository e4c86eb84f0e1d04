"""Strategy search: the fastest setup that fits, by the memory and speed models, in milliseconds.

DeepSpeed's autotuner finds a configuration by running it on the target GPUs; this search runs
nothing. Over strategy x micro-batch x activation checkpointing it keeps the candidates whose
estimated peak leaves at least ``MIN_HEADROOM`` of the GPU free (and, for offload, of the
node's CPU RAM), never offloads when a non-offload strategy fits (offload trades GPU memory for
PCIe traffic and CPU time), and picks the highest estimated tokens/s. Every other strategy gets
the reason it lost.

When no data-parallel strategy fits without offload (not even ZeRO-3), the search adds
Megatron-style tensor x pipeline parallelism (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM"): tensor degree t in 2, 4, 8 inside
a node, pipeline degree p dividing the layers, ZeRO-1 over the world / (t x p) data-parallel
ranks (ZeRO-2/3 too when p = 1). Such a setup, when it fits, wins over offload.
"""

from __future__ import annotations

from tools.core.errors import InputError
from tools.core.schemas import (
    HardwareSpec,
    MemoryPlan,
    ModelSpec,
    StrategyEstimate,
    StrategyName,
    TrainingBrief,
)
from tools.core.strategies import MIN_HEADROOM, OFFLOAD_STRATEGIES, STRATEGY_ORDER, setup_label
from tools.planning.memory import (
    MICRO_BATCH_CANDIDATES,
    PIPELINE_STAGES,
    TENSOR_ONLY_STAGES,
    TENSOR_PARALLEL_CANDIDATES,
    capacity_bytes,
    check_model_parallel,
    estimate_strategy,
    node_ram_bytes,
    plan_memory,
    resolve_precision,
)
from tools.planning.speed import estimate_speed

# How far the search scales a cluster out, in nodes, to name hardware on which something fits.
MAX_NODES_SUGGESTED = 64
TRAINING_TASKS = ("pretrain", "finetune", "lora")
MEGATRON_NOTE = (
    "tensor/pipeline parallelism needs Megatron-DeepSpeed (or Megatron-LM/NeMo): DeepSpeed's "
    "engine alone has no Megatron tensor- or pipeline-parallel layers. ds_config.json carries "
    "the ZeRO part with train_batch_size = micro x accumulation x data-parallel ranks, which "
    "DeepSpeed checks against Megatron's data-parallel group (its mpu); the parallel degrees "
    "are Megatron arguments (--tensor-model-parallel-size, --pipeline-model-parallel-size)"
)

Setup = tuple[StrategyName, int, int]  # (ZeRO strategy, tensor degree, pipeline degree)


def model_parallel_setups(
    model: ModelSpec, hardware: HardwareSpec, names: list[StrategyName]
) -> list[Setup]:
    """Every valid (strategy, t, p) with t x p > 1 among ``names``, smallest t x p first.

    t from ``TENSOR_PARALLEL_CANDIDATES`` (within a node, dividing heads and key-value heads),
    p dividing the layers, t x p dividing the GPUs; pipelines take ZeRO-1 only.
    """
    world = hardware.world_size
    setups: list[Setup] = []
    for tp in TENSOR_PARALLEL_CANDIDATES:
        for pp in range(1, min(model.layers, world) + 1):
            if tp * pp == 1 or world % (tp * pp) or model.layers % pp:
                continue
            stages = PIPELINE_STAGES if pp > 1 else TENSOR_ONLY_STAGES
            for name in stages:
                if name not in names:
                    continue
                try:
                    check_model_parallel(model, hardware, name, tp, pp)
                except InputError:
                    continue
                setups.append((name, tp, pp))
    return sorted(setups, key=lambda s: (s[1] * s[2], s[2], STRATEGY_ORDER.index(s[0])))


def _label(est: StrategyEstimate) -> str:
    return setup_label(est.name, est.tensor_parallel, est.pipeline_parallel)


def _faster(a: StrategyEstimate, b: StrategyEstimate | None) -> bool:
    """Is ``a`` faster than ``b``; on a tie, is it less model-parallel and simpler?"""
    if b is None:
        return True

    def key(e: StrategyEstimate) -> tuple[float, int, int]:
        return (
            e.tokens_per_s or 0.0,
            -e.tensor_parallel * e.pipeline_parallel,
            -STRATEGY_ORDER.index(e.name),
        )

    return key(a) > key(b)


def _gb(value: float) -> str:
    return f"{value / 1e9:.1f} GB"


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
        strategies: Only consider these strategies (also the ZeRO stages tried with
            tensor/pipeline parallelism).

    Returns:
        The memory plan with one row per strategy (its fastest fitting setup, else its smallest),
        plus, when tensor/pipeline parallelism was searched, one row per ZeRO stage tried with it
        (its fastest fitting t x p, else its smallest); the choice with its tensor and pipeline
        degrees, whose row comes first among the rows of its name; and ``why_not`` for every
        row that lost, keyed by ``setup_label``.
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
    limit = (1 - MIN_HEADROOM) * capacity
    world = hardware.world_size
    ckpts = [activation_checkpointing] if activation_checkpointing is not None else [False, True]
    precision = resolve_precision(brief.precision, hardware)
    names = [s.name for s in base.strategies]
    ram, ram_assumed = node_ram_bytes(hardware)
    node_ram = f"the node's {ram / 1e9:g} GB" + (" (assumed)" if ram_assumed else "")

    def micro_options(per_rank: int) -> list[int]:
        if micro_batch_size:
            return [micro_batch_size]
        return [m for m in MICRO_BATCH_CANDIDATES if per_rank % m == 0]

    def evaluate(
        name: StrategyName, tp: int = 1, pp: int = 1
    ) -> tuple[StrategyEstimate | None, StrategyEstimate]:
        """The fastest setup of (name, t, p) that fits with headroom, and the smallest one."""
        per_rank = brief.global_batch_size // (world // (tp * pp))
        best: StrategyEstimate | None = None
        smallest: StrategyEstimate | None = None
        for micro in micro_options(per_rank):
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
                    tensor_parallel=tp,
                    pipeline_parallel=pp,
                    gradient_accumulation_steps=per_rank // micro,
                ).model_copy(update={"activation_checkpointing": ckpt})
                if smallest is None or est.per_gpu_bytes.total < smallest.per_gpu_bytes.total:
                    smallest = est
                # fits is False when offloaded states overflow the node's CPU RAM.
                if not est.fits or est.per_gpu_bytes.total > limit:
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
                    tensor_parallel=tp,
                    pipeline_parallel=pp,
                )
                est = est.model_copy(update={"tokens_per_s": speed.tokens_per_s})
                if _faster(est, best):
                    best = est
        assert smallest is not None  # micro_options is never empty: 1 divides everything
        return best, smallest

    best: dict[str, StrategyEstimate] = {}
    smallest: dict[str, StrategyEstimate] = {}
    for name in names:
        fit, small = evaluate(name)
        smallest[name] = small
        if fit is not None:
            best[name] = fit
    plain = [n for n in best if n not in OFFLOAD_STRATEGIES]

    # Tensor x pipeline parallelism, only when no data-parallel setup fits without offload.
    setups: list[Setup] = []
    if not plain and brief.task in TRAINING_TASKS:
        setups = model_parallel_setups(model, hardware, names)
    mp_best: dict[str, StrategyEstimate] = {}  # per ZeRO stage: its fastest fitting t x p
    mp_smallest: dict[str, StrategyEstimate] = {}
    for name, tp, pp in setups:
        fit, small = evaluate(name, tp, pp)
        if (
            name not in mp_smallest
            or small.per_gpu_bytes.total < mp_smallest[name].per_gpu_bytes.total
        ):
            mp_smallest[name] = small
        if fit is not None and _faster(fit, mp_best.get(name)):
            mp_best[name] = fit
    mp_names = list(mp_smallest)
    mp_rows = [mp_best.get(n) or mp_smallest[n] for n in mp_names]
    rows = [best.get(n) or smallest[n] for n in names] + mp_rows
    searched = _search_line(names, micro_options, ckpts, setups)

    candidates = [best[n] for n in plain] or list(mp_best.values()) or list(best.values())
    if not candidates:
        why: dict[str, str] = {n: _over(smallest[n], limit, capacity, node_ram) for n in names}
        why.update({_label(r): _over(r, limit, capacity, node_ram, split=True) for r in mp_rows})
        bigger = _smallest_fitting(model, hardware, brief)
        note = (
            f"nothing fits with {MIN_HEADROOM:.0%} headroom; the same GPU would fit at {bigger}"
            if bigger
            else f"nothing fits with {MIN_HEADROOM:.0%} headroom, and more GPUs of this type do "
            f"not help up to {MAX_NODES_SUGGESTED} nodes, even with tensor (up to one node) and "
            "pipeline parallelism: the activations of one layer or the model states stay too "
            "large; this needs memory-efficient attention (the estimate stores attention "
            "scores, Korthikanti et al. eq. 1), a shorter sequence, or GPUs with more memory"
        )
        return base.model_copy(
            update={
                "strategies": [*base.strategies, *mp_rows],
                "why_not": why,
                "smallest_fitting_hardware": bigger,
                "assumptions": [note, searched, *base.assumptions],
            }
        )
    # Fastest wins; on a tie the simpler setup (less communication) does.
    win = candidates[0]
    for est in candidates[1:]:
        if _faster(est, win):
            win = est
    win_label = _label(win)
    why_not: dict[str, str] = {}
    for row in rows:
        label = _label(row)
        if row is win:
            continue
        mp = row.tensor_parallel * row.pipeline_parallel > 1
        fitting = (mp_best.get(row.name) if mp else best.get(row.name)) is row
        if not fitting:
            why_not[label] = _no_fit(row, limit, capacity, node_ram, split=mp)
        elif row.name in OFFLOAD_STRATEGIES and win.name not in OFFLOAD_STRATEGIES:
            why_not[label] = "offload not needed: a strategy without offload fits" + (
                f" ({win_label}, tensor/pipeline parallel)" if win_label != win.name else ""
            )
        elif (row.tokens_per_s or 0) >= (win.tokens_per_s or 0):
            why_not[label] = (
                f"no faster than {win_label} ({win.tokens_per_s or 0:,.0f} tokens/s), which is "
                "simpler"
            )
        else:
            why_not[label] = (
                f"slower: {row.tokens_per_s or 0:,.0f} tokens/s vs {win.tokens_per_s or 0:,.0f} "
                f"(micro-batch {row.micro_batch_size}"
                f"{', checkpointing' if row.activation_checkpointing else ''})"
            )
    tp, pp = win.tensor_parallel, win.pipeline_parallel
    dp = world // (tp * pp)
    if tp * pp > 1:
        # The chosen setup is the first row with the chosen name, so a reader that looks the
        # choice up by name (the report, the reviewer, the offline engineer) finds this row.
        rows.remove(win)
        rows.insert(names.index(win.name) if win.name in names else len(names), win)
    per_rank = brief.global_batch_size // dp
    assumptions = [
        a
        for a in base.assumptions
        if not a.startswith(("data-parallel world size", "activation checkpointing is needed"))
    ]
    assumptions.insert(0, searched)
    if tp * pp > 1:
        assumptions.insert(
            1,
            f"no data-parallel strategy fits without offload, not even ZeRO-3: {win_label} "
            f"(tensor {tp} x pipeline {pp} x data {dp}) fits and is preferred to offload",
        )
        assumptions.append(MEGATRON_NOTE)
        assumptions.append(
            f"tensor parallel {tp} x pipeline parallel {pp} x data parallel {dp}; seq_len "
            f"{brief.seq_len}; global batch {brief.global_batch_size} = micro "
            f"{win.micro_batch_size} x accumulation {per_rank // win.micro_batch_size} x {dp}"
        )
    else:
        assumptions.append(
            f"data-parallel world size {world}; seq_len {brief.seq_len}; global batch "
            f"{brief.global_batch_size} = micro {win.micro_batch_size} x accumulation "
            f"{per_rank // win.micro_batch_size} x {world}"
        )
    return base.model_copy(
        update={
            "strategies": rows,
            "chosen": win.name,
            "tensor_parallel": tp,
            "pipeline_parallel": pp,
            "micro_batch_size": win.micro_batch_size,
            "gradient_accumulation_steps": per_rank // win.micro_batch_size,
            "activation_checkpointing": win.activation_checkpointing,
            "assumptions": assumptions,
            "why_not": why_not,
        }
    )


def _search_line(
    names: list[StrategyName],
    micro_options: object,
    ckpts: list[bool],
    setups: list[Setup],
) -> str:
    line = (
        f"search: {len(names)} strategies x micro-batch x checkpointing {ckpts}; the fastest "
        f"estimated setup with at least {MIN_HEADROOM:.0%} memory headroom, never offloading "
        "when a non-offload strategy fits"
    )
    if setups:
        tps = sorted({s[1] for s in setups})
        pps = sorted({s[2] for s in setups})
        line += (
            f"; no data-parallel strategy fit without offload, so also {len(setups)} tensor x "
            f"pipeline splits (t in {tps}, p in {pps}; ZeRO-1 with a pipeline, ZeRO-1/2/3 with "
            "tensor parallelism alone; activations with sequence parallelism, Korthikanti et "
            "al. 2022 sec. 4.2)"
        )
    return line


def _cpu_short(est: StrategyEstimate, limit: float) -> bool:
    """Did ``est`` fail on the node's CPU RAM rather than on GPU memory?"""
    return not est.fits and est.per_gpu_bytes.total <= limit and est.cpu_bytes_per_node > 0


def _over(
    est: StrategyEstimate, limit: float, capacity: int, node_ram: str, *, split: bool = False
) -> str:
    """Why a row does not fit, when nothing does (every reason says "over 90%")."""
    if _cpu_short(est, limit):
        return (
            f"offload needs {_gb(est.cpu_bytes_per_node)} of CPU RAM per node, over "
            f"{1 - MIN_HEADROOM:.0%} of {node_ram}"
        )
    where = f" (smallest at tensor {est.tensor_parallel} x pipeline {est.pipeline_parallel})"
    return (
        f"needs {_gb(est.per_gpu_bytes.total)} at best, over {1 - MIN_HEADROOM:.0%} of "
        f"{capacity / 1e9:.0f} GB" + (where if split else "")
    )


def _no_fit(
    est: StrategyEstimate, limit: float, capacity: int, node_ram: str, *, split: bool
) -> str:
    """Why a row lost by not fitting, when something else does."""
    if _cpu_short(est, limit):
        return (
            f"does not fit in CPU RAM: offload needs {_gb(est.cpu_bytes_per_node)} per node, "
            f"over {1 - MIN_HEADROOM:.0%} of {node_ram}"
        )
    what = "any tensor/pipeline split or micro-batch" if split else "any micro-batch"
    return (
        f"does not fit with {MIN_HEADROOM:.0%} headroom at {what} (smallest "
        f"{_gb(est.per_gpu_bytes.total)} of {capacity / 1e9:.0f} GB)"
    )


def _fits_somewhere(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> bool:
    """Does any strategy, or tensor x pipeline split, fit at micro-batch 1 with checkpointing?"""
    try:
        plan = plan_memory(
            model, hardware, brief, micro_batch_size=1, activation_checkpointing=True
        )
    except InputError:
        return False
    limit = (1 - MIN_HEADROOM) * (capacity_bytes(hardware) or 0)
    if any(s.fits and s.per_gpu_bytes.total <= limit for s in plan.strategies):
        return True
    if brief.task not in TRAINING_TASKS:
        return False
    precision = resolve_precision(brief.precision, hardware)
    for name, tp, pp in model_parallel_setups(model, hardware, list(STRATEGY_ORDER)):
        dp = hardware.world_size // (tp * pp)
        est = estimate_strategy(
            model,
            hardware,
            name,
            task=brief.task,
            precision=precision,
            micro_batch_size=1,
            activation_checkpointing=True,
            seq_len=brief.seq_len,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            gradient_accumulation_steps=brief.global_batch_size // dp,
        )
        if est.fits and est.per_gpu_bytes.total <= limit:
            return True
    return False


def _smallest_fitting(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> str | None:
    """Scale the cluster out (same GPU) until some setup fits with headroom; None if never."""
    if hardware.gpu is None:
        return None
    gpus = max(hardware.gpus_per_node, 8) if hardware.gpus_per_node < 8 else hardware.gpus_per_node
    nodes = 1 if gpus > hardware.gpus_per_node else hardware.nodes * 2
    while nodes <= MAX_NODES_SUGGESTED:
        bigger = hardware.model_copy(update={"nodes": nodes, "gpus_per_node": gpus})
        world = bigger.world_size
        batch = max(world, -(-brief.global_batch_size // world) * world)
        trial = brief.model_copy(update={"global_batch_size": batch})
        if _fits_somewhere(model, bigger, trial):
            return f"{nodes}x{gpus}x{_gpu_id(hardware.gpu.name)}"
        nodes *= 2
    return None


def _gpu_id(name: str) -> str:
    """The catalog id of a GPU (what a hardware spec names), from its display name."""
    from tools.research.hardware import find_gpu

    try:
        return str(getattr(find_gpu(name), "id", name))
    except InputError:
        return name
