"""One optimizer step assembled: compute, the pipeline bubble, overlap, throughput and MFU.

The per-micro-batch compute (tools/planning/compute.py) and the communication times
(tools/planning/comm.py) become a step: the 1F1B / interleaved bubble (Narayanan et al. 2021
sec. 2.2), data-parallel collectives hidden behind the compute they overlap at a contention
cost, the rest exposed, offload on top; then tokens/s, MFU and the bottleneck.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tools.core.schemas import Bottleneck
from tools.core.strategies import OFFLOAD_STRATEGIES, base_strategy
from tools.planning.comm import CONTENTION, StepSetup, comm_units
from tools.planning.compute import MicroBatchCompute, micro_batch_compute, optimizer_step_s
from tools.planning.conv_algos import ConvMode, executed_share
from tools.planning.flops import training_flops_per_token
from tools.planning.fp8 import fp8_device
from tools.planning.kernels import Device
from tools.planning.parallel import params_per_rank
from tools.planning.vision import conv_net_of


@dataclass(frozen=True)
class StepTime:
    """The step's parts, seconds: compute, the pipeline's idle time, what communication adds."""

    compute_s: float
    bubble_s: float
    exposed_dp_s: float
    hidden_dp_s: float
    exposed_cp_s: float
    step_s: float


def step_time(
    setup: StepSetup,
    device: Device | None,
    dp_s: float,
    tp_s: float,
    pp_s: float,
    cp_s: float,
    offload_s: float,
) -> StepTime:
    """Assemble one optimizer step from the per-micro-batch compute and the communication.

    A pipeline stage runs m micro-batches plus (p-1)/v micro-batch slots of bubble (Narayanan
    et al. 2021 sec. 2.2: 1F1B and the interleaved schedule). Tensor-parallel collectives and
    pipeline sends sit on the critical path; context-parallel ring exchanges hide behind the
    attention they feed (Liu et al. 2023, "Ring Attention", sec. 3), Ulysses' all-to-alls do not. Data-parallel collectives
    overlap compute: ZeRO-3/FSDP prefetch parameters during forward and backward, DDP and
    ZeRO-1/2 reduce buckets during backward (Li et al. 2020 sec. 3.2.3); ZeRO-1/2's parameter
    all-gather after the optimizer step and the first layer's gather do not overlap, and
    overlapped collectives slow compute by ``CONTENTION`` of their time (NCCL kernels occupy SMs).
    """
    if device is None:
        return StepTime(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
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
        fp8=linear_device(setup, device),
        ep=setup.ep,
        conv_mode=conv_mode(setup),
    )
    mb = gemm_rate_floor(setup, device, mb)
    per_micro_cp = cp_s / m
    # Ring exchanges hide behind the attention they feed; Ulysses' all-to-alls come first.
    exposed_cp = cp_s if setup.all_to_all_cp else max(0.0, per_micro_cp - mb.attention_s) * m
    # A stage's slot per micro-batch: compute plus what cannot overlap inside the stage.
    slot = mb.total_s + (tp_s + pp_s) / m + exposed_cp / m
    bubble_s = slot * (p - 1) / v if p > 1 else 0.0
    base = base_strategy(setup.strategy)
    params_here: float = params_per_rank(model, setup.tp, p, setup.ep)
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
    return StepTime(compute_s, bubble_s, exposed_dp, hidden, exposed_cp, step_s)


def gemm_rate_floor(setup: StepSetup, device: Device, mb: MicroBatchCompute) -> MicroBatchCompute:
    """``mb``, or ``mb`` slowed to the large-GEMM rate where it computes faster than that.

    No kernel runs faster than a large, well-tiled GEMM (``KernelFacts.gemm``), so one GPU's
    share of a micro-batch's executed FLOPs (6N + 12·L·h·s per token, 8N + 16·L·h·s with full
    recomputation) takes at least FLOPs / (peak x gemm); hence neither MFU nor the executed
    FLOPs' share of peak exceeds the GEMM efficiency. The kernel shapes can count less than
    that (an architecture's projections or routing they do not model, an attention kernel whose
    causal skip halves the counted FLOPs): the time is raised, said in the notes.
    """
    flops = training_flops_per_token(
        setup.model, setup.seq, activation_checkpointing=setup.checkpointing
    )
    tokens = setup.micro * setup.seq / (setup.tp * setup.pp * setup.cp)
    fastest = linear_device(setup, device) or device
    rate = max(fastest.peak_flops * fastest.facts.gemm, device.peak_flops * device.facts.gemm)
    net = conv_net_of(setup.model)
    # Winograd convolutions execute fewer multiplies than the FLOPs count (conv_algos.py).
    executed = executed_share(net, conv_mode(setup)) if net is not None else 1.0
    floor_s = tokens * flops * executed / rate
    computed = mb.total_s
    if computed <= 0 or computed >= floor_s:
        return mb
    scale = floor_s / computed
    setup.notes.append(
        f"compute raised {scale - 1:.1%} to the large-GEMM rate ({rate / 1e12:,.0f} TFLOP/s"
        + (" with fp8 linears" if setup.fp8 else "")
        + "): the kernel shapes counted fewer FLOPs than 6N + 12·L·h·s (8N + 16·L·h·s with "
        "full recomputation), and no kernel runs faster than a large GEMM"
    )
    return replace(
        mb,
        forward_s=mb.forward_s * scale,
        backward_s=mb.backward_s * scale,
        recompute_s=mb.recompute_s * scale,
        attention_s=mb.attention_s * scale,
    )


def conv_mode(setup: StepSetup) -> ConvMode:
    """How the setup's convolutions run: tensor cores unless fp32 without TF32; its layout."""
    return ConvMode(
        tensor_cores=setup.precision != "fp32" or setup.tf32,
        memory_format=setup.memory_format,
    )


def linear_device(setup: StepSetup, device: Device) -> Device | None:
    """The device the linear GEMMs run on with fp8 linears (None: the step's own device)."""
    if not setup.fp8 or setup.hardware.gpu is None:
        return None
    return fp8_device(setup.hardware.gpu, device)[0]


def bottleneck(compute_s: float | None, comm_s: float, offload_s: float) -> Bottleneck:
    """The largest raw time names the bottleneck, before overlap hides any of it."""
    if compute_s is None:
        return "unknown"
    if comm_s > compute_s and comm_s >= offload_s:
        return "communication"
    if offload_s > compute_s and offload_s > comm_s:
        return "offload"
    return "compute"


def throughput(
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
    # PaLM appendix B: MFU = observed tokens/s x 6N + 12·L·h·s over the cluster's peak (the
    # 16-bit peak with fp8 linears too, as torchtitan and llm-foundry report fp8 runs).
    mfu = tokens_per_s * model_flops / (setup.hardware.world_size * peak * 1e12)
    time_to_train = None
    if dataset_tokens is not None:
        time_to_train = dataset_tokens / tokens_per_s
        setup.notes.append(
            f"time to train: {dataset_tokens:.3g} tokens / {tokens_per_s:,.0f} tokens/s"
        )
    return tokens_per_s, mfu, time_to_train
