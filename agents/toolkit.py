"""The agents' tools: typed functions over ``tools/``, with plumbing injected, not model-set.

Each role gets LangChain tools whose argument schema holds only the decisions a model may
make (a micro-batch, a strategy floor); the brief, settings and output directory come from
the ``Workspace`` the tools close over. Every tool records its typed result in
the workspace, which is where the graph reads the facts from: never from the model's text.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool
from pydantic import BaseModel

from agents.brief_contract import brief_hardware, brief_model
from agents.smoke_run import smoke_for
from agents.tool_args import (
    EmitLaunchArgs,
    LookupModelArgs,
    NoArgs,
    PlanParallelismArgs,
    ProfileHardwareArgs,
    SearchKnowledgeArgs,
    SmokeArgs,
)
from agents.workspace import SearchRecord, Workspace, need, search_inputs
from tools.core.errors import InputError
from tools.core.schemas import (
    HardwareSpec,
    MemoryPlan,
    ModelParams,
    ModelShape,
    ModelSpec,
    SmokeResult,
)
from tools.core.strategies import STRATEGY_ORDER
from tools.research.framework import DEEPSPEED_FRAMEWORKS, REPLICATING_FRAMEWORKS


def _dump(obj: BaseModel | dict[str, Any], **exclude: Any) -> str:
    data = (
        obj.model_dump(mode="json", exclude=exclude or None) if isinstance(obj, BaseModel) else obj
    )
    return json.dumps(data, default=str)


# ---- researcher ------------------------------------------------------------------------------


def researcher_tools(ws: Workspace) -> list[BaseTool]:
    """profile_hardware, lookup_model, select_framework."""
    from tools.planning import search_strategy
    from tools.research.framework import select_framework as _select

    def profile_hardware(spec: str, interconnect: str | None = None) -> str:
        """Resolve the target hardware: 'local' profiles this machine, NODESxGPUSxTYPE describes a cluster."""
        ws.hardware = brief_hardware(ws, spec, interconnect)
        ws.settle_batch()
        ws.progress(
            f"hardware: {ws.hardware.nodes}x{ws.hardware.gpus_per_node} "
            f"{ws.hardware.gpu.name if ws.hardware.gpu else 'CPU'}"
        )
        return _dump(ws.hardware)

    def lookup_model(model: str | ModelParams | ModelShape, seq_len: int) -> str:
        """Look up a model's exact architecture and parameter count (meta-device instantiation)."""
        ws.model = brief_model(ws, model, seq_len)
        ws.settle_batch()
        ws.progress(f"model: {ws.model.name} {ws.model.params / 1e9:.3f} B parameters")
        return _dump(ws.model, hf_config=True)

    def select_framework() -> str:
        """Choose the training framework for the brief, hardware and model, with cited reasons."""
        hw = need(ws.hardware, "the hardware", "profile_hardware")
        if ws.brief.task == "agent-app":
            ws.framework = _select(ws.brief, hw, None, None)
        elif ws.brief.task == "inference":
            from tools.planning.inference import serving_framework

            # Serving is its own plan: the engine's stack, no training-strategy search.
            ws.framework = serving_framework(ws.brief)
        else:
            model = need(ws.model, "the model", "lookup_model")
            # The search the engineer reuses: the framework is chosen for the setup the plan uses.
            searched = search_strategy(model, hw, ws.brief)
            ws.searched = SearchRecord(
                inputs=search_inputs(ws.brief, hw, model), plan=searched, speed=searched.speed
            )
            ws.framework = _select(ws.brief, hw, model, searched)
        ws.progress(f"framework: {ws.framework.primary}")
        return _dump(ws.framework)

    def search_knowledge(query: str, k: int = 3) -> str:
        """Search the framework knowledge cards; returns passages with card#section citations."""
        from tools.research.knowledge import cite
        from tools.research.knowledge import search_knowledge as _search

        passages = _search(query, ws.settings, k=k)
        if ws.framework is not None:
            # Passages about the chosen stack or its alternatives back the choice: cite them.
            from tools.research.framework import CARD_OF

            relevant = {
                CARD_OF[f]
                for f in [*ws.framework.stack, *(a.name for a in ws.framework.alternatives)]
            }
            extra = [cite(p) for p in passages if p.card in relevant]
            ws.framework.citations = list(dict.fromkeys([*ws.framework.citations, *extra]))
        return json.dumps(
            [{"cite": cite(p), "score": round(p.score, 3), "text": p.text[:800]} for p in passages]
        )

    return [
        StructuredTool.from_function(profile_hardware, args_schema=ProfileHardwareArgs),
        StructuredTool.from_function(lookup_model, args_schema=LookupModelArgs),
        StructuredTool.from_function(select_framework, args_schema=NoArgs),
        StructuredTool.from_function(search_knowledge, args_schema=SearchKnowledgeArgs),
    ]


