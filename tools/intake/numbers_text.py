"""The numbers of a request that are not hardware: sequence length, batch, token budget, precision.

Each reader returns ``Read`` values (tools/intake/readings.py) with the words and their span,
so the request's accounting (tools/intake/account.py) can tell which numbers were bound to a
field. Sequence lengths in any spelling: "sequence 8192", "seq 8192", "seq_len=4096", "8k
context", "128K context window", "4096-token sequences", "序列长度 32k", "32k 上下文" ("k" is
1024); batches in sequences ("global batch 512", "512 sequences per step") or tokens ("4M-token
batch": converted with the sequence length); token budgets ("200B tokens", "2000亿 token");
deadlines and money budgets, which no brief field holds, become wishes (tools/intake/wishes.py).

Offline and deterministic; every pattern is linear and the request is capped in length.
"""

from __future__ import annotations

import re

from tools.intake.data_size_text import average_examples_tokens
from tools.intake.optim_text import lr_reading, warmup_reading
from tools.intake.readings import Read

# A number, thousands separators and all ("8,192"; a list "4096,8192" stays two numbers).
_NUM = r"(\d{1,3}(?:,\d{3})+(?!\d|,\d)(?:\.\d+)?|\d+(?:\.\d+)?)"


def _number(written: str) -> float:
    """A number ``_NUM`` matched, without its thousands separators."""
    return float(written.replace(",", ""))


