"""Models named in free text: aliases, GPT-style sizes, typos and ambiguous names.

``tools.intake.brief.request_fields`` first looks for a catalog id inside the request; when
there is none it asks ``read_model`` here, which reads, in order:

1. a GPT-style size ("a 1.3B GPT", "GPT-3 2.7B", "a 350M GPT-style model"): the GPT-3 shape
   of that size from the catalog (``gpt3-*``, GPT-2's architecture), never a llama-style
   stand-in; a size between GPT-3's shapes is ambiguous and lists the nearest ones;
2. a catalog alias spelt out in the words ("T5-XL", "ViT-L/16", "bert large", "resnet 50");
2b. a size with a family or a word for a model ("a 1B llama", "a 70B policy"): the catalog
   model of that size or the family's shape at it, said to be assumed (``model_sizes``);
3. a close match of a name-like run of words ("lama-3-8b", "mixtral 8x7"), by the same
   ``difflib`` ratio the catalog's own suggestions use (``model_catalog._suggest``). A match
   is taken only when it is confident: close (ratio >= ``CONFIDENT``), its numbers are the
   words' numbers (so "llama-3-7b" never becomes llama-3-70b) and no other model with those
   numbers comes close to it; then the reading says "read 'lama-3-8b' as llama-3-8b".
   Otherwise the close ones are candidates, and intake asks which one;
4. a bare family word with several catalog sizes ("resnet", "convnext") : the candidates.

Offline and deterministic; the words looked at are bounded (``MAX_WORDS_READ``).
"""

from __future__ import annotations

import difflib
import math
import re
from functools import lru_cache

from tools.intake.model_sizes import read_size
from tools.intake.readings import ModelReading, Read
from tools.intake.shape_text import shape_reads
from tools.research.model_catalog import catalog_id, load_model_catalog
from tools.research.variant_weights import variant_weights

__all__ = ["ModelReading", "model_reads", "read_model", "variant_named"]

# How close a run of words must be to a catalog name to be read as it, and how much closer
# than any other model.
CONFIDENT = 0.8
MARGIN = 0.08
# A run this close is at least a candidate worth asking about.
CANDIDATE = 0.7
# A run of words without a digit is spelt like many English words ("context" is 0.8 of
# "convnext"): it must be this close to a name, even to be a candidate.
WORDS_ONLY = 0.9
MAX_CANDIDATES = 4
# A request is a few sentences; past this many words the rest is not looked at (each run of
# words is compared with every catalog name: 200 words take about a second at worst).
MAX_WORDS_READ = 200
_MAX_WORDS = 3

# Words that never start or continue a model name.
_STOP = frozenset(
    "a an and as at by for from in into is it its of on or our the their this to use using "
    "want we with my your model models llm gpus gpu nodes node train training pretrain "
    "fine-tune finetune tune serve serving inference lora qlora".split()
)
_GPU_LIKE = re.compile(
    r"^(?:(?:[abhv]\d{3}|t4|l4|l40s?|a10g?|gh200|gb200|rtx\d*|mi\d{3}x?)[a-z0-9-]*|\d+gb)$", re.I
)
# A model name the catalog lacks: a hyphenated name ending in a size or variant word
# ("roberta-large", "flan-t5-xl", "whisper-large-v3", "deberta-v3-base"), or a well-known model
# kind the catalog has none of ("sdxl", "OLMo 2 7B", "CLIP"). Read only when nothing else was,
# so that the refusal names it instead of saying the request names no model.
_UNKNOWN_RE = re.compile(
    r"\b[a-z][a-z0-9]*(?:[-_.][a-z0-9]+)*[-_](?:\d+(?:\.\d+)?[bm]|base|large|small|medium|mini|"
    r"tiny|xl|xxl|huge|giant|v\d+(?:\.\d+)?|uncased|cased)(?:[-_.][a-z0-9]+)*\b"
    r"|\b(?:sdxl|stable[\s-]?diffusion(?:[\s-]?(?:xl|\d(?:\.\d)?))?|whisper|(?-i:CLIP)|roberta|deberta|"
    r"distilbert|electra|bloom|falcon|olmo(?:[\s-]*\d+)?(?:[\s-]+\d+(?:\.\d+)?[bm])?)\b",
    re.I,
)
_SIZE = r"(\d+(?:\.\d+)?)\s*([bm])(?:illion)?\b"
_GPT = r"gpt(?:-?[23])?(?:[\s-]*(?:style|like))?"
_GPT_SIZE_RES = (
    re.compile(_SIZE + r"(?:\s*param(?:eter)?s?)?[\s-]*" + _GPT + r"\b", re.I),
    re.compile(r"\b" + _GPT + r"(?:\s+model)?\s*(?:of|with|at|,|-)?\s*(?:about\s+)?" + _SIZE, re.I),
)
_WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", text.lower())


