"""What a mixture-of-experts layer keeps for backward, per token dispatcher (issue 30).

A dense layer's MLP keeps its intermediates once per token (``layer_coefficient``: 8 bytes per
element of the i-wide gated MLP at 16-bit). A MoE layer routes each token to k experts, so the
experts keep those intermediates once per routed copy, k per token, at the expert's width, and
the dispatcher that moves the copies to the experts and back keeps h-wide copies of its own.
Which copies depends on the framework's dispatcher; each count below is what autograd saves in
the named source (``torch.gather`` saves its input, a product saves both factors, a linear
layer its input: PyTorch tools/autograd/derivatives.yaml):

- ``megatron``: Megatron-Core's ``MoEAllGatherTokenDispatcher`` (the default
  ``moe_token_dispatcher_type`` of core_v0.6.0, megatron/core/transformer/moe/
  token_dispatcher.py) with ``GroupedMLP`` (experts.py). With sequence parallelism it
  all-gathers the layer's input over the tensor-parallel group, so every rank works on the
  whole micro-batch, and ``torch.gather`` keeps that gathered [T, h] input (2h bytes a token,
  not divided by t). Then per routed copy: the gathered local copy [kT, h] (kept by the second
  gather that sorts it by expert), the sorted copy (kept by the first grouped GEMM), the
  experts' intermediates (split over t: GroupedMLP's fc1 output is ffn_hidden/t wide per rank)
  and the unpermuted expert output, kept by ``unpermuted_local_hidden * scores``: 6h + 8i/t
  bytes per copy. The router (router.py ``aux_loss_load_balancing``) keeps its E logits and
  their fp32 softmax on the rank's own tokens. The gather and sort indices are int64.
- ``transformers``: ``MixtralSparseMoeBlock`` (transformers models/mixtral/modeling_mixtral.py,
  ``MixtralExperts`` in transformers 5) loops over the experts: each expert's gate-up
  projection keeps the routed tokens (``hidden_states[token_idx]``, 2h), its gated MLP the 8i
  intermediates, the product with the routing weight the expert output (2h), and
  ``index_add_`` the weighted output (its backward expands the gradient to the source's
  shape): 6h + 8i per copy, with two int64 indices and the fp32 weight, and the router's
  logits and fp32 softmax.
- ``deepspeed-moe``: DeepSpeed-MoE (deepspeed/moe/sharded_moe.py, GShard's algorithm), which
  the planner prices for expert parallelism: the gate runs in fp32 (``input.float()``, kept by
  its linear layer: 4h a token), ``top2gating``/``topkgating`` build [T, E, C] combine weights
  and a dispatch mask, C = ceil(k x T x capacity_factor / E) slots per expert; the dispatch
  einsum keeps the mask cast to 16-bit and the combine einsum the weights cast to 16-bit
  (2 x 2 x E x C bytes a token, which grows with the tokens: E x C is about k x T), the
  experts keep their [E, C, h] input and their intermediates, and the combine einsum keeps
  their [E, C, h] output.

The caller (tools/planning/activations.py) swaps the dense MLP's intermediates for these on the
model's MoE layers. Capacity factor 1.0 is DeepSpeed's ``MoE`` default (deepspeed/moe/layer.py)
and Megatron-DeepSpeed's ``--moe-train-capacity-factor`` default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tools.core.schemas import ModelSpec
from tools.planning.experts import ExpertShape, expert_shape

MOE_DISPATCHERS = ("transformers", "megatron", "deepspeed-moe")
# deepspeed/moe/layer.py MoE(capacity_factor=1.0); Megatron-DeepSpeed --moe-train-capacity-factor.
DEEPSPEED_CAPACITY_FACTOR = 1.0
# int64 indices Megatron's all-gather dispatcher keeps per routed copy: ``nonzero()`` of the
# [T, k] mask ([kT, 2]) whose first column is the gather map, and the ``argsort`` order.
INDEX_BYTES_PER_COPY = 8 * 3


@dataclass(frozen=True)
class MoeLayerBytes:
    """One MoE layer's saved bytes for one micro-batch on one GPU, at 16-bit.

    ``split``: divided by the tensor-parallel degree (the experts' intermediates);
    ``whole``: every tensor-parallel rank keeps all of it (the dispatcher's h-wide copies).
    """

    split: float
    whole: float


def moe_layer_bytes(
    shape: ExpertShape,
    hidden: int,
    tokens: int,
    *,
    mlp_bytes_per_width: int,
    dispatcher: str,
    tp: int = 1,
    sequence_parallel: bool = True,
    capacity_factor: float = DEEPSPEED_CAPACITY_FACTOR,
) -> MoeLayerBytes:
    """What one MoE layer keeps for backward over ``tokens`` tokens (see the module doc).

    ``tokens`` is the micro-batch's s x b; ``mlp_bytes_per_width`` the bytes a gated (8) or
    plain (4) MLP keeps per intermediate element at 16-bit, as the dense layer counts them.
    The shared experts (Qwen-MoE, DeepSeek) run on every token as a dense MLP would.
    """
    h, k, e = hidden, shape.top_k, shape.experts
    experts_mid = mlp_bytes_per_width * shape.expert_width
    shared = mlp_bytes_per_width * shape.shared_width * tokens
    if dispatcher == "megatron":
        all_gather = tp > 1 and sequence_parallel
        gathered = 2 * h * tokens if all_gather else 0
        # The sorted copy always; the local copy where a gather makes one (sequence parallel,
        # or top-k > 1); the weighted output where k > 1 (``if self.router_topk > 1``).
        per_copy = 2 * h + (2 * h if all_gather or k > 1 else 0) + (2 * h if k > 1 else 0)
        copies = k * tokens * (per_copy + INDEX_BYTES_PER_COPY) + gathered
        own = tokens / (tp if sequence_parallel else 1)
        router = 6 * e * own  # 16-bit logits and their fp32 softmax
        return MoeLayerBytes(split=k * tokens * experts_mid + shared, whole=copies + router)
    if dispatcher == "transformers":
        router = 6 * e * tokens
        per_copy = 6 * h + 2 * 8 + 4  # three h-wide copies, token and slot indices, the weight
        return MoeLayerBytes(
            split=k * tokens * experts_mid + shared, whole=k * tokens * per_copy + router
        )
    if dispatcher == "deepspeed-moe":
        slots = e * math.ceil(k * tokens * capacity_factor / e)  # E x C
        gate = 4 * h * tokens + 4 * e * tokens  # fp32 gate input, fp32 softmax
        masks = 2 * 2 * slots * tokens  # [T, E, C] dispatch mask and combine weights, 16-bit
        return MoeLayerBytes(split=slots * experts_mid + shared, whole=gate + masks + slots * 4 * h)
    raise ValueError(f"unknown MoE dispatcher {dispatcher!r}")


def moe_extra_bytes(
    model: ModelSpec,
    tokens: int,
    *,
    mlp_bytes_per_width: int,
    dense_mlp_bytes: float,
    dispatcher: str,
    tp: int,
    sequence_parallel: bool,
) -> tuple[float, float]:
    """(split over t, whole) bytes per layer a MoE model keeps beyond its dense MLP count.

    The dense count (``layer_coefficient``) holds one MLP's intermediates per token,
    ``dense_mlp_bytes``; on the MoE layers that is replaced by ``moe_layer_bytes``, averaged
    over the layers (DeepSeek's first dense layers, Qwen's sparse step keep the dense MLP).
    (0, 0): a dense model.
    """
    shape = expert_shape(model)
    if shape is None or shape.moe_layers == 0:
        return 0.0, 0.0
    dense = dense_mlp_bytes * tokens
    moe = moe_layer_bytes(
        shape,
        model.hidden,
        tokens,
        mlp_bytes_per_width=mlp_bytes_per_width,
        dispatcher=dispatcher,
        tp=tp,
        sequence_parallel=sequence_parallel,
    )
    share = shape.moe_layers / max(1, model.layers)
    return share * (moe.split - dense), share * moe.whole
