"""How convolutions are priced: input-gradient shapes, memory format, Winograd, TF32."""

from __future__ import annotations

import pytest

from tools.core.errors import InputError
from tools.intake.brief import image_seq_len
from tools.planning import estimate_speed
from tools.planning.conv_algos import (
    ConvMode,
    executed_share,
    transpose_bytes,
    winograd,
)
from tools.planning.kernels import Device, matmul_s, memory_s
from tools.planning.vision import cnn_compute_s, conv_net_of, weight_grad_s
from tools.research.hardware import find_gpu, parse_hardware
from tools.research.model_catalog import lookup_model
from tools.research.vision_shapes import Conv, ConvNet

NHWC = ConvMode(tensor_cores=True, memory_format="nhwc")
NCHW = ConvMode(tensor_cores=True, memory_format="nchw")
CUDA_CORES = ConvMode(tensor_cores=False, memory_format="nchw")


def _device(gpu: str = "A100-80GB", tflops: float | None = None) -> Device:
    spec = find_gpu(gpu)
    return Device.of(spec, tflops or spec.bf16_tflops or spec.fp16_tflops)


def _net(*convs: Conv) -> ConvNet:
    return ConvNet(convs, (), 224)


def _image_model(name: str):
    spec = lookup_model(name, 1)
    seq = image_seq_len(spec.name, spec.params, spec.hf_config or {})
    assert seq is not None
    return lookup_model(name, seq), seq


def _times(net: ConvNet, device: Device, mode: ConvMode, images: int = 64, bytes_per: int = 2):
    return cnn_compute_s(
        net, device, images=images, tp=1, pp=1, recompute="none", bytes_per=bytes_per, mode=mode
    )


def test_the_input_gradient_is_a_convolution_with_the_long_reduction():
    # CUTLASS implicit GEMM, Dgrad: M = N·H·W, N = C, K = K·R·S.
    conv = Conv(3, 64, 128, 56 * 56)
    m, n, k = conv.dgrad_gemm
    assert (n, k) == (64, 9 * 128)
    assert m * n * k == conv.macs


def test_the_stem_has_no_input_gradient_and_later_layers_do():
    device = _device()
    stem = Conv(7, 3, 64, 112 * 112, stride=2)
    later = Conv(3, 64, 64, 56 * 56)
    _, bwd_stem, _ = _times(_net(stem), device, NHWC)
    m, n, k = stem.gemm
    assert bwd_stem == pytest.approx(weight_grad_s(device, m * 64, n, k, 2))
    _, bwd_both, _ = _times(_net(stem, later), device, NHWC)
    dm, dn, dk = later.dgrad_gemm
    lm, ln, lk = later.gemm
    expected = (
        bwd_stem + weight_grad_s(device, lm * 64, ln, lk, 2) + matmul_s(device, dm * 64, dn, dk, 2)
    )
    assert bwd_both == pytest.approx(expected)


def test_nchw_pays_transposes_around_tensor_core_convolutions_only():
    conv = Conv(3, 64, 64, 56 * 56)
    fwd, bwd = transpose_bytes(conv, NCHW, images=8, bytes_per=2)
    maps = 56 * 56 * 64 * 8 * 2
    assert (fwd, bwd) == (2 * (maps + maps), 2 * (maps + 2 * maps))
    assert transpose_bytes(conv, NHWC, 8, 2) == (0.0, 0.0)
    assert transpose_bytes(conv, CUDA_CORES, 8, 2) == (0.0, 0.0)  # native NCHW kernels
    depthwise = Conv(7, 64, 64, 56 * 56, groups=64)
    linear = Conv(1, 64, 256, 56 * 56, linear=True)
    assert transpose_bytes(depthwise, NCHW, 8, 2) == transpose_bytes(linear, NCHW, 8, 2) == (0, 0)
    # A strided convolution's input map is the output's times the stride squared.
    strided = Conv(3, 64, 64, 28 * 28, stride=2)
    assert transpose_bytes(strided, NCHW, 1, 2)[0] == 2 * (56 * 56 * 64 * 2 + 28 * 28 * 64 * 2)


def test_nchw_is_slower_by_exactly_the_transpose_passes():
    device = _device()
    net = _net(Conv(7, 3, 64, 112 * 112, stride=2), Conv(3, 64, 64, 56 * 56))
    f_nhwc, b_nhwc, _ = _times(net, device, NHWC)
    f_nchw, b_nchw, _ = _times(net, device, NCHW)
    moved = [transpose_bytes(c, NCHW, 64, 2) for c in net.convs]
    assert f_nchw - f_nhwc == pytest.approx(memory_s(device, sum(f for f, _ in moved), 0))
    assert b_nchw - b_nhwc == pytest.approx(memory_s(device, sum(b for _, b in moved), 0))


