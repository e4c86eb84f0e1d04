"""Compute time of one micro-batch on one GPU, operation by operation.

Each transformer layer is its matmuls with their shapes after tensor and context parallelism
(QKV, attention output, MLP up/gate/down; Narayanan et al. 2021 sec. 2.3 for how tensor
parallelism splits them), the attention core with the kernel in use, and the memory-bound work
between them (norms, rotary embedding, activation, residual adds) from the bytes it moves; the
output layer and the loss come once per micro-batch on the last pipeline stage. Backward runs
two GEMMs per forward GEMM (the input gradient and the weight gradient) and about 2.5x the
attention forward (tools.planning.kernels.attention_s). Recomputation re-runs what the policy
discards:

- full: every layer's forward once more in backward (Korthikanti et al. 2022 sec. 4.1);
- selective: torchtitan's per-op policy (``torchtitan/models/llama3/infra/parallelize.py``,
  ``_apply_ac_to_transformer_block`` with ``selective_ac_option = "op"``): the outputs of
  attention and of every other matmul are saved, so the other half of the matmuls and the
  cheap elementwise ops are re-run.

Kernel times come from tools.planning.kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.core.schemas import ModelSpec
from tools.planning.conv_algos import DEFAULT_MODE, ConvMode
from tools.planning.experts import activation_width, expert_gemms, expert_shape, permute_bytes
from tools.planning.fp8 import cast_bytes
from tools.planning.kernels import Device, attention_s, matmul_s, memory_s
from tools.planning.parallel import heaviest_stage_layers
from tools.planning.states import GATED_MLP_FAMILIES, head_dim
from tools.planning.vision import cnn_compute_s, conv_net_of, image_model


@dataclass(frozen=True)
class MicroBatchCompute:
    """Seconds one GPU spends on one micro-batch of its pipeline stage."""

    forward_s: float
    backward_s: float
    recompute_s: float
    # The attention cores' share of forward + backward (context parallelism overlaps with it).
    attention_s: float
    layers: int

    @property
    def total_s(self) -> float:
        """Forward, backward and recomputation together."""
        return self.forward_s + self.backward_s + self.recompute_s


def _gated(model: ModelSpec) -> bool:
    """Whether the MLP is gated (three matrices of width i) rather than up and down only.

    The family says so where it is known; otherwise the parameter count does: the layout
    whose weights add up closer to ``model.params``.
    """
    family = str((model.hf_config or {}).get("model_type", model.family or ""))
    if family:
        return family in GATED_MLP_FAMILIES
    if not model.intermediate:
        return False
    h, kv = model.hidden, model.kv_heads or model.heads
    attention = 2 * h * h + 2 * h * (h * kv // model.heads)
    embeddings = model.vocab * h * 2
    gated = model.layers * (attention + 3 * h * model.intermediate) + embeddings
    plain = model.layers * (attention + 2 * h * model.intermediate) + embeddings
    return abs(gated - model.params) < abs(plain - model.params)


def _attention_gemms(model: ModelSpec, tokens: int, tp: int) -> list[tuple[int, int, int]]:
    """The attention projections of one layer as (m, n, k), after tensor parallelism ``tp``."""
    h = model.hidden
    heads = model.heads
    kv = model.kv_heads or heads
    d = head_dim(model)  # heads x d is the attention's width, not always h (GPT-OSS, Gemma 2)
    gemms = []
    if kv == heads and not _gated(model):
        gemms.append((tokens, 3 * heads * d // tp, h))  # fused QKV (GPT-2, MPT, Megatron GPT)
    else:
        q, kv_out = heads * d // tp, kv * d // tp
        gemms += [(tokens, q, h), (tokens, kv_out, h), (tokens, kv_out, h)]
    gemms.append((tokens, h, heads * d // tp))  # attention output projection (row-parallel)
    return gemms


def _mlp_gemms(model: ModelSpec, tokens: int, tp: int) -> list[tuple[int, int, int]]:
    """A dense MLP's GEMMs as (m, n, k), after tensor parallelism of degree ``tp``."""
    h = model.hidden
    inter = model.intermediate or 4 * h
    gemms = []
    if _gated(model):
        gemms += [(tokens, inter // tp, h), (tokens, inter // tp, h)]  # gate and up
    else:
        gemms.append((tokens, inter // tp, h))  # up
    gemms.append((tokens, h, inter // tp))  # down (row-parallel)
    return gemms


def _mlp_s(
    model: ModelSpec,
    device: Device,
    tokens: int,
    tp: int,
    bytes_per: int,
    linear: Linears,
    ep: int = 1,
) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's MLP, averaged over the layers.

    Dense: its GEMMs. A mixture of experts (tools/planning/experts.py): the router, each
    routed expert over its share of the tokens, the shared experts, and moving the tokens to
    the experts and back, on the MoE layers; a dense MLP on the others. ``linear``: the
    device and bytes the linears run at (fp8 linears: tools/planning/fp8.py); the router stays
    16-bit (its few outputs are below fp8's 16-multiple shapes).
    """
    dense = _mlp_gemms(model, tokens, tp)
    fwd, bwd = linear.gemms_s(dense)
    shape = expert_shape(model)
    if shape is None or not shape.moe_layers:
        return fwd, bwd
    moved = memory_s(device, permute_bytes(shape, model.hidden, tokens) * bytes_per / 2, 4)
    moe_fwd = moe_bwd = moved
    for index, ((m, n, k), count) in enumerate(expert_gemms(shape, model.hidden, tokens, tp, ep)):
        if index == 0:  # the router
            moe_fwd += matmul_s(device, m, n, k, bytes_per)
            moe_bwd += _backward_gemms_s(device, [(m, n, k)], bytes_per)
            continue
        f, b = linear.gemms_s([(m, n, k)])
        moe_fwd += count * f
        moe_bwd += count * b
    share = shape.moe_layers / model.layers
    return (1 - share) * fwd + share * moe_fwd, (1 - share) * bwd + share * moe_bwd


@dataclass(frozen=True)
class Linears:
    """The device the transformer layers' linear GEMMs run on, and their casts' cost.

    16-bit: the step's own device. fp8: the FP8 peak at the fp8 GEMM share, 1-byte operands,
    plus each linear's amax-and-cast passes on the 16-bit device (tools/planning/fp8.py).
    """

    device: Device
    bytes_per: int
    cast_device: Device | None = None

    def gemms_s(self, gemms: list[tuple[int, int, int]]) -> tuple[float, float]:
        """(forward, backward) seconds of ``gemms``, casts included."""
        fwd = sum(matmul_s(self.device, m, n, k, self.bytes_per) for m, n, k in gemms)
        bwd = _backward_gemms_s(self.device, gemms, self.bytes_per)
        if self.cast_device is not None:
            for m, n, k in gemms:
                f, b = cast_bytes(m, n, k)
                fwd += memory_s(self.cast_device, f, kernels=2)
                bwd += memory_s(self.cast_device, b, kernels=3)
        return fwd, bwd


def _backward_gemms_s(device: Device, gemms: list[tuple[int, int, int]], bytes_per: int) -> float:
    """Input gradient (m x n)(n x k) and weight gradient (k x m)(m x n) of each forward GEMM."""
    return sum(
        matmul_s(device, m, k, n, bytes_per) + matmul_s(device, k, n, m, bytes_per)
        for m, n, k in gemms
    )


def _elementwise_bytes(model: ModelSpec, tokens: int, tp: int, sequence_parallel: bool) -> float:
    """HBM bytes one layer's memory-bound forward ops move, at 16-bit.

    Two norms (read 2, write 2 bytes per element, computed in fp32 in registers), two residual
    adds (read 4, write 2), the activation (gated: read gate and up, write the product, 6 bytes
    per intermediate element; GeLU: read and write, 4), rotary embedding on q and k for gated
    (Llama-style) layers (read and write, 4). A mixture of experts' activation runs over the
    top-k routed copies of each token (``experts.activation_width``). Norms and residuals run on the full sequence under
    tensor parallelism and on 1/t of it with sequence parallelism (Korthikanti et al. 2022
    sec. 4.2.2).
    """
    h = model.hidden
    inter = model.intermediate or 4 * h
    kv = model.kv_heads or model.heads
    d = head_dim(model)
    replicated = tokens * h / (tp if sequence_parallel else 1)
    norms_residuals = 2 * 4 * replicated + 2 * 6 * replicated
    # A mixture of experts activates k routed copies of each token (tools/planning/experts.py).
    width = activation_width(expert_shape(model), inter, model.layers)
    activation = tokens * width / tp * (6 if _gated(model) else 4)
    rotary = tokens * (model.heads + kv) * d / tp * 4 if _gated(model) else 0.0
    return norms_residuals + activation + rotary


def micro_batch_compute(
    model: ModelSpec,
    device: Device,
    *,
    micro: int,
    seq: int,
    tp: int,
    pp: int,
    cp: int,
    recompute: str,
    attention: str,
    sequence_parallel: bool,
    bytes_per: int,
    fp8: Device | None = None,
    ep: int = 1,
    conv_mode: ConvMode = DEFAULT_MODE,
) -> MicroBatchCompute:
    """Forward, backward and recompute seconds of one micro-batch on the busiest stage's GPU.

    A convolutional network's micro-batch is ``micro`` images, timed layer by layer
    (tools/planning/vision.py); everything else is a transformer. ``fp8``: the device its
    linear layers run on with fp8 linears (tools/planning/fp8.py ``fp8_device``); the
    attention core, the elementwise work and the output layer stay 16-bit. ``conv_mode``: how a
    convolutional network's convolutions run (tools/planning/conv_algos.py).
    """
    net = conv_net_of(model)
    if net is not None:
        fwd, bwd, re = cnn_compute_s(
            net,
            device,
            images=micro,
            tp=tp,
            pp=pp,
            recompute=recompute,
            bytes_per=bytes_per,
            mode=conv_mode,
        )
        return MicroBatchCompute(fwd, bwd, re, 0.0, max(1, model.layers // pp))
    tokens = micro * seq // cp
    layers = heaviest_stage_layers(model.layers, pp)
    gemms = _attention_gemms(model, tokens, tp)
    linear = Linears(fp8, 1, device) if fp8 is not None else Linears(device, bytes_per)
    mlp_fwd, mlp_bwd = _mlp_s(model, device, tokens, tp, bytes_per, linear, ep)
    proj_fwd, proj_bwd = linear.gemms_s(gemms)
    gemm_fwd = proj_fwd + mlp_fwd
    gemm_bwd = proj_bwd + mlp_bwd
    attn_args = {
        "batch_heads": micro * max(1, model.heads // tp),
        "q_len": seq // cp,
        "kv_len": seq,
        "head_dim": head_dim(model),
        "causal": not image_model(model),  # a vision transformer attends both ways
        "kernel": attention,
    }
    attn_fwd = attention_s(device, backward=False, **attn_args)  # type: ignore[arg-type]
    attn_bwd = attention_s(device, backward=True, **attn_args)  # type: ignore[arg-type]
    elem = _elementwise_bytes(model, tokens, tp, sequence_parallel) * bytes_per / 2
    elem_fwd = memory_s(device, elem, kernels=10)
    elem_bwd = memory_s(device, 2 * elem, kernels=16)
    layer_fwd = gemm_fwd + attn_fwd + elem_fwd
    layer_bwd = gemm_bwd + attn_bwd + elem_bwd
    if recompute == "full":
        layer_re = layer_fwd
    elif recompute == "selective":
        # Every other matmul's output is not saved (torchtitan's op policy): half of them.
        layer_re = 0.5 * gemm_fwd + elem_fwd
    else:
        layer_re = 0.0
    # Output layer (vocabulary split over t) and cross-entropy on fp32 logits, on the last stage:
    # read the 16-bit logits, write and read back fp32 softmax and its gradient.
    head_gemm = (tokens, model.vocab // tp, model.hidden)
    head_fwd = matmul_s(device, *head_gemm, bytes_per)
    head_bwd = _backward_gemms_s(device, [head_gemm], bytes_per)
    loss = memory_s(device, tokens * model.vocab / tp * 14.0, kernels=6)
    return MicroBatchCompute(
        forward_s=layers * layer_fwd + head_fwd + loss / 2,
        backward_s=layers * layer_bwd + head_bwd + loss / 2,
        recompute_s=layers * layer_re,
        attention_s=layers * (attn_fwd + attn_bwd),
        layers=layers,
    )


def optimizer_step_s(device: Device, params_here: float) -> float:
    """AdamW's step over the parameters this GPU updates, bound by HBM.

    Per parameter a fused AdamW reads the fp32 master weight, both moments and the gradient
    (16 bytes) and writes the weight, the moments and the 16-bit copy (14 bytes): 30 bytes
    (PyTorch ``torch.optim.AdamW(fused=True)``; DeepSpeed's FusedAdam moves the same).
    """
    return memory_s(device, 30.0 * params_here, kernels=4)
