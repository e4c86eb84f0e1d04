"""Speed model: PaLM FLOPs, ZeRO communication volumes, links, offload and MFU."""

from __future__ import annotations

import time

import pytest
from specs import A100, CPU_BOX, LLAMA3_8B, LLAMA3_70B, MIXTRAL

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec
from tools.planning import estimate_speed, training_flops_per_token
from tools.planning.comm import COLLECTIVE_S
from tools.planning.kernels import KERNEL_FACTS
from tools.planning.serving_speed import gpu_class
from tools.research.hardware import parse_hardware


def _speed(model=LLAMA3_8B, hardware="1x8xA100-80GB", strategy="zero2", **kw):
    hw = (
        parse_hardware(hardware, kw.pop("interconnect", None))
        if isinstance(hardware, str)
        else hardware
    )
    args = {
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 4,
        "activation_checkpointing": True,
    }
    args.update(kw)
    return estimate_speed(model, hw, strategy, **args)


def test_palm_flops_for_llama3_8b_at_4096():
    n, layers, h, s = 8_030_261_248, 32, 4096, 4096
    plain = 6 * n + 12 * layers * h * s
    recompute = 8 * n + 16 * layers * h * s
    assert training_flops_per_token(LLAMA3_8B, s, activation_checkpointing=False) == plain
    assert training_flops_per_token(LLAMA3_8B, s, activation_checkpointing=True) == recompute
    est = _speed(activation_checkpointing=True)
    assert est.flops_per_token == recompute
    assert est.model_flops_per_token == plain
    # Compute time is the sum of the kernels: never faster than every matmul at the GEMM
    # ceiling (attention under a causal mask is half the PaLM count), and the achieved share of
    # peak stays below 1.
    tokens_per_gpu = 2 * 4 * s
    ceiling = KERNEL_FACTS["a100"].gemm
    # Matmuls: forward, backward (2x) and the recomputed forward of the layers, plus the output
    # layer's forward and backward (the embedding lookup is no matmul).
    v_h = 128_256 * h
    matmul_flops = tokens_per_gpu * (8 * (n - 2 * v_h) + 6 * v_h)
    assert est.compute_time_s > matmul_flops / (312e12 * ceiling)
    assert 0 < est.efficiency < 1
    assert any("PaLM" in a for a in est.assumptions)
    assert any("8N + 16" in a for a in est.assumptions)


def test_mixture_of_experts_counts_active_params():
    est = _speed(
        model=MIXTRAL, hardware="1x8xH100-80GB", strategy="zero3", activation_checkpointing=False
    )
    active = MIXTRAL.active_params
    assert est.flops_per_token == 6 * active + 12 * 32 * 4096 * 4096
    dense = MIXTRAL.model_copy(update={"active_params": None})
    assert (
        _speed(model=dense, hardware="1x8xH100-80GB", strategy="zero3").flops_per_token
        > 3 * est.flops_per_token
    )
    # Every expert's gradients are communicated, not only the active ones.
    assert est.comm_bytes_per_step == pytest.approx(3 * 4 * 7 / 8 * MIXTRAL.params * 2, rel=1e-9)


def test_zero3_communicates_one_and_a_half_times_zero2():
    zero2 = _speed(strategy="zero2", gradient_accumulation_steps=1)
    zero3 = _speed(strategy="zero3", gradient_accumulation_steps=1)
    ddp = _speed(strategy="ddp", gradient_accumulation_steps=1)
    assert zero2.comm_bytes_per_step == ddp.comm_bytes_per_step
    assert zero3.comm_bytes_per_step == pytest.approx(1.5 * zero2.comm_bytes_per_step, rel=1e-9)
    # Ring all-reduce: 2(n-1)/n of the 16-bit model per GPU.
    assert ddp.comm_bytes_per_step == pytest.approx(2 * 7 / 8 * LLAMA3_8B.params * 2, rel=1e-9)


