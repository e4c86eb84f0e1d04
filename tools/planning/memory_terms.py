"""A recipe's memory terms on the most loaded GPU: model states, activations, the loss.

Model states come from tools/planning/states.py (DeepSpeed's ZeRO stages, with the recipe's
optimizer) or tools/planning/footprint.py (FSDP-like and Megatron recipes); activations from
tools/planning/activations.py (the Hugging Face path, Korthikanti et al. 2022) or footprint.py's
per-layer bytes for torchtitan and torchtune. tools/planning/memory.py turns the terms into a
setup's estimate.
"""

from __future__ import annotations

import math

from tools.core.schemas import TRAINING_TASKS, HardwareSpec, ModelSpec, Task
from tools.core.strategies import OFFLOAD_STRATEGIES, StrategyName
from tools.core.units import GB
from tools.planning.activations import activation_bytes, is_encoder_decoder
from tools.planning.footprint import (
    NF4_BYTES,
    Layout,
    Terms,
    block_params,
    fsdp_states,
    loss_bytes,
    megatron_states,
    native_layer_bytes,
    optimizer_bytes,
    outside_params,
    quantized_share,
    stored_bytes,
)
from tools.planning.overheads import buffer_bytes
from tools.planning.parallel import model_parallel_params, stage_expert_params
from tools.planning.recipe import Recipe
from tools.planning.states import (
    OPTIMIZER_STATE_BYTES,
    ModelStates,
    ResolvedPrecision,
    lora_adapter_params,
    model_state_bytes,
    zero3_kept_gathered,
    zero_settings,
)


def _model_states(
    model: ModelSpec,
    strategy: StrategyName,
    task: Task,
    world: int,
    tp: int,
    pp: int,
    precision: ResolvedPrecision,
    optimizer: str,
    lora_rank: int,
    notes: list[str],
    expert_parallel: int = 1,
) -> tuple[ModelStates, int]:
    """Model states on the most loaded GPU, and the parameters it holds before ZeRO shards them.

    Expert parallelism (DeepSpeed-MoE, Rajbhandari et al. 2022 sec. 4; Megatron-DeepSpeed's
    ``--moe-expert-parallel-size``, searched beside data parallelism only) gives each of e
    ranks 1/e of the routed experts; ZeRO shards the experts' states over the d/e ranks that
    hold the same experts (DeepSpeed's expert-data-parallel group), the rest over all d.
    """
    params_here, largest_here = model_parallel_params(model, tp, pp)
    if expert_parallel > 1 and task in ("pretrain", "finetune"):
        return _expert_states(
            model, strategy, world, expert_parallel, params_here, largest_here,
            stage_expert_params(model, tp, pp), precision, optimizer, notes,
        )  # fmt: skip
    share = params_here / model.params if model.params else 1.0
    if tp * pp > 1:
        notes.append(
            f"tensor parallel {tp} x pipeline {pp} x data parallel {world} "
            f"(Megatron-LM, Narayanan et al. 2021): {params_here:,} parameters on the heaviest "
            "stage's GPUs before ZeRO; activations with sequence parallelism"
            + (f" and {pp} micro-batches in flight on the first stage (1F1B)" if pp > 1 else "")
        )
    total_params, trainable, layer_trainable = _trainable(
        model, task, params_here, share, tp, lora_rank, notes
    )
    states = model_state_bytes(
        total_params,
        trainable,
        largest_here,
        world,
        strategy,
        precision=precision,
        optimizer=optimizer,
        largest_layer_trainable_params=layer_trainable,
    )
    return states, params_here


