"""Pick a training framework: a deterministic scorer over the brief, the hardware and the memory plan.

Every candidate collects points from named signals, and every point carries its reason, so the
choice can be explained and reproduced; each framework's trade-offs are stated, with sources,
in a knowledge card (``knowledge/cards/<id>.md``) that the choice cites.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from tools.core.errors import InputError
from tools.core.schemas import (
    Alternative,
    FrameworkChoice,
    FrameworkId,
    HardwareSpec,
    MemoryPlan,
    ModelSpec,
    TrainingBrief,
)
from tools.core.strategies import MIN_HEADROOM
from tools.research.fp8_framework import fp8_framework, fp8_rationale
from tools.research.splits import (
    MEGATRON_LORA,
    MEGATRON_NOT_GPT,
    REPLICATING_FRAMEWORKS,
    STACKS,
    TRAINING_FRAMEWORKS,
    megatron_builds,
    refused_in,
    setup_framework,
    split_sentence,
)
from tools.research.titan_flavors import flavor_refusal, torchtitan_flavor
from tools.research.titan_wish import titan_not_honoured, titan_score

# Frameworks whose plan carries a DeepSpeed config (and runs the plan's ZeRO stage); those that
# replicate every model state on every GPU are tools/research/splits.py's.
DEEPSPEED_FRAMEWORKS = frozenset({"deepspeed", "megatron"})
# A model at or past this size needs pipeline or tensor parallelism on top of ZeRO in practice
# (Megatron-LM and DeepSpeed's 3D parallelism papers train >100B models that way).
PIPELINE_PARAMS = 100e9

CARD_OF: dict[str, str] = {
    "pytorch": "pytorch",
    "pytorch_ddp": "pytorch",
    "pytorch_fsdp": "pytorch",
    "deepspeed": "deepspeed",
    "horovod": "horovod",
    "tensorflow": "tensorflow",
    "megatron": "megatron",
    # torchtitan is PyTorch's FSDP2 + tensor/pipeline reference trainer: the PyTorch card.
    "torchtitan": "pytorch",
    "langgraph": "langchain",
    "langchain": "langchain",
    "crewai": "crewai",
    "autogen": "autogen",
}
_RESEARCH = re.compile(
    r"\b(?:prototyp\w*|research\w*|experiment\w*|novel|new (?:\w+ )?algorithms?|ablation)", re.I
)
_MULTI_AGENT = re.compile(
    r"\b(?:multi-?agent|several (?:\w+ )?agents|cooperat\w*|crew|roles?)\b", re.I
)
_CONVERSATION = re.compile(r"\b(?:conversation\w*|group chat|debate|chat)\b", re.I)
_NAMED = {
    "deepspeed": re.compile(r"\bdeepspeed\b", re.I),
    "pytorch_fsdp": re.compile(r"\bfsdp\b", re.I),
    "horovod": re.compile(r"\bhorovod\b", re.I),
    "megatron": re.compile(r"\bmegatron\b", re.I),
}


def replicas_fit(memory: MemoryPlan | None) -> bool:
    """Whether plain data parallelism (DDP: every GPU a full replica) fits with headroom.

    The memory plan's ``ddp`` row without model parallelism, within the search's headroom. A
    faster sharded setup may still be chosen for speed; this says whether a replicating
    framework can run the job at all.
    """
    if memory is None:
        return False
    if not memory.strategies:  # a plan without its rows: what it chose says it
        return memory.chosen == "ddp"
    limit = (1 - MIN_HEADROOM) * memory.capacity_bytes if memory.capacity_bytes else None
    return any(
        row.name == "ddp"
        and row.tensor_parallel * row.pipeline_parallel * row.context_parallel == 1
        and row.fits
        and (limit is None or row.per_gpu_bytes.total <= limit)
        for row in memory.strategies
    )


def follow_setup(
    choice: FrameworkChoice,
    model: ModelSpec | None,
    memory: MemoryPlan | None,
    brief: TrainingBrief | None = None,
) -> FrameworkChoice:
    """The choice, changed to the framework the setup needs when the chosen one cannot run it.

    Megatron, and torchtitan for its flavors, run every split and are kept; otherwise a split
    runs on ``setup_framework``'s pick, and the rationale says why. A framework the brief
    refuses is never taken. With the brief, the wish sentences follow the framework.
    """
    needed = setup_framework(model, memory)
    if (
        needed is None
        or memory is None
        or choice.primary in (needed, "megatron")
        or (choice.primary == "torchtitan" and torchtitan_flavor(model) is not None)
        or (brief is not None and refused_in(needed, brief.avoid_frameworks))
    ):
        return choice
    refusal = flavor_refusal(model) if needed != "torchtitan" else None
    rationale = (
        f"{split_sentence(needed, model, memory.chosen_setup)}, so the plan runs on {needed} "
        f"({choice.primary} alone does not implement this split for this model). "
        + (f"Not torchtitan: {refusal}. " if refusal else "")
        + choice.rationale
    )
    alternatives = [a for a in choice.alternatives if a.name != needed]
    if choice.primary not in (a.name for a in alternatives):
        alternatives.insert(0, Alternative(name=choice.primary, reason=ALT_REASON[choice.primary]))
    moved = choice.model_copy(
        update={
            "primary": needed,
            "stack": list(STACKS[needed]),
            "alternatives": alternatives[:3],
            "rationale": rationale,
            "citations": list(dict.fromkeys([*cite(needed), *choice.citations])),
        }
    )
    return moved if brief is None else with_wishes(moved, brief, model, memory)


@lru_cache(maxsize=1)
def load_cards() -> dict[str, dict[str, object]]:
    """Read the knowledge cards: id -> {title, sources, body}."""
    cards: dict[str, dict[str, object]] = {}
    for entry in resources.files("knowledge").joinpath("cards").iterdir():
        if not entry.name.endswith(".md"):
            continue
        text = entry.read_text(encoding="utf-8")
        _, front, body = text.split("---", 2)
        meta = yaml.safe_load(front)
        cards[meta["id"]] = {
            "title": meta["title"],
            "sources": meta["sources"],
            "body": body.strip(),
        }
    return cards


def cite(*framework_ids: str) -> list[str]:
    """Citations (card path and title) for the cards that state these frameworks' trade-offs."""
    cards = load_cards()
    out: list[str] = []
    for fid in framework_ids:
        cid = CARD_OF[fid]
        line = f"knowledge/cards/{cid}.md: {cards[cid]['title']}"
        if line not in out:
            out.append(line)
    return out