def test_gradient_accumulation_reduces_ddp_once_but_zero2_every_micro_step():
    ddp1 = _speed(strategy="ddp", gradient_accumulation_steps=1)
    ddp8 = _speed(strategy="ddp", gradient_accumulation_steps=8)
    assert ddp8.comm_bytes_per_step == ddp1.comm_bytes_per_step
    zero2 = _speed(strategy="zero2", gradient_accumulation_steps=8)
    zero3 = _speed(strategy="zero3", gradient_accumulation_steps=8)
    unit = 7 / 8 * LLAMA3_8B.params * 2
    assert zero2.comm_bytes_per_step == pytest.approx(9 * unit, rel=1e-9)
    assert zero3.comm_bytes_per_step == pytest.approx(24 * unit, rel=1e-9)


def test_70b_is_communication_bound_over_eth25_but_not_on_one_nvlink_node():
    kw = {"model": LLAMA3_70B, "strategy": "zero3", "micro_batch_size": 1}
    one_node = _speed(hardware="1x8xH100-80GB", **kw)
    eth = _speed(hardware="2x8xH100-80GB", interconnect="eth25", **kw)
    ib = _speed(hardware="2x8xH100-80GB", interconnect="ib400", **kw)
    assert one_node.bottleneck == "compute"
    assert eth.bottleneck == "communication"
    assert eth.comm_time_s > 10 * ib.comm_time_s
    assert eth.step_time_s > ib.step_time_s
    assert eth.tokens_per_s < ib.tokens_per_s
    # More NICs per node: a faster network shortens communication.
    fat = _speed(hardware="2x8xH100-80GB", interconnect="eth25", inter_node_gbs=400, **kw)
    assert fat.comm_time_s < eth.comm_time_s / 10
    # 8-GPU H100 nodes get one 400 Gb/s NIC per GPU unless told otherwise: naming ib400 or
    # nothing is the same network.
    default = _speed(hardware="2x8xH100-80GB", **kw)
    assert default.comm_time_s == pytest.approx(ib.comm_time_s)
    assert any("one 400 Gb/s IB NIC per GPU" in a for a in default.assumptions)


def test_unknown_interconnect_between_nodes_is_assumed_and_stated():
    # A DGX/HGX-style 8-GPU A100 node: one 200 Gb/s NIC per GPU, said so.
    est = _speed(hardware=parse_hardware("2x8xA100-80GB"), strategy="zero2")
    assert est.comm_time_s > 0
    assert any("one 200 Gb/s IB NIC per GPU" in a for a in est.assumptions), est.assumptions
    # Any other node shape: one middle-of-the-road NIC per node, said so.
    four = _speed(hardware=parse_hardware("2x4xA100-80GB"), strategy="zero2")
    assert any("roce100 assumed, one NIC per node" in a for a in four.assumptions)
    assert four.comm_time_s > est.comm_time_s


def test_offload_adds_time():
    plain = _speed(strategy="zero2")
    offload = _speed(strategy="zero2_offload_optimizer")
    assert offload.offload_bytes_per_step > 0
    assert offload.offload_time_s > 0
    # The GPU skips its optimizer step and waits for PCIe and the CPU's instead.
    assert offload.step_time_s > plain.step_time_s
    assert offload.step_time_s > offload.compute_time_s + offload.offload_time_s
    everything = _speed(strategy="zero3_offload_all")
    optimizer_only = _speed(strategy="zero3_offload_optimizer")
    assert everything.offload_time_s > optimizer_only.offload_time_s > 0
    assert plain.offload_time_s == 0
    # A small step on fast GPUs waits for the CPU optimizer.
    small = _speed(
        strategy="zero3_offload_all",
        hardware="1x8xH100-80GB",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
    )
    assert small.bottleneck == "offload"
    assert any("CPU Adam" in a for a in small.assumptions)


def test_tokens_per_s_time_to_train_and_mfu_are_consistent():
    tokens = 1e9
    est = _speed(dataset_tokens=tokens)
    assert est.tokens_per_step == 2 * 4 * 8 * 4096
    assert est.tokens_per_s == pytest.approx(est.tokens_per_step / est.step_time_s)
    assert est.time_to_train_s == pytest.approx(tokens / est.tokens_per_s)
    assert 0 < est.mfu < 1
    # MFU counts model FLOPs only: checkpointing's extra forward lowers it.
    assert est.mfu == pytest.approx(est.tokens_per_s * est.model_flops_per_token / (8 * 312e12))
    no_ckpt = _speed(activation_checkpointing=False)
    assert no_ckpt.mfu > est.mfu
    assert _speed().time_to_train_s is None


