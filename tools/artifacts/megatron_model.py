"""The model's architecture as Megatron-DeepSpeed ``pretrain_gpt.py`` flags, from its config.

Megatron builds whatever GPT the flags describe, and its defaults are GPT-2's (GELU MLP,
LayerNorm, learned positions, biases, tied embeddings, dense): a flag left out trains another
model. Every flag here comes from the model's Hugging Face config (the catalog's, or the
user's), and the names are Megatron-DeepSpeed's own parser's (megatron/arguments.py at
github.com/microsoft/Megatron-DeepSpeed commit f4157bea69f3df8c6cb66f2ebcda66ba03d1288e; a copy
in tests/data/megatron_deepspeed_arguments.py parses every generated command). They are not
Megatron-LM's (``--num-query-groups``, ``--moe-router-topk``, ``--position-embedding-type``),
which Megatron-DeepSpeed refuses as unrecognized arguments.

What its GPT cannot express (a gated GELU, a ReLU MLP, biases on the attention projections
only, RoPE scaling, query/key norms, shared experts...) is listed by ``unexpressed``: MEGATRON.md
says so rather than training a different model silently.
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
# Megatron's default padding multiple (``--make-vocab-size-divisible-by``).
_VOCAB_MULTIPLE = 128
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


def vocab_multiple(vocab: int, tp: int) -> int:
    """``--make-vocab-size-divisible-by`` that keeps the model's vocabulary unpadded if it can.

    Megatron pads the vocabulary to a multiple of this x the tensor degree
    (megatron/tokenizer/tokenizer.py ``_vocab_size_with_padding``): the largest power of two up
    to 128 that divides vocab / tp leaves it as the model has it; else Megatron's 128.
    """
    for multiple in (128, 64, 32, 16, 8, 4, 2, 1):
        if vocab % (multiple * tp) == 0:
            return multiple
    return _VOCAB_MULTIPLE


def architecture_flags(model: ModelSpec, tp: int = 1, expert_parallel: int = 1) -> list[str]:
    """``pretrain_gpt.py`` flags that build the model's own architecture."""
    arch = architecture(model)
    args = [
        "--num-layers",
        str(model.layers),
        "--hidden-size",
        str(model.hidden),
        "--num-attention-heads",
        str(model.heads),
    ]
    if model.intermediate:
        args += ["--ffn-hidden-size", str(model.intermediate)]
    if model.kv_heads and model.kv_heads != model.heads:
        # Grouped-query attention (Megatron-DeepSpeed's name; Megatron-LM's is --num-query-groups).
        args += ["--num-key-value-heads", str(model.kv_heads)]
    if arch.gated:
        args.append("--swiglu")
    if arch.rmsnorm:
        args += ["--normalization", "rmsnorm"]
    args += ["--layernorm-epsilon", f"{arch.norm_eps:g}"]
    if arch.rotary:
        # The theta flag is an int in Megatron-DeepSpeed's parser.
        args += [
            "--use-rotary-position-embeddings",
            "--rotary-position-embeddings-theta",
            str(int(arch.rope_theta)),
        ]
    if not arch.tied:
        args.append("--untie-embeddings-and-output-weights")
    if not arch.biases:
        args.append("--disable-bias-linear")
    args += ["--make-vocab-size-divisible-by", str(vocab_multiple(model.vocab, tp))]
    if arch.family in _LLAMA_LIKE:
        # As examples_deepspeed/pretrain_llama2_distributed.sh sets them.
        args += [
            "--no-query-key-layer-scaling",
            "--attention-dropout",
            "0",
            "--hidden-dropout",
            "0",
        ]
    return args + moe_flags(arch, expert_parallel)


def moe_flags(arch: Architecture, expert_parallel: int = 1) -> list[str]:
    """Megatron-DeepSpeed's DeepSpeed-MoE flags for a mixture of experts, else none.

    Experts in every layer (``--expert-interval 1``; its default 2 is GShard's every other
    layer), the router's top-k and auxiliary-loss weight from the config, no token dropping
    unless the config names a capacity factor (Mixtral-style routers drop nothing), and the
    plan's expert-parallel degree (1: every data-parallel rank holds all experts; e: each holds
    1/e of them, as the memory estimate counts them).
    """
    if arch.experts <= 1:
        return []
    args = [
        "--num-experts",
        str(arch.experts),
        "--topk",
        str(arch.top_k),
        "--expert-interval",
        "1",
        "--moe-expert-parallel-size",
        str(expert_parallel),
        "--create-moe-param-group",
    ]
    if arch.aux_loss is not None:
        args += ["--moe-loss-coeff", f"{float(arch.aux_loss):g}"]
    if arch.capacity is not None:
        args += ["--moe-train-capacity-factor", f"{float(arch.capacity):g}"]
    else:
        args.append("--disable-moe-token-dropping")
    return args


def unexpressed(model: ModelSpec) -> list[str]:
    """What of the model Megatron-DeepSpeed's GPT cannot build, one phrase each (none: all)."""
    arch = architecture(model)
    cfg = model.hf_config or {}
    gaps = []
    if not arch.gated and arch.activation not in _GELU_ACTS:
        gaps.append(f"its {arch.activation} MLP (Megatron-DeepSpeed has GELU or SwiGLU)")
    if arch.gated is False and arch.family in _LLAMA_LIKE:
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


def architecture_note(model: ModelSpec) -> str:
    """MEGATRON.md's paragraph on the model the flags build, and what they cannot express."""
    arch = architecture(model)
    parts = [
        f"{model.layers} layers, hidden {model.hidden}, {model.heads} attention heads"
        + (f" in {model.kv_heads} key/value groups" if (model.kv_heads or 0) < model.heads else ""),
        "SwiGLU MLP" if arch.gated else f"{arch.activation} MLP",
        f"{'RMSNorm' if arch.rmsnorm else 'LayerNorm'} (eps {arch.norm_eps:g})",
        f"rotary positions (theta {int(arch.rope_theta)})" if arch.rotary else "learned positions",
        "tied embeddings" if arch.tied else "untied embeddings and output layer",
        "biases" if arch.biases else "no biases",
        f"vocabulary {model.vocab} (from the tokenizer you append; "
        f"`--make-vocab-size-divisible-by` keeps it unpadded where the tensor degree allows)",
    ]
    if arch.experts > 1:
        parts.append(
            f"{arch.experts} experts in every layer, top-{arch.top_k} routing"
            + (f", auxiliary loss {float(arch.aux_loss):g}" if arch.aux_loss is not None else "")
            + " (DeepSpeed-MoE); expert parallel size 1: the plan prices no expert "
            "parallelism, so every data-parallel rank holds all experts"
        )
    text = "The command builds the model from its config: " + "; ".join(parts) + "."
    gaps = unexpressed(model)
    if gaps:
        text += (
            " Megatron-DeepSpeed cannot express " + "; ".join(gaps) + ": this command trains "
            "a model that differs there, so its weights are not interchangeable with the "
            "original's. Use a trainer that builds the Hugging Face model itself for an exact "
            "copy."
        )
    return text
