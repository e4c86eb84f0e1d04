"""A chat model's reading of a request: brief fields it may fill, each checked as a brief's.

The rules' reading (tools/intake/brief.py ``request_fields``) wins where the two disagree.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tools.core.errors import InputError
from tools.core.schemas import Deployment, Precision, Task
from tools.intake.brief import catalog_name
from tools.intake.brief_load import brief_from_dict
from tools.intake.model_text import read_model


class RequestBrief(BaseModel):
    """Read a request to train (or serve) a model into brief fields.

    Fill only what the request says, converting words to values ("four thousand token
    context" -> seq_len 4096, "eight 80 GB A100s on one node" -> hardware 1x8xA100-80GB);
    leave every field the request does not mention null. Never guess a value.
    """

    model: str | None = Field(
        default=None,
        description="The model to train: a catalog id such as llama-3-8b, llama-2-7b, "
        "mistral-7b, qwen2.5-7b, gpt2, or the path to a Hugging Face config.json",
    )
    model_params_b: float | None = Field(
        default=None,
        description="Only when the request gives a size but no model name: billions of "
        "parameters (a 7B model -> 7)",
    )
    task: Task | None = Field(default=None, description="What to do with the model")
    seq_len: int | None = Field(default=None, description="Sequence length (context) in tokens")
    global_batch_size: int | None = Field(default=None, description="Sequences per optimizer step")
    hardware: str | None = Field(
        default=None,
        description="NODESxGPUSxTYPE, e.g. 1x4xA100-80GB (one node of four 80 GB A100s) or "
        "2x8xH100-80GB; 'local' for this machine",
    )
    precision: Precision | None = Field(default=None, description="Training number format")
    deployment: Deployment | None = Field(
        default=None, description="Where the trained model will be used"
    )


def _llm_field(key: str, value: Any, known_models: list[str]) -> dict[str, Any]:
    """One field an LLM read, checked as a brief field; InputError names what is wrong."""
    if key == "model":
        if not isinstance(value, str):
            raise InputError("model", f"must be a model name (got {value!r})")
        name = catalog_name(value, known_models)
        if name is None and (reading := read_model(value)) is not None:
            name = reading.model  # "T5-XL", "a 1.3B GPT", "lama-3-8b": as the parser reads them
        if name is None and not value.strip().lower().endswith(".json"):
            raise InputError("model", f"{value!r} is not a catalog model or a config.json path")
        return {"model": name or value.strip()}
    if key == "model_params_b":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError("model_params_b", f"must be a number (got {value!r})")
        value = {"params": float(value) * 1e9}
        key = "model"
    elif key == "hardware" and isinstance(value, str) and value.strip().lower() != "local":
        from tools.research.hardware import parse_hardware

        parse_hardware(value)
    if key == "model":
        brief_from_dict({"model": value})
        return {"model": value}
    # The same validation as a brief file's field; a stand-in model satisfies the one rule
    # that ties fields together.
    brief = brief_from_dict({"model": {"params": 1.0}, key: value})
    return {key: getattr(brief, key)}


def llm_request_fields(data: Any, known_models: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Check the ``RequestBrief`` fields an LLM read, one by one: the good ones and what was dropped.

    Each value goes through the same validation as a brief's (``brief_from_dict``, and
    ``parse_hardware`` for the hardware), so a bad value is dropped with the same message a
    brief file would get, and the other fields are kept. A model name is mapped onto the
    catalog; a size counts only when no name was given.
    """
    if not isinstance(data, dict):
        return {}, [f"the reply is not an object of fields (got {type(data).__name__})"]
    fields: dict[str, Any] = {}
    dropped = [f"{k}: is not a request field" for k in data if k not in RequestBrief.model_fields]
    for key in RequestBrief.model_fields:
        value = data.get(key)
        if value is None or value == "" or (key == "model_params_b" and "model" in fields):
            continue
        try:
            fields.update(_llm_field(key, value, known_models))
        except InputError as exc:
            dropped.append(str(exc))
    return fields, dropped


def merge_read_fields(
    parsed: dict[str, Any], read: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The parser's request fields, with what an LLM read filling the ones the parser did not find.

    Where both found a value and they differ, the parser's wins: it copies what the text says
    (a number it matched is the user's own digits, a model it matched is a catalog name in
    the text), while an LLM may round, convert or guess ("4k" -> 4000, "a 7B model" ->
    llama-2-7b). Returns the merged fields and one line per disagreement.
    """
    merged = {**read, **parsed}
    disagreements = [
        f"{key}: kept {parsed[key]!r} from the text over the LLM's {value!r}"
        for key, value in read.items()
        if key in parsed and parsed[key] != value
    ]
    return merged, disagreements
