"""What a request wishes for: a framework, frameworks it refuses, and pinned setup dimensions.

"we want to use FSDP, no deepspeed" -> framework pytorch_fsdp, avoid deepspeed; "with
Megatron" -> megatron; "use Horovod with Keras" -> horovod (the team's stack, TensorFlow, is
read by the brief parser); "PyTorch DDP only" -> pytorch_ddp; "with torchtitan" -> torchtitan
(its launch files where one of its flavors builds the model; otherwise the plan says in one
line why not and what runs instead: tools/research/titan_wish.py). Pins: "ZeRO-2", "ZeRO
stage 3", "TP 4", "tensor parallel 8", "PP 2", "pipeline parallelism of 4", "no tensor
parallelism" (degree 1), "expert parallelism 8", "EP=8", "ep8", "context parallel 4", "CP=2",
"no expert parallelism" (degree 1), "no offload", "with offload"; "do not use ZeRO-3" refuses
that stage (``avoid_zero_stages``).

Offline and deterministic, like the rest of the request parser (tools/intake/brief.py); every
pattern is linear (no nested quantifiers), and the request is already capped in length.
"""

from __future__ import annotations

import re
from typing import Any

from tools.intake.readings import Read

# NeMo, the trainer, and not the word inside a model's name ("mistral-nemo-12b", "Mistral NeMo
# 12B"): that model once put every plan for it on Megatron with a trainer:nemo wish nobody made.
_NEMO = r"(?<!mistral[ _-])\bnemo\b"
# Each framework's names in a request, most specific first (a longer name wins its span).
_NAMES: tuple[tuple[str, str], ...] = (
    ("torchtitan", r"torch\s*titan"),
    ("pytorch_fsdp", r"fsdp2?|fully[ -]sharded(?:\s+data[ -]parallel)?"),
    ("megatron", r"megatron(?:[ -](?:lm|deepspeed|core))?|" + _NEMO),
    ("deepspeed", r"deep[ -]?speed"),
    ("horovod", r"horovod"),
    ("pytorch_ddp", r"(?:pytorch\s+|torch\s+)?ddp|distributed\s*data\s*parallel"),
)
_ANY_NAME = "|".join(f"(?:{p})" for _, p in _NAMES)
# A refusal before the name ("no DeepSpeed", "not megatron", "without FSDP", "avoid horovod",
# "don't want deepspeed") or after it ("DeepSpeed is not allowed", "deepspeed: no").
_REFUSE_BEFORE = re.compile(
    r"\b(?:no|not|never|without|avoid(?:ing)?|except|exclude|excluding|other than|"
    r"(?:do|does|can)\s*(?:n['’]?t|not)\s+(?:want|use|like|allow)(?:\s+to\s+use)?|"
    r"instead of|rather than|but not)\s+(?:using\s+|use\s+|the\s+)?(" + _ANY_NAME + r")\b",
    re.I,
)
_REFUSE_AFTER = re.compile(
    r"\b(" + _ANY_NAME + r")\s+(?:is\s+)?(?:not allowed|forbidden|banned|is out|not an option)",
    re.I,
)
_NAME_RE = re.compile(r"\b(" + _ANY_NAME + r")\b", re.I)
# The names a refusal lists after its first: "don't use FSDP or DeepSpeed", "no fsdp/deepspeed",
# "without FSDP, DeepSpeed or Megatron" refuse each one ("and" joins too loosely to be read).
_REFUSED_NEXT = re.compile(
    r"\s*(?:,\s*(?:or\s+|nor\s+)?|\s+(?:or|nor)\s+|/)\s*(?:the\s+)?(" + _ANY_NAME + r")\b", re.I
)

