"""The layouts a search covers: the space built from the request, and every t x p x c in it.

Layouts follow Megatron-LM (Narayanan et al. 2021): t x p x c x d = the world size, the global
batch divides by the data-parallel degree d, tensor parallelism stays inside a node and divides
the heads, pipeline parallelism splits the layers (into uneven stages where p does not divide
them, as Llama 3.1 405B's 126 layers over 16 stages; interleaved where they split evenly), and
context parallelism runs from ``LONG_SEQUENCE`` tokens on (ring attention on torchtitan, DeepSpeed-
Ulysses on Megatron-DeepSpeed). Each layout combines with the
strategies its launcher runs, on a framework the request allows.
"""

from __future__ import annotations

from tools.core.errors import InputError
from tools.core.schemas import TRAINING_TASKS, HardwareSpec, ModelSpec, StrategyName, TrainingBrief
from tools.core.setup import Setup
from tools.core.strategies import (
    OFFLOAD_STRATEGIES,
    RECOMPUTE_POLICIES,
    STRATEGY_ORDER,
    Recompute,
    check_recompute,
    check_strategy,
)
from tools.planning.options import SearchOptions
from tools.planning.parallel import TENSOR_PARALLEL_CANDIDATES, routed_experts
from tools.planning.pins import batch_message, check_pins, check_split_pins
from tools.planning.recipe import resolve_recipe
from tools.planning.search_space import PIPELINE_STRATEGIES, SearchSpace
from tools.planning.states import resolve_precision
from tools.research.megatron_arch import megatron_excluded
from tools.research.splits import (
    MEGATRON_NOT_GPT,
    lora_split_refusal,
    megatron_builds,
    runs_on,
    runs_setup,
    split_framework,
    torchtitan_flavor,
)

# Context parallelism from this sequence length on (the Llama 3 paper, Dubey et al. 2024 sec.
# 3.3.2, turns it on for long-context training; shorter sequences split over TP/DP instead).
LONG_SEQUENCE = 16_384
# Megatron-Core context parallelism cuts the sequence into 2 x c chunks for load-balanced causal
# attention (its context_parallel docs), so 2 x c must divide the sequence.
CONTEXT_PARALLEL_CANDIDATES = (1, 2, 4, 8)
# Interleaved 1F1B (Narayanan et al. 2021 sec. 2.2.2): v model chunks per GPU; the layers must
# split into p x v whole chunks and Megatron needs the micro-batches per step to divide by p.
VIRTUAL_STAGE_CANDIDATES = (1, 2, 4)
# Expert-parallel degrees tried for a mixture of experts (each dividing its experts), and the
# strategies DeepSpeed-MoE runs them with (its MoE layers take ZeRO stage 0 to 2).
EXPERT_PARALLEL_CANDIDATES = (2, 4, 8, 16, 32, 64)
EXPERT_STRATEGIES: tuple[StrategyName, ...] = ("ddp", "zero1", "zero2")


