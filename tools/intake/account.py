"""The request's accounting: every fact read with its words, every default named, every number bound.

``account_request`` takes a free-text request, the fields the parser read and the validated
brief, and returns the plan JSON's ``request`` section (tools/core/request_account.py):
``read`` (each brief field the words stated, with the words), ``assumed`` (each default the
intake or the planner applies, with why), ``wishes`` (techniques, trainers, objectives,
frameworks named or refused, deadlines and budgets), ``not_understood`` (the clause around
every number that no reading bound). ``account_brief`` does the same for a brief file, whose
fields are their own quotes (``brief: <key>``).
"""

from __future__ import annotations

import re
from typing import Any

from tools.core.request_account import AssumedFact, ReadFact, RequestAccount, Wish
from tools.core.schemas import RECIPE_PRECISION_BASE, TrainingBrief
from tools.intake.batch_words import batch_assumed
from tools.intake.budget_text import price_reading
from tools.intake.count_words import COUNT_WORDS
from tools.intake.goal_text import goal_assumed
from tools.intake.gpu_names import GPU_NAMES
from tools.intake.hardware_text import NIC_AFTER_RE, read_hardware
from tools.intake.instance_names import INSTANCE_RE
from tools.intake.model_text import model_reads, other_model_mark, other_model_reads, read_model
from tools.intake.numbers_text import number_reads
from tools.intake.optim_text import optim_reads
from tools.intake.parallel_words import layout_reads, parallel_assumed
from tools.intake.readings import MODEL_ASSUMED, Read, joined_quote, states
from tools.intake.recipe_framework import recipe_launch
from tools.intake.recipe_text import recipe_reads
from tools.intake.refused_words import intake_mark, refused_reads
from tools.intake.run_text import run_reads
from tools.intake.serving_text import serving_reads
from tools.intake.spelt_text import as_written, read_as_written, spelt_numbers
from tools.intake.wishes import distill_pair, framework_wish_reads, named_wishes
from tools.intake.words import word_reads