_ZERO_RE = re.compile(r"\bzero[ -]?(?:stage[ -]?)?([0-3])\b|\bstage[ -]?([0-3])\s+zero\b", re.I)
_TP_RE = re.compile(
    r"\b(?:tp|tensor[ -]parallel(?:ism|\s+(?:size|degree))?)\s*(?:(?:of|=|:|size|degree)\s*)?(\d{1,2})\b",
    re.I,
)
_PP_RE = re.compile(
    r"\b(?:pp|pipeline[ -]parallel(?:ism|\s+(?:size|degree))?)\s*(?:(?:of|=|:|size|degree)\s*)?(\d{1,4})\b",
    re.I,
)
_TP_BEFORE_RE = re.compile(r"\b(\d{1,2})[ -]?way\s+(?:tensor[ -]parallel|tp\b)", re.I)
# "4-way pipeline", "4-stage pipeline", "4 pipeline stages", "a pipeline of 4 stages"
_PP_BEFORE_RE = re.compile(
    r"\b(\d{1,4})[ -]?(?:way|stage)s?\s+(?:pipeline|pp\b)"
    r"|\b(\d{1,4})\s+(?:pipeline|pp)(?:[ -]parallel)?[ -]stages?\b"
    r"|\bpipeline\s+of\s+(\d{1,4})\s+stages?\b",
    re.I,
)
# "pipeline 4", "pipeline=4", "pipeline stages 4" (as in "tensor parallel 8 pipeline 4": the
# degree was dropped and the search picked its own); not "pipeline 4 workers".
_PP_SHORT_RE = re.compile(
    r"\bpipeline(?:\s+stages?)?\s*(?:=|:)?\s*(\d{1,4})\b(?!\s*(?:workers?|threads?|proc))", re.I
)
# "expert parallelism 8", "expert-parallel size 8", "EP=8", "EP 8", "ep8", "8-way expert
# parallel", "专家并行 8"; the context-parallel degree likewise ("CP=2", "context parallel 4").
_EP_WORDS = r"ep|expert[ -]parallel(?:ism)?"
_CP_WORDS = r"cp|context[ -]parallel(?:ism)?"
_DEGREE_AFTER = r")\s*(?:(?:size|degree)\s*)?(?:(?:of|=|:|-)\s*)?(\d{1,4})\b"
_EP_RE = re.compile(
    r"\b(?:" + _EP_WORDS + _DEGREE_AFTER + r"|专家并行度?\s*[=:：]?\s*(\d{1,4})", re.I
)
_CP_RE = re.compile(
    r"\b(?:" + _CP_WORDS + _DEGREE_AFTER + r"|上下文并行度?\s*[=:：]?\s*(\d{1,4})", re.I
)
_EP_BEFORE_RE = re.compile(r"\b(\d{1,4})[ -]?way\s+(?:" + _EP_WORDS + r")\b", re.I)
_CP_BEFORE_RE = re.compile(r"\b(\d{1,4})[ -]?way\s+(?:" + _CP_WORDS + r")\b", re.I)
# The split named without a degree, to find a refusal before it ("no expert parallelism").
_EP_NAME_RE = re.compile(r"\b(?:ep|expert[ -]parallel\w*)\b|专家并行", re.I)
_CP_NAME_RE = re.compile(r"\b(?:cp|context[ -]parallel\w*)\b|上下文并行", re.I)
_NO_TP_RE = re.compile(r"\b(?:no|without)\s+(?:tp|tensor[ -]parallel)", re.I)
_NO_PP_RE = re.compile(r"\b(?:no|without)\s+(?:pp|pipeline(?:[ -]parallel)?)\b", re.I)
_NO_OFFLOAD_RE = re.compile(
    r"\b(?:no|not|never|without|avoid(?:ing)?|don['’]?t)\s+(?:\w+\s+)?(?:cpu\s+|nvme\s+)?offload",
    re.I,
)
# "with offload", "and CPU offload", "ZeRO-3 NVMe offloading", "offload the optimizer to CPU".
_OFFLOAD_RE = re.compile(
    r"\b(?:with|use|using|enable|want)\s+(?:cpu\s+|nvme\s+)?offload|\b(?:cpu|nvme)[ -]offload"
    r"|\boffload(?:ing)?\s+(?:the\s+)?(?:\w+\s+){0,2}(?:to|onto)\s+(?:the\s+)?(?:cpu|nvme|host)\b",
    re.I,
)


def _framework_of(name: str) -> str:
    """The framework id a matched name means."""
    for fid, pattern in _NAMES:
        if re.fullmatch(pattern, name, re.I):
            return fid
    raise ValueError(name)  # unreachable: the name was matched by one of the patterns


def _listed_after(text: str, refusal: re.Match[str]) -> list[tuple[int, int]]:
    """The spans of the names a refusal lists after its first ("no FSDP or DeepSpeed").

    A name after a comma counts only where an "or"/"nor"/"/" name follows ("without FSDP,
    DeepSpeed or Megatron"): in "no FSDP, deepspeed is fine" the comma ends the refusal.
    """
    spans: list[tuple[int, int]] = []
    kept = 0
    while n := _REFUSED_NEXT.match(text, refusal.end() if not spans else spans[-1][1]):
        spans.append(n.span(1))
        if not n.group(0).lstrip().startswith(","):
            kept = len(spans)
    return spans[:kept]