# ---- engineer --------------------------------------------------------------------------------

# Said when an fp8 recipe on Megatron is searched again without the splits its fp8 skips.
PLAIN_FP8 = (
    "fp8 on Megatron-DeepSpeed: setups searched without pipeline stages or context parallelism, "
    "since its fp8 runs only in Transformer Engine's layers of its plain model (with them the "
    "launch would train bf16)"
)


def _fp8_setup(
    ws: Workspace, model: ModelSpec, hw: HardwareSpec, options: Any, plan: MemoryPlan
) -> MemoryPlan:
    """The plan on a setup whose Megatron launch applies the recipe's fp8, else priced bf16.

    The search prices fp8 for every setup, and Megatron-DeepSpeed applies it only without
    pipeline stages or context parallelism (tools/artifacts/fp8_launch.py ``setup_refusal``):
    such a setup is searched when the request pins neither; when none fits, the plan trains
    and is priced as bf16, saying why once.
    """
    from tools.artifacts.fp8_launch import setup_refusal
    from tools.planning import search_strategy

    why = setup_refusal(ws.brief, model, plan)
    if why is None:
        return plan
    pins = ws.brief.pins
    if (pins.pipeline_parallel or 1) == 1 and (pins.context_parallel or 1) == 1:
        plain = search_strategy(
            model, hw, ws.brief, options.but(pipeline_parallel=1, context_parallel=1)
        )
        row = plain.chosen_row
        if row is not None and row.fits and setup_refusal(ws.brief, model, plain) is None:
            plain.assumptions.insert(0, PLAIN_FP8)
            return plain
    ws.memory = plan
    ws.settle_setup_precision()  # bf16, the line and the rationale, as every later node has them
    return search_strategy(model, hw, ws.brief, options)