# A number in the request: digits not glued to a letter before them ("H100", "bf16" are names),
# or a Chinese count before its unit ("两台", "八张").
_NUMBER_RE = re.compile(
    r"(?<![A-Za-z0-9_.])\d+(?:[.,]\d+)*(?:e-?\d+)?"
    r"|[一二两俩三四五六七八九十百千万]+(?=\s*(?:台|张|块|卡|个|片|节点|天|周|小时|月))"
)
_CN = r"[一二两俩三四五六七八九十]+"
_COUNT = r"(?:\d+|" + _CN + r")"
# Where the hardware stood: counts (digits or words, "two 4090s") before GPUs or nodes, a spec,
# a memory size by a GPU name.
_HARDWARE_RES = tuple(
    re.compile(p, re.I)
    for p in (
        r"\d+\s*[x×]\s*\d+\s*[x×]\s*[a-z][\w-]*",
        r"(?:" + _COUNT + r"|\b(?:" + COUNT_WORDS + r")\s+)\s*[x×*]?\s*(?:(?:张|块|个|片)\s*)?"
        r"(?:gpus?\s+of\s+|cards?\s+of\s+)?"
        r"(?:\d+\s*gi?b\s+)?(?:nvidia\s+|amd\s+|tesla\s+)?(?:" + GPU_NAMES + r")"
        r"(?:[\s-]*\d+\s*gi?b)?(?:s|es)?\b",
        r"(?:" + GPU_NAMES + r")(?:[\s-]*(?:sxm\d?|pcie|nvl))?[\s-]*\d+\s*gi?b",
        r"(?:" + GPU_NAMES + r")(?:s|es)?\s*[x×*]\s*\d+",
        r"\b(?:" + GPU_NAMES + r")(?:s|es)?\b",  # "4090s", "A100s"
        _COUNT + r"\s*[x×-]?\s*(?:nodes?|servers?|machines?|hosts?|boxes|instances?|dgxs?|hgxs?|"
        r"gpus?|cards?|accelerators?)\b",
        _COUNT + r"\s*(?:台|张|块|卡|个节点|节点|片)",
        r"每\s*台\s*\d+",
    )
)
# "AWS p4d.24xlarge x 4": the nodes, GPUs and network an instance type stands for.
_HARDWARE_RES = (*_HARDWARE_RES, INSTANCE_RE)
_RAM_RES = (
    re.compile(
        r"\d+(?:\.\d+)?\s*(?:tb|tib|gb|gib|g)\s*(?:of\s+)?(?:host\s+|cpu\s+|system\s+|ddr\d\s+)?"
        r"(?:ram|dram|memory|内存)",
        re.I,
    ),
    re.compile(r"(?:ram|内存)\s*[:=]?\s*\d+(?:\.\d+)?\s*(?:tb|tib|gb|gib|g)\b", re.I),
)
_NIC_RES = (
    re.compile(
        r"\d+\s*[x×]\s*\d+\s*(?:g|gb|gbit|gbps|gb/s|gbe)?\s*(?:ib|infiniband|roce\w*|ethernet|eth|"
        r"gbe|nics?|efa)?\b",
        re.I,
    ),
    re.compile(
        r"\d+\s*(?:g|gb|gbit|gbps|gb/s)?\s*(?:ib|infiniband|roce\w*|ethernet|eth|nics?|efa)\b|"
        r"\d+\s*gbe\b",
        re.I,
    ),
    NIC_AFTER_RE,
    INSTANCE_RE,
)
_CLAUSE_RE = re.compile(r"[^,;，；。!?？！\n]+")
# The brief fields a plan takes from the words, in the order ``read`` lists them.
_FIELD_ORDER = (
    "model", "task", "objective", "hardware", "host_ram_gb", "nics_per_node", "nic_gbps",
    "interconnect", "seq_len", "global_batch_size", "precision", "learning_rate", "warmup_steps", "train_steps", "save_every", "keep_checkpoints",
    "weight_decay", "max_grad_norm", "adam_beta1", "adam_beta2", "adam_eps", "lr_schedule", "min_lr", "warmup_ratio", "eval_every", "eval_holdout", "dataset_tokens", "seed", "wandb_project", "data_path", "lora_alpha",
    "price_per_gpu_hour", "framework", "avoid_frameworks", "pins", "context_len", "concurrency",
    "engine", "weight_dtype", "team", "deployment", "smoke",
)  # fmt: skip
# Wishes that are no brief field but that a number reading found (numbers_text.number_reads).
_NUMBER_WISHES = ("micro-batch", "grad-accum", "deadline", "money-budget", "compute-budget")
_WISH_KINDS: tuple[str, ...] = ("framework", "avoid", "technique", "trainer", "objective")
_WISH_KINDS += ("checkpoint", "unoffered", "other-model", "data")


def _claims(regexes: tuple[re.Pattern[str], ...], text: str, field: str, value: Any) -> list[Read]:
    return [Read.of(field, value, m) for p in regexes for m in p.finditer(text)]


def _hardware_reads(text: str, fields: dict[str, Any]) -> list[Read]:
    """The words each hardware field came from (only the fields the parser set)."""
    reads: list[Read] = []
    if "hardware" in fields:
        reads += _claims(_HARDWARE_RES, text, "hardware", fields["hardware"])
        if fields["hardware"] == "local" and (
            m := re.search(
                r"\b(?:this|my|our|local)\s+\w+|\blocally\b|\bhere\b|本机|本地", text, re.I
            )
        ):
            reads.append(Read.of("hardware", "local", m))
    if "host_ram_gb" in fields:
        reads += _claims(_RAM_RES, text, "host_ram_gb", fields["host_ram_gb"])
    if "nic_gbps" in fields:
        reads += _claims(_NIC_RES, text, "nic_gbps", fields["nic_gbps"])
    return reads


