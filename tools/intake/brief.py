"""Turn a brief file, a dict or a free-text request into a validated TrainingBrief."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError

from tools.core.errors import InputError, shown
from tools.core.schemas import Deployment, Precision, Task, TrainingBrief
from tools.intake.budget_text import price_reading
from tools.intake.hardware_text import (
    HARDWARE_ASSUMED,
    HARDWARE_REFUSED,
    HARDWARE_UNCLEAR,
    hardware_fields,
)
from tools.intake.model_sizes import read_size
from tools.intake.model_text import ModelReading, read_model
from tools.intake.numbers_text import number_reads
from tools.intake.readings import MODEL_ASSUMED, NUMBER_NOTES
from tools.intake.serving_text import serving_fields, serving_follow_up
from tools.intake.wishes import distill_pair, wish_fields
from tools.intake.words import AGENT_APP, DEPLOYMENT, TASKS, TEAM, TRAINING

MAX_BRIEF_BYTES = 1_000_000
# Longer requests make the regexes below quadratic (a 100k-digit run took minutes); a request
# is a few sentences.
MAX_REQUEST_CHARS = 4000
DEFAULT_SEQ_LEN = TrainingBrief.model_fields["seq_len"].default
# The brief fields the number readers (tools/intake/numbers_text.py) set; their other readings
# are wishes (a deadline, a money budget, a micro-batch) that the request accounting lists.
_NUMBER_FIELDS = ("seq_len", "global_batch_size", "dataset_tokens", "precision")
# The request-field keys that are not brief fields: removed before validation.
_PRIVATE_KEYS = (HARDWARE_UNCLEAR, HARDWARE_ASSUMED, HARDWARE_REFUSED, MODEL_ASSUMED, NUMBER_NOTES)


def _first_error(exc: ValidationError, prefix: str = "brief") -> InputError:
    """Collapse pydantic's report into one line naming the first bad field."""
    errors = exc.errors()
    # A union field (model) reports one error per member; the member-type mismatches say
    # little, so prefer an error from inside the member the user meant: a mapping without
    # `params` means a shape, not a size that lacks its count.
    mismatch = {"string_type", "model_type", "model_attributes_type", "dict_type"}

    no_params = any(
        e.get("type") == "missing" and tuple(e.get("loc", ())) == ("model", "ModelParams", "params")
        for e in errors
    )
    meant = [e for e in errors if not (no_params and e.get("loc", ())[1:2] == ("ModelParams",))]
    err = next((e for e in meant if e.get("type") not in mismatch), None)
    err = err or next((e for e in errors if e.get("type") not in mismatch), errors[0])
    member = ("ModelParams", "ModelShape", "str", "function-after")
    loc = [str(p) for p in err.get("loc", ()) if not str(p).startswith(member)]
    field = ".".join([prefix, *loc]) if loc else prefix
    msg = err.get("msg", "invalid value")
    if err.get("type") == "missing":
        msg = "is required"
    elif err.get("type") == "extra_forbidden":
        msg = "is not a brief field (the README lists the brief format)"
    value = err.get("input")
    if (
        err.get("type") not in {"missing", "extra_forbidden"}
        and isinstance(value, str | int | float)
        and not isinstance(value, bool)
    ):
        msg = f"{msg} (got {shown(value, 60) if isinstance(value, str) else _number(value)})"
    return InputError(shown_field(field), msg.replace("Value error, ", ""))


