"""When nothing fits: what binds, and the changes that would fit, each with its numbers.

Estimates only, from the same memory model the search uses (tools/planning/memory.py); the
chooser stays ``tools/planning/search.py``. Each option is tried at micro-batch 1, with and
without activation checkpointing, over the data-parallel strategies, and the first (simplest)
setup that leaves ``MIN_HEADROOM`` of the GPU free is the one quoted:

- **LoRA** (Hu et al. 2021): the base frozen in bf16, rank-16 adapters on every projection
  (q, k, v, o, gate, up, down), gradients and Adam states for the adapters only.
- **QLoRA** (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", sec. 3):
  the same adapters on a base stored as 4-bit NormalFloat (NF4): 0.5 byte per quantized weight
  plus one fp32 absmax per 64-weight block (0.5 bits per weight; bitsandbytes'
  ``Linear4bit`` default without double quantization, which would cut it to 0.127 bits). Only
  the transformer layers' linear weights are quantized; embeddings, the LM head and the norms
  stay bf16, and each layer's weight is dequantized to bf16 for its matmul. Quoted for DDP
  (one 4-bit copy per GPU); sharding a 4-bit base (FSDP + QLoRA) is not estimated.
- **8-bit Adam** (bitsandbytes, Dettmers et al. 2022, "8-bit Optimizers via Block-wise
  Quantization"): Adam's two moments at one byte each (2 bytes per parameter instead of 8).
- **offload** with the host RAM it needs: the leanest offload setup that fits on the GPU, and
  the node RAM its offloaded states need (DeepSpeed's estimator figure with 10% left free).
- **more GPUs** of the same type (the smallest count that fits) and a **larger GPU** from the
  catalog (the smallest memory size that fits at the same count).
"""

from __future__ import annotations

from tools.core.schemas import (
    TRAINING_TASKS,
    FitOption,
    HardwareSpec,
    ModelSpec,
    StrategyEstimate,
    TrainingBrief,
)
from tools.core.strategies import MIN_HEADROOM, OFFLOAD_STRATEGIES, STRATEGY_ORDER, StrategyName
from tools.core.units import gb_text
from tools.planning.footprint import NF4_BYTES
from tools.planning.memory import GB, capacity_bytes, estimate_strategy
from tools.planning.overheads import CPU_RAM_HEADROOM, FRAGMENTATION_MARGIN, node_ram_bytes
from tools.planning.scale_out import fits_somewhere, smallest_fitting
from tools.planning.states import resolve_precision

# NF4 weights with double-quantized block constants, as the generated train.py loads them
# (bnb_4bit_use_double_quant) and the memory model prices them (footprint.py NF4_BYTES).
NF4_BYTES_PER_PARAM = NF4_BYTES
# Most options quoted in the one-line summary (the line stays one line).
MAX_OPTIONS_IN_LINE = 6
PLAIN = [s for s in STRATEGY_ORDER if s not in OFFLOAD_STRATEGIES]


def _limit(hardware: HardwareSpec) -> float:
    return (1 - MIN_HEADROOM) * (capacity_bytes(hardware) or 0)


def binding(rows: list[StrategyEstimate], hardware: HardwareSpec) -> str:
    """What binds when no row fits: GPU memory, host RAM for offload, or both, with numbers."""
    limit = _limit(hardware)
    cap = (capacity_bytes(hardware) or 0) / GB
    ram, assumed = node_ram_bytes(hardware)
    ram_text = f"the node's {ram / GB:g} GB" + (
        " (assumed: not given; 2x its GPU memory, at least 64 GB)" if assumed else ""
    )
    plain = [r for r in rows if r.name not in OFFLOAD_STRATEGIES]
    offload = [r for r in rows if r.name in OFFLOAD_STRATEGIES]
    best_plain = min((r.per_gpu_bytes.total for r in plain), default=None)
    gpu_text = (
        f"without offload {gb_text(best_plain)}/GPU at best, over {1 - MIN_HEADROOM:.0%} of {cap:g} GB"
        if best_plain is not None
        else f"over {1 - MIN_HEADROOM:.0%} of {cap:g} GB per GPU"
    )
    on_gpu = [r for r in offload if r.per_gpu_bytes.total <= limit]
    if on_gpu:
        lean = min(on_gpu, key=lambda r: r.cpu_bytes_per_node)
        return (
            f"host RAM for offload ({lean.name} fits the GPU at {gb_text(lean.per_gpu_bytes.total)} "
            f"but needs {gb_text(lean.cpu_bytes_per_node)} host RAM/node, over "
            f"{1 - CPU_RAM_HEADROOM:.0%} of {ram_text}); {gpu_text}"
        )
    ram_short = [r for r in offload if r.cpu_bytes_per_node > (1 - CPU_RAM_HEADROOM) * ram]
    if ram_short:
        lean = min(offload, key=lambda r: r.per_gpu_bytes.total)
        return (
            f"GPU memory and host RAM for offload ({gpu_text}; even {lean.name} needs "
            f"{gb_text(lean.per_gpu_bytes.total)}/GPU and {gb_text(lean.cpu_bytes_per_node)} host "
            f"RAM/node, {ram_text})"
        )
    lean_offload = min((r.per_gpu_bytes.total for r in offload), default=None)
    return f"GPU memory ({gpu_text}" + (
        f"; with offload {gb_text(lean_offload)}/GPU)" if lean_offload is not None else ")"
    )