@dataclass
class Score:
    """One candidate's points, each with the reason that earned (or cost) it."""

    framework: FrameworkId
    points: int = 0
    reasons: list[str] = field(default_factory=list)

    def add(self, points: int, reason: str) -> None:
        """Add (or subtract) points for a stated reason."""
        self.points += points
        self.reasons.append(f"{points:+d} {reason}")


def score_frameworks(
    brief: TrainingBrief, hardware: HardwareSpec, model: ModelSpec | None, memory: MemoryPlan | None
) -> list[Score]:
    """Score every candidate; the list is sorted best first (ties keep the listed order)."""
    text = brief.goal
    if brief.task == "agent-app":
        return _score_agent_apps(text)
    stack, exp = brief.team.existing_stack, brief.team.experience
    fits = replicas_fit(memory)
    world, multi_node = hardware.world_size, hardware.nodes > 1
    params = model.params if model else 0
    research = brief.deployment == "research" or bool(_RESEARCH.search(text))
    serving = brief.deployment in {"production-serving", "mobile"}
    scores: dict[str, Score] = {f: Score(f) for f in TRAINING_FRAMEWORKS}
    s = scores

    for fid, pattern in _NAMED.items() if brief.framework is None else ():
        if pattern.search(text) and fid not in brief.avoid_frameworks:
            s[fid].add(5, "the request names it")  # type: ignore[index]
    if stack == "tensorflow":
        s["tensorflow"].add(6, "the team already runs TensorFlow")
        s["horovod"].add(1, "Horovod also drives TensorFlow/Keras")
        if serving:
            s["tensorflow"].add(2, "TF Serving / TF Lite carry the model into production")
    else:
        for fid in ("pytorch", "pytorch_ddp", "deepspeed"):
            s[fid].add(
                3,
                "PyTorch-based, as the team"
                + (" is" if stack == "pytorch" else " has no stack yet"),
            )
        s["pytorch_fsdp"].add(2, "PyTorch-native")
    if not fits:
        # Model states do not fit one GPU as replicas: only sharding frameworks can run it.
        for fid in ("pytorch", "pytorch_ddp", "horovod", "tensorflow"):
            s[fid].add(
                -10,
                "replicates parameters, gradients and optimizer states on every GPU; they do not fit",
            )  # type: ignore[index]
        s["deepspeed"].add(
            6, "ZeRO shards model states across ranks, with offload when that is not enough"
        )
        if stack == "pytorch" and exp == "expert":
            s["pytorch_fsdp"].add(
                4, "FSDP shards like ZeRO-3 without a new dependency, for a team that knows PyTorch"
            )
        if params >= PIPELINE_PARAMS and multi_node:
            s["megatron"].add(
                8,
                f"{params / 1e9:.0f} B parameters need tensor and pipeline parallelism across nodes",
            )
    else:
        if research:
            s["pytorch"].add(
                4,
                "prototyping new methods wants plain PyTorch: the fewest layers between idea and code",
            )
        if world == 1:
            s["pytorch"].add(2, "one device: no distribution layer needed")
        else:
            s["pytorch_ddp"].add(
                3, "the model fits every GPU, so data parallelism is the fastest use of several"
            )
            if multi_node:
                s["pytorch_ddp"].add(2, "torchrun's rendezvous scales the same script across nodes")
                s["horovod"].add(2, "ring all-reduce across nodes, launched with horovodrun")
            if exp == "beginner":
                s["pytorch_ddp"].add(1, "DDP is the best-documented path for a beginner team")
    wished = brief.framework
    if wished == "megatron" and (brief.task == "lora" or not megatron_builds(model)):
        wished = None  # Megatron's launch trains every weight of a GPT (MEGATRON_LORA, _NOT_GPT)
    if wished in s and not (wished in REPLICATING_FRAMEWORKS and not fits):
        s[wished].add(100, "the request asks for it")  # type: ignore[index]
    if (titan := titan_score(brief, model)) is not None:  # torchtitan, or FSDP in its place
        s.setdefault(titan[0], Score(titan[0])).add(100, titan[1])
    # A refused framework is no candidate at all, nor one whose stack carries it (Megatron-
    # DeepSpeed when DeepSpeed is refused).
    ranked = sorted(
        (sc for fid, sc in scores.items() if not refused_in(fid, brief.avoid_frameworks)),
        key=lambda sc: -sc.points,
    )
    return ranked


