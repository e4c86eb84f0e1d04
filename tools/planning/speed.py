"""Step time, throughput and MFU of one training setup: ZeRO 0-3 and offload, TP x PP x CP.

Pure arithmetic on a ``ModelSpec`` and a ``HardwareSpec``, like ``tools.planning.memory``: no torch, no
DeepSpeed, about a millisecond per call. Every number is a model of the run, not a measurement;
the assumptions that drive it are repeated in each estimate's ``assumptions``.

How a step is put together:

- Compute, operation by operation (tools/planning/compute.py): each layer's matmuls with their
  shapes after tensor and context parallelism, the attention core with its kernel, the
  memory-bound work from the bytes it moves, the recomputation the policy asks for, the output
  layer and loss, and the optimizer step; each kernel's time from its shape on the GPU
  (tools/planning/kernels.py: roofline, tile and wave quantization, short-k losses).
- Communication (tools/planning/comm.py): the data-parallel collectives each ZeRO stage runs
  (Rajbhandari et al. 2020 sec. 7; DeepSpeed ``engine.allreduce_gradients`` for when), tensor-
  parallel all-reduces (Narayanan et al. 2021 sec. 2.3), pipeline sends, ring-attention
  exchanges, each over the link it crosses: NVLink/NVSwitch inside a node, the NICs between
  nodes (one per GPU on datacenter 8-GPU nodes unless the brief or ``--interconnect`` says
  otherwise), plus a fixed cost per collective.
- Overlap and the pipeline (``_step_time``): the 1F1B / interleaved bubble (Narayanan et al. 2021
  sec. 2.2), data-parallel collectives hidden behind the compute they overlap at a contention
  cost, the rest exposed; ZeRO-Offload's PCIe traffic and CPU Adam step (Ren et al. 2021 sec. 4)
  on top.
- FLOPs and MFU as PaLM defines them (Chowdhery et al. 2022, appendix B: 6N + 12·L·h·s per
  token; full recomputation executes 8N + 16·L·h·s, Korthikanti et al. 2022 sec. 4.1).

How close it is: bench/calibration/published.py compares it with published training throughputs
(bench/results/2026-11-30-suite-full.md, "published").
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.core.errors import InputError
from tools.core.schemas import (
    Bottleneck,
    GPUSpec,
    HardwareSpec,
    ModelSpec,
    ResolvedPrecision,
    SpeedEstimate,
    StrategyName,
)
from tools.core.strategies import (
    OFFLOAD_STRATEGIES,
    Recompute,
    base_strategy,
    check_recompute,
    check_strategy,
)
from tools.planning.comm import (
    CONTENTION,
    StepSetup,
    comm_units,
    context_parallel_comm,
    data_parallel_comm,
    offload_cost,
    pipeline_comm,
    step_links,
    tensor_parallel_comm,
)
from tools.planning.compute import micro_batch_compute, optimizer_step_s
from tools.planning.kernels import Device
from tools.planning.parallel import check_model_parallel, model_parallel_params
from tools.planning.states import resolve_precision
from tools.research.architectures import is_convolutional


def training_flops_per_token(
    model: ModelSpec, seq_len: int, *, activation_checkpointing: bool
) -> float:
    """Training FLOPs per token: 6N + 12·L·h·s, or 8N + 16·L·h·s with full recomputation.

    PaLM (Chowdhery et al. 2022), appendix B: a forward pass costs 2N per token for the
    matmuls with the weights plus 4·L·h·s for attention scores and their product with values
    (causal masking not discounted); backward costs twice the forward. N is the parameters a
    token passes through: ``active_params`` for a mixture of experts. Full activation
    checkpointing re-runs each layer's forward in backward (Korthikanti et al. 2022 sec. 4.1),
    one more 2N + 4·L·h·s.
    """
    n = model.active_params or model.params
    # A convolutional network has no attention scores: its cost is the weights' 2N per position.
    attention = 0 if is_convolutional(model.hf_config or {}) else 4 * model.layers * model.hidden
    forward = 2 * n + attention * seq_len
    return float((4 if activation_checkpointing else 3) * forward)


def _peak_tflops(gpu: GPUSpec, precision: ResolvedPrecision, notes: list[str]) -> float | None:
    """Dense peak for the precision from the catalog; fp32 where the part lacks that mode."""
    peak = {"bf16": gpu.bf16_tflops, "fp16": gpu.fp16_tflops, "fp32": gpu.fp32_tflops}[precision]
    if peak is None and precision != "fp32" and gpu.fp32_tflops:
        notes.append(
            f"{gpu.name} has no {precision} tensor-core figure: its matmuls run at about the "
            f"fp32 rate, {gpu.fp32_tflops:g} TFLOP/s"
        )
        return gpu.fp32_tflops
    if precision == "fp32" and peak is not None:
        notes.append(
            "fp32 peak is the non-tensor (vector) rate: PyTorch leaves TF32 matmuls off by default"
        )
    return peak


def _compute(setup: StepSetup, flops: float) -> tuple[float | None, Device | None]:
    """(peak TFLOP/s, the kernel model's device) for the setup's GPU and precision."""
    gpu = setup.hardware.gpu
    if gpu is None:
        setup.notes.append(
            "no GPU: no peak FLOP/s in the catalog for a CPU, so no step time, tokens/s or MFU"
        )
        return None, None
    peak = _peak_tflops(gpu, setup.precision, setup.notes)
    if peak is None:
        setup.notes.append(f"{gpu.name}: no {setup.precision} peak known, so no step time or MFU")
        return None, None
    device = Device.of(gpu, peak)
    facts = device.facts
    setup.notes.append(
        f"kernels on {gpu.name}: large GEMMs at {facts.gemm:.0%} of {peak:g} TFLOP/s dense "
        f"{setup.precision} peak, less for small or badly tiled shapes ({facts.tile_m}x"
        f"{facts.tile_n} tiles over {facts.sms} SMs); attention at {facts.attention_fwd:.0%} "
        f"forward / {facts.attention_bwd:.0%} backward ({setup.attention}); memory-bound ops "
        f"at {facts.hbm:.0%} of {gpu.memory_bandwidth_gbs or 900:g} GB/s: {facts.why}"
    )
    return peak, device


@dataclass(frozen=True)
class _Step:
    """The step's parts, seconds: compute, the pipeline's idle time, what communication adds."""

    compute_s: float
    bubble_s: float
    exposed_dp_s: float
    hidden_dp_s: float
    exposed_cp_s: float
    step_s: float


def _step_time(
    setup: StepSetup,
    device: Device | None,
    dp_s: float,
    tp_s: float,
    pp_s: float,
    cp_s: float,
    offload_s: float,
) -> _Step:
    """Assemble one optimizer step from the per-micro-batch compute and the communication.

    A pipeline stage runs m micro-batches plus (p-1)/v micro-batch slots of bubble (Narayanan
    et al. 2021 sec. 2.2: 1F1B and the interleaved schedule). Tensor-parallel collectives and
    pipeline sends sit on the critical path; context-parallel ring exchanges hide behind the
    attention they feed (Liu et al. 2023, "Ring Attention", sec. 3). Data-parallel collectives
    overlap compute: ZeRO-3/FSDP prefetch parameters during forward and backward, DDP and
    ZeRO-1/2 reduce buckets during backward (Li et al. 2020 sec. 3.2.3); ZeRO-1/2's parameter
    all-gather after the optimizer step and the first layer's gather do not overlap, and
    overlapped collectives slow compute by ``CONTENTION`` of their time (NCCL kernels occupy SMs).
    """
    if device is None:
        return _Step(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    model, m, p, v = setup.model, setup.accumulation, setup.pp, setup.vpp
    mb = micro_batch_compute(
        model,
        device,
        micro=setup.micro,
        seq=setup.seq,
        tp=setup.tp,
        pp=p,
        cp=setup.cp,
        recompute=setup.recompute,
        attention=setup.attention,
        sequence_parallel=setup.sequence_parallel,
        bytes_per=setup.grad_bytes,
    )
    per_micro_cp = cp_s / m
    exposed_cp = max(0.0, per_micro_cp - mb.attention_s) * m
    # A stage's slot per micro-batch: compute plus what cannot overlap inside the stage.
    slot = mb.total_s + (tp_s + pp_s) / m + exposed_cp / m
    bubble_s = slot * (p - 1) / v if p > 1 else 0.0
    base = base_strategy(setup.strategy)
    params_here: float = model_parallel_params(model, setup.tp, p)[0]
    if base != "ddp":
        params_here = params_here / setup.dp
    optimizer_s = (
        0.0 if setup.strategy in OFFLOAD_STRATEGIES else optimizer_step_s(device, params_here)
    )
    compute_s = mb.total_s * m + optimizer_s
    # Data-parallel overlap window and the part that cannot hide.
    if base == "zero3":
        window = mb.total_s * m
        # The first layer's gather of each pass waits: one of the 3 x layers collectives.
        fixed = dp_s / (3 * mb.layers * m)
    else:
        window = (mb.backward_s + mb.recompute_s) * (1 if base in ("ddp", "zero1") else m)
        units, _ = comm_units(base, m)
        fixed = dp_s / units if base in ("zero1", "zero2") else 0.0
    overlappable = max(0.0, dp_s - fixed)
    hidden = min(overlappable, window)
    exposed_dp = fixed + (overlappable - hidden) + CONTENTION * hidden
    if setup.dp > 1:
        setup.notes.append(
            f"data-parallel overlap: {hidden:.3f} s of {dp_s:.3f} s hides behind "
            f"{'forward and backward' if base == 'zero3' else 'backward'}, at a {CONTENTION:.0%} "
            "slowdown of the compute it overlaps (NCCL kernels share the SMs); "
            f"{fixed + overlappable - hidden:.3f} s stays exposed"
        )
    step_s = m * slot + bubble_s + optimizer_s + exposed_dp + offload_s
    return _Step(compute_s, bubble_s, exposed_dp, hidden, exposed_cp, step_s)


def _bottleneck(compute_s: float | None, comm_s: float, offload_s: float) -> Bottleneck:
    """The largest raw time names the bottleneck, before overlap hides any of it."""
    if compute_s is None:
        return "unknown"
    if comm_s > compute_s and comm_s >= offload_s:
        return "communication"
    if offload_s > compute_s and offload_s > comm_s:
        return "offload"
    return "compute"


def _throughput(
    setup: StepSetup,
    step_s: float | None,
    peak: float | None,
    model_flops: float,
    dataset_tokens: float | None,
) -> tuple[float | None, float | None, float | None]:
    """Tokens/s of the whole cluster, MFU, and the time to train on ``dataset_tokens``."""
    if step_s is None or peak is None:
        if dataset_tokens is not None:
            setup.notes.append("time to train unknown: no step time")
        return None, None, None
    tokens_per_s = setup.tokens_per_step / step_s
    # PaLM appendix B: MFU = observed tokens/s x 6N + 12·L·h·s over the cluster's peak.
    mfu = tokens_per_s * model_flops / (setup.hardware.world_size * peak * 1e12)
    time_to_train = None
    if dataset_tokens is not None:
        time_to_train = dataset_tokens / tokens_per_s
        setup.notes.append(
            f"time to train: {dataset_tokens:.3g} tokens / {tokens_per_s:,.0f} tokens/s"
        )
    return tokens_per_s, mfu, time_to_train


def _check_speed_args(
    strategy: str,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    dataset_tokens: float | None,
    hardware: HardwareSpec,
) -> None:
    check_strategy(strategy)
    if micro_batch_size < 1:
        raise InputError("micro_batch_size", "must be at least 1")
    if gradient_accumulation_steps < 1:
        raise InputError("gradient_accumulation_steps", "must be at least 1")
    if dataset_tokens is not None and dataset_tokens <= 0:
        raise InputError("dataset_tokens", "must be positive")
    if hardware.gpu is None and strategy in OFFLOAD_STRATEGIES:
        raise InputError("strategy", f"{strategy} offloads GPU memory to CPU and needs a GPU")


def _data_parallel(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    tp: int,
    pp: int,
    cp: int,
    vpp: int,
) -> int:
    """World / (t x p x c), after checking the split (exit 2 naming the flag that breaks it)."""
    if cp < 1 or vpp < 1:
        raise InputError(
            "context_parallel", "context-parallel and virtual-stage degrees must be at least 1"
        )
    if vpp > 1 and (pp < 2 or model.layers % (pp * vpp)):
        raise InputError(
            "virtual_stages",
            f"{vpp} virtual stages need a pipeline and {pp} x {vpp} dividing the {model.layers} layers",
        )
    dp = check_model_parallel(model, hardware, strategy, tp, pp)
    if dp % cp:
        raise InputError(
            "context_parallel", f"{cp} must divide the {dp} GPUs left after tensor x pipeline"
        )
    return dp // cp


def _flops_notes(setup: StepSetup, flops: float) -> None:
    model = setup.model
    conv = is_convolutional(model.hf_config or {})
    setup.notes += [
        f"FLOPs per token {flops:.3e}: "
        + (
            "6N per FLOPs-equivalent position (a convolutional network has no attention)"
            if conv
            else "PaLM appendix B, 6N + 12·L·h·s"
        )
        + " with N = "
        f"{model.active_params or model.params:,}"
        + (
            " active (mixture of experts)"
            if model.active_params and model.active_params != model.params
            else ""
        )
        + (
            "; full activation checkpointing adds one forward: 8N + 16·L·h·s "
            "(MFU still counts 6N + 12·L·h·s)"
            if setup.checkpointing
            else ""
        ),
        f"{setup.tokens_per_step:,} tokens per step = micro {setup.micro} x accumulation "
        f"{setup.accumulation} x {setup.dp} {'data-parallel ' if setup.tp * setup.pp > 1 else ''}"
        f"rank(s) x seq {setup.seq}",
    ]
    if setup.tp * setup.pp > 1:
        setup.notes.append(
            f"tensor parallel {setup.tp} x pipeline {setup.pp} x data parallel {setup.dp}: each "
            f"GPU computes 1/{setup.tp * setup.pp} of its replica's FLOPs (Narayanan et al. 2021)"
        )


def estimate_speed(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    *,
    micro_batch_size: int,
    gradient_accumulation_steps: int,
    activation_checkpointing: bool = False,
    precision: str = "bf16",
    dataset_tokens: float | None = None,
    seq_len: int | None = None,
    inter_node_gbs: float | None = None,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    recompute: Recompute | None = None,
    virtual_stages: int = 1,
    context_parallel: int = 1,
    sequence_parallel: bool = True,
    attention: str = "sdpa",
) -> SpeedEstimate:
    """Estimate step time, tokens/s, MFU and the bottleneck of one training setup.

    Args:
        model: The architecture, with exact sizes (``active_params`` for a mixture of experts).
        hardware: The target machine or cluster; every GPU is a data-parallel rank.
        strategy: ddp, zero1, zero2, zero3, zero2_offload_optimizer, zero3_offload_optimizer or
            zero3_offload_all.
        micro_batch_size: Sequences per GPU per forward pass.
        gradient_accumulation_steps: Micro batches per optimizer step.
        activation_checkpointing: Whether every transformer layer is recomputed in backward.
        precision: bf16, fp16, fp32 or auto (CPU-only machines run fp32).
        dataset_tokens: Tokens to train on; gives ``time_to_train_s`` when set.
        seq_len: Tokens per sequence; defaults to ``model.seq_len``.
        inter_node_gbs: Network GB/s per direction per node, overriding the interconnect table
            (e.g. 400 for eight 400 Gb/s NICs per node).
        tensor_parallel: Megatron tensor-parallel degree t (inside a node).
        pipeline_parallel: Pipeline-parallel degree p; ``gradient_accumulation_steps`` is then
            the pipeline's micro-batches per step, m. Data parallel is world / (t x p x c).
        recompute: none, selective or full; None: full when ``activation_checkpointing``.
        virtual_stages: Interleaved pipeline stages per GPU, v (Narayanan et al. 2021 sec. 2.2.2).
        context_parallel: Context-parallel degree c (the sequence split over c GPUs).
        sequence_parallel: Megatron sequence parallelism with tensor parallelism.
        attention: The attention kernel, sdpa (FlashAttention-style) or eager.
    """
    if recompute is None:
        recompute = "full" if activation_checkpointing else "none"
    check_recompute(recompute, "recompute")
    activation_checkpointing = recompute == "full"
    _check_speed_args(
        strategy, micro_batch_size, gradient_accumulation_steps, dataset_tokens, hardware
    )
    setup = StepSetup(
        model=model,
        hardware=hardware,
        strategy=strategy,
        micro=micro_batch_size,
        accumulation=gradient_accumulation_steps,
        checkpointing=activation_checkpointing,
        precision=resolve_precision(precision, hardware),
        seq=seq_len or model.seq_len,
        tp=tensor_parallel,
        pp=pipeline_parallel,
        dp=_data_parallel(
            model,
            hardware,
            strategy,
            tensor_parallel,
            pipeline_parallel,
            context_parallel,
            virtual_stages,
        ),
        recompute=recompute,
        cp=context_parallel,
        vpp=virtual_stages,
        sequence_parallel=sequence_parallel,
        attention=attention,
    )
    flops = training_flops_per_token(
        model, setup.seq, activation_checkpointing=activation_checkpointing
    )
    model_flops = training_flops_per_token(model, setup.seq, activation_checkpointing=False)
    _flops_notes(setup, flops)
    peak, device = _compute(setup, flops)
    if inter_node_gbs is None and hardware.nics_per_node and hardware.nic_gbps:
        # The brief's NICs: each node's line rate, Gb/s to GB/s.
        inter_node_gbs = hardware.nics_per_node * hardware.nic_gbps / 8
    links = step_links(setup, inter_node_gbs)
    dp_bytes, dp_s = data_parallel_comm(setup, links, inter_node_gbs)
    tp_bytes, tp_s = tensor_parallel_comm(setup, links)
    pp_bytes, pp_s, bubble_fraction = pipeline_comm(setup, links)
    cp_bytes, cp_s = context_parallel_comm(setup, links)
    offload_bytes, offload_s = offload_cost(setup)
    step = _step_time(setup, device, dp_s, tp_s, pp_s, cp_s, offload_s)
    compute_s = step.compute_s if device is not None else None
    step_s = step.step_s if device is not None else None
    bubble_s = step.bubble_s
    exposed_s = step.exposed_dp_s + tp_s + pp_s + step.exposed_cp_s
    comm_s = dp_s + tp_s + pp_s + cp_s
    efficiency = None
    if compute_s and peak:
        # Achieved share of peak while computing: executed FLOPs over compute time.
        tokens_here = (
            setup.micro * setup.accumulation * setup.seq / (setup.tp * setup.pp * setup.cp)
        )
        efficiency = tokens_here * flops / (compute_s * peak * 1e12)
    tokens_per_s, mfu, time_to_train = _throughput(setup, step_s, peak, model_flops, dataset_tokens)
    return SpeedEstimate(
        strategy=strategy,
        precision=setup.precision,
        seq_len=setup.seq,
        tokens_per_step=setup.tokens_per_step,
        flops_per_token=flops,
        model_flops_per_token=model_flops,
        peak_tflops=peak,
        efficiency=efficiency,
        compute_time_s=compute_s,
        comm_bytes_per_step=dp_bytes + tp_bytes + pp_bytes + cp_bytes,
        comm_time_s=comm_s,
        exposed_comm_time_s=exposed_s,
        offload_bytes_per_step=offload_bytes,
        offload_time_s=offload_s,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        data_parallel=setup.dp,
        context_parallel=setup.cp,
        virtual_stages=setup.vpp,
        recompute=setup.recompute,
        tp_comm_time_s=tp_s,
        pp_comm_time_s=pp_s,
        bubble_fraction=bubble_fraction,
        bubble_time_s=bubble_s,
        step_time_s=step_s,
        tokens_per_s=tokens_per_s,
        mfu=mfu,
        time_to_train_s=time_to_train,
        bottleneck=_bottleneck(compute_s, exposed_s + step.hidden_dp_s, offload_s),
        assumptions=setup.notes,
    )