def framework_reads(text: str) -> tuple[Read | None, list[Read]]:
    """The framework a request names (the first not refused) and the ones it refuses, with quotes.

    A named framework that is also refused counts as refused; of several named ones the first
    named wins ("FSDP or DeepSpeed" -> FSDP), and a refused one is never the framework.
    """
    avoided: list[Read] = []
    refused_spans: list[tuple[int, int]] = []
    for regex in (_REFUSE_BEFORE, _REFUSE_AFTER):
        for m in regex.finditer(text):
            for span in [m.span(1), *(_listed_after(text, m) if regex is _REFUSE_BEFORE else [])]:
                fid = _framework_of(text[span[0] : span[1]])
                refused_spans.append(span)
                if all(r.value != fid for r in avoided):  # quoted from the refusal's first word
                    quote = text[m.start() : span[1]]
                    avoided.append(Read(f"avoid:{fid}", fid, quote, m.start(), span[1]))
    for m in _NAME_RE.finditer(text):
        if any(a <= m.start() < b for a, b in refused_spans):
            continue
        fid = _framework_of(m.group(1))
        if all(r.value != fid for r in avoided):
            return Read.of(f"framework:{fid}", fid, m, 1), avoided
    return None, avoided


def framework_wish_reads(text: str) -> list[Read]:
    """Every framework a request names or refuses, as wishes: the first named is the brief's.

    A second framework named ("with fsdp, with megatron") was dropped without a word; each is
    its own ``framework:X`` wish, which the plan marks used or not (tools/core/request_account.py).
    """
    framework, avoided = framework_reads(text)
    reads = [r for r in (framework, *avoided) if r is not None]
    if framework is None:
        return reads
    refused = {r.value for r in avoided}
    for m in _NAME_RE.finditer(text):
        fid = _framework_of(m.group(1))
        if fid not in refused and all(r.value != fid for r in reads):
            reads.append(Read.of(f"framework:{fid}", fid, m, 1))
    return reads


def wish_fields(text: str) -> dict[str, Any]:
    """The brief fields a request's wishes set: framework, avoid_frameworks, pins, objective."""
    framework, avoided = framework_reads(text)
    fields: dict[str, Any] = {}
    if framework:
        fields["framework"] = framework.value
    if avoided:
        fields["avoid_frameworks"] = [r.value for r in avoided]
    pins = pin_fields(text)
    if pins:
        fields["pins"] = pins
    if (objective := objective_of(named_wishes(text))) is not None:
        fields["objective"] = objective
    return fields


def pin_reads(text: str) -> list[Read]:
    """The setup dimensions a request fixes, each with its words (field ``pins.<name>``).

    A ZeRO stage the request refuses ("do not use ZeRO-3") is no pin: it is
    ``pins.avoid_zero_stages``, which the search keeps out, and ``named_wishes`` reads it as the
    wish ``avoid:zero-3``.
    """
    reads: list[Read] = []
    for z in _ZERO_RE.finditer(text):
        if not _refused_before(text, z.start()):
            reads.append(Read.of("pins.zero_stage", int(z.group(1) or z.group(2)), z))
            break
    m: re.Match[str] | None
    if m := (_TP_RE.search(text) or _TP_BEFORE_RE.search(text)):
        reads.append(Read.of("pins.tensor_parallel", int(m.group(1)), m))
    elif m := _NO_TP_RE.search(text):
        reads.append(Read.of("pins.tensor_parallel", 1, m))
    if m := (_PP_RE.search(text) or _PP_BEFORE_RE.search(text) or _PP_SHORT_RE.search(text)):
        reads.append(Read.of("pins.pipeline_parallel", int(next(g for g in m.groups() if g)), m))
    elif m := _NO_PP_RE.search(text):
        reads.append(Read.of("pins.pipeline_parallel", 1, m))
    reads += _degree_reads(text, "pins.expert_parallel", _EP_RE, _EP_BEFORE_RE, _EP_NAME_RE)
    reads += _degree_reads(text, "pins.context_parallel", _CP_RE, _CP_BEFORE_RE, _CP_NAME_RE)
    if m := _NO_OFFLOAD_RE.search(text):
        reads.append(Read.of("pins.offload", False, m))
    elif m := _OFFLOAD_RE.search(text):
        reads.append(Read.of("pins.offload", True, m))
    if refused := _refused_zero_stages(text):
        reads.append(refused)
    return reads