def _score_agent_apps(text: str) -> list[Score]:
    s = {f: Score(f) for f in ("langgraph", "crewai", "autogen")}
    s["langgraph"].add(
        10,
        "an explicit state graph with checkpointing, interrupts and streaming on LangChain's models and tools",
    )
    s["crewai"].add(8, "role and task definitions as data, run as a crew")
    s["autogen"].add(7, "conversational agents composed into teams")
    if _MULTI_AGENT.search(text):
        s["crewai"].add(3, "several cooperating agents with distinct roles")
    if _CONVERSATION.search(text):
        s["autogen"].add(3, "the work is a conversation between agents")
    return sorted(s.values(), key=lambda sc: -sc.points)


# What each framework offers as a runner-up, and which runners-up each primary names first:
# the paths a team takes next from that choice (scale out, shard, serve, add agents).
ALT_REASON: dict[str, str] = {
    "pytorch": "plain PyTorch on one device, the fastest loop for prototyping",
    "pytorch_ddp": "PyTorch DDP across GPUs and nodes when one device is not enough",
    "pytorch_fsdp": "PyTorch-native sharding (like ZeRO-3), launched with torchrun, no extra dependency",
    "deepspeed": "ZeRO sharding and CPU/NVMe offload when the model outgrows one GPU",
    "horovod": "Horovod ring all-reduce across an MPI cluster, for TensorFlow or PyTorch",
    "tensorflow": "keeps a TensorFlow team's stack while the model fits one GPU",
    "megatron": "tensor and pipeline parallelism (3D with DeepSpeed) for models of hundreds of billions of parameters",
    "torchtitan": "PyTorch-native 3D parallelism (FSDP2 x tensor x pipeline) for Llama models",
    "crewai": "when several agents with distinct roles cooperate (a crew)",
    "autogen": "when the work is a conversation between agents (group chats)",
    "langgraph": "an explicit, checkpointed state graph of agents and tools",
}
NEXT_STEPS: dict[str, list[FrameworkId]] = {
    "pytorch": ["pytorch_ddp", "horovod"],
    "pytorch_ddp": ["horovod", "deepspeed"],
    "pytorch_fsdp": ["deepspeed", "megatron"],
    "deepspeed": ["pytorch_fsdp", "megatron"],
    "megatron": ["deepspeed", "pytorch_fsdp"],
    "torchtitan": ["megatron", "deepspeed"],
    "horovod": ["pytorch_ddp", "deepspeed"],
    "tensorflow": ["pytorch", "horovod"],
    "langgraph": ["crewai", "autogen"],
    "crewai": ["langgraph", "autogen"],
    "autogen": ["langgraph", "crewai"],
}


def _alternative_reason(fid: FrameworkId, brief: TrainingBrief, points: int | None) -> str:
    if fid == "pytorch" and brief.deployment in {"production-serving", "mobile"}:
        reason = "PyTorch with TorchServe (or ExecuTorch on mobile) if the team moves stacks"
    else:
        reason = ALT_REASON[fid]
    return reason + (f" (score {points})" if points is not None else "")