# After a number: a unit letter glued to it ("8k"), never the start of a word ("8 kernels").
_K = r"\s*(k)?(?![a-z0-9])"
# What joins a noun to its number: "of", "=", "is", "were", "set to", "raised to", ...
_JOIN = (
    r"(?:of|=|:|is|to|was|were|(?:were|was|is)?\s*(?:set|raised|increased|cut|reduced|doubled|"
    r"halved|changed)\s+to)?"
)
_SEQ_RES = (
    # The noun, then the number: "sequence 8192", "seq_len=4096", "context of 32k", "sequences of 4096".
    re.compile(
        r"(?<![a-z])(?:max[ _-]?)?(?:seq(?:uence)?s?|context|ctx)(?:[ _-]?(?:len(?:gth)?|window|size))?"
        r"\s*" + _JOIN + r"\s*(?:up to\s+)?" + _NUM + _K,
        re.I,
    ),
    # The number, then the noun: "8k context", "a 4096-token context", "8k sequence length".
    re.compile(
        r"(?<![\w.])" + _NUM + r"\s*(k)?(?:[ -]?tokens?)?[ -]?(?:context(?:[ -]window)?|ctx|"
        r"seq(?:uence)?[ _-]?len(?:gth)?)\b",
        re.I,
    ),
    # "with 2048 seq", "8k seq" (the abbreviation alone: "512 sequences" is a batch); not a
    # number before "seq 32768" ("context parallel 2 seq 32768" was read as 2 tokens).
    re.compile(
        r"(?<![\w.])" + _NUM + r"\s*(k)?[ -]?seq\b(?![ _-]?s\b)(?![ _-]?(?:len\w*)?\s*[=:]?\s*\d)",
        re.I,
    ),
    # "4096-token sequences", "8k tokens per sequence".
    re.compile(
        r"(?<![\w.])" + _NUM + r"\s*(k)?[ -]?tokens?(?:[ -](?:long\s+)?sequences?|\s+(?:per|each|a)"
        r"\s+(?:sequence|sample|example))\b",
        re.I,
    ),
    # "max length 4096", "max_length=2048", "maximum length of 8k", "cutoff_len 4096" (the
    # tokenizer's truncation length in Hugging Face and LLaMA-Factory configs).
    re.compile(
        r"(?<![a-z])(?:max(?:imum)?[ _-]?len(?:gth)?|cutoff[ _-]?len(?:gth)?)\s*(?:of|=|:|is|to)?\s*"
        + _NUM
        + _K,
        re.I,
    ),
    re.compile(
        r"(?:序列长度|序列长|序列|上下文长度|上下文窗口|上下文|长度)\s*(?:为|是|:|：|=|设为|设置为)?\s*"
        + _NUM
        + _K,
        re.I,
    ),
    re.compile(r"(?<![\w.])" + _NUM + r"\s*(k)?\s*(?:的)?\s*(?:上下文|序列长度|长度)", re.I),
    # "fine-tune llama-3-8b at 4k?": a length in k at the clause's end (not "at 4k steps",
    # "at $4k", "at 4k tokens/s")
    re.compile(
        r"\bat\s+(\d{1,3}(?:\.\d+)?)\s*(k)\b(?=\s*(?:[?.,;!)]|$|context\b|tokens?\b(?!\s*(?:/|per\b))))",
        re.I,
    ),
)
_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12, "万": 1e4, "亿": 1e8, "万亿": 1e12}
_SCALE.update(thousand=1e3, million=1e6, billion=1e9, trillion=1e12)
_UNIT = r"(?:\s*(tokens?|sequences?|samples?|examples?|seqs?))?"
_BATCH_RES = (
    re.compile(
        r"(?<![a-z])(?<!micro[ _-])(?<!micro)(?:(?:global[ _-]|total[ _-]|effective[ _-])?batch"
        r"(?:[ _-]?size)?|gbs|bsz?)\s*" + _JOIN + r"\s*" + _NUM + r"\s*([km])?(?![a-z0-9])" + _UNIT,
        re.I,
    ),
    re.compile(
        r"(?<![\w.])" + _NUM + r"\s*([km])?[ -]?(tokens?|sequences?|samples?)?[ -](?:global[ -])?"
        r"batch(?:es)?\b",
        re.I,
    ),
    re.compile(
        r"(?<![\w.])" + _NUM + r"\s*([km])?\s*(tokens?|sequences?|samples?)\s+per\s+"
        r"(?:optimi[sz]er\s+)?(?:step|update|batch)\b",
        re.I,
    ),
    re.compile(
        r"(?:全局)?(?:批大小|批量大小|批次大小|批量|批次)\s*(?:为|是|:|：|=)?\s*"
        + _NUM
        + r"\s*([km])?"
        + _UNIT,
        re.I,
    ),
)
# A micro-batch (sequences per GPU per forward): "micro-batch 4", "4 per-GPU batch", "batch 256
# per GPU", "per-device batch size 8", "batch size per device of 2".
_PER_GPU = r"per[ _-](?:gpu|device|rank)"
_MICRO_RE = re.compile(
    r"\bmicro[ _-]?batch(?:[ _-]?size)?\s*(?:of|=|:|is)?\s*(\d+)"
    r"|(\d+)\s*" + _PER_GPU + r"\s+batch"
    r"|\b(?:batch(?:[ _-]?size)?|bsz?)\s*(?:of|=|:|is)?\s*(\d+)\s*(?:sequences?\s+|samples?\s+|images?\s+)?"
    + _PER_GPU
    + r"|\b"
    + _PER_GPU
    # Hugging Face's "per_device_train_batch_size"; Megatron's "mbs".
    + r"[ _-](?:train(?:ing)?[ _-])?batch(?:[ _-]?size)?\s*(?:of|=|:|is)?\s*(\d+)"
    r"|\bbatch(?:[ _-]?size)?\s+" + _PER_GPU + r"\s*(?:of|=|:|is)?\s*(\d+)"
    r"|\bmbs\s*(?:=|:)?\s*(\d+)",
    re.I,
)
_TOKEN_SCALE = r"(k|m|b|t|thousand|million|billion|trillion|万亿|亿|万)"
_TOKENS_RE = re.compile(
    r"(?<![\w.])" + _NUM + r"\s*" + _TOKEN_SCALE + r"\s*(?:个\s*)?(?:training\s+|of\s+)?"
    r"(?:tokens?|toks?|词元)(?![a-z])",
    re.I,
)
# A dataset counted in examples of a length: "10M examples of 512 tokens", "50k samples at 2048
# tokens", "120k conversations of 4k tokens each": the sequence length, and count x length tokens.
_EXAMPLES_RE = re.compile(
    r"(?<![\w.])" + _NUM + r"\s*(k|m|b|thousand|million|billion)?\s*(?:training\s+)?"
    r"(?:examples?|samples?|sequences?|conversations?|documents?|rows|records|pairs)\s+"
    r"(?P<len>(?:of|at|with|x|×)\s+(?:about\s+|~\s*)?"
    + _NUM
    + r"\s*(k)?[ -]?tokens?(?:\s+each)?)\b",
    re.I,
)
# Epochs over the dataset: "3 epochs", "2 个 epoch", "for 2 epochs", "epochs=3", "num_train_epochs: 2".
EPOCHS_RE = re.compile(
    r"(?<![\w.])" + _NUM + r"\s*(?:个\s*)?epochs?\b|\b(?:num_train_)?epochs?\s*[=:]\s*" + _NUM, re.I
)
_PREP_BEFORE = re.compile(r"(?:on|over|for|with|of|about|~|训练|用)\s*$", re.I)
# bf16 with no fp32 master copy ("pure bf16") and TF32 matmuls ("tf32") are the recipe's too
# (tools/intake/recipe_text.py), which the plan says its launch does not run; "mixed precision"
# and "AMP" are the default's own run (bf16 where the GPU has it, else fp16), read with the words.
PURE_BF16 = (
    r"\bpure[ -](?:bf16|bfloat16)\b|\b(?:bf16|bfloat16)\s+(?:without|with\s+no|no)\s+(?:fp32\s+)?"
    r"master(?:\s+(?:weights|copy|copies|params))?\b"
)
_PRECISION = (
    ("bf16", re.compile(PURE_BF16 + r"|\b(?:bf16|bfloat16)\b", re.I)),
    ("fp16", re.compile(r"\b(?:fp16|float16|half[- ]precision)\b", re.I)),
    (
        "fp32",
        re.compile(r"\b(?:fp32|float32|tf32|full[- ]precision|single[- ]precision)\b", re.I),
    ),
    ("auto", re.compile(r"\bmixed[ -]precision\b|\bamp\b", re.I)),
)
_DEADLINE_RE = re.compile(
    r"\b(?:in|within|by|under|before|in less than|in under|deadline(?: of)?|due in)\s+"
    r"(?:about\s+|~\s*)?(?:"
    + _NUM
    + r"|an?(?=\s))"  # "in under a week", "within a day"
    + r"\s*(hours?|hrs?|days?|weeks?|months?)\b|(?<![\w.])"
    + _NUM
    + r"\s*[ -]?(?:days?|weeks?|months?)[ -]deadline\b|(?<![a-z0-9.])"
    + r"(\d+(?:\.\d+)?|[一二两三四五六七八九十]+)"
    + r"\s*(?:天|周|星期|个月|小时)(?:内|之内|以内|完成|训完)",
    re.I,
)
# A deadline named by a day, not a duration ("by Friday", "before next Monday", "by end of the
# week"): a deadline wish the plan cannot check (it does not know today's date) and says so.
_DAY_DEADLINE_RE = re.compile(
    r"\b(?:by|before|until|due(?:\s+on)?|deadline(?:\s+is|\s+of|\s*:)?(?:\s+on)?)\s+"
    r"(?:(?:next|this|the)\s+)?(?:(?:mon|tues|wednes|thurs|fri|satur|"
    r"sun)day|tomorrow|tonight|(?:the\s+)?end\s+of\s+(?:the\s+|this\s+|next\s+)?(?:day|week|"
    r"month|quarter|year)|eod|eow|eom)\b",
    re.I,
)
_MONEY_RE = re.compile(
    r"[$€£¥]\s*\d[\d,]*(?:\.\d+)?\s*(?:k|m|thousand|million)?(?![\w/]|\.\d)"
    r"|(?<![\w.])\d[\d,]*(?:\.\d+)?\s*(?:k|m)?\s*(?:usd|dollars?|eur|euros?|rmb|cny|元|美元)"
    r"|预算\s*(?:为|是|:|：)?\s*\d+(?:\.\d+)?\s*(?:万|千)?\s*(?:元|美元|块)?",
    re.I,
)
_PER_HOUR = re.compile(r"^\s*(?:/|per\b|an?\b|each\b)\s*(?:gpu|hour|hr|h\b)", re.I)
_GPU_HOURS_RE = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s*(?:k)?\s*(?:h100|a100|gpu)[\s-]*(?:hours?|hrs?|h)\b|"
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s*(?:k)?\s*(?:卡时|gpu\s*小时)",
    re.I,
)


