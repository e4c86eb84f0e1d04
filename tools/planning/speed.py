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
- Overlap and the pipeline (tools/planning/step_time.py): the 1F1B / interleaved bubble
  (Narayanan et al. 2021 sec. 2.2), data-parallel collectives hidden behind the compute they
  overlap at a contention cost, the rest exposed; ZeRO-Offload's PCIe traffic and CPU Adam step
  (Ren et al. 2021 sec. 4) on top.
- FLOPs and MFU as PaLM defines them (tools/planning/flops.py; Chowdhery et al. 2022, appendix B: 6N + 12·L·h·s per
  token; full recomputation executes 8N + 16·L·h·s, Korthikanti et al. 2022 sec. 4.1).

How close it is: bench/calibration/published.py compares it with published training throughputs
(bench/results/2026-11-30-suite-full.md, "published").
"""

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, ModelSpec, SpeedEstimate, StrategyName
from tools.core.strategies import OFFLOAD_STRATEGIES, Recompute, check_recompute, check_strategy
from tools.planning.all_to_all import expert_parallel_comm, ulysses_comm
from tools.planning.comm import (
    StepSetup,
    context_parallel_comm,
    data_parallel_comm,
    offload_cost,
    pipeline_comm,
    step_links,
    tensor_parallel_comm,
)
from tools.planning.conv_algos import check_memory_format
from tools.planning.flops import device_for, flops_notes, require_tf32, training_flops_per_token
from tools.planning.fp8 import fp8_notes, require_fp8
from tools.planning.parallel import check_model_parallel
from tools.planning.states import resolve_precision
from tools.planning.step_time import bottleneck, conv_mode, step_time, throughput
from tools.planning.vision import image_fields
from tools.research.splits import split_framework


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
    expert_parallel: int = 1,
    sequence_parallel: bool = True,
    attention: str = "sdpa",
    fp8_all_gather: bool = False,
    memory_format: str = "nhwc",
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
        precision: bf16, fp16, fp32, auto (CPU-only machines run fp32) or fp8: the linear
            layers' GEMMs on FP8 tensor cores over bf16 mixed precision (tools/planning/fp8.py;
            a GPU without an FP8 peak is refused); tf32: fp32 tensors with TF32 tensor-core
            matmuls and convolutions (a GPU without a TF32 peak is refused).
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
        expert_parallel: Expert-parallel degree e of a mixture of experts (within data parallel).
        sequence_parallel: Megatron sequence parallelism with tensor parallelism.
        attention: The attention kernel, sdpa (FlashAttention-style) or eager.
        fp8_all_gather: With fp8 and ZeRO-3/FSDP, the weights are all-gathered in fp8
            (torchtitan ``enable_fsdp_float8_all_gather``).
        memory_format: A convolutional network's tensor layout, nhwc (channels-last, the
            default) or nchw (tools/planning/conv_algos.py: cuDNN's transposes priced).
    """
    if recompute is None:
        recompute = "full" if activation_checkpointing else "none"
    check_recompute(recompute, "recompute")
    activation_checkpointing = recompute == "full"
    if context_parallel > (seq_len or model.seq_len):
        raise InputError(
            "context_parallel",
            f"{context_parallel} ranks cannot split a sequence of {seq_len or model.seq_len} "
            "tokens (each needs at least one)",
        )
    _check_speed_args(
        strategy, micro_batch_size, gradient_accumulation_steps, dataset_tokens, hardware
    )
    fp8 = precision == "fp8"
    if fp8:
        require_fp8(hardware)
    tf32 = precision == "tf32"
    if tf32:
        require_tf32(hardware)
    check_memory_format(memory_format)
    setup = StepSetup(
        model=model,
        hardware=hardware,
        strategy=strategy,
        micro=micro_batch_size,
        accumulation=gradient_accumulation_steps,
        checkpointing=activation_checkpointing,
        precision=resolve_precision("bf16" if fp8 else "fp32" if tf32 else precision, hardware),
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
        # The framework that runs the split decides the algorithm: ring attention on
        # torchtitan, DeepSpeed-Ulysses on Megatron-DeepSpeed (tools/research/splits.py).
        ep=expert_parallel,
        all_to_all_cp=context_parallel > 1
        and split_framework(model, strategy, tensor_parallel, pipeline_parallel, context_parallel)
        == "megatron",
        fp8=fp8,
        fp8_all_gather=fp8 and fp8_all_gather,
        tf32=tf32,
        memory_format=memory_format,
    )
    return _estimate(setup, inter_node_gbs, dataset_tokens)