def text_reads(text: str, fields: dict[str, Any]) -> list[Read]:
    """Every field reading of the request with its span, and the wish readings (ids in ``field``)."""
    numbers, _ = number_reads(text, int(fields.get("seq_len") or 2048))
    reads = [r for r in numbers if r.field in fields]
    reads += [r for r in numbers if r.field in _NUMBER_WISHES]
    if "pins" in fields:
        reads += [
            Read("pins.micro_batch", r.value, r.quote, r.start, r.end)
            for r in numbers
            if r.field == "micro-batch"
        ]
    if "global_batch_size" in fields and not any(r.field == "global_batch_size" for r in reads):
        # A global batch a micro-batch and gradient accumulation gave (brief.accumulated_batch).
        reads += [
            Read("global_batch_size", fields["global_batch_size"], r.quote, r.start, r.end)
            for r in numbers
            if r.field in ("micro-batch", "grad-accum")
        ]
    reads += model_reads(text, fields.get("model")) if "model" in fields else []
    reads += other_model_reads(text, fields.get("model")) if not distill_pair(text) else []
    reads += _hardware_reads(text, fields)
    reads += layout_reads(text, fields)
    reads += [r for r in serving_reads(text) if r.field in fields and r.field != "task"]
    reads += word_reads(text, fields)
    reads += [
        r for r in serving_reads(text) if r.field == "task" and fields.get("task") == "inference"
    ]
    if (price := price_reading(text)) is not None:
        reads.append(price)
    reads += framework_wish_reads(text)
    reads += named_wishes(text)
    reads += refused_reads(text, fields)  # optimizers other than AdamW, ...
    reads += [r for r in recipe_reads(text, fields.get("task")) if "recipe" in fields]
    reads += [r for r in run_reads(text) if r.field in fields]
    reads += [r for r in optim_reads(text, fields.get("task")) if r.field in fields]
    return reads


def not_understood(text: str, spans: list[tuple[int, int]]) -> list[str]:
    """The words around each number no reading bound: its clause, cut to a few words each side.

    A word before the number and one after ("for 3 epochs", "lr 2e-4"), or
    eight characters each side in unspaced (Chinese) text; numbers of one phrase are one entry.
    """
    out: list[str] = []
    for m in _NUMBER_RE.finditer(text):
        if any(a <= m.start() < b for a, b in spans) or any(m.group(0) in q for q in out[-1:]):
            continue
        clause = next(c for c in _CLAUSE_RE.finditer(text) if c.start() <= m.start() < c.end())
        before, after = text[clause.start() : m.start()], text[m.end() : clause.end()]
        if re.search(r"[\u4e00-\u9fff]", clause.group(0)):
            quote = before[-8:] + m.group(0) + after[:8]
        else:
            glued = re.match(r"\S*", after)
            unit = glued.group(0) if glued else ""
            words = [*before.split()[-1:], m.group(0) + unit, *after[len(unit) :].split()[:1]]
            quote = " ".join(words)
        quote = quote.strip()
        if quote not in out:
            out.append(quote)
    return out


def account_request(
    text: str,
    fields: dict[str, Any],
    brief: TrainingBrief,
    overrides: dict[str, Any] | None = None,
    said: dict[str, Any] | None = None,
) -> RequestAccount:
    """The ``request`` section of a plan from free text (see the module docstring).

    ``fields`` are what ``request_fields`` and any answer or LLM reading gave; ``said`` what the
    text alone gave (``request_fields(text)``; default ``fields``): a field whose value an
    answer or the LLM changed is quoted as theirs, not as the text's. ``overrides`` are the
    CLI's flags, which win and are quoted as ``flag: <key>``.
    """
    overrides = overrides or {}
    said = fields if said is None else said
    spelt = spelt_numbers(text)  # "twenty" as "20    ": spans of it are spans of text
    reads = [read_as_written(r, text, spelt) for r in text_reads(spelt, said)]
    facts: list[ReadFact] = []
    stated = {k for k in fields if not k.startswith("_") and k != "goal"} | set(overrides)
    by_field: dict[str, list[Read]] = {}
    for r in reads:
        by_field.setdefault(_brief_key(r, brief), []).append(r)
    dumped = brief.model_dump(mode="json")
    for key in sorted(stated, key=lambda k: _FIELD_ORDER.index(k) if k in _FIELD_ORDER else 99):
        if key in overrides:
            quote = f"flag: {key}"
        elif said.get(key) != fields.get(key):
            quote = "an answer to intake's question, or the LLM's reading"
        elif key in by_field:
            quote = joined_quote(by_field[key], text)
        elif key in ("nics_per_node", "interconnect") and "nic_gbps" in by_field:
            quote = joined_quote(by_field["nic_gbps"], text)
        else:
            quote = "an answer to intake's question, or the LLM's reading"
        facts.append(ReadFact(field=key, value=dumped.get(key, fields.get(key)), quote=quote))
    wishes = _wishes(reads, brief)
    spans = [(r.start, r.end) for r in reads]
    changed = {k for k in stated if said.get(k) != fields.get(k)}  # by an answer or the LLM
    assumed = assumed_defaults(text, brief, stated, overridden=set(overrides) | changed)
    if not any(a.field == "model" for a in assumed) and "model" not in overrides:
        # A model an answer gave by size ("7B"): its assumption line, as intake's notes have it.
        assumed += [
            AssumedFact(field="model", value=_plain(brief.model), why=line.removeprefix("intake: "))
            for line in fields.get(MODEL_ASSUMED) or []
        ]
    return RequestAccount(
        text=text,
        read=facts,
        assumed=assumed,
        wishes=wishes,
        not_understood=[as_written(q, spelt, text) for q in not_understood(spelt, spans)],
    )


