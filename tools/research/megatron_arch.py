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
from tools.research.architectures import GATED_MLP_FAMILIES

# Families whose MLP is gated SiLU (SwiGLU), whose norm is RMSNorm and whose positions are
# rotary (their modeling_*.py in transformers): the gated families but Gemma's (GeGLU, its own
# norms) and GPT-OSS's (a clamped SwiGLU over fused gate_up experts).
# DeepSeek-V2/V3 are too (DeepseekV2MLP: gate_proj, up_proj, SiLU; no biases); what they add
# (multi-head latent attention, shared experts, dense first layers) is ``unexpressed``.
_LLAMA_LIKE = GATED_MLP_FAMILIES - {"gemma", "gemma2", "gemma3", "gemma3_text", "gpt_oss"}
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
    return [phrase for phrase, _ in _gaps(model)]


def _gaps(model: ModelSpec) -> list[tuple[str, bool]]:
    """Each gap with whether it is structural: Megatron's GPT would have other layers or shapes.

    Structural: a gated MLP built ungated, shared experts, dense layers built as experts,
    latent attention, parallel blocks, Gemma's extra norms; the GPT Megatron builds is another
    architecture. A detail keeps every layer and shape: an activation, which projections carry
    biases, RoPE scaling, query/key norms, a sliding attention window shorter than the sequence.
    """
    arch = architecture(model)
    cfg = model.hf_config or {}
    gaps = []
    if not arch.gated and arch.activation not in _GELU_ACTS:
        gaps.append((f"its {arch.activation} MLP (Megatron-DeepSpeed has GELU or SwiGLU)", False))
    if arch.gated is False and arch.llama_like:
        gaps.append((f"its gated {arch.activation} MLP (only the SiLU gate, --swiglu)", True))
    if arch.family in ("gemma", "gemma2", "gemma3", "gemma3_text"):
        gaps.append(("Gemma's gated GELU MLP, scaled embeddings and extra norms", True))
    if arch.qkv_bias_only:
        gaps.append(("biases on the query/key/value projections only (all or none here)", False))
    if cfg.get("rope_scaling"):
        kind = (cfg["rope_scaling"] or {}).get("rope_type") or cfg["rope_scaling"].get("type")
        gaps.append((f"its RoPE scaling ({kind}): trained with unscaled rotary positions", False))
    if arch.family in ("qwen3", "qwen3_moe"):
        gaps.append(("the query/key RMSNorm of Qwen3 attention", False))
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window", True) and model.seq_len > int(window):
        # Megatron-DeepSpeed's attention is causal over the whole sequence (no window flag).
        gaps.append(
            (
                f"its sliding-window attention ({int(window)} tokens): full attention over the "
                f"{model.seq_len} here",
                False,
            )
        )
    if cfg.get("shared_expert_intermediate_size") or cfg.get("n_shared_experts"):
        gaps.append(("its shared experts", True))
    if cfg.get("kv_lora_rank") or cfg.get("q_lora_rank"):
        gaps.append(("multi-head latent attention", True))
    if arch.experts > 1 and int(cfg.get("first_k_dense_replace") or 0) > 0:
        dense = int(cfg["first_k_dense_replace"])
        first = "dense first layer" if dense == 1 else f"{dense} dense first layers"
        gaps.append((f"its {first} (experts in every layer here)", True))
    if arch.family == "falcon" or cfg.get("parallel_attn"):
        gaps.append(("parallel attention and MLP blocks", True))
    return gaps


def megatron_differs(model: ModelSpec | None, loads_weights: bool) -> str | None:
    """What Megatron-DeepSpeed's launch would not train as this job's model is (None: nothing).

    What its GPT cannot express (``unexpressed``) and, for a job that starts from the model's
    weights, what its converter cannot load (``convert_refusal``: the launch's convert step
    exits). The launch notes say it whenever a plan runs on Megatron.
    """
    if model is None or not model.hf_config:
        return None  # a model given by size or shape: built llama-style from it, nothing to load
    parts = unexpressed(model)
    if loads_weights and (refusal := convert_refusal(model)) is not None:
        parts.append(f"its weights cannot be loaded ({refusal})")
    if not parts:
        return None
    return f"Megatron-DeepSpeed cannot build {model.name} exactly: " + "; ".join(parts)


def megatron_excluded(model: ModelSpec | None, loads_weights: bool) -> str | None:
    """Why the search keeps this job off the splits only Megatron runs (None: it does not).

    A job that starts from the weights needs the model exactly as it is, and weights its
    convert step can load; pretraining from scratch needs the same architecture, so only a
    structural gap (``_gaps``) keeps it off, and a detail is said in the launch notes instead.
    The request lifts it by naming Megatron or pinning a split's degree, and the search does
    when nothing else fits (tools/planning/search.py).
    """
    if model is None or not model.hf_config:
        return None
    if loads_weights:
        return megatron_differs(model, loads_weights)
    structural = [phrase for phrase, whole in _gaps(model) if whole]
    if not structural:
        return None
    return f"Megatron-DeepSpeed cannot build {model.name}'s architecture: " + "; ".join(structural)


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
