"""Per-GPU memory of a training recipe as its framework implements it: states, activations, loss.

tools/planning/memory.py prices a strategy; this module gives it the framework-specific terms
(``Recipe``, tools/planning/recipe.py) that DeepSpeed's generic ZeRO picture gets wrong for
FSDP2, Megatron, torchtitan and torchtune, and the liveness of each term over a step:

- model states per framework: DeepSpeed (tools/planning/states.py); FSDP/FSDP2 keep fp32
  sharded parameters that are their own master copy, fp32 sharded gradients, and the unsharded
  16-bit weights of the current and prefetched unit (torch.distributed.fsdp fully_shard with
  MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), torchtitan's default); Megatron
  keeps 16-bit weights, a persistent fp32 gradient buffer and 12 bytes of optimizer state per
  parameter, divided by the data-parallel size with the distributed optimizer
  (Megatron-LM docs/source/api-guide/dist_optimizer.md: 18 bytes per parameter, or 6 + 12/d);
  nanotron adds a 16-bit gradient next to its fp32 accumulator.
- activations of the modeling code that runs: Hugging Face's (DeepSpeed, FSDP, Megatron's
  layers by Korthikanti et al. 2022; tools/planning/activations.py) or torchtitan/torchtune's
  own Llama, whose saved tensors are counted here per recompute policy.
- the loss: standard (fp32 log-softmax saved, its gradient and the nll gradient at once),
  torchtune's chunked loss, or a fused/compiled one.
- liveness: gradients that persist across micro-batches (gradient accumulation, pipelines,
  Megatron's buffer) live with the activations; otherwise backward trades one for the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tools.core.schemas import ModelSpec
from tools.planning.recipe import Recipe
from tools.planning.states import GATED_MLP_FAMILIES

# Bytes of optimizer state per trainable parameter, by the dtype the states are kept in.
# AdamW: two moments (fp32: 8; in pure bf16 they follow the parameters' dtype: 4). 8-bit Adam
# (bitsandbytes / torchao AdamW8bit): one byte per moment plus a 4-byte scale per block of 256
# (torchao optim/subclass_8bit.py block_size=256): 2.03. SGD with momentum: one buffer.
# Adafactor (Shazeer & Stern 2018, no first moment by default): factored second moment, rows +
# columns of each matrix: ~4 * 2 / h per parameter, priced per layer in ``optimizer_bytes``.
ADAM8BIT_BYTES = 2 + 2 * 4 / 256
# Paged 8-bit Adam keeps its states in CUDA unified memory (bitsandbytes paged optimizers,
# cudaMallocManaged): the caching allocator never sees them and the driver pages them to host
# memory under pressure, so they count in neither allocated nor reserved memory.
PAGED_ON_DEVICE = 0.0
# QLoRA (Dettmers et al. 2023 sec. 3): NF4 weights, 4 bits, plus double-quantized constants,
# 0.127 bits per parameter: 0.516 bytes per quantized parameter. Embeddings and the output
# layer stay in 16-bit (torchtune's qlora builders quantize the decoder's linear layers).
NF4_BYTES = (4 + 0.127) / 8
# torchtune CEWithChunkedOutputLoss num_output_chunks.
LOSS_CHUNKS = 8


@dataclass
class Terms:
    """Bytes on one GPU by term, and when each is live."""

    # Live for the whole step.
    params: int = 0
    optimizer: int = 0
    # Gradients kept across micro-batches (live with activations) or produced in backward.
    gradients: int = 0
    gradients_persistent: bool = False
    # Unsharded weights and gradient buffers of the units being computed (FSDP / ZeRO-3).
    transient: int = 0
    activations: int = 0
    loss: int = 0
    # Of ``activations``: one layer's tensors rebuilt while it is recomputed in backward, which
    # exist next to nearly every gradient at the end of backward.
    working: int = 0
    # Of ``gradients``: what exists only at the optimizer step (DeepSpeed's fp32 gradient copy,
    # made from the 16-bit partition when the step runs), so never with the activations.
    step_gradients: int = 0
    # Of ``gradients``: a buffer allocated before the first forward and kept, so live with the
    # activations (ZeRO-3's flat 16-bit gradient partition, ``grad_partitions_flat_buffer``).
    resident_gradients: int = 0
    notes: list[str] = field(default_factory=list)

    def peak(self) -> int:
        """The largest allocation over forward, backward and the optimizer step."""
        resident = self.resident_gradients
        live = self.params + self.optimizer + self.transient + resident
        if self.gradients_persistent:
            kept = self.gradients - self.step_gradients - resident
            return live + kept + max(self.activations + self.loss, self.step_gradients)
        # Backward frees saved tensors as it produces gradients: the start (activations and
        # the loss's gradients, no parameter gradients yet) or the end (every gradient, and
        # the last recomputed layer's working set).
        return live + max(self.activations + self.loss, self.gradients - resident + self.working)


def _gated(model: ModelSpec) -> bool:
    family = str((model.hf_config or {}).get("model_type", ""))
    return family in GATED_MLP_FAMILIES and bool(model.intermediate)


def block_params(model: ModelSpec) -> int:
    """Parameters of one transformer block (all but the embeddings and output layer)."""
    head = model.vocab * model.hidden
    tied = bool((model.hf_config or {}).get("tie_word_embeddings"))
    outside = head if tied else 2 * head
    return max(1, (model.params - outside) // max(1, model.layers))


def outside_params(model: ModelSpec) -> int:
    """The embeddings and output layer (the FSDP root unit)."""
    return model.params - block_params(model) * model.layers


# --- activations of torchtitan/torchtune's Llama ------------------------------------------------


def native_layer_bytes(
    model: ModelSpec, policy: str, *, tp: int = 1, sp: bool = True, compiled: bool = False
) -> tuple[float, float]:
    """(bytes kept per token by one layer until backward, bytes while one layer recomputes).

    torchtitan's Llama TransformerBlock (torchtitan/models/llama3/model.py), bf16, counting what
    autograd saves: each RMSNorm (torch.nn.RMSNorm's composite rms_norm keeps its fp32 upcast
    input and the normalised bf16 result: 6h) and its weighted output, the projections' shared
    input (2h); q (2h), k and v repeated to every head by repeat_kv (2h each) and the attention
    output the SDPA kernel saves (2h), the output projection's contiguous input (2h); the MLP's
    w1 and w3 outputs, the SiLU and the product (2i each). No parallelism: 26h + 8i bytes.

    Policies: ``none`` keeps all of it; ``selective`` (Megatron's: only the attention core is
    recomputed) keeps the same with a FlashAttention-style kernel, which stores no scores;
    ``selective-op`` (torchtitan's _apply_ac_to_transformer_block, op policy) keeps the block
    input and the outputs of the ops in its save list, i.e. every odd matmul of the block
    (wq, wv, w1, w2 in call order) and the SDPA output; ``full`` keeps the block input. The
    recomputed policies rebuild one block's full set during its backward.

    torch.compile'd blocks (``compiled``): Inductor's min-cut partitioner saves the inputs of
    each fused elementwise region instead of its intermediates, so a norm keeps its input
    (2h) and not its fp32 upcast and result, and the fused SiLU-times-up keeps the w1 and w3
    outputs but not the SiLU output: 18h + 6i. Under the per-op policy the saved set is the
    policy's either way.

    Tensor parallelism divides the head- and MLP-wide tensors by t; with sequence parallelism
    (torchtitan's plan shards the norms and the residual stream) everything is divided by t.
    """
    h = model.hidden
    kv = h * (model.kv_heads or model.heads) / model.heads
    inter = float(model.intermediate or 4 * h)
    gated = _gated(model)
    if compiled:
        wide = (6 if gated else 4) * inter  # w1, w3 outputs and the product (GPT: up, GeLU in)
        norms_and_inputs = 2 * (2 * h + 2 * h)  # each norm's input and weighted output
    else:
        wide = (8 if gated else 6) * inter  # GPT MLP: up output, GeLU output and its input
        norms_and_inputs = 2 * (6 * h + 2 * h)  # two norms with their weighted outputs
    attention = 2 * h + 2 * h + 2 * h + 2 * h + 2 * h  # q, k, v (repeated), SDPA out, wo input
    full_set = norms_and_inputs / (tp if sp else 1) + (attention + wide) / tp
    if sp and tp > 1:
        # torchtitan's DTensor plan all-gathers the sequence before wq/wk/wv and w1/w3, and
        # those linears save the gathered (full-sequence) input: two 2h tensors not divided.
        full_set += 2 * 2 * h * (1 - 1 / tp)
    block_input = 2 * h / (tp if sp else 1)
    if policy in ("none", "selective"):
        return full_set, 0.0
    if policy == "full":
        return block_input, full_set
    # selective-op: block input, wq (2h), wv (2kv), w1 (2i), w2 (2h), SDPA output (2h).
    kept = block_input + (2 * h + 2 * kv + 2 * inter + 2 * h + 2 * h) / tp
    return kept, full_set


# --- the loss --------------------------------------------------------------------------------


def loss_bytes(
    tokens: int, vocab: int, kind: str, *, hf: bool, fp32: bool, compiled: bool = False
) -> tuple[int, str]:
    """Peak bytes of the logits and cross-entropy per GPU, and how they were counted.

    ``standard`` in a torchtitan-style loop (``F.cross_entropy(pred.float(), labels)``, pred
    deleted before backward): at the start of backward the saved fp32 log-softmax, the nll
    gradient and the log-softmax gradient are live at once, 12 bytes per logit. In Hugging Face
    models the logits stay in the output and the fp32 copy lives through the loss: 2 + 4 + 4
    (tools/planning/activations.py). ``chunked`` (torchtune): the 16-bit logit chunks and the
    fp32 log-softmax of every chunk saved for backward, 2 + 4, plus one chunk's working set.
    ``fused`` (a compiled or Liger-style kernel): the 16-bit logits and their 16-bit gradient.
    A compiled chunked loss (torchtune compile with CEWithChunkedOutputLoss) fuses each
    chunk's upcast and log-softmax: the 16-bit chunks, plus one chunk's fp32 gradient work.
    """
    n = tokens * vocab
    if fp32:
        return 8 * n, "fp32 logits and their gradient"
    if kind == "fused":
        return 4 * n, "fused loss: 16-bit logits and their gradient"
    if kind == "chunked" and compiled:
        return 2 * n + 6 * n // LOSS_CHUNKS, f"compiled chunked loss ({LOSS_CHUNKS} chunks)"
    if kind == "chunked":
        return (6 * n + 8 * n // LOSS_CHUNKS), f"chunked loss ({LOSS_CHUNKS} chunks)"
    if hf:
        return 10 * n, "logits kept in the output, their fp32 copy and the log-softmax"
    return 12 * n, "fp32 log-softmax, its gradient and the nll gradient at once"


# --- model states ----------------------------------------------------------------------------


def stored_bytes(recipe: Recipe) -> int:
    """Bytes per trained parameter FSDP keeps at rest: fp32 under mixed precision, else 16-bit."""
    return 4 if (recipe.mixed or recipe.precision == "fp32") else 2


def optimizer_bytes(recipe: Recipe, trainable: float, hidden: int) -> float:
    """Optimizer state bytes for ``trainable`` parameters (unsharded)."""
    name = recipe.optimizer
    pure = recipe.precision == "pure-bf16"
    if name in ("adamw", "adam"):
        return (4 if pure else 8) * trainable
    if name == "adam8bit":
        return ADAM8BIT_BYTES * trainable
    if name == "paged-adam8bit":
        return PAGED_ON_DEVICE * trainable
    if name == "sgd":
        return (2 if pure else 4) * trainable
    # adafactor: a row and a column statistic per h x k matrix: ~2/h of the parameters, fp32.
    return 4 * 2 * trainable / max(1, hidden)


@dataclass(frozen=True)
class Layout:
    """Where the parameters of one GPU come from: its share and how it is sharded."""

    params_here: int  # after TP/PP, before data-parallel sharding
    trainable_here: int
    frozen_quantized: int  # of params_here, kept in NF4 (QLoRA)
    block: int  # one block's parameters on this GPU (after TP)
    outside: int  # the root unit's parameters on this GPU
    shards: int  # data-parallel (x context-parallel) ranks the states shard over
    largest: int = 0  # the largest single parameter tensor on this GPU
    widest: int = 0  # the largest weight matrix inside one block (the MLP's h x i)
    pipeline: int = 1  # pipeline stages


def fsdp_states(recipe: Recipe, strategy: str, lay: Layout, hidden: int, terms: Terms) -> None:
    """FSDP / FSDP2 (fsdp, torchtitan, torchtune): fp32 sharded parameters are the master copy.

    FULL_SHARD / fully_shard(reshard_after_forward=True) ~ ``zero3``; SHARD_GRAD_OP ~ ``zero2``;
    no sharding ~ ``ddp``. Mixed precision (MixedPrecisionPolicy param_dtype bf16, reduce_dtype
    fp32): 4 bytes of sharded parameters and 4 of sharded gradients; pure bf16 (torchtune's
    default dtype bf16): 2 and 2. While a unit computes, its weights are all-gathered in bf16
    and the next unit's are prefetched (2 units), and in backward its unsharded bf16 gradients
    and the fp32 reduce-scatter input exist once; the root unit (embeddings, output layer) is
    not resharded after forward (torchtitan sets reshard_after_forward=False for it).
    """
    pure = recipe.precision in ("pure-bf16", "fp32") or not recipe.mixed
    store = stored_bytes(recipe)
    shard = lay.shards if strategy.startswith(("zero3", "zero2", "zero1")) else 1
    frozen = lay.params_here - lay.trainable_here
    frozen_bytes = (lay.frozen_quantized * NF4_BYTES) + (frozen - lay.frozen_quantized) * 2
    trained_bytes = store * lay.trainable_here
    sharded_states = strategy.startswith(("zero2", "zero3"))  # at rest: FSDP's flat shards
    terms.params = int((frozen_bytes + trained_bytes) / (shard if sharded_states else 1))
    grad_store = 4 if store == 4 else 2
    grads = grad_store * lay.trainable_here / (shard if sharded_states else 1)
    if recipe.optimizer_in_backward:
        # torchtune optimizer_in_bwd: each gradient is stepped and freed as it is produced; the
        # largest single parameter (the embedding or output matrix) bounds what is live.
        grads = min(grads, grad_store * max(lay.block, lay.largest))
    terms.gradients = int(grads)
    terms.optimizer = int(optimizer_bytes(recipe, lay.trainable_here, hidden) / shard)
    if strategy == "zero3_offload_all":
        # FSDP CPUOffload(offload_params=True): sharded parameters, gradients and the optimizer
        # step live in host memory; the GPU holds what is gathered for compute.
        terms.params = terms.gradients = terms.optimizer = 0
    # The compute weights a unit is gathered in: bf16 under mixed precision, else the stored
    # dtype (fp32 runs, such as CPU ranks, gather fp32 weights).
    work = 2 if recipe.mixed else store
    if strategy.startswith("zero3"):
        # fully_shard gathers (and casts) each unit even on one rank.
        # torchtune's configs shard the embeddings and the output layer as units of their own
        # (custom_sharded_layers: tok_embeddings, output): at the peak only the output layer
        # is gathered. torchtitan's root unit holds both.
        root = work * (lay.largest if recipe.framework == "torchtune" else lay.outside)
        quantized = lay.frozen_quantized / max(1, lay.params_here) / max(1e-9, _block_share(lay))
        # Gathered blocks keep their stored dtype: NF4 under QLoRA, dequantized one linear at
        # a time for compute (torchao NF4Tensor), the largest being the MLP's h x i matrix.
        block_bytes = lay.block * (work * (1 - quantized) + NF4_BYTES * quantized)
        dequant = work * lay.widest if quantized else 0
        blocks = 2 * block_bytes + dequant
        trainable_share = lay.trainable_here / max(1, lay.params_here)
        # Mixed: bf16 gradients and their fp32 reduce-scatter input; otherwise the gradients
        # are reduced in their own dtype.
        reduce = (2 + 4 if not pure else store) * lay.block * trainable_share
        terms.transient = int(root + blocks + reduce)
        terms.notes.append(
            f"FSDP units: root {root / 1e9:.2f} GB unsharded, current + prefetched block "
            f"{blocks / 1e9:.2f} GB, one block's gradients before reduce-scatter "
            f"{reduce / 1e9:.2f} GB"
        )
    if lay.pipeline > 1 and strategy.startswith(("zero2", "zero3")):
        # torchtitan with a pipeline: fully_shard(reshard_after_forward=False) keeps the stage's
        # bf16 weights gathered, and the schedule defers the reduce-scatter to the last
        # micro-batch, so FSDP2 accumulates unsharded gradients in its reduce dtype (fp32).
        gathered = work * lay.params_here
        unsharded_grads = (4 if store == 4 else 2) * lay.trainable_here
        terms.transient = int(gathered)
        terms.gradients += int(unsharded_grads)
        terms.notes.append(
            f"pipeline stage weights kept gathered {gathered / 1e9:.2f} GB and unsharded "
            f"gradients accumulated over the micro-batches {unsharded_grads / 1e9:.2f} GB"
        )
    elif strategy.startswith("zero2"):
        # SHARD_GRAD_OP (reshard_after_forward=False) keeps the 16-bit weights gathered
        # between forward and backward.
        terms.transient = int(work * lay.params_here)
    elif recipe.mixed and strategy in ("ddp", "zero1"):
        # Without sharding, autocast / MixedPrecision casts the fp32 weights to 16-bit: the
        # trained ones only, a frozen LoRA/QLoRA base is stored in 16-bit already.
        terms.transient = int(work * lay.trainable_here)


def megatron_states(recipe: Recipe, strategy: str, lay: Layout, hidden: int, terms: Terms) -> None:
    """Megatron-LM / nanotron: 16-bit weights, a persistent fp32 gradient buffer, fp32 optimizer.

    Megatron's DDP keeps gradients in a contiguous fp32 buffer (main_grad, allocated at start
    and accumulated into every micro-batch), so gradients always live with activations. The
    distributed optimizer (ZeRO-1, ``zero1``) shards the fp32 master weights and moments over
    the data-parallel ranks: 6 + 12/d bytes per parameter, against 18 without it. nanotron
    keeps the bf16 gradient next to its fp32 accumulator (accumulate_grad_in_fp32).

    The buffer is fp32 because Megatron turns ``accumulate_allreduce_grads_in_fp32`` on for
    bf16 (megatron/training/arguments.py: "bfloat16 requires gradient accumulation and
    all-reduce to be done in fp32"); with ``--fp16`` it stays off and the buffer takes the
    parameters' dtype, 2 bytes (megatron/core/distributed/distributed_data_parallel.py,
    core_v0.6.0: ``grad_dtype = torch.float if accumulate_allreduce_grads_in_fp32 else
    param.dtype``).
    """
    distributed = bool(recipe.distributed_optimizer) or strategy.startswith(("zero1", "zero2"))
    shard = lay.shards if distributed else 1
    weight = 4 if recipe.precision == "fp32" else 2
    terms.params = int(weight * lay.params_here)
    fp16_megatron = recipe.framework == "megatron" and recipe.precision == "fp16"
    grad_buffer = 2 if recipe.precision == "pure-bf16" or fp16_megatron else 4
    extra = 2 if recipe.framework == "nanotron" and recipe.mixed else 0
    terms.gradients = int((grad_buffer + extra) * lay.trainable_here)
    terms.gradients_persistent = True
    master = 4 if recipe.mixed else 0
    terms.optimizer = int(
        (master * lay.trainable_here + optimizer_bytes(recipe, lay.trainable_here, hidden)) / shard
    )
    terms.notes.append(
        f"{recipe.framework}: persistent {grad_buffer + extra}-byte gradient buffer; optimizer "
        + (f"sharded over {shard} ranks (distributed optimizer)" if shard > 1 else "not sharded")
    )


def _block_share(lay: Layout) -> float:
    """Share of this GPU's parameters that sit in the transformer blocks."""
    return max(0.0, 1 - lay.outside / max(1, lay.params_here))


def quantized_share(model: ModelSpec) -> float:
    """Share of the parameters QLoRA quantizes: the blocks' linear layers, not the embeddings."""
    return block_params(model) * model.layers / max(1, model.params)
