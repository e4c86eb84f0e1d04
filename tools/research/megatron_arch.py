"""What Megatron-DeepSpeed's GPT builds of a model, read from its Hugging Face config.

Megatron builds whatever GPT its flags describe (tools/artifacts/megatron_model.py writes
them); some architectures it cannot express at all (a gated GELU, a ReLU MLP, biases on the
attention projections only, RoPE scaling, query/key norms, shared experts, multi-head latent
attention), and its Hugging Face converter maps dense Llama weights only. ``unexpressed`` and
``convert_refusal`` say which: the strategy search keeps a Megatron-only split out of a plan
for such a model unless the request asks for Megatron (tools/research/splits.py), and the
launch says what differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.core.schemas import ModelSpec

# Families whose MLP is gated SiLU (SwiGLU), whose norm is RMSNorm and whose positions are
# rotary (their modeling_*.py in transformers).
_LLAMA_LIKE = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "yi"}
)
_SWIGLU_ACTS = frozenset({"silu", "swish"})
_GELU_ACTS = frozenset({"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"})
# HF config keys for the MoE numbers, by the names the families use.
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "moe_top_k", "top_k")
_AUX_KEYS = ("router_aux_loss_coef", "aux_loss_alpha")
_CAPACITY_KEYS = ("capacity_factor", "expert_capacity_factor", "moe_capacity_factor")
# DeepSpeed's MoE gate (deepspeed/moe/sharded_moe.py TopKGate) routes top-1, top-2 and, from
# 0.14, any k through ``topkgating``.


@dataclass(frozen=True)
class Architecture:
    """What Megatron needs to know of the model, read from its config."""

    family: str
    llama_like: bool
    gated: bool
    activation: str
    rmsnorm: bool
    norm_eps: float
    rotary: bool
    rope_theta: float
    tied: bool
    biases: bool
    qkv_bias_only: bool
    experts: int
    top_k: int
    aux_loss: float | None
    capacity: float | None


def _first(config: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((config[k] for k in keys if config.get(k) is not None), None)


def architecture(model: ModelSpec) -> Architecture:
    """The model's switches, from its Hugging Face config (defaults as transformers' own)."""
    cfg = model.hf_config or {}
    family = str(cfg.get("model_type") or model.family or "").lower()
    llama_like = family in _LLAMA_LIKE
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "").lower()
    if not act:
        act = "silu" if llama_like else "gelu"
    experts = int(_first(cfg, _EXPERT_KEYS) or 1)
    norm_eps = _first(cfg, ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"))
    attention_bias = bool(cfg.get("attention_bias", family in ("qwen2", "qwen2_moe")))
    mlp_bias = bool(cfg.get("mlp_bias", False)) if llama_like else True
    return Architecture(
        family=family,
        llama_like=llama_like,
        gated=llama_like and act in _SWIGLU_ACTS,
        activation=act,
        rmsnorm=llama_like or "rms_norm_eps" in cfg,
        norm_eps=float(norm_eps if norm_eps is not None else 1e-5),
        rotary=llama_like or "rope_theta" in cfg,
        rope_theta=float(cfg.get("rope_theta") or 10000.0),
        # transformers' PretrainedConfig default is tied.
        tied=bool(cfg.get("tie_word_embeddings", True)),
        biases=(attention_bias and mlp_bias) if llama_like else True,
        qkv_bias_only=llama_like and attention_bias and not mlp_bias,
        experts=experts,
        top_k=int(_first(cfg, _TOPK_KEYS) or 1) if experts > 1 else 1,
        aux_loss=_first(cfg, _AUX_KEYS) if experts > 1 else None,
        capacity=_first(cfg, _CAPACITY_KEYS) if experts > 1 else None,
    )


def unexpressed(model: ModelSpec) -> list[str]:
    """What of the model Megatron-DeepSpeed's GPT cannot build, one phrase each (none: all)."""
    arch = architecture(model)
    cfg = model.hf_config or {}
    gaps = []
    if not arch.gated and arch.activation not in _GELU_ACTS:
        gaps.append(f"its {arch.activation} MLP (Megatron-DeepSpeed has GELU or SwiGLU)")
    if arch.gated is False and arch.llama_like:
        gaps.append(f"its gated {arch.activation} MLP (only the SiLU gate, --swiglu)")
    if arch.family in ("gemma", "gemma2", "gemma3", "gemma3_text"):
        gaps.append("Gemma's gated GELU MLP, scaled embeddings and extra norms")
    if arch.qkv_bias_only:
        gaps.append("biases on the query/key/value projections only (all or none here)")
    if cfg.get("rope_scaling"):
        kind = (cfg["rope_scaling"] or {}).get("rope_type") or cfg["rope_scaling"].get("type")
        gaps.append(f"its RoPE scaling ({kind}): trained with unscaled rotary positions")
    if arch.family in ("qwen3", "qwen3_moe"):
        gaps.append("the query/key RMSNorm of Qwen3 attention")
    if cfg.get("shared_expert_intermediate_size") or cfg.get("n_shared_experts"):
        gaps.append("its shared experts")
    if cfg.get("kv_lora_rank") or cfg.get("q_lora_rank"):
        gaps.append("multi-head latent attention")
    if arch.family == "falcon" or cfg.get("parallel_attn"):
        gaps.append("parallel attention and MLP blocks")
    return gaps


def convert_refusal(model: ModelSpec) -> str | None:
    """Why Megatron-DeepSpeed's Hugging Face converter cannot convert the model, else None.

    tools/hf2megads_weight_converter.py (``refactor.transform_from_hf_to_megds``) maps the
    dense Llama layout only: embeddings, QKV, the SwiGLU MLP, the two norms; any other
    parameter (an expert, a bias) raises "Unrecognized weight type".
    """
    arch = architecture(model)
    if arch.experts > 1:
        return (
            f"the converter maps dense Llama weights only, and {model.name} is a mixture of "
            f"{arch.experts} experts"
        )
    if arch.family not in ("llama", "mistral", "yi") or arch.biases or not arch.gated:
        return f"the converter maps dense Llama-family weights only, not {arch.family or 'this'}"
    return None