def _numbers(text: str) -> list[str]:
    return [n.lstrip("0") or "0" for n in re.findall(r"\d+(?:\.\d+)?", text)]


@lru_cache(maxsize=1)
def _spelt() -> dict[str, tuple[str, str]]:
    """Squashed ids and aliases (not hub repos: "org/name" is matched exactly) -> (id, as spelt)."""
    names: dict[str, tuple[str, str]] = {}
    for model_id, entry in load_model_catalog().items():
        for name in (model_id, *entry.get("aliases", [])):
            if "/" not in name or name.lower().startswith("vit-"):
                names.setdefault(_squash(name), (model_id, name))
    return names


def _names() -> dict[str, str]:
    return {squashed: model_id for squashed, (model_id, _) in _spelt().items()}


@lru_cache(maxsize=1)
def _families() -> dict[str, tuple[str, ...]]:
    """A family word ("resnet", "convnext", "qwen3") -> its catalog ids, when there are several."""
    families: dict[str, list[str]] = {}
    for model_id in load_model_catalog():
        stem = re.split(r"-(?=\d|[a-z]+\d)|-(?:base|large|tiny|small|mini|xl)\b", model_id)[0]
        families.setdefault(stem, []).append(model_id)
    return {k: tuple(v) for k, v in families.items() if len(v) > 1}


def family_ids(said: str) -> tuple[str, ...] | None:
    """The catalog ids of a family word ("llama", "qwen2.5", "gpt"), or None when it is no family.

    A word that starts several catalog ids is their family too ("gpt": gpt2, ..., gpt3-175b).
    """
    squashed = _squash(said)
    if ids := _families().get(squashed):
        return ids
    if not re.fullmatch(r"[a-z]{3,}", squashed):
        return None
    ids = tuple(i for i in load_model_catalog() if _squash(i).startswith(squashed))
    return ids if len(ids) > 1 else None


def family_in(text: str) -> tuple[str, tuple[str, ...]] | None:
    """The first family word the text names, with its catalog ids ("a 2-layer 128-hidden llama")."""
    for said, _ in _windows(text):
        if " " not in said and (ids := family_ids(said)):
            return said, ids
    return None


def _gpt_sizes() -> dict[float, str]:
    sizes: dict[float, str] = {}
    for model_id in load_model_catalog():
        if m := re.fullmatch(r"gpt3-(\d+(?:\.\d+)?)([mb])", model_id):
            sizes[float(m[1]) * (1e9 if m[2] == "b" else 1e6)] = model_id
    return sizes


def _gpt_reading(text: str) -> ModelReading | None:
    for pattern in _GPT_SIZE_RES:
        if m := pattern.search(text):
            params = float(m[1]) * (1e9 if m[2].lower() == "b" else 1e6)
            sizes = _gpt_sizes()
            if not sizes or params <= 0:
                return None
            nearest = sorted(sizes, key=lambda p: abs(math.log(p / params)))
            said = m[0].strip()
            if abs(math.log(nearest[0] / params)) <= math.log(1.05):
                return ModelReading(said, model=sizes[nearest[0]])
            return ModelReading(said, candidates=tuple(sizes[p] for p in sorted(nearest[:2])))
    return None


def _windows(text: str) -> list[tuple[str, str]]:
    """Name-like runs of 1-3 words, longest first: (as written, squashed)."""
    words = [w.rstrip(".,;:!?)'\"") for w in _WORD_RE.findall(text)][:MAX_WORDS_READ]
    runs: list[tuple[str, str]] = []
    for size in range(_MAX_WORDS, 0, -1):
        for start in range(len(words) - size + 1):
            run = words[start : start + size]
            if any(not w or w.lower() in _STOP for w in run) or not run[0][0].isalpha():
                continue
            if any(_GPU_LIKE.match(w) for w in run):
                continue
            runs.append((" ".join(run), _squash("".join(run))))
    return runs