def build_space(
    model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief, options: SearchOptions
) -> SearchSpace:
    """Check the batch arithmetic and the asked-for options; the space the search covers."""
    strategies, micro_batch_size = options.strategies, options.micro_batch_size
    tensor_parallel, pipeline_parallel = options.tensor_parallel, options.pipeline_parallel
    names = [check_strategy(s) for s in strategies] if strategies else list(STRATEGY_ORDER)
    names = sorted(set(names), key=STRATEGY_ORDER.index)
    notes: list[str] = []
    if hardware.gpu is None:
        skipped = [s for s in names if s in OFFLOAD_STRATEGIES]
        names = [s for s in names if s not in OFFLOAD_STRATEGIES]
        if skipped:
            notes.append("CPU-only machine: offload strategies do not apply")
        if not names:
            raise InputError("strategies", "offload strategies need a GPU; this machine has none")
    check_pins(
        model, hardware, brief, tensor_parallel, pipeline_parallel, names if strategies else None
    )
    check_split_pins(
        model,
        hardware,
        options.expert_parallel,
        options.context_parallel,
        (tensor_parallel, pipeline_parallel),
    )
    if micro_batch_size is not None and micro_batch_size < 1:
        raise InputError("micro_batch_size", "must be at least 1")
    if options.recompute is not None:
        policies: list[Recompute] = [check_recompute(options.recompute)]
    elif options.activation_checkpointing is not None:
        policies = ["full" if options.activation_checkpointing else "none"]
    else:
        policies = list(RECOMPUTE_POLICIES)
    ckpts = sorted({p != "none" for p in policies})
    precision = resolve_precision(brief.precision, hardware)
    space = SearchSpace(
        model, hardware, brief, precision, names, micro_batch_size, ckpts, notes, policies
    )
    space.pinned = (tensor_parallel, pipeline_parallel)
    space.cp_pin = options.context_parallel
    space.ep_pin = options.expert_parallel
    # Degrees the request pins are its layout: kept on Megatron even for a model it cannot
    # build as it is (the launch notes say what differs).
    pinned_split = (tensor_parallel, pipeline_parallel, options.context_parallel)
    space.inexact_megatron = options.inexact_megatron or any(
        (d or 1) > 1 for d in (*pinned_split, options.expert_parallel)
    )
    if options.recipe is not None:
        space.recipe = resolve_recipe(options.recipe)
        space.notes.append(f"memory priced for: {space.recipe.describe()}")
        space.notes.extend(f"assumed {a}" for a in space.recipe.assumed)
    space.layouts = _layouts(space)
    if not space.layouts and space.ep_pin is not None and space.ep_pin > 1:
        raise _expert_refusal(space)
    if not space.layouts:
        raise InputError(
            "global_batch_size", batch_message(brief, hardware, step=space.smallest_dp)
        )
    if hardware.gpu is not None and (line := _not_searched(space)):
        space.notes.append(line)
    if micro_batch_size is not None:
        runs = [lay for lay in space.layouts if space.micro_range(space.per_rank(lay))]
        if not runs:
            per_rank = space.per_rank(space.layouts[0])
            raise InputError(
                "micro_batch_size",
                f"{micro_batch_size} must divide the per-GPU batch of {per_rank} sequences",
            )
        space.layouts = runs
    return space


