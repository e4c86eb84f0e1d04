"""Turn a free-text request into a validated TrainingBrief; brief files and dicts too.

Files and dicts are read in brief_load.py (re-exported here), a chat model's reading of a
request is checked in llm_reading.py.
"""

from __future__ import annotations

import re
from typing import Any

from tools.core.errors import InputError
from tools.core.schemas import TrainingBrief

# Re-exported: callers load briefs through this module, requests and files alike.
from tools.intake.brief_load import brief_from_dict as brief_from_dict
from tools.intake.brief_load import load_brief as load_brief
from tools.intake.budget_text import price_reading
from tools.intake.hardware_text import (
    HARDWARE_ASSUMED,
    HARDWARE_REFUSED,
    HARDWARE_UNCLEAR,
    SPEC_RE,
    hardware_fields,
)
from tools.intake.model_sizes import read_size
from tools.intake.model_text import ModelReading, family_in, read_model, variant_named
from tools.intake.numbers_text import number_reads
from tools.intake.optim_text import optim_fields
from tools.intake.parallel_words import parallel_pins
from tools.intake.readings import MODEL_ASSUMED, NUMBER_NOTES
from tools.intake.recipe_text import recipe_text_fields
from tools.intake.run_text import run_fields
from tools.intake.serving_text import serving_fields
from tools.intake.shape_text import shape_model
from tools.intake.spelt_text import spelt_numbers
from tools.intake.wishes import distill_pair, wish_fields
from tools.intake.words import AGENT_APP, DEPLOYMENT, TASKS, TEAM, TRAINING

# Longer requests make the regexes below quadratic (a 100k-digit run took minutes); a request
# is a few sentences.
MAX_REQUEST_CHARS = 4000
DEFAULT_SEQ_LEN = TrainingBrief.model_fields["seq_len"].default
# The brief fields the number readers (tools/intake/numbers_text.py) set; their other readings
# are wishes (a deadline, a money budget, a micro-batch) that the request accounting lists.
_NUMBER_FIELDS = (
    "seq_len",
    "global_batch_size",
    "dataset_tokens",
    "precision",
    "learning_rate",
    "warmup_steps",
    "train_steps",
    "save_every",
    "keep_checkpoints",
)
# The request-field keys that are not brief fields: removed before validation.
_PRIVATE_KEYS = (HARDWARE_UNCLEAR, HARDWARE_ASSUMED, HARDWARE_REFUSED, MODEL_ASSUMED, NUMBER_NOTES)


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
    if catalog_name(text, known_models):
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
    return brief_from_dict(with_model_seq_len(data))


def with_model_seq_len(data: dict[str, Any]) -> dict[str, Any]:
    """Brief fields with the model's own sample length where none is given (``default_seq_len``).

    One rule for a request, a brief file and ``estimate``: gpt2 takes its 1024 positions, an
    image model one image; the account names it as assumed. An unknown model is left as it is:
    the researcher's lookup says so.
    """
    model = data.get("model")
    if "seq_len" in data or not isinstance(model, str):
        return data
    try:
        limit = default_seq_len(model)
    except InputError:
        return data
    return data if limit is None else {**data, "seq_len": limit}


def default_seq_len(model: str) -> int | None:
    """The sample length of a catalog model when none is given, if not the planner's default.

    Never past the model's position table (gpt2: 1024); an image model's sample is one image:
    a vision transformer's patches plus the class token, a convolutional network's
    FLOPs-equivalent positions (``conv_positions``).
    """
    from tools.research.model_catalog import lookup_model

    spec = lookup_model(model, 1)
    cfg = spec.hf_config or {}
    limit = image_seq_len(spec.name, spec.params, cfg)
    if limit is None:
        limit = cfg.get("n_positions") or cfg.get("max_position_embeddings")
    return limit if isinstance(limit, int) and limit < DEFAULT_SEQ_LEN else None


def image_seq_len(name: str, params: int, config: dict[str, Any]) -> int | None:
    """An image model's sample length (one image), None for a model that does not take pixels.

    A vision transformer: its patches plus the class token; a convolutional network: its
    FLOPs-equivalent positions (``conv_positions``).
    """
    from tools.research.vision_shapes import vit_positions

    if (patches := vit_positions(config)) is not None:
        return patches
    return conv_positions(name, params, config)