def test_single_gpu_does_not_communicate():
    est = _speed(hardware="1x1xA100-80GB", strategy="ddp")
    assert est.comm_bytes_per_step == 0
    assert est.comm_time_s == 0
    assert est.bottleneck == "compute"


def test_cpu_only_machine_returns_an_estimate_without_peak():
    est = _speed(hardware=CPU_BOX, strategy="ddp", dataset_tokens=1e6)
    assert est.precision == "fp32"
    assert est.mfu is None
    assert est.step_time_s is None
    assert est.tokens_per_s is None
    assert est.time_to_train_s is None
    assert est.bottleneck == "unknown"
    assert any("no GPU" in a for a in est.assumptions)
    with pytest.raises(InputError):
        _speed(hardware=CPU_BOX, strategy="zero2_offload_optimizer")


def test_plain_gpuspec_uses_catalog_links_and_class():
    hw = HardwareSpec(source="described", nodes=1, gpus_per_node=8, gpu=A100)
    assert gpu_class(A100) == "ampere_datacenter"
    est = _speed(hardware=hw)
    assert est.comm_time_s == pytest.approx(_speed().comm_time_s)


def test_gpu_classes_and_precision_peaks():
    assert gpu_class(parse_hardware("1xH100-80GB").gpu) == "hopper"
    assert gpu_class(parse_hardware("1xRTX4090").gpu) == "workstation"
    assert gpu_class(parse_hardware("1xT4").gpu) == "turing"
    assert gpu_class(parse_hardware("1xMI300X").gpu) == "amd_instinct"
    fp32 = _speed(hardware="1x8xA100-80GB", precision="fp32")
    assert fp32.peak_tflops == 19.5
    assert fp32.step_time_s > _speed().step_time_s
    # V100 has no bf16 tensor cores: bf16 falls back to the fp32 rate; auto picks fp16.
    v100_bf16 = _speed(hardware="1x8xV100-32GB", precision="bf16")
    assert v100_bf16.peak_tflops == 15.7
    assert _speed(hardware="1x8xV100-32GB", precision="auto").peak_tflops == 125


def test_invalid_arguments_raise_input_errors():
    for kw in ({"micro_batch_size": 0}, {"gradient_accumulation_steps": 0}, {"dataset_tokens": -1}):
        with pytest.raises(InputError):
            _speed(**kw)
    with pytest.raises(InputError):
        _speed(strategy="zero4")


def test_speed_is_fast():
    hw = parse_hardware("2x8xH100-80GB", "ib400")
    calls = 200
    start = time.perf_counter()
    for _ in range(calls):
        estimate_speed(
            LLAMA3_70B,
            hw,
            "zero3",
            micro_batch_size=1,
            gradient_accumulation_steps=8,
            activation_checkpointing=True,
        )
    per_call_ms = (time.perf_counter() - start) / calls * 1e3
    print(f"estimate_speed: {per_call_ms:.3f} ms per call")


