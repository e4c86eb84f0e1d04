"""Pick a training framework from the brief, the hardware and the memory plan.

The rules are written down here (not left to a model) so the choice is reproducible; each
reason cites a knowledge card in ``knowledge/cards`` that states the trade-off.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml

from tools.schemas import (
    Alternative,
    FrameworkChoice,
    HardwareSpec,
    MemoryPlan,
    ModelSpec,
    TrainingBrief,
)


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


def _cite(*card_ids: str) -> list[str]:
    cards = load_cards()
    return [f"knowledge/cards/{cid}.md: {cards[cid]['title']}" for cid in card_ids]


def select_framework(
    brief: TrainingBrief, hardware: HardwareSpec, model: ModelSpec, memory: MemoryPlan | None = None
) -> FrameworkChoice:
    """Choose the primary framework, the stack around it and the alternatives, with reasons."""
    if brief.task == "agent-app":
        return FrameworkChoice(
            primary="langgraph",
            stack=["langgraph", "langchain"],
            alternatives=[
                Alternative(
                    name="crewai",
                    reason="role/task definitions as data; less control over the flow",
                ),
                Alternative(
                    name="autogen", reason="conversation-first teams; a natural fit for group chats"
                ),
            ],
            rationale="An agent application needs orchestration, not distributed training: LangGraph "
            "gives an explicit state graph with checkpointing and interrupts.",
            citations=_cite("agent-frameworks"),
        )

    chosen = memory.chosen if memory else None
    fits_replicated = chosen == "ddp"
    multi_node = hardware.nodes > 1

    if brief.team.existing_stack == "tensorflow" and (fits_replicated or memory is None):
        alts = [Alternative(name="deepspeed", reason="needed only if the model outgrows one GPU")]
        if multi_node:
            alts.insert(
                0, Alternative(name="horovod", reason="ring all-reduce over MPI across nodes")
            )
        return FrameworkChoice(
            primary="tensorflow",
            stack=["tensorflow"],
            alternatives=alts,
            rationale="The team runs TensorFlow and the model states fit one GPU, so "
            f"{'MultiWorkerMirroredStrategy' if multi_node else 'MirroredStrategy'} keeps their stack.",
            citations=_cite("tensorflow", "horovod"),
        )

    alternatives = [
        Alternative(
            name="pytorch_fsdp",
            reason="native PyTorch sharding (like ZeRO-3) launched with torchrun",
        ),
        Alternative(
            name="horovod", reason="all-reduce data parallelism only; no sharding of model states"
        ),
    ]
    if brief.team.existing_stack == "tensorflow":
        rationale = (
            f"The model states do not fit one GPU with replicas ({chosen} chosen), and TensorFlow has "
            "no ZeRO-3-style sharding; DeepSpeed on PyTorch is the practical path despite the stack change."
        )
        return FrameworkChoice(
            primary="deepspeed",
            stack=["pytorch", "deepspeed"],
            alternatives=[
                Alternative(
                    name="tensorflow", reason="keeps the stack but cannot shard model states"
                )
            ],
            rationale=rationale,
            citations=_cite("deepspeed", "tensorflow"),
        )
    if fits_replicated and brief.team.experience == "expert" and hardware.gpus_per_node > 1:
        return FrameworkChoice(
            primary="pytorch_ddp",
            stack=["pytorch", "pytorch_ddp"],
            alternatives=[
                Alternative(
                    name="deepspeed", reason="one JSON config for precision and accumulation"
                )
            ]
            + alternatives[1:],
            rationale="Parameters, gradients and optimizer states fit every GPU, and DDP is the simplest and "
            "fastest way to use them for a team that knows PyTorch well.",
            citations=_cite("pytorch"),
        )
    if fits_replicated:
        rationale = (
            "The model fits with full replicas, so DeepSpeed runs it as plain data parallelism (ZeRO "
            "stage 0); its one JSON config carries precision, accumulation and checkpointing unchanged "
            "from this machine to a cluster, which suits a team that wants fewer moving parts."
        )
        alternatives.insert(
            0, Alternative(name="pytorch_ddp", reason="same parallelism, no extra dependency")
        )
    else:
        rationale = (
            f"The model states do not fit one GPU as replicas; DeepSpeed {chosen} shards them across "
            f"{hardware.world_size} ranks and keeps the launch and config in one place."
        )
    return FrameworkChoice(
        primary="deepspeed",
        stack=["pytorch", "deepspeed"],
        alternatives=alternatives,
        rationale=rationale,
        citations=_cite("deepspeed", "pytorch"),
    )