def _degree_reads(
    text: str, field: str, after: re.Pattern[str], before: re.Pattern[str], name: re.Pattern[str]
) -> list[Read]:
    """A split's degree with its words: "EP 8", "4-way context parallel"; a refusal is 1.

    "no expert parallelism", "without CP" pin the degree 1; a request that names the split
    without a degree ("with expert parallelism") pins nothing (the wish says it).
    """
    for m in after.finditer(text):
        if not _refused_before(text, m.start()):
            degree = m.group(1) if m.group(1) is not None else m.group(2)
            return [Read(field, int(degree), m.group(0).strip(), m.start(), m.end())]
    if way := before.search(text):
        return [Read.of(field, int(way.group(1)), way)]
    for named in name.finditer(text):
        if (at := _refusal_start(text, named.start())) is not None:
            return [Read(field, 1, text[at : named.end()], at, named.end())]
    return []


def pin_fields(text: str) -> dict[str, Any]:
    """The setup dimensions a request fixes: ZeRO stage, split degrees, offload."""
    return {r.field.split(".", 1)[1]: r.value for r in pin_reads(text)}


def _refused_zero_stages(text: str) -> Read | None:
    """The ZeRO stages a request refuses ("do not use ZeRO-3"), quoted from the first refusal."""
    refused = [
        (at, m)
        for m in _ZERO_RE.finditer(text)
        if (at := _refusal_start(text, m.start())) is not None
    ]
    if not refused:
        return None
    stages = sorted({int(m.group(1) or m.group(2)) for _, m in refused})
    at, first = refused[0]
    return Read("pins.avoid_zero_stages", stages, text[at : first.end()], at, first.end())