def _brief_key(r: Read, brief: TrainingBrief) -> str:
    """The brief field a reading sets: ``pins.tensor_parallel`` -> pins, ``framework:X`` -> framework."""
    kind, _, name = r.field.partition(":")
    if kind == "framework":
        return "framework"
    if kind == "avoid" and name in brief.avoid_frameworks:
        return "avoid_frameworks"
    if kind == "objective" and name == brief.objective:
        return "objective"
    return r.field.split(".", 1)[0]


def _plain(value: Any) -> Any:
    """A brief value as JSON data (a model shape as its fields)."""
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def _wishes(reads: list[Read], brief: TrainingBrief) -> list[Wish]:
    """The wishes among the readings: frameworks, refusals, techniques, trainers, objectives, limits."""
    out: list[Wish] = []
    for r in reads:
        kind = r.field.split(":", 1)[0]
        if kind not in _WISH_KINDS and r.field not in _NUMBER_WISHES:
            continue
        if any(w.wish == r.field for w in out):
            continue
        wish = Wish(wish=r.field, quote=r.quote)
        if kind == "avoid" and r.value in brief.avoid_frameworks:
            wish.honoured, wish.how = True, "not used: recorded in avoid_frameworks"
        elif (mark := intake_mark(r)) is not None:
            wish.honoured, wish.how = mark
        elif kind == "other-model":
            wish.honoured, wish.how = other_model_mark(r.value, brief.model)
        out.append(wish)
    return out


def assumed_defaults(
    text: str, brief: TrainingBrief, stated: set[str], overridden: set[str] | None = None
) -> list[AssumedFact]:
    """Each default applied to what the request left open, with why (the model's and GPU's too).

    ``overridden`` are the fields a CLI flag set: what the text's words assumed about them
    no longer applies.
    """
    out: list[AssumedFact] = []
    from_text = stated - (overridden or set())
    reading = read_model(text) if text and "model" in from_text else None
    if (
        reading is not None
        and (a := reading.assumption) is not None
        and brief.model == reading.value
    ):
        out.append(
            AssumedFact(field="model", value=a.value, why=f"{a.why} (read from {a.quote!r})")
        )
    if "hardware" in from_text and text:
        hw = read_hardware(text)
        out += [
            AssumedFact(field="hardware", value=a.value, why=f"{a.why} (read from {a.quote!r})")
            for a in hw.assumed
        ]
    out += parallel_assumed(text, brief.hardware) if "pins" in from_text else []
    out += batch_assumed(text, brief.seq_len, "global_batch_size" in from_text)
    return out + _planner_defaults(brief, stated)