def seq_reading(text: str) -> Read | None:
    """The sequence length the request states (the first phrase that gives one), or None."""
    found = [m for p in _SEQ_RES for m in p.finditer(text)]
    for m in sorted(found, key=lambda m: m.start()):
        value = int(_number(m.group(1)) * (1024 if m.group(2) else 1))
        if value > 0:
            return Read.of("seq_len", value, m)
    return None


# Batches in tokens are quoted in binary multiples: Llama's "4M tokens" is 4 x 2^20 =
# 4,194,304 (1,024 sequences of 4,096), GPT-3's "3.2M" is 1,536 x 2,048 = 3 x 2^20.
_BINARY = {"k": 2**10, "thousand": 2**10, "m": 2**20, "million": 2**20}


def _binary_batch(count: float, scale: str | None, seq_len: int) -> float:
    """A token batch read in binary multiples (4M = 4 x 2^20) when that is whole sequences."""
    binary = _BINARY.get((scale or "").lower())
    if binary is None:
        return count
    tokens = count / _SCALE[scale.lower()] * binary  # type: ignore[union-attr]
    return tokens if (tokens / seq_len).is_integer() else count


def batch_reading(text: str, seq_len: int) -> tuple[Read | None, str | None]:
    """The global batch in sequences, and how a batch given in tokens was converted (or None).

    A batch in tokens ("4M-token batch", "batch of 2M tokens") is that many tokens over the
    sequence length, rounded (at least 1); the second value says so.
    """
    found = sorted((m for p in _BATCH_RES for m in p.finditer(text)), key=lambda m: m.start())
    micro = [(m.start(), m.end()) for m in _MICRO_RE.finditer(text)]
    for m in found:
        if any(a <= m.start() < b for a, b in micro):
            continue  # a batch per GPU is the micro-batch, not the global batch
        count = _number(m.group(1)) * (_SCALE[m.group(2).lower()] if m.group(2) else 1)
        unit = (m.group(3) or "").lower()
        if count <= 0:
            continue
        if unit.startswith("token"):
            count = _binary_batch(count, m.group(2), seq_len)
            sequences = max(1, round(count / seq_len))
            how = f"{m.group(0).strip()!r} is {count:,.0f} tokens = {sequences} sequences of {seq_len}"
            return Read.of("global_batch_size", sequences, m), how
        return Read.of("global_batch_size", int(count), m), None
    return None, None