# Techniques, trainers and objectives a request may name: each becomes a wish with its words,
# which the planner honours or refuses out loud (plan JSON ``request.wishes``). Id, pattern.
_NAMED: tuple[tuple[str, str], ...] = (
    (
        "technique:expert-parallelism",
        r"\bexpert[ -]parallel\w*|\bEP\s*(?:[=:-]|of|size|degree)?\s*\d+\b|专家并行",
    ),
    (
        "technique:context-parallelism",
        r"\bcontext[ -]parallel\w*|\bCP\s*(?:[=:-]|of|size|degree)?\s*\d+\b|\bring[ -]attention\b"
        r"|上下文并行",
    ),
    ("technique:sequence-parallelism", r"\bsequence[ -]parallel\w*|\bulysses\b|序列并行"),
    ("technique:zero++", r"\bzero\s*\+\+|\bzeropp\b|\bzero[ -]plus[ -]plus\b"),
    ("technique:fsdp2", r"\bfsdp[ -]?2\b|\bfully_shard\b"),
    ("technique:hybrid-sharding", r"\bhybrid[ _-]?shard\w*|\bHSDP\b"),
    (
        "technique:8bit-optimizer",
        r"\b8[ -]?bit\s+(?:adam\w*|optimi[sz]ers?|states?)\b|\badamw?[ _-]?8[ _-]?bit\b|"
        r"\bbitsandbytes\b|\bpaged[ _-]adamw?(?:[ _-]?8[ _-]?bit)?\b",
    ),
    ("technique:fp8", r"\bfp8\b|\bfloat8\b|\btransformer[ -]engine\b"),
    (
        "technique:torch.compile",
        r"\btorch\.compile\b|\btorch[ -]compile\b|\bcompiled?\s+with\s+torch\b",
    ),
    ("technique:flash-attention", r"\bflash[ -]?attn\w*|\bflash[ -]?attention[ -]?\d?\b"),
    # "with packing", "sample packing", "packed sequences": every launch here packs documents.
    (
        "technique:packing",
        r"\b(?:sequence[ -]|sample[ -])?packing\b|\bpacked\s+(?:sequences|samples)\b",
    ),
    ("technique:nvme-offload", r"\bnvme\b"),  # the plans offload to CPU RAM only
    # "extend llama-3-8b to 64k context", "YaRN": the launch keeps the model's RoPE (plan_wishes.py)
    (
        "technique:context-extension",
        r"\bextend\w*\s+(?:[\w.-]+\s+){0,3}?to\s+\d+\s*k?\s+(?:tokens?\s+(?:of\s+)?)?context\b"
        r"|\bextend\w*\s+(?:the\s+|its\s+)?context(?:\s+(?:length|window))?\b"
        r"|\b(?:long[ -])?context[ -](?:length[ -]|window[ -])?extension\b"
        r"|\byarn\b|\brope[ -]scaling\b|\bposition(?:al)?[ -]interpolation\b|\bntk[ -]aware\b",
    ),
    # "resume from checkpoint /ckpt/step-4000": a checkpoint of another run (plan_wishes.py).
    (
        "checkpoint:resume",
        # a path or a named checkpoint, not "resume from where it stopped" (launch.sh does that)
        r"\bresum\w*\s+(?:training\s+)?from\s+(?:the\s+|a\s+|my\s+)?(?:checkpoint\s+)?"
        r"(?:[\w.~-]*/[\w./~:-]+|checkpoint[-_]\d+\b|step[-_ ]?\d+\b)",
    ),
    # "tensor parallelism across nodes": where the split is placed (plan_wishes.py decides)
    (
        "technique:tp-across-nodes",
        r"\b(?:tensor[ -]parallel\w*|tp)\s+(?:across|over|between|spanning)\s+"
        r"(?:the\s+|all\s+|multiple\s+|\d+\s+)?nodes\b",
    ),
    (
        "technique:activation-checkpointing",
        r"\b(?:activation|gradient)[ -]checkpointing\b|\brecompute\b|重计算|激活检查点",
    ),
    (
        "trainer:hf-trainer",
        r"\b(?:hf|hugging\s?face|transformers)(?:'s)?\s+trainer\b|\bSFTTrainer\b",
    ),
    (
        "trainer:accelerate",
        r"\b(?:hf|hugging\s?face|🤗)\s+accelerate\b|\b(?:with|using|via|use)\s+accelerate\b|\baccelerate\s+(?:launch|config)\b",
    ),
    ("trainer:axolotl", r"\baxolotl\b"),
    ("trainer:torchtune", r"\btorchtune\b"),
    ("trainer:llama-factory", r"\bllama[ -]?factory\b"),
    ("trainer:nemo", _NEMO),
    ("trainer:trl", r"\btrl\b"),
    ("trainer:unsloth", r"\bunsloth\b"),
    # Stacks no launch here is written for: refused out loud (``UNOFFERED``), never dropped.
    ("unoffered:jax", r"\bjax\b|\bflax\b|\bmaxtext\b|\bpaxml?\b|\bt5x\b"),
    (
        "unoffered:lightning",
        r"\bpytorch[ -]lightning\b|\blightning[ -](?:ai|fabric|trainer)\b"
        r"|\b(?:with|using|via|in|on|use)\s+lightning\b",
    ),
    (
        "unoffered:ray-train",
        r"\bray[ -]train\b|\b(?:with|using|via|on|use)\s+ray\b(?![ -]train)",
    ),
    ("unoffered:colossalai", r"\bcolossal[ -]?ai\b"),
    (
        "objective:sft",
        r"\bsft\b|\bsupervised\s+fine-?tun\w*|\binstruction[ -]tun\w*|指令微调|监督微调",
    ),
    ("objective:dpo", r"\bdpo\b|\bdirect\s+preference\b|\borpo\b|\bsimpo\b|\bipo\b|偏好优化"),
    (
        "objective:rl",
        r"\bppo\b|\bgrpo\b|\brlhf\b|\brlaif\b|\breinforcement\s+learning\b|\breward\s+model\w*|"
        r"\brollouts?\b|强化学习",
    ),
    ("objective:distill", r"\bdistil\w*|蒸馏"),
    (
        "objective:continued-pretraining",
        r"\bcontinu\w*\s+(?:the\s+)?pre-?train\w*|\bfurther\s+pre-?train\w*|\bcontinual\s+pre-?train\w*"
        r"|\bCPT\b|继续预训练|增量预训练|持续预训练",
    ),
)
# What each unoffered stack is, for the line that refuses it.
UNOFFERED = {
    "jax": "JAX/Flax",
    "lightning": "PyTorch Lightning",
    "ray-train": "Ray Train",
    "colossalai": "ColossalAI",
}
OFFERED = "DeepSpeed, Megatron-LM, PyTorch FSDP or DDP, torchtitan and Horovod"


def stack_mark(kind: str, name: str) -> tuple[bool, str] | None:
    """How intake marks a wish about an unoffered stack: named, refused; refused, kept."""
    if name not in UNOFFERED:
        return None
    if kind == "avoid":
        return True, "not used: trainwright never plans on it"
    if kind != "unoffered":
        return None
    return False, (
        f"not offered: trainwright writes launch files for {OFFERED}, not {UNOFFERED[name]}; "
        "this plan runs on the framework its Framework section names"
    )