def _close(squashed: str) -> list[tuple[float, str, str]]:
    """(ratio, catalog id, the name matched) of every catalog name close to ``squashed``, best first."""
    best: dict[str, tuple[float, str]] = {}
    matcher = difflib.SequenceMatcher(b=squashed, autojunk=False)
    for squashed_name, (model_id, name) in _spelt().items():
        matcher.set_seq1(squashed_name)
        if matcher.real_quick_ratio() < CANDIDATE or matcher.quick_ratio() < CANDIDATE:
            continue
        ratio = matcher.ratio()
        if ratio >= CANDIDATE and ratio > best.get(model_id, (0.0, ""))[0]:
            best[model_id] = (ratio, name)
    order = {model_id: n for n, model_id in enumerate(load_model_catalog())}  # ties: catalog order
    return sorted(((r, i, n) for i, (r, n) in best.items()), key=lambda t: (-t[0], order[t[1]]))


def read_model(text: str) -> ModelReading | None:
    """The model a request names by alias, GPT-style size or close match; None when none.

    A confident reading has ``model`` set; an unclear one has ``candidates`` (at most
    ``MAX_CANDIDATES``) for the clarifying question.
    """
    if reading := _gpt_reading(text):
        return reading
    windows = _windows(text)
    names = _spelt()
    for said, squashed in windows:
        if model_id := (names[squashed][0] if squashed in names else catalog_id(said)):
            return ModelReading(said, model=model_id)
    if sized := read_size(text):
        return sized  # "a 70B policy", "a 1B llama": a size is always a model, said as assumed
    unclear: ModelReading | None = None
    for said, squashed in windows:
        if len(re.findall(r"[a-z]", squashed)) < 4:
            continue  # "t5", "a 7" : too short to be told from other words by spelling
        close = _close(squashed)
        if not re.search(r"\d", squashed):
            close = [c for c in close if c[0] >= WORDS_ONLY]
        if not close:
            continue
        # The numbers are what the user typed with care (sizes, versions); a typo is in the
        # letters. So only names with the same numbers can be taken, and only one of them.
        same = [(r, i) for r, i, n in close if _numbers(n) == _numbers(said)]
        if same and same[0][0] >= CONFIDENT:
            runner_up = same[1][0] if len(same) > 1 else 0.0
            if same[0][0] - runner_up >= MARGIN:
                return ModelReading(said, model=same[0][1])
        if unclear is None:
            stem = re.sub(r"[^a-z].*", "", squashed)
            if _UNKNOWN_RE.fullmatch(said) and not any(i.startswith(stem) for _, i, _ in close):
                # "phi-3-small" is no gpt3-125m, "deberta-v3-base" no bert-base: another family
                unclear = ModelReading(said, unknown=True)
                continue
            # "qwen2.5-coder-7b": qwen2.5-7b, whose numbers it has, never qwen2.5-72b
            numbered = [i for _, i, n in close if set(_numbers(n)) <= set(_numbers(said))]
            named = numbered or [i for _, i, _ in close]
            unclear = ModelReading(said, candidates=tuple(named[:MAX_CANDIDATES]))
    if unclear is not None:
        return unclear
    for said, squashed in windows:
        if family := _families().get(squashed):
            return ModelReading(said, candidates=family[:MAX_CANDIDATES])
    for m in _UNKNOWN_RE.finditer(text):
        if not _GPU_LIKE.match(m[0]) and catalog_id(m[0]) is None:
            return ModelReading(m[0], unknown=True)
    return None


def other_model_reads(text: str, model: object) -> list[Read]:
    """Catalog models the request names besides ``model``, the one planned (field ``other-model:<id>``).

    Only whole words that are a catalog name ("llama-3-8b or mistral-7b"), outside the words
    the planned model was read from ("gpt2 medium" is one name); a plan is for one model, so
    intake says the others were not planned instead of listing them as not understood.
    """
    first = read_model(text)
    if not isinstance(model, str) or first is None:
        return []
    at = text.find(first.said)
    taken = range(at, at + len(first.said)) if at >= 0 else range(0)
    names = _spelt()
    out: list[Read] = []
    for m in _WORD_RE.finditer(text[: 20 * MAX_WORDS_READ]):
        word = m.group(0).rstrip(".,;:!?)'\"")
        other = names.get(_squash(word), (None, ""))[0]
        if (
            other
            and other != model
            and m.start() not in taken
            and all(r.value != other for r in out)
        ):
            out.append(Read(f"other-model:{other}", other, word, m.start(), m.start() + len(word)))
    for m in _UNKNOWN_RE.finditer(text):
        # "a CLIP ViT-B/16": CLIP is no part of the vit-base planned, and not in the catalog
        if m.start() not in taken and not _GPU_LIKE.match(m[0]) and catalog_id(m[0]) is None:
            out.append(Read(f"other-model:{m[0]}", m[0], m[0], m.start(), m.end()))
    return out


