"""The ``estimate`` command's request and its gathering: flags in, the memory plan out.

``EstimateRequest`` has one field per flag of ``python app.py estimate`` (the flag's name with
underscores; tests/unit/cli/test_cli_flags.py keeps the two sets equal), so the CLI maps its flags onto
it and any caller (a batch of JSON lines, another program) fills the same fields. ``estimate``
reads the brief, model and hardware, prices the recipe, and runs the one search
(tools/planning/search.py). Errors name the command line's flags, as the user wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from tools.core.errors import InputError
from tools.core.schemas import HardwareSpec, MemoryPlan, ModelSpec, TrainingBrief
from tools.core.strategies import check_recompute, check_strategy
from tools.planning.options import SearchOptions
from tools.planning.recipe import PRECISIONS, Recipe, resolve_recipe
from tools.planning.search import search_strategy

# The search's and the recipe's field names, as ``estimate`` spells them on the command line.
ESTIMATE_FLAGS = {
    "tensor_parallel": "--tp",
    "pipeline_parallel": "--pp",
    "micro_batch_size": "--micro-batch",
    "strategy": "--strategy",
    "strategies": "--strategy",
    "checkpointing": "--checkpointing",
    "global_batch_size": "--global-batch",
    "framework": "--framework",
    "precision": "--precision",
    "optimizer": "--optimizer",
    "grad_accum": "--grad-accum",
    "lora_rank": "--lora-rank",
    "qlora": "--qlora",
    "cp": "--cp",
    "context_parallel": "--cp",
    "ep": "--ep",
    "expert_parallel": "--ep",
}
# The request fields that ask for a recipe other than DeepSpeed's default.
RECIPE_FIELDS = ("framework", "optimizer", "grad_accum", "lora_rank", "qlora", "cp")


class EstimateRequest(BaseModel):
    """One ``estimate``: the brief or model, the hardware, and what the flags pin (None: searched).

    The fields are the ``estimate`` flags' (``--seq-len`` is ``seq_len``); ``brief`` is a
    brief file, ``model`` a catalog id or config.json path (exactly one of the two).
    """

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    brief: Path | None = None
    model: str | None = None
    hardware: str | None = None
    task: str | None = None
    seq_len: int | None = None
    global_batch: int | None = None
    micro_batch: int | None = None
    precision: str | None = None
    framework: str | None = None
    optimizer: str | None = None
    grad_accum: int | None = None
    lora_rank: int | None = None
    qlora: bool = False
    cp: int | None = None
    activation_offload: bool = False
    interconnect: str | None = None
    strategy: str | None = None
    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    checkpointing: str | None = None

    def check_source(self) -> None:
        """InputError unless exactly one of ``brief`` and ``model`` is given."""
        if (self.brief is None) == (self.model is None):
            raise InputError("estimate", "give either --brief FILE or --model M")


@dataclass(frozen=True)
class Estimate:
    """What ``estimate`` found: the inputs it read and the plan the search made."""

    model: ModelSpec
    hardware: HardwareSpec
    brief: TrainingBrief
    memory: MemoryPlan
    # Why the global batch is the planner's default (``--grad-accum`` without a global batch).
    batch_note: str | None = None


def estimate(request: EstimateRequest) -> Estimate:
    """The memory plan ``request`` asks for: its pins kept, the search filling the rest."""
    from tools.research.model_catalog import brief_model

    request.check_source()
    recipe = _recipe(request)
    brief, hw = _brief_and_hardware(request, recipe)
    if request.strategy is not None:
        check_strategy(request.strategy, "--strategy")
    recompute = "selective" if request.checkpointing == "selective-op" else request.checkpointing
    if recompute is not None:
        check_recompute(recompute, "--checkpointing")
    assert brief.model is not None  # _brief_and_hardware refuses an agent-app brief
    model = brief_model(brief)
    batch_note = None
    if request.grad_accum is not None and brief.global_batch_size is None:
        # --grad-accum sets the micro-batch from the global batch: without --global-batch, the
        # planner's default (tools/planning/batch.py), said so in the output and the JSON.
        from tools.planning.batch import resolve_batch

        brief, batch_note = resolve_batch(brief, model, hw)
    micro = _micro_for_grad_accum(request, brief, hw.world_size, defaulted=batch_note is not None)
    options = SearchOptions(
        micro_batch_size=micro,
        strategies=[request.strategy] if request.strategy else None,
        tensor_parallel=request.tp,
        pipeline_parallel=request.pp,
        recompute=recompute,
        context_parallel=request.cp,
        expert_parallel=request.ep,
        recipe=recipe,
    )
    try:
        memory = search_strategy(model, hw, brief, options)
    except InputError as exc:
        # The search names its own fields; on this command line they are flags.
        flag = ESTIMATE_FLAGS.get(exc.field)
        if flag == "--micro-batch" and request.micro_batch is None and request.grad_accum:
            flag = "--grad-accum"
        elif flag is None or (flag == "--micro-batch" and request.micro_batch is None):
            raise
        raise InputError(flag, exc.message) from None
    if batch_note is not None:
        memory.assumptions.insert(0, batch_note)
    memory.assumptions[:0] = model.notes
    return Estimate(model, hw, brief, memory, batch_note)


def _brief_and_hardware(
    request: EstimateRequest, recipe: Recipe | None
) -> tuple[TrainingBrief, HardwareSpec]:
    """The brief the request describes (its file, with the flags over it) and its hardware."""
    from tools.intake.brief import brief_from_dict, load_brief, with_model_seq_len
    from tools.intake.network_text import network_fields
    from tools.research.hardware import hardware_for_brief

    # The file's own fields only: a default seq_len filled in by the loader would hide the
    # model's own (gpt2's 1024 positions, an image model's one image), as a plan reads it.
    data: dict[str, Any] = (
        load_brief(request.brief).model_dump(mode="json", exclude_unset=True)
        if request.brief
        else {"model": request.model}
    )
    flags: dict[str, Any] = {
        "hardware": request.hardware,
        "task": "lora" if recipe is not None and recipe.lora_rank else request.task,
        "seq_len": request.seq_len,
        "global_batch_size": request.global_batch,
        # pure-bf16 and fp8 compute in bf16, tf32 keeps fp32 tensors; the recipe carries the
        # difference.
        "precision": "bf16"
        if request.precision in ("pure-bf16", "fp8")
        else "fp32"
        if request.precision == "tf32"
        else request.precision,
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    data = with_model_seq_len(data)
    brief = brief_from_dict(data)
    if request.interconnect is not None:
        # The brief's network fields; a rate per GPU needs the node's GPU count.
        data.update(network_fields(request.interconnect, hardware_for_brief(brief).gpus_per_node))
        brief = brief_from_dict(data)
    if brief.model is None:
        raise InputError(
            "brief.model", "an agent-app brief trains nothing, so there is no memory to estimate"
        )
    return brief, hardware_for_brief(brief)


def _recipe(request: EstimateRequest) -> Recipe | None:
    """The recipe the request names (None when it names none: DeepSpeed's default)."""
    if request.precision is not None and request.precision not in PRECISIONS:
        raise InputError(
            "--precision",
            f"unknown precision {request.precision!r}; use {' | '.join(PRECISIONS)}",
        )
    named = [f for f in RECIPE_FIELDS if getattr(request, f) is not None]
    named = [f for f in named if getattr(request, f) is not False]  # qlora left off
    special = request.precision in ("pure-bf16", "fp8", "tf32")
    selective_op = request.checkpointing == "selective-op"
    if not (named or special or selective_op or request.activation_offload):
        return None
    recipe = Recipe(
        framework=request.framework or "deepspeed",
        precision=request.precision if request.precision not in (None, "auto") else "bf16",
        optimizer=request.optimizer or "adamw",
        checkpointing="selective-op" if selective_op else None,
        lora_rank=request.lora_rank,
        qlora=request.qlora,
        activation_offload=request.activation_offload,
    )
    try:
        return resolve_recipe(recipe)
    except InputError as exc:
        raise InputError(ESTIMATE_FLAGS.get(exc.field, exc.field), exc.message) from None


def _micro_for_grad_accum(
    request: EstimateRequest, brief: TrainingBrief, world: int, defaulted: bool = False
) -> int | None:
    """The micro-batch that ``--grad-accum N`` implies for the pinned (or data-only) layout.

    ``defaulted``: the global batch is the planner's default (no ``--global-batch``).
    """
    if request.grad_accum is None:
        return request.micro_batch
    split = (request.tp or 1) * (request.pp or 1) * (request.cp or 1)
    dp = max(1, world // split)
    per_rank = brief.batch // dp if brief.batch % dp == 0 else 0
    if not per_rank or per_rank % request.grad_accum:
        raise InputError(
            "--grad-accum",
            f"{request.grad_accum} must divide the {brief.batch // dp if dp else 0} sequences "
            f"per data-parallel rank ({brief.batch} over {dp} ranks"
            + ("; the default global batch: set --global-batch" if defaulted else "")
            + ")",
        )
    micro = per_rank // request.grad_accum
    if request.micro_batch is not None and request.micro_batch != micro:
        raise InputError(
            "--grad-accum",
            f"with --micro-batch {request.micro_batch} it would be "
            f"{per_rank // request.micro_batch}",
        )
    return micro