_NAMED_RES = tuple((wish, re.compile(pattern, re.I)) for wish, pattern in _NAMED)
# A refusal after the name: "packing disabled", "flash attention: off", "compile=false".
_REFUSAL_AFTER = re.compile(r"\s*(?:[:=]\s*)?(?:disabled|off|false|turned\s+off)\b", re.I)
# "no", "without", "do not use", "avoid", "不要用" just before a name: the wish is to avoid it.
_REFUSAL_TAIL = re.compile(
    r"(?:\bno|\bnot|\bnever|\bwithout|\bavoid(?:ing)?|\bskip|\bdisable|n['’]t(?:\s+(?:use|want|need))?|"
    r"\binstead\s+of|\brather\s+than|不要|不用|别用|禁止|不使用)\s*(?:use\s+|using\s+|the\s+|any\s+)?$",
    re.I,
)
# The objective a wish names, for the brief's ``objective`` (RL first: "PPO with a reward model").
_OBJECTIVES = ("rl", "dpo", "distill", "continued-pretraining", "sft")


def _refusal_start(text: str, start: int) -> int | None:
    """Where the words refusing what stands at ``start`` begin ("do not use ZeRO-3"), or None."""
    lo = max(0, start - 30)
    m = _REFUSAL_TAIL.search(text[lo:start])
    return None if m is None else lo + m.start()


def _refused_before(text: str, start: int) -> bool:
    """Whether the words just before ``start`` refuse what follows ("do not use ZeRO-3")."""
    return _refusal_start(text, start) is not None


def named_wishes(text: str) -> list[Read]:
    """The techniques, trainers and objectives a request names, each once, with its words.

    ``field`` is the wish id ("technique:expert-parallelism", "trainer:hf-trainer",
    "objective:rl"); a name refused in its clause ("no flash attention", "do not use ZeRO-3")
    is the wish ``avoid:<name>``.
    """
    reads: list[Read] = []
    pair = distill_pair(text)
    for wish, pattern in _NAMED_RES:
        if wish == "objective:distill" and pair is not None:
            reads.append(pair[0])
        elif m := pattern.search(text):
            name = wish.split(":", 1)[1]
            if (at := _refusal_start(text, m.start())) is not None:
                reads.append(Read(f"avoid:{name}", name, text[at : m.end()], at, m.end()))
            elif after := _REFUSAL_AFTER.match(text, m.end()):
                reads.append(
                    Read(
                        f"avoid:{name}", name, text[m.start() : after.end()], m.start(), after.end()
                    )
                )
            else:
                reads.append(Read.of(wish, name, m))
    for m in _ZERO_RE.finditer(text):
        if (at := _refusal_start(text, m.start())) is not None:
            stage = f"zero-{m.group(1) or m.group(2)}"
            reads.append(Read(f"avoid:{stage}", stage, text[at : m.end()], at, m.end()))
    return sorted(reads, key=lambda r: r.start)


# Distillation names two models: the teacher's words join the wish, the student is the model.
_DISTILL_PAIR_RE = re.compile(
    r"\bdistil\w*\s+(?:from\s+)?(?:the\s+)?(?P<teacher>[\w.-]+)\s+(?:into|to|onto)\s+(?:an?\s+|the\s+)?"
    r"(?P<student>[\w.-]+)|把\s*(?P<teacher_cn>[\w.-]+?)\s*蒸馏(?:到|成|为)\s*(?P<student_cn>[\w.-]+)",
    re.I,
)


def distill_pair(text: str) -> tuple[Read, str] | None:
    """A distillation's teacher (the wish ``objective:distill`` with its words) and the student's name."""
    if (m := _DISTILL_PAIR_RE.search(text)) is None:
        return None
    teacher = "teacher" if m.group("teacher") else "teacher_cn"
    student = m.group("student") or m.group("student_cn")
    end = m.end(teacher) if teacher == "teacher" else m.end()
    if teacher == "teacher_cn":
        end = m.start("student_cn")
    quote = text[m.start() : end]
    return Read("objective:distill", m.group(teacher), quote.strip(), m.start(), end), student


def objective_of(reads: list[Read]) -> str | None:
    """The brief's ``objective`` from the wishes named (RL wins: it cannot be planned as SFT)."""
    named = {r.field.split(":", 1)[1] for r in reads if r.field.startswith("objective:")}
    return next((o for o in _OBJECTIVES if o in named), None)