# Gradient accumulation: "gradient accumulation 8", "grad accum 4", "GA=8",
# "8 gradient accumulation steps", "accumulate gradients over 4 steps".
_ACCUM_RE = re.compile(
    r"\b(?:grad(?:ient)?[ _-]?accum(?:ulation)?(?:[ _-]steps?)?|ga)\s*(?:of|=|:|is)?\s*(\d{1,5})\b"
    # not "batch_size=4 gradient_accumulation_steps=8": that 4 is the key before's value
    r"|(?<![\w.=:])(\d{1,5})\s*(?:grad(?:ient)?[ _-]?accum(?:ulation)?[ _-]?steps?)\b(?!\s*[=:])"
    r"|\baccumulat\w*\s+(?:the\s+)?gradients?\s+(?:over|for|across)\s+(\d{1,5})\s*(?:steps?|micro[ -]?batch\w*)",
    re.I,
)


def accumulation_reading(text: str) -> Read | None:
    """Gradient accumulation steps the request names ("gradient accumulation 8"): a wish."""
    if m := _ACCUM_RE.search(text):
        return Read.of("grad-accum", int(next(g for g in m.groups() if g)), m)
    return None


def micro_batch_reading(text: str) -> Read | None:
    """A micro-batch the request names ("micro-batch 4"): a wish, not a brief field."""
    if m := _MICRO_RE.search(text):
        return Read.of("micro-batch", int(next(g for g in m.groups() if g)), m)
    return None


def tokens_reading(text: str, taken: list[tuple[int, int]]) -> Read | None:
    """The tokens to train on ("200B tokens", "on 500k tokens", "2000亿 token"), or None.

    A count outside ``taken`` (the spans of a batch or a context already read); a thousands
    count ("4k tokens") only after on/over/for/with, since a bare one is a context length.
    """
    for m in _TOKENS_RE.finditer(text):
        if any(a <= m.start() < b or m.start() <= a < m.end() for a, b in taken):
            continue
        scale = m.group(2).lower()
        if scale in ("k", "thousand") and not _PREP_BEFORE.search(text[: m.start()]):
            continue
        return Read.of("dataset_tokens", _number(m.group(1)) * _SCALE[scale], m)
    return None