def _layouts(space: SearchSpace) -> list[Setup]:
    """Every t x p x c the search covers: it factorizes the world and d divides the batch."""
    hw, model, brief = space.hardware, space.model, space.brief
    world = hw.world_size
    tp_pin, pp_pin = space.pinned
    if hw.gpu is None or brief.task not in TRAINING_TASKS:
        tps, pps, cps = [tp_pin or 1], [pp_pin or 1], [1]
    else:
        kv_heads = model.kv_heads or model.heads
        tps = (
            [tp_pin]
            if tp_pin
            else [
                t
                for t in TENSOR_PARALLEL_CANDIDATES
                if t <= max(1, hw.gpus_per_node) and model.heads % t == 0 and kv_heads % t == 0
            ]
        )
        # Any p up to the layers: where p does not divide them the stages are uneven
        # (tools/planning/parallel.py ``pipeline_split``) and the heaviest is priced.
        pps = [pp_pin] if pp_pin else list(range(1, min(model.layers, world) + 1))
        cps = _context_degrees(model, brief.seq_len)
    if space.cp_pin is not None:
        cps = [space.cp_pin]
    splits = []
    for tp in tps:
        for pp in pps:
            for cp in cps:
                lay = Setup(tp=tp, pp=pp, cp=cp)
                if cp > 1 and tp * pp > 1 and torchtitan_flavor(model) is None:
                    continue  # Ulysses runs beside data parallelism only (_context_degrees)
                if world % lay.split == 0:
                    splits.append(lay)
    # The fewest data-parallel ranks a layout leaves: the batch step the refusal suggests.
    space.smallest_dp = min((world // lay.split for lay in splits), default=world)
    layouts = [lay for lay in splits if brief.batch % (world // lay.split) == 0]
    experts = _expert_layouts(space, layouts)
    if space.ep_pin is not None and space.ep_pin > 1:
        return experts  # pinned: expert-parallel layouts only
    return layouts + experts


def _expert_layouts(space: SearchSpace, layouts: list[Setup]) -> list[Setup]:
    """Expert-parallel layouts of a mixture of experts: e ranks split its routed experts.

    DeepSpeed-MoE on Megatron-DeepSpeed (``--moe-expert-parallel-size``): e divides the experts
    and the data-parallel ranks it runs within; searched beside plain data parallelism (t x p
    x c = 1), the layout the DeepSpeed-MoE recipes run, with ZeRO stage 0 to 2.
    """
    hw, model, brief = space.hardware, space.model, space.brief
    experts = routed_experts(model)
    if experts <= 1 or hw.gpu is None or brief.task not in ("pretrain", "finetune"):
        return []
    if space.recipe is not None and space.recipe.framework != "deepspeed":
        # The expert groups' states are priced as DeepSpeed's ZeRO shards them (memory_terms).
        space.notes.append(
            f"expert parallelism not searched: its memory is priced for DeepSpeed-MoE's ZeRO "
            f"(Megatron-DeepSpeed), not the {space.recipe.framework} recipe this plan is priced for"
        )
        return []
    if space.ep_pin is not None:
        eps = [space.ep_pin] if space.ep_pin > 1 else []
    else:
        eps = [e for e in EXPERT_PARALLEL_CANDIDATES if experts % e == 0]
    return [
        lay.but(ep=e) for lay in layouts if lay.split == 1 for e in eps if space.dp(lay) % e == 0
    ]


def _expert_refusal(space: SearchSpace) -> InputError:
    """Why a pinned expert-parallel degree has no layout here (``_expert_layouts``' rules)."""
    hw, brief, ep = space.hardware, space.brief, space.ep_pin
    if hw.gpu is None or brief.task not in ("pretrain", "finetune"):
        return InputError(
            "expert_parallel",
            f"expert parallel {ep} is planned for full pretraining or fine-tuning on GPUs, "
            f"not {brief.task} on {'this CPU-only machine' if hw.gpu is None else hw.gpu.name}",
        )
    if space.recipe is not None and space.recipe.framework != "deepspeed":
        return InputError(
            "expert_parallel",
            f"expert parallel {ep} runs on DeepSpeed-MoE (Megatron-DeepSpeed), its memory "
            f"priced as DeepSpeed's ZeRO shards it, not on the {space.recipe.framework} recipe",
        )
    tp, pp = space.pinned
    if (tp or 1) * (pp or 1) * (space.cp_pin or 1) > 1:
        return InputError(
            "expert_parallel",
            f"expert parallel {ep} runs beside plain data parallelism only (tensor x pipeline x "
            "context parallel 1, as DeepSpeed-MoE's recipes run it), not with the other "
            "pinned degrees",
        )
    if brief.batch % hw.world_size:
        return InputError("global_batch_size", batch_message(brief, hw, dp=hw.world_size))
    return InputError("expert_parallel", f"no layout here runs expert parallel {ep}")


def _context_degrees(model: ModelSpec, seq_len: int) -> list[int]:
    """The context-parallel degrees searched for a sequence of ``seq_len`` tokens.

    From ``LONG_SEQUENCE`` tokens on. A Llama model a torchtitan flavor builds gets ring
    attention there (FSDP2 x TP x PP x CP); 2 x c chunks must divide the sequence. Any other
    model runs it on Megatron-DeepSpeed as DeepSpeed-Ulysses (``--ds-sequence-parallel-size``,
    Jacobs et al. 2023): an all-to-all splits the attention heads, so c divides the query and
    key-value heads and the sequence; it is searched beside ZeRO data parallelism only, as the
    Ulysses recipes run it: Megatron-DeepSpeed refuses it with Megatron's own sequence
    parallelism (megatron/initialize.py), which the memory model assumes under tensor
    parallelism, and its pipeline model is not among the recipes.
    """
    if seq_len < LONG_SEQUENCE:
        return [1]
    if torchtitan_flavor(model) is not None:
        return [c for c in CONTEXT_PARALLEL_CANDIDATES if seq_len % (2 * c) == 0]
    kv_heads = model.kv_heads or model.heads
    return [
        c
        for c in CONTEXT_PARALLEL_CANDIDATES
        if model.heads % c == 0 and kv_heads % c == 0 and seq_len % c == 0
    ]


def _split_names(space: SearchSpace, layout: Setup) -> list[StrategyName]:
    """The strategies a layout combines with (offload is data-parallel only, see parallel.py)."""
    if layout.ep > 1:
        return [n for n in space.names if n in EXPERT_STRATEGIES]
    if layout.split == 1:
        return space.names
    names = [n for n in space.names if n not in OFFLOAD_STRATEGIES]
    return [n for n in names if n in PIPELINE_STRATEGIES] if layout.pp > 1 else names


def names_for(space: SearchSpace, layout: Setup) -> list[StrategyName]:
    """The strategies a layout combines with, on a framework the request allows."""
    return [
        n
        for n in _split_names(space, layout)
        if runs_setup(
            space.brief,
            space.model,
            n,
            layout.tp,
            layout.pp,
            layout.cp,
            layout.ep,
            exact=not space.inexact_megatron,
        )
    ]


def _not_searched(space: SearchSpace) -> str | None:
    """The line saying which splits the request's framework wishes keep out of the search."""
    needs = {
        split_framework(space.model, n, lay.tp, lay.pp, lay.cp, lay.ep)
        for lay in space.layouts
        for n in _split_names(space, lay)
        if not runs_setup(
            space.brief,
            space.model,
            n,
            lay.tp,
            lay.pp,
            lay.cp,
            lay.ep,
            exact=not space.inexact_megatron,
        )
    }
    if not needs:
        return None
    brief = space.brief
    why = (
        f"the request refuses {', '.join(brief.avoid_frameworks)}" if brief.avoid_frameworks else ""
    )
    if brief.task == "lora" and needs - {None}:
        why += ("; " if why else "") + lora_split_refusal(needs)
    if brief.framework is not None:
        why += ("; " if why else "") + f"the request asks for {brief.framework}"
    if "megatron" in needs and not megatron_builds(space.model):
        why += ("; " if why else "") + MEGATRON_NOT_GPT.format(name=space.model.name)
    elif (
        "megatron" in needs
        and brief.framework != "megatron"
        and not space.inexact_megatron
        and (differs := megatron_excluded(space.model, brief.loads_weights)) is not None
    ):
        why += ("; " if why else "") + (
            f"{differs}: its launch would not train the model as it is (name Megatron, or pin a "
            "tensor, pipeline, context or expert degree, to plan it anyway)"
        )
    kept_out = []
    if None in needs:  # no framework the request allows shards: DDP replicas alone
        kept_out.append("ZeRO and FSDP sharding (only DeepSpeed and FSDP shard model states)")
    if splits := sorted(str(f) for f in needs if f is not None):
        kept_out.append(f"the splits that run only on {', '.join(splits)}")
    return f"not searched: {'; '.join(kept_out)} ({why})"


def virtual_stages(space: SearchSpace, layout: Setup, accumulation: int) -> list[int]:
    """The interleaving degrees v a pipeline of ``accumulation`` micro-batches can run.

    Only torchtitan's pipelines interleave (``Interleaved1F1B``); Megatron-DeepSpeed runs its
    pipeline on DeepSpeed's PipelineEngine, whose schedule is 1F1B alone (its launcher writes
    no virtual-stage flag), so a Megatron plan is priced with v = 1.
    """
    if layout.pp == 1:
        return [1]
    if runs_on(space.brief, space.model, layout.strategy, layout.tp, layout.pp, layout.cp) != (
        "torchtitan"
    ):
        return [1]
    return [
        v
        for v in VIRTUAL_STAGE_CANDIDATES
        if space.model.layers % (layout.pp * v) == 0 and (v == 1 or accumulation % layout.pp == 0)
    ]