def other_model_mark(name: str, planned: object) -> tuple[bool, str]:
    """How intake marks a second model: not planned, and which one is."""
    if catalog_id(name) is None:
        return False, (
            f"not planned: {name!r} is not in the model catalog, and the plan is for {planned} "
            "alone (its own architecture and training loss)"
        )
    return False, (
        f"not planned: a plan is for one model, and this one is for {planned} (read first); "
        f"ask for {name} as its own request"
    )


# A hub id ("org/name"), as opposed to a path that happens to hold a model's name.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def variant_named(text: str, model_id: str) -> tuple[str, str | None] | None:
    """The model reference for ``model_id`` where the text names more than its catalog id.

    The first word holding the catalog id: a catalog alias naming other weights (``Llama-3-8B-
    Instruct``; tools/research/variant_weights.py) is the reference, so the launch loads them;
    a name the catalog lacks (``qwen2.5-7b-instruct``) plans the catalog model, and the note
    says which weights the launch loads instead. None where the words name the catalog model.
    """
    want = _squash(model_id)
    for m in _WORD_RE.finditer(text):
        word = m.group(0).rstrip(".,;:")
        flat = _squash(word)
        if want not in flat or ("/" in word and not _HUB_ID.match(word)):
            continue
        if catalog_id(word) == model_id:
            return (word, None) if variant_weights(word) else None
        if flat == want:
            return None
        repo = load_model_catalog()[model_id].get("hf_repo")
        loads = f"its own weights, {repo}" if repo else "no weights of its own (give MODEL_PATH)"
        return model_id, (
            f"'{word}' is not in the catalog: planned as {model_id}, read as its architecture; "
            f"the launch loads {loads}: set MODEL_PATH to the weights '{word}' names"
        )
    return None


# A size written after a model's name ("gpt2 124M"): part of the name where it is the model's.
_SIZE_AFTER = re.compile(r"\s*[-(]?\s*(\d+(?:\.\d+)?)\s*([bm])(?:illion)?\b\)?", re.I)
_SIZE_AGREES = 0.25  # within this share of the catalog's published count


def _with_own_size(text: str, model: str, m: re.Match[str], field: str) -> Read:
    """The reading of a mention ``m`` of ``model``, with a size after it that is the model's own.

    "gpt2 124M" is gpt2 (124M parameters); "gpt2 1.5B" is not, and the size stays unread.
    """
    end = m.end()
    size = _SIZE_AFTER.match(text, end)
    model_id = catalog_id(model)
    published = load_model_catalog()[model_id].get("published_params") if model_id else None
    if size is not None and published:
        count = float(size[1]) * (1e9 if size[2].lower() == "b" else 1e6)
        if abs(count - float(published)) <= _SIZE_AGREES * float(published):
            end = size.end()
    return Read(field, model, text[m.start() : end], m.start(), end)


def model_reads(text: str, model: object) -> list[Read]:
    """Where the model was named: its catalog id as spelt in the text, or the words it was read from.

    Each mention of the catalog id is read; the later ones are ``model:again`` (not listed).
    """
    if isinstance(model, dict) and "layers" in model:  # its dimensions ("24 layers, hidden 2048")
        # and the name or size beside them ("a custom 1B model with ..."), quoted with them
        reads = model_reads(text, model.get("like") or "") + shape_reads(text)
        return [Read("model", model, r.quote, r.start, r.end) for r in reads]
    if isinstance(model, str):
        if squashed := _squash(model):
            spelt = r"[^a-z0-9.]*".join(re.escape(ch) for ch in squashed)
            found = re.finditer(r"[\w.-]*" + spelt + r"[\w.-]*", text, re.I)
            mentions = [
                _with_own_size(text, model, m, "model:again" if i else "model")
                for i, m in enumerate(found)
            ]
            if mentions:
                return mentions
    reading = read_model(text)
    if reading is not None and (at := text.lower().find(reading.said.lower())) >= 0:
        return [Read("model", model, reading.said, at, at + len(reading.said))]
    if m := re.search(
        r"\b\d+(?:\.\d+)?\s*[bm](?:illion)?\s*(?:param(?:eter)?s?)?\s*model\b", text, re.I
    ):
        return [Read.of("model", model, m)]
    return []