def engineer_tools(ws: Workspace) -> list[BaseTool]:
    """plan_parallelism, emit_deepspeed_config, emit_launch, run_smoke_test."""
    from tools.artifacts.launch import emit_launch as _emit_launch
    from tools.artifacts.run_shape import run_steps
    from tools.artifacts.run_shape import sized_config as _sized_config
    from tools.planning import SearchOptions, search_strategy
    from tools.research.framework import follow_setup

    def plan_parallelism(
        micro_batch_size: int | None = None,
        activation_checkpointing: bool | None = None,
        min_strategy: str | None = None,
    ) -> str:
        """Search strategy x micro-batch x checkpointing for the fastest setup that fits in memory."""
        hw = need(ws.hardware, "the hardware", "the researcher's profile_hardware")
        model = need(ws.model, "the model", "the researcher's lookup_model")
        strategies: list[str] | None = (
            list(STRATEGY_ORDER[STRATEGY_ORDER.index(min_strategy) :]) if min_strategy else None
        )
        fw = ws.framework
        options = SearchOptions(
            micro_batch_size=micro_batch_size,
            activation_checkpointing=activation_checkpointing,
            strategies=strategies,
            replicating=fw.primary if fw and fw.primary in REPLICATING_FRAMEWORKS else None,
        )
        # The researcher's search, when it was for this brief, hardware and model: not rerun.
        reuse = ws.searched.reused() if ws.searched is not None else None
        if ws.searched is not None and ws.searched.inputs != search_inputs(ws.brief, hw, model):
            reuse = None
        ws.memory = search_strategy(model, hw, ws.brief, options, searched=reuse)
        ws.memory = _fp8_setup(ws, model, hw, options, ws.memory)
        if ws.batch_note and ws.batch_note not in ws.memory.assumptions:
            ws.memory.assumptions.insert(0, ws.batch_note)
        if ws.recipe_note and ws.recipe_note not in ws.memory.not_honoured:
            # The recipe framework the brief names, not priced: said under "not as asked".
            ws.memory.assumptions.insert(0, ws.recipe_note)
            ws.memory.not_honoured.insert(0, ws.recipe_note)
        if ws.precision_note and ws.precision_note not in ws.memory.not_honoured:
            # The fp8 the request asked for, not applied: said first, and under "not as asked".
            ws.memory.assumptions.insert(0, ws.precision_note)
            ws.memory.not_honoured.insert(0, ws.precision_note)
        ws.deepspeed_config = None
        ws.config_validated = False
        # Launch files written for another plan are stale: the engineer re-emits them.
        ws.launch = None
        ws.speed = ws.memory.speed
        if ws.framework is not None and ws.brief.task != "agent-app":
            # The framework runs the setup this search chose (DeepSpeed AutoTP, torchtitan or
            # Megatron for a tensor/pipeline split): the plan's framework and launch agree.
            ws.framework = follow_setup(ws.framework, model, ws.memory, ws.brief)
        ws.progress(f"strategy: {ws.memory.chosen} micro-batch {ws.memory.micro_batch_size}")
        return _dump(ws.memory)

    def emit_deepspeed_config() -> str:
        """Write the DeepSpeed config for the chosen strategy and check it against DeepSpeed's rules."""
        return _emit_validated_config(ws)

    def emit_launch(steps: int | None = None) -> str:
        """Write ds_config.json, train.py, hostfile and launch.sh to the output directory."""
        hw = need(ws.hardware, "the hardware", "profile_hardware")
        model = need(ws.model, "the model", "lookup_model")
        fw = need(ws.framework, "the framework", "the researcher's select_framework")
        if ws.deepspeed_config is not None:
            # The plan's config, its schedule sized for the run launched (run_shape.py).
            total = run_steps(ws.brief, steps, ws.deepspeed_config)[0]
            ws.deepspeed_config = _sized_config(ws.deepspeed_config, ws.brief, total)
        ws.launch = _emit_launch(
            ws.out_dir, ws.brief, hw, model, fw, ws.deepspeed_config, steps=steps, memory=ws.memory
        )
        return _dump(ws.launch)

    def run_smoke_test(steps: int | None = None) -> str:
        """Run a short real training run of the plan on this machine and report whether it learns."""
        if ws.smoke is not None or ws.smoke_runs:
            raise InputError(
                "",
                "the smoke test already ran in this round (at most one run per plan round); "
                "its result stands: answer without calling run_smoke_test again",
            )
        ws.smoke = smoke_for(ws, steps)
        return _dump(ws.smoke)

    return [
        StructuredTool.from_function(plan_parallelism, args_schema=PlanParallelismArgs),
        StructuredTool.from_function(emit_deepspeed_config, args_schema=NoArgs),
        StructuredTool.from_function(emit_launch, args_schema=EmitLaunchArgs),
        StructuredTool.from_function(run_smoke_test, args_schema=SmokeArgs),
    ]


