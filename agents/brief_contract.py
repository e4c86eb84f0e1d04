"""The brief is the contract: tool arguments may not change its model or hardware.

A researcher's tool call that names other hardware or another model is refused with the call
to make instead; nothing in the workspace changes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from agents.workspace import Workspace
from tools.core.errors import InputError, shown
from tools.core.schemas import HardwareSpec, ModelParams, ModelShape, ModelSpec


class ModelConfigError(InputError):
    """The brief's model could not be read: the user gets the detail, the model one generic line.

    What goes back to a (possibly remote) chat model must not tell it which files exist on this
    machine, so ``tool_message`` (agents/loop.py sends it instead of the detail) does not say
    whether a path is missing, a folder, unreadable or malformed.
    """

    def __init__(self, detail: InputError, ref: str) -> None:
        super().__init__(detail.field, detail.message)
        self.tool_message = f"model: {shown(ref)} is not a catalog model or a readable model config"


# ---- the brief is the contract: tool arguments may not change its model or hardware ----------


def _hardware_key(hw: HardwareSpec) -> tuple[Any, ...]:
    return (hw.nodes, hw.gpus_per_node, hw.gpu.name if hw.gpu else None, hw.interconnect)


def brief_hardware(ws: Workspace, spec: str, interconnect: str | None) -> HardwareSpec:
    """The brief's hardware, if ``spec``/``interconnect`` name it; else the tool-call error.

    The arguments may spell the brief's hardware differently (an alias, the link a single node
    has anyway) but must resolve to the same machine; nothing in the workspace changes otherwise.
    """
    from tools.research.hardware import hardware_for_brief, parse_hardware

    brief = ws.brief
    expected = hardware_for_brief(brief)
    same_text = spec.strip().lower() == brief.hardware.strip().lower() and interconnect in (
        None,
        brief.interconnect,
    )
    if not same_text:
        local = "local" in (spec.strip().lower(), brief.hardware.strip().lower())
        asked = None if local else parse_hardware(spec, interconnect or brief.interconnect)
        if asked is None or _hardware_key(asked) != _hardware_key(expected):
            wanted = f"spec={brief.hardware!r}" + (
                f", interconnect={brief.interconnect!r}" if brief.interconnect else ""
            )
            raise InputError(
                "spec",
                f"{shown(spec)}"
                + (f" with interconnect {shown(interconnect)}" if interconnect else "")
                + f" is not the brief's hardware; the brief is the contract: call "
                f"profile_hardware with {wanted}",
            )
    return expected


def _same_model(asked: str | ModelParams | ModelShape, ref: Any) -> bool:
    from tools.research.model_catalog import catalog_id

    if isinstance(asked, str) and isinstance(ref, str):
        if asked.strip() == ref.strip():
            return True
        ids = catalog_id(asked), catalog_id(ref)
        return ids[0] is not None and ids[0] == ids[1]
    if isinstance(asked, BaseModel) and isinstance(ref, BaseModel):
        return type(asked) is type(ref) and asked.model_dump() == ref.model_dump()
    return False


def brief_model(ws: Workspace, model: str | ModelParams | ModelShape, seq_len: int) -> ModelSpec:
    """The brief's model, if the arguments name it; else the tool-call error.

    Another model, config path or sequence length is refused before anything is read: a tool
    call cannot make the plan about another model, nor probe which files exist here.
    """
    from tools.research.model_catalog import brief_model

    brief = ws.brief
    if brief.model is None:
        raise InputError("model", "this brief trains no model; do not call lookup_model")
    wanted = brief.model if isinstance(brief.model, str) else brief.model.model_dump()
    if not _same_model(model, brief.model) or seq_len != brief.seq_len:
        asked = model if isinstance(model, str) else model.model_dump()
        raise InputError(
            "model",
            f"{shown(asked)} at seq_len {str(seq_len)[:12]} is not the brief's model; the brief "
            f"is the contract: call lookup_model with model={shown(wanted, 200)} and "
            f"seq_len={brief.seq_len}",
        )
    try:
        return brief_model(brief)
    except InputError as exc:
        if isinstance(brief.model, str):
            raise ModelConfigError(exc, brief.model) from None
        raise