def _not_honoured(
    brief: TrainingBrief, chosen: str, model: ModelSpec | None, memory: MemoryPlan | None
) -> str | None:
    """Why the plan does not run on the framework the request names (None: it does, or none)."""
    wished = brief.framework
    if wished is None or wished == chosen:
        return None
    if (titan := titan_not_honoured(brief, chosen, model)) is not None:
        return titan
    if wished == "megatron" and brief.task == "lora":
        why = MEGATRON_LORA
    elif wished == "megatron" and not megatron_builds(model):
        why = MEGATRON_NOT_GPT.format(name=model.name if model is not None else "the model")
    elif wished in REPLICATING_FRAMEWORKS and not replicas_fit(memory):
        why = (
            "it replicates parameters, gradients and optimizer states on every GPU, and they "
            "do not fit"
        )
    elif setup_framework(model, memory) == chosen and memory is not None:
        why = (
            f"no setup {wished} runs fits in memory here, and {memory.chosen_label} needs "
            f"{chosen} for its split (the plan's notes say what {wished} alone would need)"
        )
    else:
        why = "it does not apply to this task"
    return f"Wish not honoured: {wished} was asked for, but {why}; the plan runs on {chosen}."


def wish_notes(
    brief: TrainingBrief, chosen: str, memory: MemoryPlan | None, model: ModelSpec | None = None
) -> list[str]:
    """The sentences saying which framework wishes the plan honours, and why not the others."""
    notes = []
    if (missed := _not_honoured(brief, chosen, model, memory)) is not None:
        notes.append(missed)
    elif brief.framework is not None:
        notes.append(f"The framework is {chosen}, as the request asks.")
    if brief.avoid_frameworks:
        notes.append(
            f"Not considered, as the request refuses them: {', '.join(brief.avoid_frameworks)}."
        )
    return notes


def with_wishes(
    choice: FrameworkChoice,
    brief: TrainingBrief,
    model: ModelSpec | None,
    memory: MemoryPlan | None,
) -> FrameworkChoice:
    """The choice with the wish sentences for its primary, in place of any earlier ones."""
    rationale = choice.rationale
    for old in choice.wish_notes:
        rationale = rationale.replace(" " + old, "").replace(old, "")
    notes = wish_notes(brief, choice.primary, memory, model)
    return choice.model_copy(
        update={
            "rationale": " ".join([rationale.strip(), *notes]),
            "wish_notes": notes,
            "not_honoured": _not_honoured(brief, choice.primary, model, memory),
        }
    )


def select_framework(
    brief: TrainingBrief,
    hardware: HardwareSpec,
    model: ModelSpec | None,
    memory: MemoryPlan | None = None,
) -> FrameworkChoice:
    """Choose the primary framework, the stack around it and the alternatives, with reasons."""
    ranked = score_frameworks(brief, hardware, model, memory)
    if not ranked:
        raise InputError(
            "avoid_frameworks",
            f"refuses every framework that can train this ({', '.join(brief.avoid_frameworks)})",
        )
    best = ranked[0]
    primary: FrameworkId = fp8_framework(brief) or best.framework
    stack = list(STACKS[primary])
    if primary == "horovod" and brief.team.existing_stack == "tensorflow":
        stack = ["tensorflow", "horovod"]  # horovod.tensorflow.keras (HOROVOD.md)
    points = {sc.framework: sc.points for sc in ranked}
    # The primary's next steps first, then any other candidate that scored above zero.
    order = NEXT_STEPS[primary] + [sc.framework for sc in ranked if sc.points > 0]
    names = list(
        dict.fromkeys(
            f for f in order if f != primary and not refused_in(f, brief.avoid_frameworks)
        )
    )[:3]
    alternatives = [
        Alternative(name=f, reason=_alternative_reason(f, brief, points.get(f))) for f in names
    ]
    rationale = (
        f"{best.framework} scores {best.points}: "
        + "; ".join(r.split(" ", 1)[1] for r in best.reasons if not r.startswith("-"))
        + "."
    )
    rationale = fp8_rationale(primary, best.framework) + rationale
    if brief.task == "agent-app":
        rationale += (
            " Nothing is trained, so there is no parallelism plan, DeepSpeed config or smoke run."
        )
    elif primary == "deepspeed" and model is not None:
        # Said only of what the plan runs: a split is explained by follow_setup, from the setup.
        if memory is None and model.params >= PIPELINE_PARAMS:
            rationale += " At this size add pipeline parallelism (DeepSpeed's PipelineModule or Megatron-LM) to ZeRO."
        elif memory is not None and setup_framework(model, memory) is None:
            # No setup label here: the engineer may re-plan; the plan's strategy is its own field.
            rationale += (
                " ZeRO runs the setup the strategy search chose (the plan's strategy) across the "
                "data-parallel ranks."
            )
    choice = FrameworkChoice(
        primary=primary,
        stack=stack,
        alternatives=alternatives,
        rationale=rationale,
        citations=cite(primary, *(a.name for a in alternatives)),
    )
    if brief.task != "agent-app":
        choice = follow_setup(choice, model, memory)
    return with_wishes(choice, brief, model, memory)