def test_winograd_only_for_3x3_stride_1_on_cuda_cores():
    assert winograd(Conv(3, 64, 64, 3136), CUDA_CORES)
    assert not winograd(Conv(3, 64, 64, 3136), NHWC)  # tensor cores: implicit GEMM
    assert not winograd(Conv(3, 64, 64, 784, stride=2), CUDA_CORES)
    assert not winograd(Conv(1, 64, 256, 3136), CUDA_CORES)
    assert not winograd(Conv(3, 64, 64, 3136, groups=64), CUDA_CORES)
    spec = find_gpu("V100-16GB")
    device = Device.of(spec, spec.fp32_tflops)
    conv = Conv(3, 256, 256, 14 * 14)
    fast, _, _ = _times(_net(conv), device, CUDA_CORES, images=128, bytes_per=4)
    m, n, k = conv.gemm
    direct = matmul_s(device, m * 128, n, k, 4)
    assert fast < direct / 1.5  # 2.25x fewer multiplies, less the tiles' fixed costs


def test_resnet50_executes_fewer_multiplies_with_winograd_and_says_so():
    model, seq = _image_model("resnet-50")
    net = conv_net_of(model)
    assert net is not None
    assert executed_share(net, NHWC) == 1.0
    share = executed_share(net, CUDA_CORES)
    assert 0.6 < share < 0.9  # the 3x3 stride-1 convolutions are about 40% of the MACs
    est = estimate_speed(
        model, parse_hardware("1x1xV100-16GB"), "ddp", micro_batch_size=128,
        gradient_accumulation_steps=1, precision="fp32", seq_len=seq, memory_format="nchw",
    )  # fmt: skip
    assert any("Winograd F(2x2,3x3)" in a for a in est.assumptions)
    assert any("fp32 convolutions on CUDA cores" in a for a in est.assumptions)


def test_the_layout_changes_a_resnet_on_tensor_cores_and_is_said():
    model, seq = _image_model("resnet-50")
    hw = parse_hardware("1x1xRTX3090")
    by_format = {
        fmt: estimate_speed(
            model,
            hw,
            "ddp",
            micro_batch_size=256,
            gradient_accumulation_steps=1,
            precision="fp16",
            seq_len=seq,
            memory_format=fmt,
        )  # fmt: skip
        for fmt in ("nhwc", "nchw")
    }
    assert by_format["nchw"].images_per_s < by_format["nhwc"].images_per_s
    assert any("NHWC (channels-last) assumed" in a for a in by_format["nhwc"].assumptions)
    assert any("cuDNN transposes" in a for a in by_format["nchw"].assumptions)
    with pytest.raises(InputError, match="memory format"):
        estimate_speed(
            model, hw, "ddp", micro_batch_size=8, gradient_accumulation_steps=1,
            precision="fp16", seq_len=seq, memory_format="chwn",
        )  # fmt: skip


def test_tf32_runs_fp32_tensors_at_the_tf32_peak_where_the_part_has_one():
    model, seq = _image_model("resnet-50")
    kwargs = {"micro_batch_size": 64, "gradient_accumulation_steps": 1, "seq_len": seq}
    a100 = parse_hardware("1x1xA100-80GB")
    tf32 = estimate_speed(model, a100, "ddp", precision="tf32", **kwargs)
    fp32 = estimate_speed(model, a100, "ddp", precision="fp32", **kwargs)
    assert tf32.peak_tflops == find_gpu("A100-80GB").tf32_tflops == 156
    assert (tf32.precision, tf32.gemm_precision) == ("fp32", "tf32")
    assert fp32.gemm_precision is None and fp32.peak_tflops == find_gpu("A100-80GB").fp32_tflops
    assert tf32.images_per_s > 2 * fp32.images_per_s
    for gpu in ("V100-16GB", "T4"):
        with pytest.raises(InputError, match="no TF32 peak"):
            estimate_speed(model, parse_hardware(f"1x1x{gpu}"), "ddp", precision="tf32", **kwargs)


def test_slower_math_modes_lose_fewer_k_to_the_tiles_fixed_costs():
    v100 = find_gpu("V100-16GB")
    assert Device.of(v100, v100.fp16_tflops).k_scale == 1.0
    assert Device.of(v100, v100.fp32_tflops).k_scale == pytest.approx(15.7 / 125)
    rtx = find_gpu("RTX3090")
    # The SM count is the part's, whatever the math mode.
    assert Device.of(rtx, rtx.tf32_tflops).facts.sms == Device.of(rtx, rtx.fp16_tflops).facts.sms