_BATCH_BEFORE = re.compile(r"batch(?:[ _-]?size)?\s*(?:of|=|:|is)?\s*$", re.I)
_PER_STEP = re.compile(
    r"\s*(?:per|each|every|a)\s+(?:optimi[sz]er\s+)?(?:step|update|batch)\b", re.I
)


def examples_reads(text: str) -> tuple[Read, Read] | None:
    """The sequence length and the tokens of a dataset counted in examples of a length, or None."""
    for m in _EXAMPLES_RE.finditer(text):
        if _BATCH_BEFORE.search(text[: m.start()]) or _PER_STEP.match(text[m.end() :]):
            continue  # "a batch of 512 sequences of 2048 tokens" is a batch, not the data
        count = _number(m.group(1)) * (_SCALE[m.group(2).lower()] if m.group(2) else 1)
        length = int(_number(m.group(4)) * (1024 if m.group(5) else 1))
        if count > 0 and length > 0:
            return Read.of("seq_len", length, m, 3), Read.of("dataset_tokens", count * length, m)
    return None


def precision_reading(text: str) -> Read | None:
    """The training number format the request names (bf16, fp16, fp32), or None."""
    for precision, pattern in _PRECISION:
        if m := pattern.search(text):
            return Read.of("precision", precision, m)
    return None


# The run's optimizer steps: "for 5000 steps", "train for 10k steps", "max_steps=2000",
# "20,000 training steps", "train_iters 5000", "20 steps", "run 500 iterations" (never "every
# 500 steps": a save interval; see _NOT_RUN_BEFORE).
_STEPS_RE = re.compile(
    r"(?<!every )\bfor\s+(\d[\d,]*)\s*(k)?\s*(?:optimizer\s+|training\s+)?(?:steps|iterations|iters)\b"
    r"|\b(?:max_steps|train_iters|train[ _-]steps|total[ _-]steps)\s*[=:]?\s*(\d[\d,]*)(k)?\b"
    r"|(?<![\w.,])(\d[\d,]*)\s*(k)?\s*(?:optimizer|training)\s+(?:steps|iterations)\b"
    r"|(?<![\w.,])(\d[\d,]*)\s*(k)?\s*(?:steps|iterations|iters)\b",  # "20 steps", "run 2k iters"
    re.I,
)
# What a bare step count belongs to when not the run: a save, eval or log interval ("every"),
# the warm-up ("warmup of 2000 steps", "the first 300 steps", "2000 steps of warmup") or the
# gradient accumulation ("accumulate gradients over 4 steps").
_NOT_RUN_BEFORE = re.compile(
    r"(?:\bevery|\bfirst|\blast|warm[ _-]?up(?:[ _-]steps?)?\s*(?:of|=|:|for|over)?"
    r"|accumulat\w*(?:\s+\w+)?\s+(?:over|for|across))\s*$",
    re.I,
)
_NOT_RUN_AFTER = re.compile(r"\s*(?:of\s+)?warm[ _-]?up", re.I)


# Checkpoints: "save every 200 steps", "checkpoint every 1k steps", "save_steps=500"; "keep the
# last 3 checkpoints", "keep 5 checkpoints", "save_total_limit=2".
_SAVE_RE = re.compile(
    r"\b(?:sav(?:e|es|ed|ing)|checkpoint\w*)\s+(?:a\s+|the\s+)?(?:checkpoints?\s+|model\s+)?every\s+(\d[\d,]*)(k)?"
    r"\s*(?:steps?|iterations?|iters?)\b|\bsave_steps\s*[=:]\s*(\d[\d,]*)(k)?\b",
    re.I,
)
_KEEP_RE = re.compile(
    r"\bkeep(?:ing)?\s+(?:only\s+)?(?:the\s+)?(?:last|latest|newest|most\s+recent)?\s*(\d{1,5})\s+"
    r"(?:\w+\s+)?checkpoints?\b|\bsave_total_limit\s*[=:]\s*(\d{1,5})\b",
    re.I,
)