def test_tensor_and_pipeline_parallel_step():
    """Narayanan et al. 2021: bubble (p-1)/(m+p-1), 4 all-reduces of s·b·h per layer, t x p split."""
    hw = parse_hardware("4x8xH100-80GB", "ib400")
    tp, pp, m, s = 8, 4, 16, 4096
    est = estimate_speed(
        LLAMA3_70B,
        hw,
        "zero1",
        micro_batch_size=1,
        gradient_accumulation_steps=m,
        activation_checkpointing=False,
        seq_len=s,
        tensor_parallel=tp,
        pipeline_parallel=pp,
    )
    dp = 32 // (tp * pp)
    assert (est.tensor_parallel, est.pipeline_parallel, est.data_parallel) == (tp, pp, dp)
    assert est.tokens_per_step == m * dp * s
    flops = training_flops_per_token(LLAMA3_70B, s, activation_checkpointing=False)
    # Each GPU does 1/(t x p) of its replica's FLOPs, at no more than the GEMM ceiling.
    ceiling = KERNEL_FACTS["h100"].gemm
    assert est.compute_time_s > m * s * flops / (tp * pp) / (989.4e12 * ceiling) * 0.9
    assert est.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))
    # The bubble is p-1 micro-batch slots (compute plus the stage's own communication).
    slot = (est.step_time_s - est.bubble_time_s) / m
    assert est.bubble_time_s == pytest.approx(slot * (pp - 1), rel=0.05)
    # Tensor parallel: 4 ring all-reduces of s·b·h 16-bit values per layer per micro-batch,
    # each sending 2(t-1)/t of it, over NVLink and not overlapped.
    tp_bytes = 4 * (80 // pp) * m * 2 * (tp - 1) / tp * s * 8192 * 2
    assert est.tp_comm_time_s > 0
    collectives = 4 * (80 // pp) * m
    assert est.tp_comm_time_s == pytest.approx(
        tp_bytes / (900 / 2 * 0.75 * 1e9) + collectives * COLLECTIVE_S
    )
    assert est.pp_comm_time_s > 0
    assert est.step_time_s == pytest.approx(
        est.compute_time_s + est.bubble_time_s + est.exposed_comm_time_s + est.offload_time_s
    )
    assert any("1F1B bubble" in a for a in est.assumptions)
    # Recomputation repeats the forward's two all-reduces.
    ckpt = estimate_speed(
        LLAMA3_70B,
        hw,
        "zero1",
        micro_batch_size=1,
        gradient_accumulation_steps=m,
        activation_checkpointing=True,
        seq_len=s,
        tensor_parallel=tp,
        pipeline_parallel=pp,
    )
    assert ckpt.tp_comm_time_s == pytest.approx(1.5 * est.tp_comm_time_s)
    # Interleaving v stages per GPU divides the bubble by v (Narayanan et al. 2021 sec. 2.2.2).
    interleaved = estimate_speed(
        LLAMA3_70B,
        hw,
        "zero1",
        micro_batch_size=1,
        gradient_accumulation_steps=m,
        seq_len=s,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        virtual_stages=2,
    )
    assert interleaved.bubble_fraction == pytest.approx((pp - 1) / (2 * m + pp - 1))
    assert interleaved.step_time_s < est.step_time_s
    # More micro-batches shrink the bubble.
    longer = estimate_speed(
        LLAMA3_70B,
        hw,
        "zero1",
        micro_batch_size=1,
        gradient_accumulation_steps=4 * m,
        activation_checkpointing=False,
        seq_len=s,
        tensor_parallel=tp,
        pipeline_parallel=pp,
    )
    assert longer.bubble_fraction < est.bubble_fraction


def test_data_parallel_only_has_no_model_parallel_terms():
    est = _speed(strategy="zero2")
    assert (est.tensor_parallel, est.pipeline_parallel, est.data_parallel) == (1, 1, 8)
    assert est.tp_comm_time_s == est.pp_comm_time_s == est.bubble_time_s == 0


def test_invalid_model_parallel_degrees_raise_input_errors():
    hw = parse_hardware("2x8xH100-80GB")
    for kw in (
        {"tensor_parallel": 16},  # more than one node's GPUs
        {"tensor_parallel": 3},  # does not divide the GPUs or the heads
        {"pipeline_parallel": 3},  # does not divide 80 layers or the GPUs
    ):
        with pytest.raises(InputError):
            _speed(model=LLAMA3_70B, hardware=hw, strategy="zero1", **kw)
    with pytest.raises(InputError):  # DeepSpeed's pipeline engine takes ZeRO-0/1 only
        _speed(model=LLAMA3_70B, hardware=hw, strategy="zero3", pipeline_parallel=2)
    with pytest.raises(InputError):
        _speed(model=LLAMA3_70B, hardware=hw, strategy="zero3_offload_all", tensor_parallel=2)
