"""Layer shapes of image models from their Hugging Face configs: convolutions and feature maps.

A convolutional network (ResNet, ConvNeXt) is listed layer by layer for one image: each
convolution as the implicit GEMM cuDNN runs it (Chetlur et al. 2014, "cuDNN: Efficient
Primitives for Deep Learning", sec. 3: M = output positions, N = output channels, K = kernel
height x width x input channels per group), and the feature maps the bandwidth-bound layers
between them (normalization, activation, pooling, residual adds) read and write. A vision
transformer is a transformer over its patches: (image / patch)^2 positions plus the class token.

Shapes follow transformers' modeling code: ``ResNetModel`` (a 7x7/2 stem convolution, a 3x3/2
max pool, bottleneck or basic blocks whose first block of a stage strides in its 3x3
convolution unless ``downsample_in_bottleneck``, as ResNet v1.5) and ``ConvNextModel`` (a
patch_size x patch_size stem, 2x2/2 downsampling between stages, blocks of a 7x7 depthwise
convolution, LayerNorm and a 4x inverted-bottleneck MLP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_IMAGE_SIZE = 224  # the ImageNet training crop the catalog's image models use


@dataclass(frozen=True)
class Conv:
    """One convolution (or linear layer) over one image, as an implicit GEMM."""

    kernel: int
    cin: int
    cout: int
    out_hw: int  # output height x width (positions)
    groups: int = 1
    stride: int = 1
    # A fully connected layer over each position (ConvNeXt's pointwise layers and the
    # classifier are ``nn.Linear``): a GEMM, never a cuDNN convolution.
    linear: bool = False

    @property
    def in_hw(self) -> int:
        """Input positions: the output's times the stride squared."""
        return self.out_hw * self.stride * self.stride

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(m, n, k) per image: positions, output channels, kernel area x input channels."""
        return self.out_hw, self.cout, self.kernel * self.kernel * self.cin // self.groups

    @property
    def dgrad_gemm(self) -> tuple[int, int, int]:
        """(m, n, k) per image of the input gradient: positions, input channels, area x outputs.

        The input gradient is itself a convolution, of the output gradient with the filter
        (CUTLASS "Implicit GEMM Convolution", Dgrad: GEMM_M = N·H·W, GEMM_N = C, GEMM_K = K·R·S),
        so its reduction is the long one, kernel area x output channels; the same
        multiply-accumulates as forward (the positions counted at the output's stride).
        """
        return self.out_hw, self.cin // self.groups, self.kernel * self.kernel * self.cout

    @property
    def macs(self) -> int:
        """Multiply-accumulates per image."""
        m, n, k = self.gemm
        return m * n * k


@dataclass(frozen=True)
class Elementwise:
    """A bandwidth-bound layer over one feature map: elements per image, passes over them.

    ``fwd`` and ``bwd``: how many times the layer reads or writes a tensor of ``elements``
    in forward and in backward (e.g. BatchNorm in training: a statistics pass, then read and
    write; backward reads the gradient and the input twice and writes one gradient).
    """

    kind: str
    elements: int
    fwd: int
    bwd: int


# Passes over a feature map (reads + writes), forward and backward, as eager frameworks run
# them unfused: BatchNorm/LayerNorm in training (statistics, normalize: 1 + 2; backward:
# reductions over dy and x, then dx: 2 + 3), ReLU/GeLU (read, write; backward reads dy and
# the saved tensor, writes dx), a residual add (two reads, one write; backward passes the
# gradient on), max pooling (read, write; backward scatters into the input-sized gradient).
PASSES = {
    "norm": (3, 5),
    "act": (2, 3),
    "add": (3, 1),
    "pool": (2, 3),
}


@dataclass(frozen=True)
class ConvNet:
    """One image's convolutions and bandwidth-bound layers, and the classifier."""

    convs: tuple[Conv, ...]
    elementwise: tuple[Elementwise, ...]
    image_size: int

    @property
    def forward_macs(self) -> int:
        """Multiply-accumulates of one image's forward pass (the figure papers call FLOPs)."""
        return sum(c.macs for c in self.convs)


def _ew(kind: str, elements: int) -> Elementwise:
    fwd, bwd = PASSES[kind]
    return Elementwise(kind, elements, fwd, bwd)


def _resnet(config: dict[str, Any], size: int) -> ConvNet:
    convs: list[Conv] = []
    ew: list[Elementwise] = []
    stem = int(config.get("embedding_size", 64))
    channels = int(config.get("num_channels", 3))
    hw = (size + 1) // 2  # 7x7 stride 2, padding 3
    convs.append(Conv(7, channels, stem, hw * hw, stride=2))
    ew += [_ew("norm", stem * hw * hw), _ew("act", stem * hw * hw)]
    hw = (hw + 1) // 2  # 3x3/2 max pool, padding 1
    ew.append(_ew("pool", stem * hw * hw))
    bottleneck = config.get("layer_type", "bottleneck") == "bottleneck"
    stride_first_1x1 = bool(config.get("downsample_in_bottleneck", False))
    cin = stem
    for stage, (width, depth) in enumerate(
        zip(config["hidden_sizes"], config["depths"], strict=True)
    ):
        for block in range(int(depth)):
            stride = (
                2 if block == 0 and (stage > 0 or config.get("downsample_in_first_stage")) else 1
            )
            out_hw = -(-hw // stride)
            if bottleneck:
                mid = int(width) // 4  # ResNetBottleNeckLayer: reduction 4
                in_hw = out_hw if stride_first_1x1 else hw
                layers = [
                    Conv(1, cin, mid, in_hw * in_hw, stride=1 if in_hw == hw else stride),
                    Conv(3, mid, mid, out_hw * out_hw, stride=stride if in_hw == hw else 1),
                    Conv(1, mid, int(width), out_hw * out_hw),
                ]
            else:
                layers = [
                    Conv(3, cin, int(width), out_hw * out_hw, stride=stride),
                    Conv(3, int(width), int(width), out_hw * out_hw),
                ]
            for conv in layers:
                convs.append(conv)
                ew.append(_ew("norm", conv.cout * conv.out_hw))
                ew.append(_ew("act", conv.cout * conv.out_hw))
            if cin != int(width) or stride != 1:  # projection shortcut: 1x1 conv + BatchNorm
                convs.append(Conv(1, cin, int(width), out_hw * out_hw, stride=stride))
                ew.append(_ew("norm", int(width) * out_hw * out_hw))
            ew.append(_ew("add", int(width) * out_hw * out_hw))
            cin, hw = int(width), out_hw
    ew.append(_ew("pool", cin * hw * hw))  # global average pool reads the last map
    convs.append(Conv(1, cin, int(config.get("num_labels", 1000)), 1, linear=True))  # classifier
    return ConvNet(tuple(convs), tuple(ew), size)


def _convnext(config: dict[str, Any], size: int) -> ConvNet:
    convs: list[Conv] = []
    ew: list[Elementwise] = []
    patch = int(config.get("patch_size", 4))
    channels = int(config.get("num_channels", 3))
    widths = [int(w) for w in config["hidden_sizes"]]
    hw = size // patch
    convs.append(Conv(patch, channels, widths[0], hw * hw, stride=patch))  # stem, patchify
    ew.append(_ew("norm", widths[0] * hw * hw))
    cin = widths[0]
    for stage, (width, depth) in enumerate(zip(widths, config["depths"], strict=True)):
        if stage > 0:  # LayerNorm, then a 2x2 stride-2 convolution
            ew.append(_ew("norm", cin * hw * hw))
            hw //= 2
            convs.append(Conv(2, cin, width, hw * hw, stride=2))
        for _ in range(int(depth)):
            maps = width * hw * hw
            convs.append(Conv(7, width, width, hw * hw, groups=width))  # depthwise 7x7
            ew.append(_ew("norm", maps))
            convs.append(Conv(1, width, 4 * width, hw * hw, linear=True))  # pointwise up
            ew.append(_ew("act", 4 * maps))
            convs.append(Conv(1, 4 * width, width, hw * hw, linear=True))  # pointwise down
            ew += [_ew("act", maps), _ew("add", maps)]  # layer scale, residual add
        cin = width
    ew.append(_ew("pool", cin * hw * hw))
    convs.append(Conv(1, cin, int(config.get("num_labels", 1000)), 1, linear=True))
    return ConvNet(tuple(convs), tuple(ew), size)


def conv_net(config: dict[str, Any]) -> ConvNet | None:
    """The layers of a ResNet or ConvNeXt config at its image size (224 unless it says), else None."""
    size = int(config.get("image_size") or DEFAULT_IMAGE_SIZE)
    if not config.get("hidden_sizes") or not config.get("depths"):
        return None
    model_type = config.get("model_type")
    if model_type == "resnet":
        return _resnet(config, size)
    if model_type in ("convnext", "convnextv2"):
        return _convnext(config, size)
    return None


def vit_positions(config: dict[str, Any]) -> int | None:
    """A vision transformer's sequence: (image / patch)^2 patches plus the class token."""
    size, patch = config.get("image_size"), config.get("patch_size")
    if not size or not patch or not config.get("num_attention_heads"):
        return None
    return (int(size) // int(patch)) ** 2 + 1


def is_image_model(config: dict[str, Any]) -> bool:
    """A model that takes pixels: a convolutional network or a vision transformer."""
    return conv_net(config) is not None or vit_positions(config) is not None