def _number(value: int | float) -> str:
    """A number for an error line: a 5000-digit integer as its first digits and its length."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"


def shown_field(field: str) -> str:
    """A field path for an error line; an unknown key a brief invented is cut and escaped."""
    return field if field.isprintable() and len(field) <= 80 else shown(field, 60)


def brief_from_dict(data: Any) -> TrainingBrief:
    """Validate a mapping as a TrainingBrief, raising InputError naming the first bad field."""
    if not isinstance(data, dict):
        raise InputError("brief", f"must be a mapping of brief fields, got {type(data).__name__}")
    if data.get("model") is None and data.get("task") != "agent-app":
        raise InputError("brief.model", "is required (only an agent-app brief may omit it)")
    try:
        return TrainingBrief.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None


class _DuplicateKey(ValueError):
    """A key given twice in one mapping of a brief: which value was meant is unknowable."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the base class reports it
                break
            if duplicate:
                raise _DuplicateKey(
                    f"key {shown(key, 60)} appears twice (line {key_node.start_mark.line + 1})"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(f"key {shown(key, 60)} appears twice")
        data[key] = value
    return data


def _parse_brief_text(text: str, *, json_file: bool) -> Any:
    """The brief's data: JSON or YAML (safe types only), every key at most once per mapping."""
    if json_file:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_brief(path: str | Path) -> TrainingBrief:
    """Read a YAML or JSON brief file."""
    p = Path(path)
    try:
        if not p.is_file():
            raise InputError("--brief", f"no such file: {shown(p, 120)}")
        if p.stat().st_size > MAX_BRIEF_BYTES:
            raise InputError("--brief", f"{shown(p, 120)} is larger than {MAX_BRIEF_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("--brief", f"{shown(p, 120)} is not UTF-8 text") from None
    except (OSError, ValueError) as exc:  # a name too long, a NUL, no permission
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise InputError("--brief", f"cannot read {shown(p, 120)}: {why}") from None
    try:
        data = _parse_brief_text(text, json_file=p.suffix.lower() == ".json")
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        if isinstance(exc, json.JSONDecodeError):
            line = exc.lineno - 1
        where = f" (line {line + 1})" if line is not None else ""
        raise InputError("--brief", f"{shown(p, 120)} is not valid YAML/JSON{where}") from None
    except _DuplicateKey as exc:
        raise InputError("--brief", f"{shown(p, 120)}: {exc}") from None
    except RecursionError:
        raise InputError(
            "--brief", f"{shown(p, 120)} is nested too deeply (a brief is a few levels deep)"
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise InputError("--brief", f"{shown(p, 120)}: {str(exc).split(';')[0]}") from None
    if data is None:
        raise InputError("--brief", f"{p} is empty")
    return brief_from_dict(data)


# A bare size, accepted only as the answer to "which model?": "7B", "1.3 billion parameters".
_BARE_SIZE_RE = re.compile(
    r"^\s*(?:an?\s+)?(\d+(?:\.\d+)?)\s*([bm])(?:illion)?(?:\s*param(?:eter)?s?)?\s*$", re.I
)
_SIZE_RE = re.compile(
    r"^\s*(?:an?\s+)?(\d+(?:\.\d+)?)\s*([bm])(?:illion)?(?:\s*param(?:eter)?s?)?\s*$", re.I
)
_BATCH_RE = re.compile(r"(?:global\s+)?batch(?:\s+size)?\s*(?:of|=|:)?\s*(\d+)", re.I)
_SIZE_RE = re.compile(
    r"\b(\d+(?:\.\d+)?)\s*([bm])(?:illion)?\s*(?:param(?:eter)?s?)?\s*model\b", re.I
)
# One clarifying question per essential field a request can lack (graph intake asks it).
# What a good answer looks like, for the question and for the error when none came.
ANSWER_HINTS = {
    "model": "a catalog model (e.g. llama-3-8b, gpt2), a size (e.g. 'a 7B model') "
    "or the path to a Hugging Face config.json",
    "hardware": "the GPUs as a count and a catalog type (e.g. '4 A100 40GB', '2 nodes of 8 "
    "H100'), NODESxGPUSxTYPE (e.g. 2x8xH100-80GB) or 'this machine'",
}
QUESTIONS = {
    "model": f"Which model should this plan train? Name {ANSWER_HINTS['model']}.",
    "hardware": f"Which hardware should this plan target? Give {ANSWER_HINTS['hardware']}.",
}


def question_for(field: str, fields: dict[str, Any]) -> str:
    """The clarifying question about ``field``; for the hardware, what was read and what was not."""
    if field == "hardware" and fields.get(HARDWARE_UNCLEAR):
        return (
            f"I could not fully read the hardware: {fields[HARDWARE_UNCLEAR]}. {QUESTIONS[field]}"
        )
    return QUESTIONS[field]


def parse_request(text: str, known_models: list[str]) -> TrainingBrief:
    """Read a free-text request ("fine-tune llama-3-8b on 8 A100s") into a brief.

    Offline and deterministic: recognises catalog model names, model sizes ("a 7B model"),
    GPU counts and types, sequence length, batch size, task words, the team's experience and
    stack, and where the model will be deployed. A training request without a model is an
    input error, since every number downstream depends on it; an agent application (an
    assistant, a multi-agent app) trains nothing and needs none.
    """
    return brief_from_request(request_fields(text, known_models))


def model_reading(text: str, known_models: list[str]) -> ModelReading | None:
    """How ``request_fields`` read a model the text does not name by catalog id, else None.

    Its ``note`` says what a name was read as ("read 'lama-3-8b' as llama-3-8b"), its
    ``question`` which models an unclear name could be.
    """
    if _catalog_name(text, known_models):
        return None
    return read_model(text)


def missing_field(fields: dict[str, Any]) -> str | None:
    """The essential field parsed request fields lack (a key of ``QUESTIONS``), or None."""
    if fields.get("model") is None and fields.get("task") != "agent-app":
        return "model"
    if fields.get(HARDWARE_UNCLEAR):
        return "hardware"
    return None


def hardware_refusal(fields: dict[str, Any]) -> InputError | None:
    """The one-line refusal for hardware no plan can target (an A40, a Gaudi, an Ascend 910B).

    It names what was read and the GPU types trainwright plans for; intake raises it instead
    of asking, so no other machine is ever planned in its place. None when there is none.
    """
    if not fields.get(HARDWARE_REFUSED):
        return None
    return InputError("request", f"hardware unclear: {fields[HARDWARE_REFUSED]}")


def brief_from_request(fields: dict[str, Any]) -> TrainingBrief:
    """Validate the fields ``request_fields`` read; a training request without a model is an input error."""
    if missing_field(fields) == "model":
        reading = read_model(str(fields.get("goal") or ""))
        if reading is not None and reading.question:
            raise InputError("request", f"{reading.question}; say which or use --brief")
        raise InputError(
            "request",
            "names no model; say which (e.g. 'llama-3-8b', 'gpt2', 'a 7B model') or use --brief",
        )
    if (refused := hardware_refusal(fields)) is not None:
        raise refused
    if fields.get(HARDWARE_UNCLEAR):
        raise InputError(
            "request",
            f"hardware unclear: {fields[HARDWARE_UNCLEAR]}; name it (e.g. '4 A100 40GB', "
            "'2 nodes of 8 H100', 'on this machine') or use --brief",
        )
    data = {k: v for k, v in fields.items() if k not in _PRIVATE_KEYS}
    if "seq_len" not in data and isinstance(data.get("model"), str):
        # No length given: the default, but never past the model's position table (gpt2: 1024).
        from tools.research.model_catalog import lookup_model

        spec = lookup_model(data["model"], 1)
        cfg = spec.hf_config or {}
        limit = cfg.get("n_positions") or cfg.get("max_position_embeddings")
        if (positions := conv_positions(spec.name, spec.params, cfg)) is not None:
            limit = positions
        if cfg.get("image_size") and cfg.get("patch_size"):
            # A vision transformer's sequence is its patches plus the class token.
            limit = (int(cfg["image_size"]) // int(cfg["patch_size"])) ** 2 + 1
        if isinstance(limit, int) and limit < DEFAULT_SEQ_LEN:
            data["seq_len"] = limit
    return brief_from_dict(data)


def conv_positions(name: str, params: int, config: dict[str, Any]) -> int | None:
    """A convolutional network's sample length for the planner: FLOPs-equivalent positions.

    The speed model costs a sample 6·N FLOPs per position; a convolutional network reuses
    each weight at every position of its feature maps, so its published forward
    multiply-accumulates per image (``forward_macs`` in the catalog, e.g. 4.1e9 for
    ResNet-50) over N give the positions that make that cost right (160 for ResNet-50).
    None for a model that is not convolutional or has no published figure.
    """
    from tools.research.architectures import is_convolutional
    from tools.research.model_catalog import load_model_catalog

    macs = load_model_catalog().get(name, {}).get("forward_macs")
    if not is_convolutional(config) or not macs or params <= 0:
        return None
    return max(1, round(float(macs) / params))


def merge_answer(
    fields: dict[str, Any], field: str, answer: str, known_models: list[str]
) -> dict[str, Any]:
    """Fold the answer to the clarifying question about ``field`` into a request's fields.

    The answer goes through the same parser as the request; what it states wins (it is the
    newer word), except the goal, which stays the request's, and ``agent-app``, which an
    answer naming a model cannot mean. An answer that still leaves ``field`` open is an input
    error naming the field.
    """
    said = request_fields(answer, known_models) if answer.strip() else {}
    said.pop("goal", None)
    if said.get("task") == "agent-app":
        del said["task"]
    if field == "model" and "model" not in said:
        text = answer.strip()
        if _BARE_SIZE_RE.match(text) and (sized := read_size(f"{text} model")) is not None:
            said.update(_model_fields(sized))  # "7B": as "a 7B model" reads, said as assumed
        elif text.lower().endswith(".json"):
            said["model"] = text
    merged = {**fields, **said}
    if field == "hardware" and "hardware" in said and not said.get(HARDWARE_UNCLEAR):
        merged.pop(HARDWARE_UNCLEAR, None)  # answered: the request's unclear phrase is settled
        merged.pop(HARDWARE_REFUSED, None)
    if missing_field(merged) == field:
        raise InputError(
            field,
            f"the answer {answer.strip()[:80]!r} names no {field}; give {ANSWER_HINTS[field]}",
        )
    if answer.strip():
        merged["goal"] = f"{fields.get('goal', '')} ({field}: {answer.strip()[:200]})".strip()
    return merged


def request_fields(text: str, known_models: list[str]) -> dict[str, Any]:
    """The brief fields a free-text request states, not yet validated (the model may be missing)."""
    if not text or not text.strip():
        raise InputError(
            "request", "is empty; describe what to train, e.g. 'fine-tune llama-3-8b on 8xA100'"
        )
    if len(text) > MAX_REQUEST_CHARS:
        raise InputError(
            "request",
            f"is {len(text)} characters; keep it under {MAX_REQUEST_CHARS} or use --brief",
        )
    low = text.lower()
    data: dict[str, Any] = {"goal": text.strip()[:500]}

    pair = distill_pair(text)
    if pair is not None and (student := _catalog_name(pair[1], known_models)):
        data["model"] = student  # "distill llama-3-70b into llama-3-8b": the student is trained
    elif name := _catalog_name(text, known_models):
        data["model"] = name
    elif (reading := read_model(text)) is not None and reading.value is not None:
        # An alias, a GPT-style size, a confident close match, or a size ("a 70B policy").
        data.update(_model_fields(reading))
    elif m := _SIZE_RE.search(text):
        scale = 1e9 if m.group(2).lower() == "b" else 1e6
        data["model"] = {"params": float(m.group(1)) * scale}
    agent_app = bool(AGENT_APP.search(text)) and not TRAINING.search(text)
    if agent_app:
        data["task"] = "agent-app"
    data.update(hardware_fields(text))
    reads, batch_notes = number_reads(text, DEFAULT_SEQ_LEN)
    data.update({r.field: r.value for r in reads if r.field in _NUMBER_FIELDS})
    if batch_notes:
        data[NUMBER_NOTES] = batch_notes
    for task, pattern in TASKS if not agent_app else ():
        if re.search(pattern, low):
            data["task"] = task
            break
    team: dict[str, str] = {}
    for key, value, pattern in TEAM:
        if key not in team and re.search(pattern, low):
            team[key] = value
    if team:
        data["team"] = team
    for deployment, pattern in DEPLOYMENT:
        if re.search(pattern, low):
            data["deployment"] = deployment
            break
    if re.search(r"\bno smoke\b|\bwithout (?:a )?smoke", low):
        data["smoke"] = False
    data.update(wish_fields(text))
    # Serving a model is its own plan (tools/intake/serving_text.py).
    data.update(serving_fields(text, data))
    if (price := price_reading(text)) is not None:
        data["price_per_gpu_hour"] = price.value
    return data


def _model_fields(reading: ModelReading) -> dict[str, Any]:
    """The brief's model a reading gives, with its assumption line when the words named none."""
    fields: dict[str, Any] = {"model": reading.value}
    if (assumption := reading.assumption) is not None:
        fields[MODEL_ASSUMED] = [f"intake: {assumption.line()}"]
    return fields


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


def _squash(s: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", s.lower())


def _catalog_name(name: str, known_models: list[str]) -> str | None:
    """The catalog id a model name means ("Meta-Llama-3-8B-Instruct" -> llama-3-8b), or None."""
    flat = _squash(name)
    for known in sorted(known_models, key=len, reverse=True):
        if _squash(known) and _squash(known) in flat:
            return known
    return None


def _llm_field(key: str, value: Any, known_models: list[str]) -> dict[str, Any]:
    """One field an LLM read, checked as a brief field; InputError names what is wrong."""
    if key == "model":
        if not isinstance(value, str):
            raise InputError("model", f"must be a model name (got {value!r})")
        name = _catalog_name(value, known_models)
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


# A follow-up that counts GPUs or nodes without naming a type: "what if I only had 4 GPUs?".
_GPU_COUNT_RE = re.compile(r"\b(\d+)\s*(?:x\s*)?gpus?\b", re.I)
_NODE_COUNT_RE = re.compile(r"\b(\d+)\s*nodes?\b", re.I)
_SPEC_RE = re.compile(r"^\s*(?:(\d+)x)?(\d+)x(.+?)\s*$", re.I)


def follow_up_fields(text: str, brief: dict[str, Any], known_models: list[str]) -> dict[str, Any]:
    """The brief fields a follow-up ("what if I only had 4 GPUs?") changes in ``brief``.

    The follow-up goes through the request parser; a GPU or node count without a GPU type
    keeps the brief's type ("4 GPUs" on 1x8xA100-80GB -> 1x4xA100-80GB; "2 nodes" keeps the
    GPUs per node). The goal stays the brief's. Merge the result over the brief.
    """
    said = request_fields(text, known_models)
    said.pop("goal", None)
    said.pop(HARDWARE_ASSUMED, None)
    said.pop(MODEL_ASSUMED, None)
    said.pop(NUMBER_NOTES, None)
    said.pop(HARDWARE_REFUSED, None)
    unclear = said.pop(HARDWARE_UNCLEAR, None)
    said = {**serving_follow_up(text, {**brief, **said}), **said}
    if said.get("task") == "agent-app" and brief.get("model") is not None:
        del said["task"]  # "my assistant" in a follow-up does not drop the model
    spec = _SPEC_RE.match(str(brief.get("hardware") or ""))
    if "hardware" not in said and spec:
        nodes, per_node, gpu = int(spec[1] or 1), int(spec[2]), spec[3]
        node_count, gpu_count = _NODE_COUNT_RE.search(text), _GPU_COUNT_RE.search(text)
        if node_count:
            nodes = int(node_count[1])
            if gpu_count:  # "2 nodes of 4 GPUs": the count is per node
                per_node = int(gpu_count[1])
        elif gpu_count:
            total = int(gpu_count[1])
            # "N GPUs" is the total: whole nodes of the brief's size when it divides, else one node.
            nodes, per_node = (
                (total // per_node, per_node)
                if total > per_node and total % per_node == 0
                else (1, total)
            )
        if (nodes, per_node) != (int(spec[1] or 1), int(spec[2])):
            said["hardware"] = f"{nodes}x{per_node}x{gpu}"
        if node_count or gpu_count:
            unclear = None  # a count of the brief's own GPUs
    if unclear:
        raise InputError("hardware", f"unclear: {unclear}; name the GPUs (e.g. '4 A100 40GB')")
    return said
