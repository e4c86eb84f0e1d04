"""Intake: a brief or a free-text request becomes a validated brief, asking what it must.

A free-text request is read by the offline parser and, when the chat model is a real LLM, also
by the LLM through structured output: the LLM fills what the parser did not find, and the
parser wins where both found a value (``tools.intake.llm_reading.merge_read_fields``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from langchain_core.exceptions import (
    ContextOverflowError,
    ModelError,
    ModelInvalidRequestError,
    ModelRefusalError,
)
from langchain_core.language_models.chat_models import BaseChatModel
from langgraph.types import Overwrite, interrupt

from agents.events import Events
from agents.roles import Node
from agents.workspace import PRODUCT_KEYS
from tools.core.errors import InputError
from tools.core.paths import confined
from tools.core.request_account import RequestAccount
from tools.core.schemas import TRAINING_TASKS, TrainingBrief
from tools.core.settings import Settings
from tools.core.untrusted import cap_text
from tools.intake.account import account_brief, account_request
from tools.intake.brief import brief_from_dict, with_model_seq_len
from tools.intake.fp8_wish import apply_fp8_wish
from tools.intake.hardware_text import (
    HARDWARE_ASSUMED,
    HARDWARE_REFUSED,
    HARDWARE_UNCLEAR,
    read_hardware,
)
from tools.intake.readings import MODEL_ASSUMED, NUMBER_NOTES

# Everything a plan's later nodes write: a fresh request on a used thread starts clean.
_FRESH: dict[str, Any] = dict.fromkeys((*PRODUCT_KEYS, "plan"))
# What a served graph (the LangGraph server) takes from a client: the input as JSON at most
# this long, and a request or a brief's goal at most MAX_REQUEST_CHARS, the CLI's bound on a
# request. A brief file on the command line may be up to 1 MB (tools/intake/brief.py).
MAX_SERVED_INPUT_BYTES = 64 * 1024
_INPUT_KEYS = ("request", "brief", "overrides", "out_dir", "smoke")
SERVED_NO_SMOKE = "server: no smoke run; the input did not ask for one (set smoke: true)"


def default_out_dir(brief: TrainingBrief, settings: Settings) -> Path:
    """out/<model name>-<digest>, or out/<task>-<digest> for an agent application.

    The digest (8 hex of the brief's SHA-256, with a model file's absolute path) makes the
    folder unique per model and request: two config.json models, or two requests for one
    model, never share a folder; the same request again reuses its folder. A model given as
    ``.../NAME/config.json`` is named after its folder, NAME.
    """
    if isinstance(brief.model, str):
        path = Path(brief.model)
        name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
    else:
        name = brief.task if brief.model is None else "custom"
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:64] or "plan"
    request = brief.model_dump(mode="json")
    if isinstance(brief.model, str) and brief.model.endswith(".json"):
        request["model_path"] = os.path.abspath(brief.model)
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:8]
    return (settings.serve_root or settings.out_dir) / f"{safe}-{digest}"


def _out_dir(state: Mapping[str, Any], brief: TrainingBrief, settings: Settings) -> str:
    """Where the plan's files go: the caller's ``out_dir``, else a default folder.

    Served (``settings.serve_root`` set: the LangGraph server) the caller's folder is a name
    inside that root, and anything that resolves outside it is refused.
    """
    chosen = state.get("out_dir")
    if not chosen:
        return str(default_out_dir(brief, settings))
    if settings.serve_root is not None:
        return str(confined(settings.serve_root, str(chosen)))
    return str(chosen)


# Provider failures after which intake still has the offline parser's reading: the server
# refused this structured request (e.g. no tool_choice support), or the model would not answer
# it. Any other provider failure (down, timed out, HTTP 5xx, a rejected key) ends the run.
_STRUCTURED_REFUSALS = (ModelInvalidRequestError, ModelRefusalError, ContextOverflowError)


def _llm_read(
    model: BaseChatModel, text: str, known_models: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """Ask a real LLM for a request's brief fields by structured output: (fields, notes).

    Method ``function_calling``: the tool-calling API the roles already need, so any server
    that can run the roles (vLLM, llama.cpp, Ollama, LM Studio) can answer it, where
    ``json_schema`` response formats are less widely served. A reply that cannot be used
    (unparsable, not the schema, values a brief would refuse) leaves a note and the offline
    parser's reading; a provider that is down, times out or rejects the key raises the
    same error the roles would (``provider_error``).
    """
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from pydantic import ValidationError

    from agents.chat_models import provider_error
    from tools.intake.llm_reading import RequestBrief, llm_request_fields

    schema = convert_to_openai_tool(RequestBrief)
    messages = [
        SystemMessage(
            f"{' '.join((RequestBrief.__doc__ or '').split())} Reply by calling "
            f"{schema['function']['name']}."
        ),
        HumanMessage(text),
    ]
    fallback = "intake: the LLM's structured reading of the request could not be used"
    try:
        # A dict schema (not the class) so the reply comes back unvalidated: each field is
        # then checked on its own, and one bad value does not cost the others.
        try:
            reader = model.with_structured_output(
                schema, method="function_calling", include_raw=True
            )
        except (TypeError, ValueError):  # a chat model whose structured output has one method
            reader = model.with_structured_output(schema, include_raw=True)
        answer = reader.invoke(messages)  # include_raw: {raw, parsed, parsing_error}
    except NotImplementedError:
        return {}, [f"{fallback} ({model._llm_type} has no structured output); parser only"]
    except ValidationError as exc:
        # The client could not build a message from the reply (arguments not an object).
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        return {}, [f"{fallback} (unreadable reply: {where}: {first['msg']}); parser only"]
    except Exception as exc:
        error = provider_error(exc, model)
        if error is None:
            raise  # our own model: a bug, not a provider failure
        status = getattr(exc, "status_code", None)
        refused = isinstance(exc, _STRUCTURED_REFUSALS) or status in (400, 422)
        if not refused and (isinstance(exc, ModelError) or isinstance(status, int)):
            raise error from exc
        return {}, [f"{fallback} ({error}); parser only"]
    result: dict[str, Any] = answer if isinstance(answer, dict) else {"parsed": answer}
    if result.get("parsing_error") is not None:
        line = (str(result["parsing_error"]).strip().splitlines() or ["?"])[0][:160]
        return {}, [f"{fallback} (unparsable: {line}); parser only"]
    if result.get("parsed") is None:
        raw = result.get("raw")
        bad = getattr(raw, "invalid_tool_calls", None)
        why = "its arguments are not valid JSON" if bad else "it answered without the fields"
        return {}, [f"{fallback} ({why}); parser only"]
    fields, dropped = llm_request_fields(result["parsed"], known_models)
    return fields, [f"intake: dropped the LLM's {d}" for d in dropped]


def make_intake(settings: Settings, model: BaseChatModel) -> Node:
    """Intake: a brief or a free-text request becomes a validated brief; the hardware is checked.

    ``model`` is the graph's chat model; a real LLM also reads a free-text request. A request
    that lacks something essential (a training request naming no model) gets one clarifying
    question through LangGraph's ``interrupt``: the run pauses (it needs a checkpointer) and
    resumes with ``Command(resume=answer)``; the answer goes through the parser and is merged
    into the request. Flags the caller set (``overrides``) win.
    """

    def intake(state: Mapping[str, Any]) -> dict[str, Any]:
        from tools.research.hardware import parse_hardware

        events = Events("intake")
        served = settings.serve_root is not None
        if served:
            _check_served_input(state)
        overrides = dict(state.get("overrides") or {})
        notes = _smoke_flag(state, overrides, served)
        if state.get("brief"):
            brief = brief_from_dict(with_model_seq_len({**state["brief"], **overrides}))
            account = account_brief(dict(state["brief"]), brief, overrides)
            brief, account, sizing, sized_notes = _sized_brief(brief, account, overrides, events)
            notes += sized_notes
        else:
            brief, read_notes, account, sizing = _brief_from_request(
                str(state.get("request") or ""), overrides, model, events
            )
            notes += read_notes
        # Fail fast on a bad hardware spec, before any agent spends a turn on it.
        hardware = parse_hardware(brief.hardware, brief.interconnect)
        # An fp8 wish is the recipe's precision on a GPU with FP8 tensor cores, else refused.
        brief, account = apply_fp8_wish(brief, account, hardware)
        name = brief.model if isinstance(brief.model, str) else "custom model"
        events.progress(f"{name if brief.model is not None else brief.task} on {brief.hardware}")
        return {
            **_FRESH,
            "brief": brief.model_dump(mode="json"),
            "out_dir": _out_dir(state, brief, settings),
            "review_round": 0,
            "narrative": Overwrite({}),
            "notes": Overwrite([cap_text(n) for n in notes]),
            "request_account": account.model_dump(mode="json"),
            # A sizing question's answer (agents/sizing.py), for the reporter; None otherwise.
            "sizing": sizing,
        }

    return intake


def _check_served_input(state: Mapping[str, Any]) -> None:
    """Refuse a served input past its bounds (one line naming the field), before any work."""
    from tools.intake.brief import MAX_REQUEST_CHARS

    brief = state.get("brief")
    texts = {
        "request": state.get("request"),
        "brief.goal": brief.get("goal") if isinstance(brief, Mapping) else None,
    }
    for field, text in texts.items():
        if isinstance(text, str) and len(text) > MAX_REQUEST_CHARS:
            raise InputError(
                field,
                f"is {len(text):,} characters; the server takes at most {MAX_REQUEST_CHARS:,}",
            )
    size = len(json.dumps({k: state.get(k) for k in _INPUT_KEYS}, default=str).encode())
    if size > MAX_SERVED_INPUT_BYTES:
        raise InputError(
            "input",
            f"is {size:,} bytes as JSON; the server takes at most {MAX_SERVED_INPUT_BYTES:,}",
        )


def _smoke_flag(state: Mapping[str, Any], overrides: dict[str, Any], served: bool) -> list[str]:
    """Put the input's ``smoke`` flag into ``overrides``; served, no smoke run unless asked.

    The served graph runs a smoke test only when the input says ``smoke: true`` (the flag,
    ``overrides`` or the brief's own key): a client's free-text request does not start a
    training run by default. Returns the note that says so, when it applies.
    """
    if isinstance(state.get("smoke"), bool):
        overrides["smoke"] = state["smoke"]
    brief = state.get("brief")
    asked = "smoke" in overrides or (
        isinstance(brief, Mapping) and isinstance(brief.get("smoke"), bool)
    )
    if not served or asked:
        return []
    overrides["smoke"] = False
    return [SERVED_NO_SMOKE]


def _brief_from_request(
    text: str, overrides: dict[str, Any], model: BaseChatModel, events: Events
) -> tuple[TrainingBrief, list[str], RequestAccount, dict[str, Any] | None]:
    """Read a request (parser, and a real LLM), ask what it lacks; the brief, notes, accounting.

    A sizing question (agents/sizing.py) is sized, and the brief's hardware is the sizing's
    pick; the sizing (plan JSON ``sizing``) comes last, None for any other request.
    """
    from agents.offline import OfflinePlaybookModel
    from agents.sizing import (
        account_sizing,
        drop_unclear,
        not_sized,
        run_sizing,
        sizing_ask,
        trains,
    )
    from tools.intake.brief import brief_from_request, model_reading, request_fields
    from tools.intake.llm_reading import merge_read_fields
    from tools.research.model_catalog import list_models

    models = list_models()
    parsed = request_fields(text, models)
    said = dict(parsed)  # what the words alone say, for the request's accounting
    notes: list[str] = []
    reading = model_reading(text, models)
    if reading is not None and reading.note and parsed.get("model") == reading.value:
        events.progress(reading.note)
        if reading.assumption is None:  # assumptions travel as MODEL_ASSUMED, with answers
            notes.append(f"intake: {reading.note}")  # "read 'lama-3-8b' as llama-3-8b"
    if not isinstance(model, OfflinePlaybookModel):
        # On a resume after the clarifying question this node runs again and so asks the LLM
        # again; whatever it says then, the answers given stay matched to the question (the
        # model is the only field asked about).
        read, notes = _llm_read(model, text, models)
        parsed, disagreements = merge_read_fields(parsed, read)
        notes += [f"intake: {d}" for d in disagreements]
        if read:
            events.progress(f"LLM read: {', '.join(sorted(read))}")
    unclear = (reading.question, reading.candidates) if reading and reading.question else None
    ask = sizing_ask(text, {**parsed, **overrides}, overrides)
    if ask is not None and trains({**parsed, **overrides}):
        parsed = drop_unclear(parsed)  # the sizing chooses the hardware: nothing to ask
    fields = _ask_missing({**parsed, **overrides}, overrides, models, events, unclear)
    notes += fields.get(MODEL_ASSUMED) or []
    notes += fields.get(HARDWARE_ASSUMED) or []
    notes += fields.get(NUMBER_NOTES) or []
    brief = brief_from_request(fields)
    account = account_request(text, fields, brief, overrides, said)
    if ask is None:
        return brief, notes, account, None
    if brief.task not in TRAINING_TASKS:
        return brief, [*notes, not_sized(ask, brief.task)], account, None
    # "How many H100s ...": the part the words name without a count is the sizing's type.
    gpu = _gpu_type(fields.get("hardware")) or read_hardware(text).gpu
    sized = run_sizing(ask, brief, gpu)
    events.progress(sized.notes[0].removeprefix("intake: "))
    brief = brief.model_copy(update={"hardware": sized.hardware})
    acc = account_sizing(account.model_dump(mode="json"), sized, ask)
    if acc is not None:
        account = RequestAccount.model_validate(acc)
    return brief, notes + sized.notes, account, sized.plan.model_dump(mode="json")


def _sized_brief(
    brief: TrainingBrief, account: RequestAccount, overrides: dict[str, Any], events: Events
) -> tuple[TrainingBrief, RequestAccount, dict[str, Any] | None, list[str]]:
    """A brief whose goal asks a sizing question, on the default hardware: sized and planned.

    A brief has no words for its hardware but its ``hardware`` key, so only a goal that asks
    ("how many", "which GPUs", "cheapest") on ``local`` (the default; no ``--hardware``) is
    sized (agents/sizing.py), as ``report`` and ``plan --brief`` both take briefs.
    """
    from agents.sizing import account_sizing, run_sizing, sizing_ask

    if brief.hardware != "local" or brief.task not in TRAINING_TASKS:
        return brief, account, None, []
    ask = sizing_ask(brief.goal, {"hardware": "local"}, overrides)
    if ask is None:
        return brief, account, None, []
    sized = run_sizing(ask, brief, None)
    events.progress(sized.notes[0].removeprefix("intake: "))
    note = "intake: the brief's goal asks a sizing question and its hardware is the default, local"
    acc = account_sizing(account.model_dump(mode="json"), sized, ask)
    return (
        brief.model_copy(update={"hardware": sized.hardware}),
        RequestAccount.model_validate(acc) if acc is not None else account,
        sized.plan.model_dump(mode="json"),
        [note, *sized.notes],
    )


def _gpu_type(hardware: Any) -> str | None:
    """The catalog GPU type a hardware spec names (None: none, or local)."""
    from tools.research.hardware import parse_hardware

    if not isinstance(hardware, str) or hardware.strip().lower() == "local":
        return None
    gpu = parse_hardware(hardware).gpu
    return getattr(gpu, "id", None)


def _ask_missing(
    fields: dict[str, Any],
    overrides: dict[str, Any],
    models: list[str],
    events: Events,
    unclear: tuple[str, tuple[str, ...]] | None = None,
) -> dict[str, Any]:
    """Ask the clarifying question for an essential field the request lacks, until answered.

    On resume the node runs again from the top and each interrupt() returns its answer, in
    order (LangGraph matches resume values to interrupts by position). An answer that still
    names no model is asked about again, saying why: the answers given stay with the task, so
    failing here would replay the bad one on every resume of this thread. ``unclear`` says
    what the request's own words left open ("'convnext' could be convnext-tiny or
    convnext-base") and the candidates; the first question starts with it and lists them.
    """
    from tools.intake.brief import hardware_refusal, merge_answer, missing_field, question_for

    if "hardware" in overrides:  # --hardware settles what the request's text left unclear
        fields.pop(HARDWARE_UNCLEAR, None)
        fields.pop(HARDWARE_REFUSED, None)
    if (refused := hardware_refusal(fields)) is not None:
        raise refused  # hardware no plan can target: refused, not asked about
    # One question per field (the model, then hardware the request named but could not be read).
    while (field := missing_field(fields)) is not None:
        problem, candidates = unclear if unclear and field == "model" else (None, ())
        unclear = None  # the request's own reading opens the first model question only
        while True:
            question = question_for(field, fields)
            if problem:
                question = f"{problem[0].upper()}{problem[1:]}. {question}"
            payload: dict[str, Any] = {
                "field": field,
                "question": question,
                "problem": problem,
                "unclear": fields.get(HARDWARE_UNCLEAR) if field == "hardware" else None,
            }
            if candidates:
                payload["candidates"] = list(candidates)
            answer = str(interrupt(payload) or "")
            candidates = ()
            try:
                fields = {**merge_answer(fields, field, answer, models), **overrides}
                break
            except InputError as exc:
                problem = exc.message.split(";")[0]
        events("answer", f"{field}: {answer.strip()[:120]}", field=field)
    return fields
