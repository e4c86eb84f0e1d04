"""How cuDNN runs a convolution: the tensors' memory format and the algorithm the math mode allows.

Two rules the convolutional speed model (tools/planning/vision.py) applies per convolution:

- **Memory format.** Tensor-core convolutions run in NHWC (channels-last): with NCHW tensors,
  cuDNN transposes the input to NHWC before the convolution and the output back after it
  (NVIDIA Deep Learning Performance Guide, "Convolutional Layers User's Guide", tensor layouts;
  MosaicML Composer's "Channels Last" method card, after NVIDIA's diagram; PyTorch's
  ``torch.nn.utils.convert_conv2d_weight_memory_format`` docs: cuDNN permutes NCHW inputs to run
  its NHWC kernels). Each transpose is a memory-bound pass: read the map, write it. Backward
  does it again for the output gradient and the input gradient, and once more for the saved
  input the weight gradient reads. CUDA-core (fp32 without TF32) kernels run NCHW natively, and
  depthwise and fully connected layers are not cuDNN tensor-core convolutions: neither pays.
- **Winograd.** Without tensor cores, cuDNN runs 3x3 stride-1 convolutions with Winograd's minimal
  filtering (``CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD``, ``CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD``):
  F(2x2, 3x3) computes a 2x2 output tile with 16 multiplies instead of 36, 2.25x fewer
  (Lavin & Gray 2016, "Fast Algorithms for Convolutional Neural Networks", sec. 4). The forward
  and the input gradient (a 3x3 stride-1 convolution too) take it; the weight gradient stays an
  implicit GEMM. Tensor-core kernels run implicit GEMM (the transforms would not fit their
  fragment layouts), so the rule applies only to fp32 math on CUDA cores.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.core.errors import InputError
from tools.research.vision_shapes import Conv, ConvNet

MEMORY_FORMATS = ("nhwc", "nchw")
# Lavin & Gray 2016, sec. 4: F(2x2, 3x3) uses (2 + 3 - 1)^2 = 16 multiplies per 2x2 output tile
# and input channel where direct convolution uses 2 x 2 x 3 x 3 = 36.
WINOGRAD_REDUCTION = 36 / 16


@dataclass(frozen=True)
class ConvMode:
    """How the convolutions run: on tensor cores or not, and the tensors' memory format."""

    tensor_cores: bool = True
    memory_format: str = "nhwc"


# Tensor cores on channels-last tensors: what a 16-bit run is priced as unless told otherwise.
DEFAULT_MODE = ConvMode()


def check_memory_format(memory_format: str) -> str:
    """``memory_format`` if it is one the model prices (nhwc, nchw); InputError otherwise."""
    if memory_format not in MEMORY_FORMATS:
        raise InputError(
            "memory_format", f"unknown memory format {memory_format!r}; use nhwc or nchw"
        )
    return memory_format


def cudnn_conv(conv: Conv) -> bool:
    """A dense convolution cuDNN runs (not depthwise, not a fully connected layer)."""
    return conv.groups == 1 and not conv.linear


def winograd(conv: Conv, mode: ConvMode) -> bool:
    """Whether cuDNN runs ``conv`` with Winograd F(2x2, 3x3): 3x3, stride 1, CUDA cores."""
    return not mode.tensor_cores and cudnn_conv(conv) and conv.kernel == 3 and conv.stride == 1


def transpose_bytes(conv: Conv, mode: ConvMode, images: int, bytes_per: int) -> tuple[float, float]:
    """(forward, backward) bytes of the NCHW <-> NHWC transposes around one convolution.

    Forward: the input to NHWC and the output back (read and write each). Backward: the
    output gradient in, the input gradient out, and the saved input again for the weight
    gradient. Zero in NHWC, on CUDA cores, and for layers that are not cuDNN convolutions.
    """
    if mode.memory_format == "nhwc" or not mode.tensor_cores or not cudnn_conv(conv):
        return 0.0, 0.0
    in_maps = conv.in_hw * conv.cin * images * bytes_per
    out_maps = conv.out_hw * conv.cout * images * bytes_per
    return 2 * (in_maps + out_maps), 2 * (out_maps + 2 * in_maps)


def executed_share(net: ConvNet, mode: ConvMode) -> float:
    """Multiplies the kernels execute over those counted (2 x 3 x MACs): below 1 with Winograd.

    Forward and input gradient of each Winograd convolution run 1/2.25 of their multiplies;
    the weight gradient all of them.
    """
    counted = 3 * net.forward_macs
    saved = sum(
        2 * conv.macs * (1 - 1 / WINOGRAD_REDUCTION) for conv in net.convs if winograd(conv, mode)
    )
    return (counted - saved) / counted if counted else 1.0


def conv_mode_notes(net: ConvNet, mode: ConvMode) -> list[str]:
    """What the convolutions were priced as: the memory format, and Winograd where it applies."""
    if mode.tensor_cores:
        layout = (
            "memory format NHWC (channels-last) assumed: tensor-core convolutions run on it "
            "directly, no transposes (PyTorch: model and inputs .to(memory_format="
            "torch.channels_last))"
            if mode.memory_format == "nhwc"
            else "memory format NCHW: cuDNN transposes each tensor-core convolution's input to "
            "NHWC and its output back, priced as memory-bound passes (channels-last avoids them)"
        )
    else:
        layout = (
            f"memory format {mode.memory_format.upper()}: fp32 convolutions on CUDA cores run "
            "in either layout without transposes"
        )
    notes = [layout]
    count = sum(winograd(conv, mode) for conv in net.convs)
    if count:
        notes.append(
            f"assumed: cuDNN runs the {count} 3x3 stride-1 convolutions with Winograd F(2x2,3x3) "
            f"in fp32 on CUDA cores (forward and input gradient at 1/{WINOGRAD_REDUCTION:g} of "
            "the multiplies, Lavin & Gray 2016); the weight gradients as implicit GEMMs"
        )
    return notes