def _emit_validated_config(ws: Workspace) -> str:
    """The engineer's emit_deepspeed_config: the plan's config, within DeepSpeed's config rules.

    Checked by tools/artifacts/ds_rules.py, which gives DeepSpeedConfig's verdict on every
    config the emitter writes (tested) without importing DeepSpeed and torch (about 0.8 s of
    CPU); DeepSpeed itself parses the config when the plan's job (or a DeepSpeed smoke run)
    starts.
    """
    from tools.artifacts.deepspeed_config import emit_deepspeed_config as _emit
    from tools.artifacts.deepspeed_config import planned_total_steps
    from tools.artifacts.ds_rules import check_deepspeed_rules
    from tools.planning import data_parallel_size
    from tools.planning.batch_layout import deepspeed_batch_ranks

    memory = need(ws.memory, "the memory plan", "plan_parallelism")
    hw = need(ws.hardware, "the hardware", "profile_hardware")
    model = need(ws.model, "the model", "lookup_model")
    fw = ws.framework
    ws.launch = None  # written from the config this call replaces: re-emitted after it
    if fw is not None and fw.primary not in DEEPSPEED_FRAMEWORKS:
        ws.deepspeed_config = None
        return json.dumps(
            {"deepspeed_config": None, "reason": f"{fw.primary} does not use DeepSpeed"}
        )
    config = _emit(
        memory,
        model,
        hw,
        ws.brief,
        total_steps=planned_total_steps(ws.brief),
        autotp=fw is not None and fw.primary == "deepspeed",
    )
    # Megatron's mpu: DeepSpeed sizes batches by the data-parallel group; AutoTP: by the world.
    dp = deepspeed_batch_ranks(
        config,
        data_parallel_size(
            hw, memory.tensor_parallel, memory.pipeline_parallel, memory.context_parallel
        ),
    )
    check_deepspeed_rules(config, dp)
    ws.deepspeed_config = config
    ws.config_validated = True
    ws.progress(
        f"deepspeed config: ZeRO stage {config.get('zero_optimization', {}).get('stage', 0)}, "
        f"checked against DeepSpeed 0.19's config rules at {dp} batch ranks "
        "(DeepSpeed itself parses it at launch)"
    )
    return json.dumps({"deepspeed_config": config, "validated_world_size": dp})


# ---- reviewer --------------------------------------------------------------------------------


def reviewer_tools(ws: Workspace) -> list[BaseTool]:
    """review_plan."""
    from tools.review import (
        check_contract,
        check_plan,
        check_wishes,
        decide,
        round_findings,
        setup_of,
    )
    from tools.review.contract import check_brief

    def review_plan() -> str:
        """Run the review checks (batch arithmetic, memory headroom, framework fit, config keys, smoke run)."""
        hardware = need(ws.hardware, "the hardware", "profile_hardware")
        if ws.brief.task == "inference":
            from tools.review.inference import check_inference

            findings = check_brief(ws.brief, hardware, ws.model) + check_inference(
                ws.inference, ws.launch, ws.smoke, ws.model, hardware, ws.deepspeed_config
            )
            ws.review = decide(findings, ws.round_no, ws.settings.max_review_rounds, {})
            ws.progress(f"review round {ws.round_no}: {ws.review.verdict}")
            return _dump(ws.review)
        findings = check_plan(
            ws.brief,
            hardware,
            need(ws.framework, "the framework", "select_framework"),
            ws.memory
            if ws.brief.task == "agent-app"
            else need(ws.memory, "the memory plan", "plan_parallelism"),
            ws.deepspeed_config,
            ws.smoke or SmokeResult(status="skipped", reason="no smoke run was made"),
        )
        # The plan against the brief, and its files against the plan: whatever the tool calls did.
        findings += check_contract(
            ws.brief,
            hardware,
            ws.model,
            ws.memory,
            ws.deepspeed_config,
            ws.launch,
            ws.smoke or SmokeResult(status="skipped", reason="no smoke run was made"),
        )
        # The brief's framework wishes against the plan's framework and the files it emitted.
        findings += check_wishes(
            ws.brief,
            need(ws.framework, "the framework", "select_framework"),
            ws.deepspeed_config,
            ws.launch,
        )
        findings += round_findings(ws.memory, ws.deepspeed_config, ws.prior_review, ws.round_no)
        setup = setup_of(ws.memory, ws.deepspeed_config)
        ws.review = decide(findings, ws.round_no, ws.settings.max_review_rounds, setup)
        ws.progress(f"review round {ws.round_no}: {ws.review.verdict}")
        return _dump(ws.review)

    return [StructuredTool.from_function(review_plan, args_schema=NoArgs)]