def _planner_defaults(brief: TrainingBrief, stated: set[str]) -> list[AssumedFact]:
    """The brief defaults a plan uses when the request is silent: hardware, task, length, batch, ..."""
    if brief.task == "agent-app":
        return []
    out: list[AssumedFact] = []

    def add(field: str, value: Any, why: str) -> None:
        out.append(AssumedFact(field=field, value=value, why=why))

    if "hardware" not in stated:
        add("hardware", brief.hardware, "the request names no hardware: planned for this machine")
    if "task" not in stated:
        add(
            "task", brief.task, "no task word (pretrain, fine-tune, LoRA, serve): fine-tune assumed"
        )
    if brief.task == "inference":
        for field, default in (
            ("context_len", "8192, or the model's own limit"),
            ("concurrency", 16),
            ("engine", "vllm"),
            ("weight_dtype", "bf16, or fp16 on GPUs without bf16"),
        ):
            if field not in stated:
                add(
                    field,
                    default,
                    "not stated: the serving plan's default (tools/planning/inference.py)",
                )
        return out
    if "seq_len" not in stated:
        why = "not stated: the brief's default"
        if brief.seq_len != TrainingBrief.model_fields["seq_len"].default:
            why = "not stated: the model's own position limit (shorter than the default 2048)"
        add("seq_len", brief.seq_len, why)
    if "global_batch_size" not in stated:
        add(
            "global_batch_size",
            None,
            "not stated: the planner picks one for the model's size that the data-parallel "
            "degree divides (tools/planning/batch.py) and the plan says which",
        )
    recipe_precision = brief.recipe.precision if brief.recipe is not None else None
    if "precision" not in stated and recipe_precision is not None:
        add(
            "precision",
            RECIPE_PRECISION_BASE[recipe_precision],
            f"not stated: the launch trains as recipe.precision {recipe_precision} is priced "
            "(tools/intake/recipe_framework.py)",
        )
    elif "precision" not in stated:
        add(
            "precision",
            brief.precision,
            "not stated: bf16 where the GPU has it, else fp16; fp32 on CPU",
        )
    described = brief.hardware != "local"
    if described and "host_ram_gb" not in stated:
        add(
            "host_ram_gb",
            "2x the node's GPU memory, at least 64 GB",
            "not stated: a common server sizing; it bounds CPU offload",
        )
    nodes = int(m.group(1)) if (m := re.match(r"(\d+)x\d+x", brief.hardware)) else 1
    if described and nodes > 1 and not stated & {"interconnect", "nic_gbps", "nics_per_node"}:
        add(
            "interconnect",
            "the node type's reference network (DGX/HGX), else roce100 with one NIC per node",
            "not stated: the speed model needs the network between nodes",
        )
    return out


def account_brief(
    data: dict[str, Any], brief: TrainingBrief, overrides: dict[str, Any] | None = None
) -> RequestAccount:
    """The ``request`` section for a brief: its fields are their own quotes (``brief: key``).

    A field a CLI flag set (``overrides``) is quoted ``flag: key``.
    """
    overrides = overrides or {}
    # An empty field (None, [], pins of None) states nothing: a follow-up's brief has them all.
    stated = {k for k in (*data, *overrides) if k != "goal" and (k in overrides or states(data[k]))}
    dumped = brief.model_dump(mode="json")
    facts = [
        ReadFact(
            field=k,
            value=dumped.get(k, overrides.get(k, data.get(k))),
            quote=f"flag: {k}" if k in overrides else f"brief: {k}",
        )
        for k in sorted(stated, key=lambda k: _FIELD_ORDER.index(k) if k in _FIELD_ORDER else 99)
    ]
    wishes: list[Wish] = []
    if brief.framework is not None:
        wishes.append(Wish(wish=f"framework:{brief.framework}", quote="brief: framework"))
    elif (launch := recipe_launch(brief)) is not None:
        # The recipe's framework is the launch's (tools/intake/recipe_framework.py).
        wishes.append(Wish(wish=f"framework:{launch}", quote="brief: recipe.framework"))
    for fid in brief.avoid_frameworks:
        wishes.append(
            Wish(
                wish=f"avoid:{fid}",
                quote="brief: avoid_frameworks",
                honoured=True,
                how="not used: recorded in avoid_frameworks",
            )
        )
    if brief.objective is not None:
        wishes.append(Wish(wish=f"objective:{brief.objective}", quote="brief: objective"))
    return RequestAccount(
        text=brief.goal,
        read=facts,
        assumed=goal_assumed(brief, stated) + _planner_defaults(brief, stated),
        wishes=wishes,
    )
