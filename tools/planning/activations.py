"""Activation bytes per GPU for one micro-batch (Korthikanti et al. 2022).

"Reducing Activation Recomputation in Large Transformer Models": eq. 1 (no parallelism), sec.
4.1 (full recomputation), sec. 4.2.2 (tensor + sequence parallelism divide a layer's
activations by t), sec. 4.2.3 (with the 1F1B pipeline schedule the first stage holds p
micro-batches of its L/p layers).
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.core.errors import InputError
from tools.core.schemas import ModelSpec, Task
from tools.planning.footprint import loss_bytes
from tools.planning.moe_activations import MOE_DISPATCHERS, moe_extra_bytes
from tools.planning.states import GATED_MLP_FAMILIES, ResolvedPrecision
from tools.planning.vision import conv_activation_bytes, conv_net_of

# Attention kernels the activation model knows (activation_bytes).
ATTENTION_KERNELS = ("sdpa", "eager", "cudnn")
# GATED_MLP_FAMILIES (tools/planning/states.py): RMSNorm + a gated SiLU/GeLU MLP with no dropout.


def layer_coefficient(model: ModelSpec, *, hf: bool = True) -> float:
    """Bytes per s*b*h one transformer layer keeps for backward at 16-bit, without the scores.

    34 for GPT-style layers (Korthikanti et al. 2022, eq. 1); 24 + 8*i/h for llama-style
    layers as the Hugging Face modeling code saves them (see ``_layer_bytes``). ``hf=False``
    (Megatron's and nanotron's own layers, which fuse their norms differently) keeps the
    earlier count, 22 + 8*i/h, not re-derived for them.
    """
    config = model.hf_config or {}
    family = str(config.get("model_type", ""))
    if family in GATED_MLP_FAMILIES and model.intermediate:
        return (24 if hf else 22) + 8 * model.intermediate / model.hidden
    if config.get("activation_function") == "gelu_new" or family == "gpt2":
        # Hugging Face's NewGELUActivation is composed of elementwise ops, which save the tanh
        # output, the half input and the (1 + tanh) factor besides its input: 3 more 4h-wide
        # 16-bit tensors (+24); the attention kernel also keeps its output (+2).
        return 60.0
    return 34.0


def mlp_bytes_per_width(model: ModelSpec) -> int:
    """Bytes ``layer_coefficient`` counts per MLP intermediate element at 16-bit: 8 gated, 4 GPT.

    A gated MLP keeps its gate, SiLU, up and product outputs (2 bytes each); Korthikanti's GPT
    MLP its 4h-wide first projection output and GeLU output (8 + 8 bytes per s*b*h over 4h).
    """
    family = str((model.hf_config or {}).get("model_type", ""))
    return 8 if family in GATED_MLP_FAMILIES and model.intermediate else 4


def dense_mlp_bytes(model: ModelSpec) -> int:
    """Bytes per token ``layer_coefficient`` counts for the MLP's intermediates at 16-bit.

    8 x i for a gated MLP of width i, 4 x 4h for Korthikanti's GPT MLP (its 34 assume 4h).
    """
    per_width = mlp_bytes_per_width(model)
    width = model.intermediate if per_width == 8 and model.intermediate else 4 * model.hidden
    return per_width * width


def replicated_coefficient(model: ModelSpec) -> float:
    """Of ``layer_coefficient``, the bytes per s*b*h that tensor parallelism alone leaves whole.

    GPT layers: 10 (Korthikanti et al. 2022 eq. 2: the two LayerNorms' inputs, 4, the inputs of
    the QKV and first MLP projections, 4, and the two dropout masks, 2). Llama-style layers:
    the two RMSNorms (12) and the two column-parallel projections' shared inputs (4): 16.
    """
    config = model.hf_config or {}
    if str(config.get("model_type", "")) in GATED_MLP_FAMILIES and model.intermediate:
        return 16.0
    return 10.0


def is_encoder_decoder(model: ModelSpec) -> bool:
    """T5, BART and the like: an encoder stack over the source, a decoder over the target."""
    return bool((model.hf_config or {}).get("is_encoder_decoder"))


def encoder_decoder_bytes(
    model: ModelSpec,
    *,
    source_len: int,
    target_len: int,
    micro_batch_size: int,
    precision: ResolvedPrecision,
    activation_checkpointing: bool,
    tensor_parallel: int = 1,
    mask_bytes: int = 1,
) -> int:
    """Activation bytes of an encoder-decoder model (Hugging Face T5/BART code) per micro-batch.

    Counted per token from what the modeling code saves for backward (w = 2 bytes at 16-bit,
    4 in fp32; dropout masks ``mask_bytes``: 1 on CUDA, whose fused dropout keeps a bool
    mask, the activation dtype on CPU, which keeps the scaled noise), h the width, f the feed-forward width, a the heads:
    - each T5LayerNorm keeps its fp32 input and its normalised output: (4 + w)h;
    - self-attention: the projections' input, q, k, v and the output projection's input,
      5wh, and a residual dropout mask h; per score (eager attention, as T5 computes it) the
      fp32 softmax output, the dropout mask and its output: (4 + 1 + w) x a x s^2;
    - the feed-forward (ReLU): its input wh, the ReLU output, the dropout mask and wo's input,
      2wf + f; gated GeLU (T5 v1.1): wi_0's output, the tanh-GeLU composite's three saved
      tensors, its output, wi_1's output and wo's input, 7wf + f; a residual mask h;
    - each decoder layer adds cross-attention: a norm, q's input, q and the output
      projection's input (3wh), a mask h, k and v of the encoder output (2wh per source
      token) and (4 + 1 + w) x a x s_t x s_s per micro-batch; the encoder's final
      normalised output (wh per source token) is shared by every decoder layer.
    Full checkpointing keeps each layer's input (wh per token) and one layer's working set.
    The logits (vocabulary-wide, fp32 copy and log-softmax) cover the target tokens only.
    ``tests/unit/planning/test_memory_recipes.py`` checks these counts against the bytes autograd saves
    for Hugging Face T5 (saved_tensors_hooks).
    """
    config = model.hf_config or {}
    h, a, b = model.hidden, model.heads, micro_batch_size
    f = model.intermediate or 4 * h
    gated = "gated" in str(config.get("feed_forward_proj", ""))
    enc_layers = int(config.get("num_layers") or config.get("encoder_layers") or model.layers // 2)
    dec_layers = int(config.get("num_decoder_layers") or config.get("decoder_layers") or enc_layers)
    w = 4 if precision == "fp32" else 2
    t = tensor_parallel
    m = mask_bytes
    norm = (4 + w) * h
    ffn = norm + w * h + ((7 * w + m) * f if gated else (2 * w + m) * f) + m * h
    self_attn = norm + 5 * w * h + m * h
    cross = norm + 3 * w * h + m * h
    score = 4 + m + w
    enc_layer = b * (source_len * (self_attn + ffn) + score * a * source_len**2) / t
    dec_layer = (
        b
        * (
            target_len * (self_attn + cross + ffn)
            + 2 * w * h * source_len
            + score * a * (target_len**2 + target_len * source_len)
        )
        / t
    )
    # Embedding dropout masks, the final norms and the encoder output the decoder shares.
    ends = b * (source_len * (m * h + norm + w * h) + target_len * (m * h + norm + w * h)) / t
    if activation_checkpointing:
        kept = w * h * b * (enc_layers * source_len + dec_layers * target_len) / t
        body = kept + max(enc_layer, dec_layer) + ends
    else:
        body = enc_layers * enc_layer + dec_layers * dec_layer + ends
    logits = loss_bytes(target_len * b, -(-model.vocab // t), "standard", hf=True, fp32=w == 4)[0]
    return int(body + logits)


def activation_bytes(
    model: ModelSpec,
    *,
    seq_len: int,
    micro_batch_size: int,
    precision: ResolvedPrecision,
    activation_checkpointing: bool,
    task: Task = "finetune",
    selective_recompute: bool = False,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    micro_batches: int | None = None,
    attention: str = "sdpa",
    sequence_parallel: bool = True,
    loss: str = "standard",
    offload: bool = False,
    target_len: int | None = None,
    moe_dispatcher: str = "transformers",
    modeling: str = "transformers",
) -> int:
    """Activation bytes per GPU for one micro batch (Korthikanti et al. 2022, eq. 1).

    ``attention`` is the kernel: ``sdpa`` (PyTorch's scaled_dot_product_attention, the
    Hugging Face default since transformers 4.36, or FlashAttention) keeps no s x s tensors
    (Dao et al. 2022: memory linear in s); ``eager`` keeps the scores. One layer's bytes are
    ``_layer_bytes``'s (the per-layer coefficients, the scores, sequence parallelism); training
    stores them, or the checkpointed inputs, over the stage's layers with the logits
    (``_training_bytes``: recomputation, activation offload, the pipeline's stages); inference
    keeps a KV cache (2 * layers * s * b * kv_dim) instead of training activations.
    ``loss`` is the cross-entropy's implementation (tools/planning/footprint.py
    ``loss_bytes``); ``offload`` moves the stored per-layer tensors to host memory (activation
    CPU offload), leaving about two layers' on the GPU. Encoder-decoder models (T5, BART) take
    ``encoder_decoder_bytes`` with ``seq_len`` source tokens and ``target_len`` (default
    ``seq_len``) target tokens. A mixture of experts' layers keep their routed copies and the
    experts' intermediates as ``moe_dispatcher`` saves them (tools/planning/moe_activations.py:
    ``transformers``, ``megatron`` or ``deepspeed-moe``) in training. ``modeling`` names whose
    layers run: ``transformers`` (Hugging Face's modeling code, DeepSpeed's and FSDP's
    launches) or the framework with its own (``megatron``, ``nanotron``).
    """
    if moe_dispatcher not in MOE_DISPATCHERS:
        raise InputError("moe_dispatcher", f"must be one of {', '.join(MOE_DISPATCHERS)}")
    if attention not in ATTENTION_KERNELS:
        raise InputError("attention", f"must be one of {', '.join(ATTENTION_KERNELS)}")
    if is_encoder_decoder(model) and task not in ("inference", "agent-app"):
        # Source and target both seq_len unless the recipe says otherwise (memory.py).
        return encoder_decoder_bytes(
            model,
            source_len=seq_len,
            target_len=target_len or seq_len,
            micro_batch_size=micro_batch_size,
            precision=precision,
            activation_checkpointing=activation_checkpointing,
            tensor_parallel=tensor_parallel,
        )
    net = conv_net_of(model)
    if net is not None and task not in ("inference", "agent-app"):
        # A convolutional network keeps its feature maps (tools/planning/vision.py).
        return conv_activation_bytes(
            net,
            images=micro_batch_size,
            act_bytes=4 if precision == "fp32" else 2,
            full_recompute=activation_checkpointing,
            tp=tensor_parallel,
            pp=pipeline_parallel,
        )
    shape = _Shape(seq_len, micro_batch_size, precision, tensor_parallel, pipeline_parallel)
    training = task not in ("inference", "agent-app")
    one_layer = _layer_bytes(
        model,
        shape,
        attention,
        selective_recompute=selective_recompute,
        sequence_parallel=sequence_parallel,
        moe_dispatcher=moe_dispatcher if training else None,
        hf=modeling == "transformers",
    )
    if task in ("inference", "agent-app"):
        s, b, h, a, t = seq_len, micro_batch_size, model.hidden, model.heads, tensor_parallel
        kv_dim = h * (model.kv_heads or a) // a
        kv_cache = -(-2 * shape.layers(model) * s * b * kv_dim * shape.act_bytes // t)
        # Generation computes logits for the last position only (transformers logits_to_keep).
        return kv_cache + one_layer + b * model.vocab * 4
    return _training_bytes(
        model,
        shape,
        one_layer,
        activation_checkpointing,
        micro_batches,
        sequence_parallel,
        loss,
        offload,
    )


@dataclass(frozen=True)
class _Shape:
    """One micro-batch on one GPU: s tokens x b sequences, the precision, and t x p."""

    s: int
    b: int
    precision: ResolvedPrecision
    t: int
    p: int

    @property
    def scale(self) -> int:
        """fp32 doubles the 16-bit tensors."""
        return 2 if self.precision == "fp32" else 1

    @property
    def act_bytes(self) -> int:
        """Bytes per activation element at the working precision."""
        return 4 if self.precision == "fp32" else 2

    def layers(self, model: ModelSpec) -> int:
        """The layers of one pipeline stage, L/p rounded up."""
        return -(-model.layers // self.p)


def _layer_bytes(
    model: ModelSpec,
    shape: _Shape,
    attention: str,
    *,
    selective_recompute: bool,
    sequence_parallel: bool,
    moe_dispatcher: str | None = None,
    hf: bool = True,
) -> int:
    """One transformer layer's activations on one GPU, without recomputation.

    Per layer: s*b*h*(34 + 5*a*s/h) bytes at 16-bit (Korthikanti et al. 2022, eq. 1; the
    5*a*s/h part is the attention score/softmax/dropout tensors, which FlashAttention-style
    kernels do not store, so it counts only with ``eager`` attention, at 6 bytes each in 16-bit
    training, see the code). Selective recomputation (sec. 5, Table 2) recomputes only the
    attention core, so a layer keeps 34*s*b*h bytes; memory-efficient attention kernels store
    about the same.

    The per-layer coefficient 34 is Korthikanti's for a GPT layer (LayerNorm, 4h GeLU MLP,
    dropout). Llama-style layers (``GATED_MLP_FAMILIES``: RMSNorm, a gated SiLU MLP of width i,
    no dropout) keep, per s*b*h at 16-bit, as the Hugging Face modeling code saves them for
    backward: 16 for the two RMSNorms (LlamaRMSNorm's pow and multiply keep its fp32 input, 4
    bytes; ``self.weight * hidden_states.to(input_dtype)`` keeps the 16-bit normalised tensor,
    2, and returns a new one, the norm's output, 2, which the next projections keep: the same
    4 per norm ``replicated_coefficient`` counts), 8 for attention (q, k and v and the
    output, saved by the attention kernel; the output projection's input is a view of that
    output: FlashAttention-2's and SDPA's (b, s, heads, d) output reshaped, no copy) and 8*i/h
    for the MLP (gate, SiLU, up and product outputs, i wide): 24 + 8*i/h (46 for i = 2.75h;
    the H200 run of the 1.1B llama-style model measured 47, where the earlier count, 22,
    gave 44: bench/results/2026-12-01-memory-model-notes.md). Megatron's and nanotron's own
    layers keep the earlier 22 (``layer_coefficient(hf=False)``). GPT-2 (composite tanh GeLU,
    ``layer_coefficient``) keeps 60.

    Tensor parallelism of degree t is modelled with Megatron's sequence parallelism (sec. 4.2.2):
    every per-layer term is divided by t. Without sequence parallelism
    (``sequence_parallel=False``: DeepSpeed AutoTP, Megatron without --sequence-parallel) the
    tensors at the block boundaries are replicated on every tensor-parallel rank (Korthikanti
    eq. 2, sbh(10 + 24/t + 5as/(ht)) for GPT layers): the norms' inputs and outputs
    (``replicated_coefficient``) are not divided by t.

    A mixture of experts (``moe_dispatcher`` given) swaps the dense MLP's intermediates for
    its experts' (k routed copies at the expert width, split over t) and the dispatcher's
    h-wide copies, which every tensor-parallel rank keeps whole (``moe_extra_bytes``).
    """
    s, b, h, a = shape.s, shape.b, model.hidden, model.heads
    t, precision, scale = shape.t, shape.precision, shape.scale
    keeps_scores = attention == "eager" and not selective_recompute
    # Eager attention keeps the softmax output in fp32 (Hugging Face computes it with
    # dtype=torch.float32) and, at 16-bit, its cast that the scores-times-values matmul saves:
    # 6 bytes per score (Korthikanti's 5 assume a 16-bit softmax plus dropout), 4 in fp32.
    score_bytes = (4 if precision == "fp32" else 6) * a * s * s * b if keeps_scores else 0
    coefficient = layer_coefficient(model, hf=hf)
    replicated = 0.0 if sequence_parallel or t == 1 else replicated_coefficient(model)
    moe_split, moe_whole = 0.0, 0.0
    if moe_dispatcher is not None:
        moe_split, moe_whole = moe_extra_bytes(
            model,
            s * b,
            mlp_bytes_per_width=mlp_bytes_per_width(model),
            dense_mlp_bytes=dense_mlp_bytes(model),
            dispatcher=moe_dispatcher,
            tp=t,
            sequence_parallel=sequence_parallel,
        )
    sharded = int(s * b * (coefficient - replicated) * h + moe_split) * scale + score_bytes
    return -(-sharded // t) + int(s * b * replicated * h + moe_whole) * scale


def _training_bytes(
    model: ModelSpec,
    shape: _Shape,
    one_layer: int,
    activation_checkpointing: bool,
    micro_batches: int | None,
    sequence_parallel: bool,
    loss: str,
    offload: bool,
) -> int:
    """Training activations per GPU: the stage's stored layers, the recompute set, the logits.

    With full activation checkpointing (Korthikanti et al. 2022 sec. 4.1) each layer keeps only
    its 16-bit input, 2*s*b*h bytes (divided by t with sequence parallelism), plus one layer's
    full activations while it is recomputed. The logits add s*b*V at the working precision plus
    the fp32 copy cross-entropy takes (Hugging Face ``ForCausalLMLoss`` upcasts logits with
    ``.float()``), vocabulary-parallel over t. Pipeline parallelism of degree p (sec. 4.2.3,
    1F1B schedule of Narayanan et al. 2021 sec. 2.2.1): a stage runs L/p layers; the first
    stage holds min(p, m) micro-batches in flight (m = ``micro_batches`` per optimizer step, p
    when not given), the last stage one, plus the logits. The larger of the two is the per-GPU
    peak.
    """
    s, b, h = shape.s, shape.b, model.hidden
    t, p, scale, act_bytes = shape.t, shape.p, shape.scale, shape.act_bytes
    layers = shape.layers(model)
    # Per layer and micro-batch: the layer's input under full checkpointing (plus one layer's
    # activations while it is recomputed), else all of them.
    split = t if sequence_parallel else 1
    stored = -(-2 * s * b * h * scale // split) if activation_checkpointing else one_layer
    working = one_layer if activation_checkpointing else 0
    if offload:
        stored = stored * min(2, layers) // max(1, layers)
    # Logits at the working precision (kept in the model output), the fp32 copy Hugging Face's
    # ForCausalLMLoss makes with .float() (none when training in fp32) and the fp32
    # log-softmax that cross-entropy saves for backward, all live during the loss.
    logits = loss_bytes(s * b, -(-model.vocab // t), loss, hf=True, fp32=act_bytes == 4)[0]
    if p == 1:
        return model.layers * stored + working + logits
    in_flight = min(p, micro_batches or p)
    first_stage = layers * stored * in_flight + working
    last_stage = layers * stored + working + logits
    return max(first_stage, last_stage)
