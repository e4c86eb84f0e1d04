"""Hugging Face architectures: configs, and what a model built on the meta device says.

Llama-style configs for a model given only by its size or shape; the config and model classes
transformers builds; depth, FFN width, learned positions and active experts of a built model.
"""

from __future__ import annotations

import math
from typing import Any

from tools.core.errors import InputError

# Llama-style reference shapes (hidden, layers, heads, kv_heads, ffn), mostly from published
# models, that give a bare parameter count a plausible depth and width: asked for 7e9, the
# planner sees Llama-2-7B's shape rather than an arbitrary one.
REFERENCE_SHAPES = (
    (256, 4, 4, 4, 768),  # toy scale, below any published LLM
    (512, 8, 8, 8, 1536),  # toy scale
    (768, 12, 12, 12, 2048),  # GPT-2 small's width and depth
    (1024, 24, 16, 16, 2816),  # GPT-2 medium's width and depth
    (2048, 22, 32, 4, 5632),  # TinyLlama-1.1B
    (3200, 26, 32, 32, 8640),  # OpenLLaMA-3B
    (4096, 32, 32, 32, 11008),  # Llama-2-7B
    (5120, 40, 40, 40, 13824),  # Llama-2-13B
    (6656, 60, 52, 52, 17920),  # LLaMA-33B
    (8192, 80, 64, 8, 28672),  # Llama-2-70B
    (12288, 96, 96, 8, 32768),  # GPT-3 175B's width and depth, SwiGLU FFN
    (16384, 126, 128, 8, 53248),  # Llama-3.1-405B
)
DERIVED_VOCAB = 32000  # Llama-2's tokenizer
# Families whose MLP is gated (gate, up and down projections): llama-style layers. Qwen3-MoE,
# DeepSeek-V2/V3 (dense layers and experts: gate_proj, up_proj, down_proj with SiLU) and Gemma 3
# (GeGLU, ``gelu_pytorch_tanh``; the catalog's text checkpoints are ``gemma3_text``) as their
# transformers modeling files build them (Qwen3MoeMLP, DeepseekV2MLP, DeepseekV3MLP, Gemma3MLP).
GATED_MLP_FAMILIES = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "deepseek_v2",
        "deepseek_v3",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "phi3",
        "yi",
        # GPT-OSS experts: gate_up_proj of 2 x the expert width, a clamped SwiGLU (transformers
        # GptOssExperts; openai/gpt-oss-120b config.json swiglu_limit 7.0).
        "gpt_oss",
    }
)