def _expert_states(
    model: ModelSpec,
    strategy: StrategyName,
    world: int,
    ep: int,
    params_here: int,
    largest_here: int,
    stage_experts: int,
    precision: ResolvedPrecision,
    optimizer: str,
    notes: list[str],
) -> tuple[ModelStates, int]:
    """The states of a rank of e-way expert parallelism: its experts' and the shared rest.

    ``stage_experts`` are the routed experts' parameters of this GPU's pipeline stage and
    tensor shard (``stage_expert_params``), not the whole model's: a stage of ceil(L/p) layers
    holds that share of them, and the whole model's count left a stage's other parameters
    negative under pipelining (issue 30; ``params_per_rank`` in parallel.py is the speed
    model's count of the same parameters).
    """
    experts = min(params_here, stage_experts)
    local = experts // ep
    rest = params_here - experts
    shared = model_state_bytes(
        rest, rest, largest_here, world, strategy, precision=precision, optimizer=optimizer
    )
    mine = model_state_bytes(
        local, local, largest_here, max(1, world // ep), strategy,
        precision=precision, optimizer=optimizer,
    )  # fmt: skip
    gpu = {k: shared.gpu.get(k, 0) + mine.gpu.get(k, 0) for k in {*shared.gpu, *mine.gpu}}
    notes.append(
        f"expert parallel {ep} (DeepSpeed-MoE): {local:,} of the stage's {experts:,} expert "
        f"parameters on each GPU, their ZeRO states over the {max(1, world // ep)} ranks holding the same "
        f"experts; the other {rest:,} parameters over all {world}"
    )
    return ModelStates(gpu=gpu, cpu_per_rank={}), rest + local


def _trainable(
    model: ModelSpec,
    task: Task,
    params_here: int,
    share: float,
    tp: int,
    lora_rank: int,
    notes: list[str],
) -> tuple[int, int, int | None]:
    """(parameters held, parameters trained, trained parameters of the largest layer) per GPU."""
    if task == "lora":
        adapters = lora_adapter_params(model, lora_rank)
        adapters_here = math.ceil(adapters * share)
        notes.append(
            f"LoRA rank {lora_rank} on q/k/v/o/gate/up/down: {adapters:,} trainable parameters"
        )
        return params_here + adapters_here, adapters_here, adapters // model.layers // tp
    if task in ("pretrain", "finetune"):
        return params_here, params_here, None
    return params_here, 0, 0


def _deepspeed_terms(
    states: ModelStates, recipe: Recipe, quantized: int, world: int, strategy: str, hidden: int
) -> Terms:
    """tools/planning/states.py's DeepSpeed states, adjusted for the recipe's optimizer."""
    gpu = dict(states.gpu)
    if recipe.precision == "pure-bf16":
        gpu.pop("master_params", None)
        gpu.pop("grads_fp32", None)
    moments = gpu.get("optimizer_moments", 0)
    if moments:
        part = moments / OPTIMIZER_STATE_BYTES["adamw"]  # states.py priced AdamW
        gpu["optimizer_moments"] = int(optimizer_bytes(recipe, part, hidden))
    if quantized and "params" in gpu:
        # With the parameters offloaded (zero3_offload_all) the NF4 base is in host RAM, which
        # stays priced at 16 bits (on the safe side).
        shard = world if strategy.startswith("zero3") else 1
        gpu["params"] -= int((2 - NF4_BYTES) * quantized / shard)
    return Terms(
        params=gpu.get("params", 0) + gpu.get("gathered_params", 0),
        gradients=gpu.get("grads", 0) + gpu.get("gathered_grads", 0) + gpu.get("grads_fp32", 0),
        optimizer=gpu.get("master_params", 0) + gpu.get("optimizer_moments", 0),
        # stage_1_and_2.py / stage3.py make the fp32 gradients from the 16-bit partition when
        # the step runs; through accumulation only the 16-bit gradients are kept.
        step_gradients=gpu.get("grads_fp32", 0),
        # stage3.py allocates the flat 16-bit gradient partition (grad_partitions_flat_buffer,
        # torch.zeros of every parameter's partition) when the optimizer is built
        # (v0.11.1 lines 467-482; _setup_for_real_optimizer in 0.16), so it is there in forward.
        resident_gradients=gpu.get("grads", 0) if strategy.startswith("zero3") else 0,
    )


def _zero3_kept(
    model: ModelSpec,
    strategy: StrategyName,
    params_here: int,
    largest_here: int,
    resolved: ResolvedPrecision,
    notes: list[str],
) -> int:
    """Bytes ZeRO-3 keeps gathered at the forward/backward turn beyond the largest layer."""
    if not strategy.startswith("zero3"):
        return 0
    distance = zero_settings(model, strategy).max_reuse_distance
    kept = zero3_kept_gathered(params_here, distance)
    extra = (4 if resolved == "fp32" else 2) * max(0, kept - largest_here)
    if extra:
        notes.append(
            f"ZeRO-3 keeps {kept / 1e6:,.0f}M parameters gathered where forward turns into "
            f"backward (stage3_max_reuse_distance {distance:.0e}: modules reused within it are "
            f"not released): {extra / GB:.2f} GB beyond the largest layer"
        )
    return extra


def recipe_terms(
    model: ModelSpec,
    hardware: HardwareSpec,
    strategy: StrategyName,
    *,
    task: Task,
    recipe: Recipe,
    resolved: ResolvedPrecision,
    world: int,
    tp: int,
    pp: int,
    seq: int,
    micro_batch_size: int,
    micro_batches: int | None,
    attention: str,
    lora_rank: int,
    notes: list[str],
    expert_parallel: int = 1,
) -> tuple[Terms, int, list[str]]:
    """The recipe's terms on the most loaded GPU, and the DeepSpeed buckets (with their notes)."""
    cp = recipe.context_parallel
    rank = recipe.lora_rank or lora_rank
    states, params_here = _model_states(
        model, strategy, task, world * cp, tp, pp, resolved, "adamw", rank, notes, expert_parallel
    )
    share = params_here / model.params if model.params else 1.0
    trainable = _trainable(model, task, params_here, share, tp, rank, [])
    quantized = int(params_here * quantized_share(model)) if recipe.qlora else 0
    if recipe.framework == "deepspeed":
        terms = _deepspeed_terms(states, recipe, quantized, world * cp, strategy, model.hidden)
        if task in TRAINING_TASKS:
            largest_here = model_parallel_params(model, tp, pp)[1]
            terms.transient += _zero3_kept(
                model, strategy, params_here, largest_here, resolved, notes
            )
    else:
        lay = Layout(
            params_here=trainable[0],
            trainable_here=trainable[1],
            frozen_quantized=quantized,
            block=-(-block_params(model) // tp),
            outside=-(-outside_params(model) // tp),
            shards=world * cp,
            largest=-(-model.largest_layer_params // tp),
            widest=-(-model.hidden * (model.intermediate or 4 * model.hidden) // tp),
            pipeline=pp,
        )
        terms = Terms()
        if recipe.fsdp_like:
            fsdp_states(recipe, strategy, lay, model.hidden, terms)
        else:
            megatron_states(recipe, strategy, lay, model.hidden, terms)
        notes.extend(terms.notes)
    accumulating = (micro_batches or 1) > 1 or pp > 1
    if accumulating and task in TRAINING_TASKS and not recipe.optimizer_in_backward:
        terms.gradients_persistent = True
    terms.activations, terms.loss, terms.working = _activation_terms(
        model, task, recipe, resolved, tp, pp, seq // cp, micro_batch_size, micro_batches, attention,
        moe_dispatcher(recipe, expert_parallel),
    )  # fmt: skip
    if recipe.qlora:
        notes.append(
            f"QLoRA: {quantized:,} base parameters in NF4 ({NF4_BYTES:.3f} bytes each, "
            "Dettmers et al. 2023), embeddings and output layer in 16-bit"
        )
    buffers, buffer_notes = 0, list[str]()
    if recipe.framework == "deepspeed":
        bucket_model = model if tp * pp == 1 else model.model_copy(update={"params": params_here})
        buffers, buffer_notes = buffer_bytes(
            bucket_model,
            strategy,
            world_size=world,
            precision=resolved,
            on_gpu=False,
            training=task in TRAINING_TASKS,
        )
    return terms, buffers, buffer_notes


def moe_dispatcher(recipe: Recipe, expert_parallel: int = 1) -> str:
    """Whose MoE token dispatcher a recipe runs (tools/planning/moe_activations.py).

    Megatron-LM: Megatron-Core's all-gather dispatcher; DeepSpeed with expert parallelism:
    DeepSpeed-MoE (the only expert parallelism the planner prices there); otherwise the model's
    transformers modeling code (a DeepSpeed or FSDP recipe trains the Hugging Face model).
    """
    if recipe.framework == "megatron":
        return "megatron"
    if recipe.framework == "deepspeed" and expert_parallel > 1:
        return "deepspeed-moe"
    return "transformers"


def _activation_terms(
    model: ModelSpec,
    task: Task,
    recipe: Recipe,
    resolved: ResolvedPrecision,
    tp: int,
    pp: int,
    seq: int,
    micro: int,
    micro_batches: int | None,
    attention: str,
    dispatcher: str = "transformers",
) -> tuple[int, int, int]:
    """(activations, loss, recompute working set) per GPU for one micro-batch of ``seq`` tokens.

    The Hugging Face path (tools/planning/activations.py) counts its logits in the activations
    and its recompute working set in them too, so it returns 0 for the other two.
    """
    policy = str(recipe.checkpointing)
    native = (
        recipe.framework in ("torchtitan", "torchtune")
        and task != "inference"
        and not is_encoder_decoder(model)  # they train decoder-only models
    )
    if not native or task in ("inference", "agent-app"):
        acts = activation_bytes(
            model,
            seq_len=seq,
            micro_batch_size=micro,
            precision=resolved,
            activation_checkpointing=policy == "full",
            task=task,
            selective_recompute=policy.startswith("selective"),
            tensor_parallel=tp,
            pipeline_parallel=pp,
            micro_batches=micro_batches,
            attention=attention,
            sequence_parallel=bool(recipe.sequence_parallel) or tp == 1,
            loss=str(recipe.loss),
            offload=recipe.activation_offload,
            target_len=recipe.target_len,
            moe_dispatcher=dispatcher,
            # DeepSpeed's and FSDP's launches run Hugging Face's modeling code.
            modeling="transformers"
            if recipe.framework in ("deepspeed", "fsdp")
            else str(recipe.framework),
        )
        return acts, 0, 0
    tokens = seq * micro
    kept, working = native_layer_bytes(
        model, policy, tp=tp, sp=bool(recipe.sequence_parallel), compiled=recipe.compile
    )
    layers_here = -(-model.layers // pp)
    in_flight = min(pp, micro_batches or pp) if pp > 1 else 1
    if recipe.activation_offload:
        # torchtune OffloadActivations: saved tensors go to pinned host memory as they are
        # made and come back for backward; about two layers' worth stay on the GPU.
        stored = kept * tokens * min(2, layers_here)
    else:
        stored = kept * tokens * layers_here * in_flight
    loss, _how = loss_bytes(
        tokens,
        -(-model.vocab // tp),
        str(recipe.loss),
        hf=False,
        fp32=resolved == "fp32",
        compiled=recipe.compile,
    )
    acts = int(stored + working * tokens)
    if pp > 1:
        # The first stage holds the micro-batches in flight; the last one the loss.
        last = int(kept * tokens * layers_here + working * tokens) + loss
        return max(acts, last), 0, int(working * tokens)
    return acts, loss, int(working * tokens)


def terms_cpu(
    model: ModelSpec,
    strategy: StrategyName,
    task: Task,
    world: int,
    tp: int,
    pp: int,
    resolved: ResolvedPrecision,
    recipe: Recipe,
    lora_rank: int,
) -> dict[str, int]:
    """Offloaded states per rank in host RAM: DeepSpeed's offload strategies, or FSDP's.

    FSDP's CPU offload (FSDP1 ``CPUOffload(offload_params=True)``, FSDP2 ``CPUOffloadPolicy``)
    keeps each rank's shard of the parameters and of their gradients in host memory in the
    parameters' stored dtype (fp32 under a mixed-precision policy) and steps the optimizer
    there on the fp32 shard: no 16-bit copy and no second fp32 gradient copy, unlike
    DeepSpeed's offload (whose CPU Adam steps an fp32 partition beside the 16-bit one).
    """
    if strategy not in OFFLOAD_STRATEGIES:
        return {}
    if recipe.fsdp_like:
        return _fsdp_host(model, task, world, tp, pp, recipe, lora_rank)
    states, _ = _model_states(
        model, strategy, task, world, tp, pp, resolved, "adamw", recipe.lora_rank or lora_rank, []
    )
    return dict(states.cpu_per_rank)


# torch.optim.AdamW's multi-tensor (foreach) step, the default on CPU tensors too, makes one
# temporary the size of the second moment (``torch._foreach_sqrt(exp_avg_sqs)`` in
# torch/optim/adamw.py _multi_tensor_adamw) while it steps: fp32, 4 bytes per trained parameter.
ADAM_STEP_TEMP_BYTES = 4


def _fsdp_host(
    model: ModelSpec, task: Task, world: int, tp: int, pp: int, recipe: Recipe, lora_rank: int
) -> dict[str, int]:
    """FSDP CPU offload's host bytes per rank: parameter, gradient and optimizer shards."""
    shards = world * recipe.context_parallel
    params_here, _ = model_parallel_params(model, tp, pp)
    share = params_here / model.params if model.params else 1.0
    held, trained, _ = _trainable(
        model, task, params_here, share, tp, recipe.lora_rank or lora_rank, []
    )
    store = stored_bytes(recipe)
    frozen = held - trained
    out = {
        "params": math.ceil((store * trained + 2 * frozen) / shards),
        "grads": math.ceil(store * trained / shards),
        "optimizer_moments": math.ceil(optimizer_bytes(recipe, trained, model.hidden) / shards),
    }
    if recipe.optimizer in ("adamw", "adam"):
        out["optimizer_step_temp"] = math.ceil(ADAM_STEP_TEMP_BYTES * trained / shards)
    return out
