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

from tools.core.schemas import ModelSpec
from tools.research.megatron_arch import Architecture, architecture, unexpressed

# Megatron's default padding multiple (``--make-vocab-size-divisible-by``).
_VOCAB_MULTIPLE = 128


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
    if arch.llama_like:
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