def llama_config(
    layers: int, hidden: int, heads: int, kv_heads: int, vocab: int, intermediate: int, seq_len: int
) -> dict[str, Any]:
    """A Llama-2-style HF config (RMSNorm, SwiGLU, RoPE, untied embeddings)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": seq_len,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    }


# The keys a config names its sizes by, per family (llama-style first; OPT and Falcon name
# their FFN and KV heads their own way).
SIZE_KEYS = {
    "layers": ("num_hidden_layers",),
    "hidden": ("hidden_size",),
    "heads": ("num_attention_heads",),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "intermediate": ("intermediate_size", "ffn_dim", "ffn_hidden_size"),
}


def resized_config(config: dict[str, Any], sizes: dict[str, int | None]) -> dict[str, Any]:
    """``config`` with its sizes replaced (``SIZE_KEYS`` names; None keeps the config's own).

    What follows a size follows it: OPT's embedding projection when it was the width, Qwen's
    ``max_window_layers`` when it was the depth. Everything else (activation, norms, RoPE,
    head size, tied embeddings, vocabulary unless given) stays the config's.
    """
    out = dict(config)
    for what, keys in SIZE_KEYS.items():
        value = sizes.get(what)
        if value is None:
            continue
        present = [k for k in keys if k in out] or list(keys[:1])
        for key in present:
            out[key] = value
    if sizes.get("hidden") and out.get("word_embed_proj_dim") == config.get("hidden_size"):
        out["word_embed_proj_dim"] = sizes["hidden"]
    if sizes.get("layers") and out.get("max_window_layers") == config.get("num_hidden_layers"):
        out["max_window_layers"] = sizes["layers"]
    if sizes.get("vocab"):
        out["vocab_size"] = sizes["vocab"]
    out.pop("_name_or_path", None)
    return out


def llama_ffn(hidden: int) -> int:
    """Llama's FFN width: 2/3 of 4*hidden rounded up to a multiple of 256 (11008 for 4096)."""
    return 256 * math.ceil(int(8 * hidden / 3) / 256)


def _approx_llama_params(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int) -> float:
    # Only steers the choice of shape; the reported count comes from meta instantiation.
    attention = 2 * hidden * hidden + 2 * hidden * (kv_heads * (hidden // heads))
    return layers * (attention + 3 * hidden * ffn + 2 * hidden) + 2 * DERIVED_VOCAB * hidden


def derive_shape(params: float) -> tuple[int, int, int, int, int]:
    """(layers, hidden, heads, kv_heads, ffn) of a llama-style model with about ``params``."""
    embeddings = 2 * DERIVED_VOCAB  # untied input and output embeddings, per unit of width
    refs = list(REFERENCE_SHAPES)
    largest = refs[-1]
    largest_params = _approx_llama_params(*largest)
    if params > 2 * largest_params:
        # Past the largest published dense model, grow width and depth together (cube law).
        scale = (params / largest_params) ** (1 / 3)
        hidden = 1024 * round(largest[0] * scale / 1024)
        refs.append(
            (hidden, round(largest[1] * scale), hidden // 128, 8, round(largest[4] * scale))
        )
    hidden, ref_layers, heads, kv_heads, ref_ffn = min(
        refs, key=lambda r: abs(math.log(params / _approx_llama_params(*r)))
    )
    ref_body = (
        _approx_llama_params(hidden, ref_layers, heads, kv_heads, ref_ffn) - embeddings * hidden
    )
    layers = max(1, round(ref_layers * (params - embeddings * hidden) / ref_body))
    # Absorb the rounding of the depth into the FFN width (a multiple of 64, as tensor cores
    # like), kept within a plausible range.
    rest = params - _approx_llama_params(hidden, layers, heads, kv_heads, 0)
    ffn = min(max(64 * round(rest / (3 * hidden * layers) / 64), hidden), 8 * hidden)
    return layers, hidden, heads, kv_heads, ffn


def active_params(model: Any, config: Any, params: int) -> int:
    """Parameters one token passes through: a mixture of experts routes each token to top-k.

    Counted from the instantiated modules: every parameter under an ``experts`` module belongs
    to the expert pool (fused or one module per expert), and a token uses top_k / n_experts of
    it (Mixtral: 46.7 B total, about 12.9 B active, per its paper's "13B active parameters").
    """
    n_experts = (
        getattr(config, "num_local_experts", None)
        or getattr(config, "num_experts", None)
        or getattr(config, "n_routed_experts", None)  # DeepSeek: the shared experts always run
    )
    top_k = getattr(config, "num_experts_per_tok", None)
    if not n_experts or not top_k:
        return params
    expert_params = sum(
        p.numel() for name, p in model.named_parameters() if ".experts." in f".{name}"
    )
    return params - round(expert_params * (1 - top_k / n_experts))


def hf_config(config_dict: dict[str, Any]) -> Any:
    """The transformers config object for a config dict (no remote code)."""
    from transformers import CONFIG_MAPPING

    model_type = config_dict["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise InputError(
            "model",
            f"model_type '{model_type}' is not built into transformers (remote code is not run); "
            "give a config of a supported architecture or {layers, hidden, heads, vocab}",
        )
    fields = {k: v for k, v in config_dict.items() if k not in ("model_type", "auto_map")}
    try:
        return CONFIG_MAPPING[model_type].from_dict(fields)
    except Exception as exc:  # config classes validate with assorted exception types
        raise InputError(
            "model", f"invalid {model_type} config: {str(exc).strip()[:200]}"
        ) from None


def model_class(config_dict: dict[str, Any], config: Any) -> Any:
    """The class the checkpoint was saved from, else the task head its config implies."""
    import transformers

    for arch in config_dict.get("architectures") or []:
        cls = getattr(transformers, str(arch), None)
        if cls is not None and hasattr(cls, "_from_config"):
            return cls
    candidates = (
        [transformers.AutoModelForSeq2SeqLM, transformers.AutoModel]
        if getattr(config, "is_encoder_decoder", False)
        else [transformers.AutoModelForCausalLM, transformers.AutoModel]
    )
    for auto in candidates:
        mapping: Any = auto._model_mapping
        if type(config) in mapping:
            return mapping[type(config)]
    raise InputError(
        "model", f"transformers has no model class for model_type '{config.model_type}'"
    )


def is_convolutional(config: Any) -> bool:
    """A convolutional network (ResNet, ConvNeXt): stages of widths and depths, no attention.

    Takes a config object or a config dict.
    """
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    return bool(get("hidden_sizes") and get("depths") and not get("num_attention_heads"))


# Heads of encoder-only checkpoints (BERT, RoBERTa): bidirectional attention, no causal LM.
_ENCODER_HEADS = (
    "ForMaskedLM",
    "ForPreTraining",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
)


def is_encoder_only(config: dict[str, Any]) -> bool:
    """An encoder-only checkpoint (BERT's masked-LM head), not one configured as a decoder."""
    architectures = config.get("architectures") or []
    return (
        bool(architectures)
        and all(str(a).endswith(_ENCODER_HEADS) for a in architectures)
        and not config.get("is_decoder")
    )


def trains_as_causal_lm(config: dict[str, Any]) -> bool:
    """Whether trainwright's training script (a causal LM on token batches) can train it.

    Not an encoder-decoder (T5), an encoder-only model (BERT: AutoModelForCausalLM would build
    BertLMHeadModel, whose attention sees the token it is asked to predict), an image model
    (ViT, ResNet, ConvNeXt: they take pixels), or a config with its own vision tower.
    """
    return not (
        config.get("is_encoder_decoder")
        or is_encoder_only(config)
        or is_convolutional(config)
        or "num_channels" in config
        or "image_size" in config
        or isinstance(config.get("vision_config"), dict)
    )


def layer_count(config: Any) -> int:
    """Transformer blocks, counting encoder and decoder stacks of encoder-decoder models."""
    if is_convolutional(config):
        return int(sum(config.depths))  # a convolutional network: its blocks over all stages
    layers = int(config.num_hidden_layers)
    if getattr(config, "is_encoder_decoder", False):
        layers += int(getattr(config, "num_decoder_layers", None) or layers)
    return layers


def intermediate_size(config: Any) -> int | None:
    """The feed-forward width, however the family names it."""
    for key in ("intermediate_size", "n_inner", "d_ff", "ffn_dim"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    if getattr(config, "model_type", None) == "gpt2":
        return 4 * int(config.hidden_size)  # GPT2MLP's default when n_inner is None
    return None


def learned_positions(model: Any, config: Any) -> int | None:
    """Tokens a model with learned absolute position embeddings can take, else None (RoPE etc.)."""
    import torch

    for module_name, module in model.named_modules():
        leaf = module_name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Embedding) and leaf in (
            "wpe",
            "position_embeddings",
            "embed_positions",
        ):
            declared = getattr(config, "max_position_embeddings", None)
            limit = int(module.num_embeddings)
            return min(limit, int(declared)) if isinstance(declared, int) else limit
    return None


# The config keys of a learned position table's length: GPT-2's n_positions (n_ctx, its old
# twin, kept equal so the file does not contradict itself), everyone else's
# max_position_embeddings (GPT-Neo, OPT, BERT).
POSITION_KEYS = ("n_positions", "n_ctx", "max_position_embeddings")


def with_position_rows(config: dict[str, Any], rows: int) -> dict[str, Any]:
    """``config`` with its learned position table sized to ``rows`` (a model built from scratch).

    Sets every length key the config has; one that has none gets ``max_position_embeddings``,
    which transformers maps to the family's own attribute (GPT-2: ``n_positions``).
    """
    sized = dict(config)
    present = [key for key in POSITION_KEYS if key in sized]
    for key in present or ["max_position_embeddings"]:
        sized[key] = rows
    return sized
