"""The mixture-of-experts MLP as the speed model runs it: its shape, and its GEMMs per layer.

A token passes through its top-k routed experts (and the shared experts, where the model has
them), so a MoE layer's MLP is not one dense MLP of ``intermediate`` width: each routed expert
runs its own gated MLP over the tokens routed to it, about tokens x k / E of them (a balanced
router; Fedus et al. 2022, "Switch Transformers", sec. 2.2 for capacity and balance), plus the
router's projection to E logits and the permutation of tokens to and from the experts.
Without this the time counted one dense MLP while the FLOPs counted k experts (Mixtral: two),
and MFU came out above the GEMM efficiency the kernels assume (issue 30).

Config keys, as transformers names them: Mixtral ``num_local_experts``, ``num_experts_per_tok``
and ``intermediate_size`` (the expert's width); Qwen-MoE ``num_experts``,
``moe_intermediate_size``, ``shared_expert_intermediate_size``, ``decoder_sparse_step``,
``mlp_only_layers``; DeepSeek ``n_routed_experts``, ``n_shared_experts``,
``first_k_dense_replace``, ``moe_layer_freq``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tools.core.schemas import ModelSpec

_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True)
class ExpertShape:
    """A mixture-of-experts model's MLP: routed experts, top-k, widths, and which layers."""

    experts: int
    top_k: int
    # One routed expert's MLP width, and the always-on shared experts' (0: none).
    expert_width: int
    shared_width: int
    # Layers whose MLP is the mixture (the others run a dense MLP of ``intermediate`` width).
    moe_layers: int


def _int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _moe_layers(config: dict[str, Any], layers: int) -> int:
    """How many of ``layers`` are mixtures (DeepSeek's first-k dense, Qwen's sparse step)."""
    first_dense = _int(config, "first_k_dense_replace")
    freq = _int(config, "moe_layer_freq") or 1
    step = _int(config, "decoder_sparse_step") or 1
    dense_only = set(config.get("mlp_only_layers") or [])
    return sum(
        1
        for i in range(layers)
        if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
    )


def expert_shape(model: ModelSpec) -> ExpertShape | None:
    """The model's MoE shape from its config, or None for a dense model."""
    config = model.hf_config or {}
    experts = next((_int(config, k) for k in _EXPERT_KEYS if _int(config, k)), 0)
    top_k = _int(config, "num_experts_per_tok") or _int(config, "moe_top_k")
    if experts < 2 or top_k < 1:
        return None
    width = _int(config, "moe_intermediate_size") or model.intermediate or 4 * model.hidden
    shared = _int(config, "shared_expert_intermediate_size") or (
        _int(config, "n_shared_experts") * width
    )
    return ExpertShape(
        experts=experts,
        top_k=min(top_k, experts),
        expert_width=width,
        shared_width=shared,
        moe_layers=_moe_layers(config, model.layers),
    )


Gemm = tuple[int, int, int]


def expert_gemms(
    shape: ExpertShape, hidden: int, tokens: int, tp: int, ep: int = 1
) -> list[tuple[Gemm, int]]:
    """One MoE layer's forward MLP GEMMs as ((m, n, k), how many), split over ``tp``.

    The router (tokens x E logits); each routed expert's gate, up and down over the
    ceil(tokens x k / E) tokens routed to it (E of each: one GEMM per expert, as a loop over
    experts runs them; a grouped GEMM runs the same shapes in one launch); the shared experts'
    gated MLP over every token. Experts are split over tensor parallelism like a dense MLP.

    Under e-way expert parallelism a rank runs only its E/e experts, each over the tokens
    routed to it from all e ranks of its group after the dispatch all-to-all: e times the
    rows (Rajbhandari et al. 2022, DeepSpeed-MoE sec. 4; Megatron-Core's MoE README, "each
    worker processes one or more experts"). The FLOPs per rank are the same with a balanced
    router; the GEMMs are e times taller, so small micro-batches no longer price E tiny GEMMs.
    """
    ep = max(1, min(ep, shape.experts))
    routed = max(1, math.ceil(tokens * shape.top_k * ep / shape.experts))
    local = max(1, shape.experts // ep)
    width = max(1, shape.expert_width // tp)
    gemms: list[tuple[Gemm, int]] = [
        ((tokens, shape.experts, hidden), 1),
        ((routed, width, hidden), 2 * local),  # gate and up
        ((routed, hidden, width), local),  # down
    ]
    if shape.shared_width:
        shared = max(1, shape.shared_width // tp)
        gemms += [((tokens, shared, hidden), 2), ((tokens, hidden, shared), 1)]
    return gemms


def activation_width(shape: ExpertShape | None, intermediate: int, layers: int) -> float:
    """The MLP activation's width per token, averaged over the layers (before tensor parallelism).

    A dense MLP applies its activation to ``intermediate`` values per token. A MoE layer applies
    it in each of the token's top-k routed experts (k x the expert's width: every routed copy
    passes its expert's gate and up outputs through the activation) and in the shared experts;
    Megatron-Core's experts (``megatron/core/transformer/moe/experts.py``, TEGroupedMLP) run
    the activation on all the tokens permuted to them. A config's ``intermediate_size`` is the
    expert's width in Mixtral and GPT-OSS, so the dense width under-counts this k-fold.
    """
    if shape is None or not shape.moe_layers:
        return float(intermediate)
    moe = shape.top_k * shape.expert_width + shape.shared_width
    share = shape.moe_layers / max(1, layers)
    return share * moe + (1 - share) * intermediate


def permute_bytes(shape: ExpertShape, hidden: int, tokens: int) -> float:
    """HBM bytes of moving tokens to their experts and back, at 16-bit, forward.

    Each of the tokens x k routed copies is gathered (read and write h values) before the
    experts and scattered and weighted back (read, weight, add) after them.
    """
    return tokens * shape.top_k * hidden * 2.0 * (2 + 3)