def _first_fit(
    model: ModelSpec,
    hardware: HardwareSpec,
    brief: TrainingBrief,
    names: list[StrategyName],
    *,
    task: str,
    optimizer: str = "adamw",
    base_saving: int = 0,
) -> tuple[StrategyEstimate | None, int, StrategyEstimate | None, int]:
    """The simplest setup at micro-batch 1 that fits with headroom, and the leanest one.

    ``base_saving`` is subtracted from every total (before the fragmentation margin): QLoRA's
    smaller base. Returns (fitting row, its total, leanest row, its total).
    """
    limit = _limit(hardware)
    precision = resolve_precision(brief.precision, hardware)
    world = hardware.world_size
    lean: tuple[StrategyEstimate | None, int] = (None, 0)
    for ckpt in (False, True):
        for name in names:
            est = estimate_strategy(
                model,
                hardware,
                name,
                task=task,  # type: ignore[arg-type]
                precision=precision,
                micro_batch_size=1,
                activation_checkpointing=ckpt,
                optimizer=optimizer,
                seq_len=brief.seq_len,
                gradient_accumulation_steps=max(1, brief.batch // world),
            )
            est = est.model_copy(update={"activation_checkpointing": ckpt})
            total = est.per_gpu_bytes.total - int(base_saving * (1 + FRAGMENTATION_MARGIN))
            if lean[0] is None or total < lean[1]:
                lean = (est, total)
            # Data-parallel strategies only (no offload): fitting is the GPU total alone.
            if total <= limit:
                return est, total, lean[0], lean[1]
    return None, 0, lean[0], lean[1]


def _setup(est: StrategyEstimate) -> str:
    return est.name + (", checkpointing" if est.activation_checkpointing else "")


def _option(
    name: str, found: tuple[StrategyEstimate | None, int, StrategyEstimate | None, int], detail: str
) -> FitOption:
    fit, total, lean, lean_total = found
    row, value = (fit, total) if fit is not None else (lean, lean_total)
    return FitOption(
        name=name,
        fits=fit is not None,
        gb_per_gpu=round(value / GB, 1) if row is not None else None,
        host_ram_gb=round(row.cpu_bytes_per_node / GB / (1 - CPU_RAM_HEADROOM), 0)
        if row is not None and row.cpu_bytes_per_node
        else None,
        setup=_setup(row) if row is not None else "",
        detail=detail,
    )


def qlora_base_saving(model: ModelSpec) -> int:
    """Bytes a 4-bit NF4 base saves against a bf16 one, net of one dequantized layer weight."""
    tied = bool((model.hf_config or {}).get("tie_word_embeddings", False))
    kept = model.vocab * model.hidden * (1 if tied else 2)  # embeddings and LM head stay bf16
    quantized = max(0, model.params - kept)
    inter = model.intermediate or 4 * model.hidden
    dequantized = 2 * model.hidden * inter  # the largest linear weight, in bf16 for its matmul
    return int((2 - NF4_BYTES_PER_PARAM) * quantized) - dequantized


def fit_options(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> list[FitOption]:
    """Every alternative with its figures, in the order a user would try them."""
    if hardware.gpu is None or brief.task not in TRAINING_TASKS:
        return []
    options: list[FitOption] = []
    plain: list[StrategyName] = list(PLAIN)
    if brief.task != "pretrain":
        if brief.task != "lora":
            options.append(
                _option(
                    "LoRA",
                    _first_fit(model, hardware, brief, plain, task="lora"),
                    "bf16 base frozen, rank 16 on q/k/v/o/gate/up/down (Hu et al. 2021)",
                )
            )
        options.append(
            _option(
                "QLoRA",
                _first_fit(
                    model,
                    hardware,
                    brief,
                    ["ddp"],
                    task="lora",
                    base_saving=qlora_base_saving(model),
                ),
                "4-bit NF4 base, rank-16 adapters (Dettmers et al. 2023)",
            )
        )
    if brief.task != "lora":
        options.append(
            _option(
                "8-bit Adam",
                _first_fit(model, hardware, brief, plain, task=brief.task, optimizer="adam8bit"),
                "bitsandbytes 8-bit Adam, 2 bytes of optimizer state per parameter",
            )
        )
    options.append(_offload_option(model, hardware, brief))
    options += _hardware_options(model, hardware, brief)
    return options


def _offload_option(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> FitOption:
    """The offload setup that fits the GPU with the least host RAM, and the RAM it needs."""
    limit = _limit(hardware)
    precision = resolve_precision(brief.precision, hardware)
    world = hardware.world_size
    best: StrategyEstimate | None = None
    for ckpt in (False, True):
        for name in [s for s in STRATEGY_ORDER if s in OFFLOAD_STRATEGIES]:
            est = estimate_strategy(
                model,
                hardware,
                name,
                task=brief.task,
                precision=precision,
                micro_batch_size=1,
                activation_checkpointing=ckpt,
                seq_len=brief.seq_len,
                gradient_accumulation_steps=max(1, brief.batch // world),
            ).model_copy(update={"activation_checkpointing": ckpt})
            key = (est.cpu_bytes_per_node, est.per_gpu_bytes.total)
            if est.per_gpu_bytes.total <= limit and (
                best is None or key < (best.cpu_bytes_per_node, best.per_gpu_bytes.total)
            ):
                best = est
    if best is None:
        return FitOption(name="offload", fits=False, detail="no offload setup fits the GPU")
    ram, assumed = node_ram_bytes(hardware)
    need = best.cpu_bytes_per_node / (1 - CPU_RAM_HEADROOM)
    return FitOption(
        name="offload",
        fits=best.fits,
        gb_per_gpu=round(best.per_gpu_bytes.total / GB, 1),
        host_ram_gb=float(round(need / GB)),
        setup=_setup(best),
        detail=f"needs {need / GB:.0f} GB host RAM per node; the node has {ram / GB:g} GB"
        + (" (assumed)" if assumed else ""),
    )


def _gpu_id(hardware: HardwareSpec) -> str:
    return str(getattr(hardware.gpu, "id", None) or (hardware.gpu.name if hardware.gpu else ""))


def _hardware_options(
    model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief
) -> list[FitOption]:
    """More GPUs of the same type, and the smallest larger GPU of the catalog, at this count."""
    from tools.research.hardware import load_gpu_catalog

    assert hardware.gpu is not None
    out: list[FitOption] = []
    more: str | None = None
    if hardware.nodes == 1:
        count = hardware.gpus_per_node * 2
        while count <= 8 and more is None:
            bigger = hardware.model_copy(update={"gpus_per_node": count})
            if _fits(model, bigger, brief):
                more = f"1x{count}x{_gpu_id(hardware)}"
            count *= 2
    more = more or smallest_fitting(model, hardware, brief)
    out.append(
        FitOption(
            name="more GPUs",
            fits=more is not None,
            setup=more or "",
            detail="the smallest count of the same GPU on which some setup fits"
            if more
            else "more GPUs of this type do not fit up to 64 nodes",
        )
    )
    memory = hardware.gpu.memory_gb
    for gpu in sorted(load_gpu_catalog().values(), key=lambda g: (g.memory_gb, g.id)):
        if gpu.memory_gb <= memory:
            continue
        other = hardware.model_copy(update={"gpu": gpu})
        if _fits(model, other, brief):
            out.append(
                FitOption(
                    name="larger GPU",
                    fits=True,
                    gb_per_gpu=gpu.memory_gb,
                    setup=f"{hardware.nodes}x{hardware.gpus_per_node}x{gpu.id}",
                    detail=f"the smallest catalog GPU with more memory that fits ({gpu.memory_gb:g} GB)",
                )
            )
            break
    return out


def _fits(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> bool:
    world = hardware.world_size
    batch = max(world, -(-brief.batch // world) * world)
    return fits_somewhere(model, hardware, brief.model_copy(update={"global_batch_size": batch}))


def option_text(option: FitOption) -> str:
    """One option in a few words: ``LoRA (17.2 GB/GPU, zero1)``."""
    if option.name == "offload":
        return f"offload with {option.host_ram_gb:g} GB host RAM/node ({option.setup}, {option.gb_per_gpu:g} GB/GPU)"
    if option.name in ("more GPUs", "larger GPU"):
        return option.setup
    return f"{option.name} ({option.gb_per_gpu:g} GB/GPU, {option.setup})"


def fit_line(binding_text: str, options: list[FitOption]) -> str:
    """The one line: ``does not fit: <binding>; fits with: LoRA (x GB/GPU), ...``."""
    fitting = [o for o in options if o.fits or o.name == "offload" and o.host_ram_gb]
    shown = "; ".join(option_text(o) for o in fitting[:MAX_OPTIONS_IN_LINE])
    lost = [
        f"{o.name} ({o.gb_per_gpu:g} GB/GPU)"
        for o in options
        if not o.fits and o.gb_per_gpu and o.name != "offload"
    ]
    line = f"does not fit: {binding_text}; fits with: {shown or 'nothing the planner knows'}"
    if lost:
        line += f"; still too large: {', '.join(lost)}"
    return line