def checkpoint_reads(text: str) -> list[Read]:
    """The checkpoint interval and the checkpoints kept, as the request names them."""
    reads = []
    if m := _SAVE_RE.search(text):
        at = 0 if m.group(1) else 2
        every = int(m.group(at + 1).replace(",", "")) * (1000 if m.group(at + 2) else 1)
        if every >= 1:
            reads.append(Read.of("save_every", every, m))
    if (m := _KEEP_RE.search(text)) and int(m.group(1) or m.group(2)) >= 1:
        reads.append(Read.of("keep_checkpoints", int(m.group(1) or m.group(2)), m))
    return reads


def steps_reading(text: str) -> Read | None:
    """The run's optimizer steps the request names, or None."""
    for m in _STEPS_RE.finditer(text):
        if _NOT_RUN_BEFORE.search(text[: m.start()]) or _NOT_RUN_AFTER.match(text, m.end()):
            continue  # "warmup for 500 steps" is the warm-up
        groups = m.groups()
        at = next(i for i in (0, 2, 4, 6) if groups[i])
        steps = int(groups[at].replace(",", "")) * (1000 if groups[at + 1] else 1)
        if steps >= 1:
            return Read.of("train_steps", steps, m)
    return None


def deadline_reading(text: str) -> Read | None:
    """A deadline ("in 2 weeks", "within 10 days", "3天内训完"): no brief field holds it."""
    if m := _DEADLINE_RE.search(text) or _DAY_DEADLINE_RE.search(text):
        return Read.of("deadline", m.group(0).strip(), m)
    return None


def money_readings(text: str) -> list[Read]:
    """Money budgets ("$50k", "20,000 USD", "预算 10 万元") and GPU-hour budgets; not prices per hour."""
    out = []
    for m in _MONEY_RE.finditer(text):
        if not _PER_HOUR.match(text[m.end() :]):
            out.append(Read.of("money-budget", m.group(0).strip(), m))
    out += [Read.of("compute-budget", m.group(0).strip(), m) for m in _GPU_HOURS_RE.finditer(text)]
    return out


def number_reads(text: str, default_seq_len: int) -> tuple[list[Read], list[str]]:
    """Every non-hardware number phrase read, as ``Read``s, and how a token batch was converted.

    Brief fields (seq_len, global_batch_size, dataset_tokens, precision) and the wishes no
    field holds (micro-batch, deadline, money-budget, compute-budget), each with its words.
    """
    reads: list[Read] = []
    notes: list[str] = []
    average = average_examples_tokens(text)  # "2M pairs averaging 600 tokens": no seq_len
    examples = examples_reads(text) if average is None else None
    seq = seq_reading(text) or (examples[0] if examples else None)
    if seq is not None:
        reads.append(seq)
    batch, how = batch_reading(text, seq.value if seq is not None else default_seq_len)
    if batch is not None:
        reads.append(batch)
        if how:
            assumed = "" if seq is not None else " (the default sequence length)"
            notes.append(f"intake: global batch {how}{assumed}")
    taken = [(r.start, r.end) for r in (*reads, *([average] if average else []))]
    tokens = tokens_reading(text, taken)
    if tokens is None and (tokens := examples[1] if examples is not None else average):
        notes.append(
            f"intake: dataset_tokens {tokens.quote!r} = {tokens.value:,.0f} tokens (examples x "
            + (
                "their length; shorter examples packed or padded change it)"
                if average is None
                else "their average length)"
            )
        )
    if tokens is None and (steps := steps_reading(text)) is not None:
        reads.append(steps)  # the run's length, when no token count gives it
    epochs = EPOCHS_RE.search(text)
    if tokens is not None and epochs is not None and _number(epochs[1] or epochs[2]) > 0:
        # "3 epochs over 500M tokens": the brief's dataset_tokens are every epoch's tokens.
        total = tokens.value * _number(epochs[1] or epochs[2])
        notes.append(
            f"intake: dataset_tokens {epochs[0].strip()!r} x {tokens.quote!r} = {total:,.0f} "
            "tokens trained"
        )
        tokens = Read(tokens.field, total, tokens.quote, tokens.start, tokens.end)
        reads.append(Read.of("dataset_tokens", total, epochs))
    for extra in (
        tokens,
        precision_reading(text),
        lr_reading(text),
        warmup_reading(text),
        micro_batch_reading(text),
        accumulation_reading(text),
        deadline_reading(text),
    ):
        if extra is not None:
            reads.append(extra)
    reads += money_readings(text)
    reads += checkpoint_reads(text)
    return reads, notes