def _estimate(
    setup: StepSetup, inter_node_gbs: float | None, dataset_tokens: float | None
) -> SpeedEstimate:
    """The step of ``setup``: FLOPs, communication, overlap, throughput and the bottleneck."""
    model, hardware, strategy = setup.model, setup.hardware, setup.strategy
    activation_checkpointing = setup.checkpointing
    flops = training_flops_per_token(
        model, setup.seq, activation_checkpointing=activation_checkpointing
    )
    model_flops = training_flops_per_token(model, setup.seq, activation_checkpointing=False)
    flops_notes(setup, flops)
    peak, device = device_for(setup, flops)
    if inter_node_gbs is None and hardware.nics_per_node and hardware.nic_gbps:
        # The brief's NICs: each node's line rate, Gb/s to GB/s.
        inter_node_gbs = hardware.nics_per_node * hardware.nic_gbps / 8
    links = step_links(setup, inter_node_gbs)
    dp_bytes, dp_s = data_parallel_comm(setup, links, inter_node_gbs)
    tp_bytes, tp_s = tensor_parallel_comm(setup, links)
    pp_bytes, pp_s, bubble_fraction = pipeline_comm(setup, links)
    cp_bytes, cp_s = (ulysses_comm if setup.all_to_all_cp else context_parallel_comm)(setup, links)
    ep_bytes, ep_s = expert_parallel_comm(setup, links)
    offload_bytes, offload_s = offload_cost(setup)
    # Expert all-to-alls sit on the critical path as tensor-parallel collectives do.
    step = step_time(setup, device, dp_s, tp_s + ep_s, pp_s, cp_s, offload_s)
    compute_s = step.compute_s if device is not None else None
    step_s = step.step_s if device is not None else None
    bubble_s = step.bubble_s
    exposed_s = step.exposed_dp_s + tp_s + ep_s + pp_s + step.exposed_cp_s
    comm_s = dp_s + tp_s + ep_s + pp_s + cp_s
    efficiency = None
    if compute_s and peak:
        # Achieved share of peak while computing: executed FLOPs over compute time.
        tokens_here = (
            setup.micro * setup.accumulation * setup.seq / (setup.tp * setup.pp * setup.cp)
        )
        efficiency = tokens_here * flops / (compute_s * peak * 1e12)
    tokens_per_s, mfu, time_to_train = throughput(setup, step_s, peak, model_flops, dataset_tokens)
    fp8_peak = fp8_notes(setup, hardware.gpu) if setup.fp8 else None
    images = image_fields(model, hardware, tokens_per_s, setup.seq, conv_mode(setup))
    setup.notes += images.get("notes", [])
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
        comm_bytes_per_step=dp_bytes + tp_bytes + ep_bytes + pp_bytes + cp_bytes,
        comm_time_s=comm_s,
        exposed_comm_time_s=exposed_s,
        offload_bytes_per_step=offload_bytes,
        offload_time_s=offload_s,
        tensor_parallel=setup.tp,
        pipeline_parallel=setup.pp,
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
        gemm_precision="fp8" if setup.fp8 else "tf32" if setup.tf32 else None,
        fp8_peak_tflops=fp8_peak,
        fp8_mfu=mfu * peak / fp8_peak if mfu is not None and peak and fp8_peak else None,
        images_per_s=images.get("images_per_s"),
        input_images_per_s=images.get("input_images_per_s"),
        time_to_train_s=time_to_train,
        bottleneck=bottleneck(compute_s, exposed_s + step.hidden_dp_s, offload_s),
        assumptions=setup.notes,
    )