def conv_positions(name: str, params: int, config: dict[str, Any]) -> int | None:
    """A convolutional network's sample length for the planner: FLOPs-equivalent positions.

    The memory model costs a sample's activations per position; a convolutional network
    reuses each weight at every position of its feature maps, so its forward
    multiply-accumulates per image over N give the positions (160 for ResNet-50): counted
    from its layer shapes (tools/research/vision_shapes.py) where the architecture is known,
    else the catalog's published ``forward_macs``. None for a model that is not
    convolutional or has neither.
    """
    from tools.research.architectures import is_convolutional
    from tools.research.model_catalog import load_model_catalog
    from tools.research.vision_shapes import conv_net

    net = conv_net(config)
    macs = net.forward_macs if net else load_model_catalog().get(name, {}).get("forward_macs")
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
    data: dict[str, Any] = {"goal": text.strip()[:500]}
    text = spelt_numbers(text)  # "twenty billion tokens" as digits, in place (count_words.py)
    low = text.lower()

    pair, named, reading = distill_pair(text), None, None
    if pair is not None and (student := catalog_name(pair[1], known_models)):
        data["model"] = student  # "distill llama-3-70b into llama-3-8b": the student is trained
    elif named := catalog_name(text, known_models):
        data["model"] = named
        if (variant := variant_named(text, named)) is not None:
            # "Llama-3-8B-Instruct": its weights; "qwen2.5-7b-instruct": the catalog's, said
            data["model"], note = variant
            if note is not None:
                data[MODEL_ASSUMED] = [f"intake: {note}"]
    elif (reading := read_model(text)) is not None and reading.value is not None:
        # An alias, a GPT-style size, a confident close match, or a size ("a 70B policy").
        data.update(_model_fields(reading))
    elif m := _SIZE_RE.search(text):
        scale = 1e9 if m.group(2).lower() == "b" else 1e6
        data["model"] = {"params": float(m.group(1)) * scale}
    # "a 2-layer 128-hidden llama": the family is the shape's, when no model was read
    family = family_in(text) if not named and (reading is None or reading.value is None) else None
    if (shape := shape_model(text, named or None, family)) is not None:
        # "24 layers, hidden 2048, 16 heads": that shape, not the model a size or name stood for.
        data["model"], notes = shape
        data.pop(MODEL_ASSUMED, None)
        if notes:
            data[MODEL_ASSUMED] = [f"intake: {line}" for line in notes]
    agent_app = bool(AGENT_APP.search(text)) and not TRAINING.search(text)
    if agent_app:
        data["task"] = "agent-app"
    data.update(hardware_fields(text))
    reads, batch_notes = number_reads(text, DEFAULT_SEQ_LEN)
    data.update({r.field: r.value for r in reads if r.field in _NUMBER_FIELDS})
    if (batch := accumulated_batch(reads, data.get("hardware"))) is not None:
        data["global_batch_size"], line = batch
        batch_notes.append(line)
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
    if micro := next((r.value for r in reads if r.field == "micro-batch"), None):
        data["pins"] = {**data.get("pins", {}), "micro_batch": micro}  # a setup dimension
    if pins := parallel_pins(text, data.get("hardware"), data.get("pins", {})):
        data["pins"] = pins  # "data parallelism only", "TP only", "4-way DP" (parallel_words.py)
    # Serving a model is its own plan (tools/intake/serving_text.py).
    data.update(serving_fields(text, data))
    data.update(recipe_text_fields(text, data.get("task")))
    data.update(optim_fields(text, data.get("task")))  # weight decay, clipping, betas, decay, eval
    data.update(run_fields(text))  # seed, W&B project, data path, LoRA alpha
    if data.get("task") != "lora":
        data.pop("lora_alpha", None)  # an alpha outside LoRA stays listed as not understood
    if (price := price_reading(text)) is not None:
        data["price_per_gpu_hour"] = price.value
    return data


def accumulated_batch(reads: list[Any], hardware: str | None) -> tuple[int, str] | None:
    """The global batch a micro-batch (and gradient accumulation) give on the named GPUs.

    Only when the request names a micro-batch and no global batch: micro x accumulation (1
    when not named, as the Hugging Face Trainer's default) x every GPU, data parallel over all
    of them, with the line saying so; a tensor or pipeline split then accumulates more
    micro-batches to keep that batch (the plan says which it runs).
    """
    by = {r.field: r for r in reads}
    micro, accum = by.get("micro-batch"), by.get("grad-accum")
    spec = SPEC_RE.match(hardware or "")
    if micro is None or "global_batch_size" in by or spec is None:
        return None
    gpus = int(spec[1] or 1) * int(spec[2])
    steps = int(accum.value) if accum is not None else 1
    batch = int(micro.value) * steps * gpus
    named = "" if accum is not None else " (none named: 1)"
    return batch, (
        f"intake: global batch {batch} = micro-batch {micro.value} x gradient accumulation "
        f"{steps}{named} x {gpus} GPUs (data parallel over every GPU; a tensor or pipeline "
        "split accumulates more micro-batches to keep this batch)"
    )


def _model_fields(reading: ModelReading) -> dict[str, Any]:
    """The brief's model a reading gives, with its assumption line when the words named none."""
    fields: dict[str, Any] = {"model": reading.value}
    if (assumption := reading.assumption) is not None:
        fields[MODEL_ASSUMED] = [f"intake: {assumption.line()}"]
    return fields


def _squash(s: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", s.lower())


def catalog_name(name: str, known_models: list[str]) -> str | None:
    """The catalog id a model name means ("Meta-Llama-3-8B-Instruct" -> llama-3-8b), or None."""
    flat = _squash(name)
    for known in sorted(known_models, key=len, reverse=True):
        if _squash(known) and _squash(known) in flat:
            return known
    return None
