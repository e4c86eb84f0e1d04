"""Model facts: exact parameter counts and shapes from Hugging Face configs.

Every count comes from instantiating the architecture with transformers on the ``meta`` device
(no weights are allocated and nothing is downloaded), so tied embeddings, biases, norms, MoE
experts and GQA are counted the way the real model has them, not by a hand formula.

Importing torch and transformers and building a 70B model on ``meta`` takes seconds, which a
one-shot ``app.py plan`` would pay on every run. So the catalog's counts are precomputed by that
same meta-device count and shipped in knowledge/models/counts.json, keyed by the SHA-256 of the
canonical config JSON and valid only for the transformers version that counted them: a changed
config or another transformers is counted live. Regenerate the file after changing the catalog
or upgrading transformers with ``python -m tools.research.model_catalog --refresh-counts``;
tests/unit/research/test_models.py fails while it is stale.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tools.core.errors import InputError, shown
from tools.core.schemas import (
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_PARAMS,
    MAX_VOCAB,
    ModelParams,
    ModelShape,
    ModelSpec,
    TrainingBrief,
)
from tools.research import architectures as arch

MAX_SEQ_LEN = 1_048_576
# A Hugging Face config.json is a few KB (a few hundred with a label map); a larger file is
# refused before it is read.
MAX_CONFIG_BYTES = 4 * 2**20
# The bounds of a brief's shape (tools/core/schemas.py), by the names Hugging Face configs
# use, checked before transformers builds anything: 1e6 layers on meta take minutes and GBs.
_CONFIG_BOUNDS = (
    (
        (
            "num_hidden_layers",
            "n_layer",
            "num_layers",
            "n_layers",
            "num_decoder_layers",
            "encoder_layers",
            "decoder_layers",
        ),
        "layers",
        MAX_LAYERS,
    ),
    (("hidden_size", "n_embd", "d_model", "dim"), "hidden width", MAX_HIDDEN),
    (
        (
            "num_attention_heads",
            "n_head",
            "num_heads",
            "n_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "num_key_value_heads",
        ),
        "attention heads",
        MAX_HEADS,
    ),
    (("vocab_size", "num_labels"), "vocabulary", MAX_VOCAB),
    (
        (
            "intermediate_size",
            "n_inner",
            "d_ff",
            "ffn_dim",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "moe_intermediate_size",
        ),
        "intermediate size",
        MAX_INTERMEDIATE,
    ),
    (
        ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
        "experts",
        MAX_EXPERTS,
    ),
)
_MAX_CONFIG_DEPTH = 8
# The rough count below over-counts (full attention, no GQA), so it may exceed MAX_PARAMS by
# this factor; it only has to stop sizes whose products overflow 64-bit counts (~9.2e18).
_ROUGH_SLACK = 10
_DERIVED_TOLERANCE = 0.05
COUNTS_FILE = "counts.json"  # in knowledge/models/, next to the catalog


@dataclass(frozen=True)
class _Counted:
    """What one meta-device instantiation tells us about an architecture."""

    params: int
    largest_layer_params: int
    model_class: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    intermediate: int | None
    max_positions: int | None
    active_params: int


# ---- catalog ----------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def load_model_catalog() -> dict[str, dict[str, Any]]:
    """The model catalog (knowledge/models/catalog.yaml): id -> repo, published count, aliases."""
    text = _models_dir().joinpath("catalog.yaml").read_text(encoding="utf-8")
    catalog: dict[str, dict[str, Any]] = yaml.safe_load(text)
    for entry in catalog.values():
        # YAML 1.1 reads "1.24e8" (no exponent sign) as a string.
        entry["published_params"] = float(entry["published_params"])
    return catalog


def list_models() -> list[str]:
    """The catalog's model ids, e.g. ``llama-3-8b``."""
    return list(load_model_catalog())


def _models_dir() -> Any:
    return resources.files("knowledge").joinpath("models")


def _norm(name: str) -> str:
    """Lowercase, punctuation dropped, except a dot between digits: 'opt-1.3b' is not 'opt-13b'."""
    kept = re.sub(r"[^a-z0-9.]+", "", name.lower())
    return re.sub(r"(?<!\d)\.|\.(?!\d)", "", kept)


@lru_cache(maxsize=1)
def _name_index() -> dict[str, str]:
    """Lowercased and punctuation-free ids, aliases and hub repos -> catalog id."""
    index: dict[str, str] = {}
    for model_id, entry in load_model_catalog().items():
        names = [model_id, entry.get("hf_repo", ""), *entry.get("aliases", [])]
        for key in {k for name in names if name for k in (name.strip().lower(), _norm(name))}:
            if index.get(key, model_id) != model_id:
                raise RuntimeError(f"catalog.yaml: '{key}' names both {index[key]} and {model_id}")
            index[key] = model_id
    return index


def _catalog_id(name: str) -> str | None:
    index = _name_index()
    exact = index.get(name.strip().lower())
    if exact is not None or _looks_like_path(name):
        # "./gpt2" is the user's folder, not the catalog's gpt2; hub ids match exactly above.
        return exact
    return index.get(_norm(name))


def catalog_id(name: str) -> str | None:
    """The catalog id a name or alias stands for (``Meta-Llama-3-8B`` -> ``llama-3-8b``), or None."""
    return _catalog_id(name)


def _looks_like_path(name: str) -> bool:
    return any(sep in name for sep in ("/", "\\")) or name.strip().endswith(".json")


def _catalog_config(model_id: str) -> dict[str, Any]:
    text = _models_dir().joinpath(f"{model_id}.json").read_text(encoding="utf-8")
    config: dict[str, Any] = json.loads(text)
    return config


# ---- lookup -----------------------------------------------------------------------------------


def lookup_model(
    ref: str | ModelParams | ModelShape | dict[str, Any],
    seq_len: int,
    *,
    from_scratch: bool = False,
) -> ModelSpec:
    """Resolve a model reference to its exact architecture and parameter count.

    Args:
        ref: A catalog id or alias (``llama-3-8b``, ``meta-llama/Meta-Llama-3-8B``), a path to
            a Hugging Face ``config.json`` (or a folder holding one), ``ModelParams`` /
            ``{"params": 7e9}`` (a llama-style shape is derived), ``ModelShape`` /
            ``{"layers":, "hidden":, "heads":, "vocab":}`` (built as a llama-style config), or
            a config dict with ``model_type``.
        seq_len: Training sequence length in tokens.
        from_scratch: The job builds the model instead of loading its weights (pretraining):
            a learned position table shorter than ``seq_len`` is sized to ``seq_len``, said in
            the spec's ``notes``. Otherwise such a ``seq_len`` is refused: the checkpoint's
            table has the rows it has.

    Returns:
        The model's sizes. ``largest_layer_params`` is the largest number of parameters owned
        directly by one module (usually the token embedding, or a fused MoE expert block). ZeRO-3
        gathers one module's full parameters at a time, so this bounds its live un-partitioned
        parameters; DeepSpeed's ``estimate_zero3_model_states_mem_needs`` takes it as
        ``largest_layer_params`` and ``model_to_params`` computes it the same way.

    Raises:
        InputError: On field ``model`` for an unknown name, a missing or malformed config file
            or an impossible shape; on field ``seq_len`` for a length the model cannot take.
    """
    seq_len = _check_seq_len(seq_len)
    if isinstance(ref, dict):
        parsed = _from_dict(ref, seq_len, from_scratch)
        if isinstance(parsed, ModelSpec):
            return parsed
        ref = parsed
    if isinstance(ref, ModelParams):
        return _from_params(ref, seq_len)
    if isinstance(ref, ModelShape):
        return _from_shape(ref, seq_len, from_scratch)
    if not isinstance(ref, str) or not ref.strip():
        raise InputError("model", "give a catalog id, a config.json path, {params: N} or a shape")
    return _from_name(ref, seq_len, from_scratch)


def brief_model(brief: TrainingBrief) -> ModelSpec:
    """The model a brief's job trains: every stage that looks a brief's model up asks here.

    A job that pretrains from scratch (``brief.loads_weights`` False) builds the model, so a
    learned position table is sized to the brief's ``seq_len``; one that loads weights keeps
    the checkpoint's table, and a longer ``seq_len`` is refused.
    """
    if brief.model is None:
        raise InputError("model", "this brief trains no model")
    return lookup_model(brief.model, brief.seq_len, from_scratch=not brief.loads_weights)


def weights_location(model: ModelSpec) -> str | None:
    """Where a fine-tune loads ``model``'s weights: its hub id, or the folder of its config file.

    None for a model given by size or shape (nothing to load).
    """
    model_id = _catalog_id(model.name)
    if model_id is not None:
        entry = load_model_catalog()[model_id]
        repo = entry.get("hf_repo")
        return str(repo) if repo else None
    prefix = "config file "
    if model.source.startswith(prefix):
        # "config file PATH; parameters counted by ..." (_spec_from_config): split at the last
        # such "; ", so a folder's own ";" stays in PATH.
        path = Path(model.source[len(prefix) :].rsplit("; parameters counted by ", 1)[0])
        return str(path.parent)
    return None


def _check_seq_len(seq_len: Any) -> int:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 0 < seq_len <= MAX_SEQ_LEN:
        raise InputError(
            "seq_len", f"must be a whole number of tokens in 1..{MAX_SEQ_LEN}, got {seq_len!r}"
        )
    return seq_len


def _from_dict(
    ref: dict[str, Any], seq_len: int, from_scratch: bool
) -> ModelParams | ModelShape | ModelSpec:
    if "model_type" in ref:
        return _spec_from_config(
            dict(ref),
            seq_len,
            name=str(ref.get("_name_or_path") or ref["model_type"]),
            source="config given inline",
            from_scratch=from_scratch,
        )
    kind = ModelParams if "params" in ref else ModelShape
    try:
        return kind.model_validate(ref)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "model"
        raise InputError(
            "model",
            f"{where}: {first['msg']} (give {{params: N}} or {{layers, hidden, heads, vocab}})",
        ) from None


def _from_name(ref: str, seq_len: int, from_scratch: bool) -> ModelSpec:
    model_id = _catalog_id(ref)
    if model_id is not None:
        entry = load_model_catalog()[model_id]
        return _spec_from_config(
            _catalog_config(model_id),
            seq_len,
            name=model_id,
            source=(
                f"catalog: {entry.get('hf_repo') or entry.get('origin')} config.json"
                f" (published {entry['published_params']:.4g} params:"
                f" {entry['published_params_source']})"
            ),
            from_scratch=from_scratch,
        )
    path = Path(ref.strip()).expanduser()
    try:
        if path.is_dir() and (path / "config.json").is_file():
            path = path / "config.json"
        is_config = path.is_file() and path.suffix == ".json"
        exists = path.exists()
    except (OSError, ValueError):  # a name too long for the file system, or one with a NUL
        is_config = exists = False
    if is_config:
        return _spec_from_config(
            _read_config_file(path),
            seq_len,
            name=_name_for(path),
            source=f"config file {path}",
            from_scratch=from_scratch,
        )
    if _looks_like_path(ref):
        problem = "is not a .json file" if exists else "does not exist"
        raise InputError(
            "model",
            f"{shown(ref)} is not a catalog model and {problem}; give the path of an "
            f"existing config.json or a catalog id ({_suggest(ref)})",
        )
    raise InputError("model", f"unknown model {shown(ref)}; {_suggest(ref)}")


def _suggest(ref: str) -> str:
    names: dict[str, str] = {}
    for model_id, entry in load_model_catalog().items():
        names[model_id] = model_id
        names.update({alias.lower(): model_id for alias in entry.get("aliases", [])})
    close = difflib.get_close_matches(ref.strip().lower(), list(names), n=8, cutoff=0.6)
    ids = list(dict.fromkeys(names[c] for c in close))[:3]
    if ids:
        return f"close matches: {', '.join(ids)}"
    return f"known models include {', '.join(list_models()[:6])}, ..."


def _name_for(path: Path) -> str:
    """A readable name for a user's config: its folder for ``.../config.json``, else the stem."""
    if path.name == "config.json" and path.parent.name:
        return path.parent.name
    return path.stem


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise InputError(
                "model",
                f"{shown(path, 120)} is {size:,} bytes; a config.json is at most "
                f"{MAX_CONFIG_BYTES:,}",
            )
        with open(path, encoding="utf-8") as fh:
            text = fh.read(MAX_CONFIG_BYTES + 1)  # a file that grew since stat stays bounded
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InputError("model", f"cannot read {shown(path, 120)}: {why}") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise InputError("model", f"{shown(path, 120)} is larger than {MAX_CONFIG_BYTES:,} bytes")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            "model", f"{shown(path, 120)} is not valid JSON ({exc.msg} at line {exc.lineno})"
        ) from None
    except RecursionError:
        raise InputError("model", f"{shown(path, 120)} is nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise InputError("model", f"{shown(path, 120)}: {str(exc).split(';')[0]}") from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise InputError(
            "model", f"{shown(path, 300)} is not a Hugging Face config.json: it has no model_type"
        )
    return config


def _from_params(ref: ModelParams, seq_len: int) -> ModelSpec:
    layers, hidden, heads, kv_heads, ffn = arch.derive_shape(ref.params)
    config = arch.llama_config(layers, hidden, heads, kv_heads, arch.DERIVED_VOCAB, ffn, seq_len)
    spec = _spec_from_config(
        config,
        seq_len,
        name=f"custom-{ref.params / 1e9:.3g}b",
        source=(
            f"derived: only a parameter count ({ref.params:.4g}) was given, so this is a "
            f"llama-style shape sized to it ({layers} layers, hidden {hidden}, {heads} heads, "
            f"{kv_heads} kv heads, FFN {ffn}, vocab {arch.DERIVED_VOCAB}); params is that shape's count"
        ),
    )
    if abs(spec.params - ref.params) > _DERIVED_TOLERANCE * ref.params:
        raise InputError(
            "model",
            f"cannot derive a llama-style shape with about {ref.params:.3g} parameters (closest "
            f"has {spec.params:.3g}); give layers, hidden, heads and vocab instead",
        )
    return spec


def _from_shape(ref: ModelShape, seq_len: int, from_scratch: bool = False) -> ModelSpec:
    if ref.like is not None:
        return _shape_like(ref, seq_len, from_scratch)
    if ref.hidden % ref.heads:
        raise InputError("model", f"hidden ({ref.hidden}) must be divisible by heads ({ref.heads})")
    ffn = ref.intermediate or arch.llama_ffn(ref.hidden)
    config = arch.llama_config(
        ref.layers, ref.hidden, ref.heads, ref.heads, ref.vocab, ffn, seq_len
    )
    return _spec_from_config(
        config,
        seq_len,
        name=f"custom-{ref.layers}l-{ref.hidden}h",
        source=(
            "shape given by the user, built as a llama-style config (SwiGLU FFN "
            f"{ffn}{'' if ref.intermediate else ' by the Llama rule'}, untied embeddings)"
        ),
    )


def _shape_like(ref: ModelShape, seq_len: int, from_scratch: bool) -> ModelSpec:
    """A shape on a catalog model's config: everything but the sizes is that model's."""
    like = _catalog_id(ref.like or "")
    if like is None:
        raise InputError(
            "model.like",
            f"{shown(ref.like or '')} is not a catalog model; {_suggest(ref.like or '')}",
        )
    sizes = {
        "layers": ref.layers,
        "hidden": ref.hidden,
        "heads": ref.heads,
        "kv_heads": ref.kv_heads or ref.heads,
        "intermediate": ref.intermediate,
        "vocab": ref.vocab,
    }
    config = arch.resized_config(_catalog_config(like), sizes)
    return _spec_from_config(
        config,
        seq_len,
        name=f"{like}-like-{ref.layers}l-{ref.hidden}h",
        source=(
            f"a shape on {like}'s config: {ref.layers} layers, hidden {ref.hidden}, "
            f"{ref.heads} heads, {ref.kv_heads or ref.heads} KV heads, FFN "
            f"{ref.intermediate or 'as ' + like}, vocab {ref.vocab}; activation, norms, "
            f"positions and embedding tying as {like}"
        ),
        from_scratch=from_scratch,
    )


# ---- counting ---------------------------------------------------------------------------------


def check_config_bounds(config: dict[str, Any], where: str = "model", depth: int = 0) -> None:
    """Refuse a config whose sizes exceed a brief shape's bounds, before anything is built.

    Checks every known size key (layers, hidden width, heads, vocabulary, intermediate size,
    experts) of the config and of its nested sub-configs (``text_config``...): each must be a
    whole number from 0 to its bound, and a rough count of the parameters they imply at most
    ``MAX_PARAMS``. InputError names the field and the bound.
    """
    if depth > _MAX_CONFIG_DEPTH:
        raise InputError(where, "the config is nested too deeply")
    sizes: dict[str, int] = {}
    for keys, what, bound in _CONFIG_BOUNDS:
        for key in keys:
            value = config.get(key)
            if value is None or isinstance(value, str | list | dict):
                continue  # absent, or a type transformers itself refuses with its message
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= bound:
                shown_value = (
                    value
                    if isinstance(value, bool) or not isinstance(value, int)
                    else (value if len(str(value)) <= 24 else f"{str(value)[:12]}...")
                )
                raise InputError(
                    f"{where}.{key}",
                    f"{what} must be a whole number from 0 to {bound:,}, got {shown_value}",
                )
            sizes.setdefault(what, value)
    layers = sizes.get("layers", 1)
    hidden = sizes.get("hidden width", 1)
    ffn = sizes.get("intermediate size", 4 * hidden)
    experts = max(1, sizes.get("experts", 1))
    rough = (
        layers * (4 * hidden * hidden + 3 * hidden * ffn * experts)
        + 2 * sizes.get("vocabulary", 1) * hidden
    )
    if rough > _ROUGH_SLACK * MAX_PARAMS:
        raise InputError(
            where,
            f"these sizes make about {rough:.3g} parameters; the most a plan takes is about "
            f"{MAX_PARAMS:.0e}",
        )
    for key, value in config.items():
        if isinstance(value, dict):
            check_config_bounds(value, f"{where}.{key}", depth + 1)


def _spec_from_config(
    config: dict[str, Any], seq_len: int, *, name: str, source: str, from_scratch: bool = False
) -> ModelSpec:
    check_config_bounds(config)
    counted, how = _counted(config)
    notes: list[str] = []
    rows = counted.max_positions
    if rows is not None and seq_len > rows:
        if not from_scratch:
            raise InputError(
                "seq_len",
                f"{name}'s checkpoint has learned position embeddings for {rows} tokens (a "
                f"table of {rows} rows), which a job that loads its weights cannot grow: seq_len "
                f"{seq_len} is longer (use seq_len <= {rows}; pretraining from scratch sizes the "
                "table to seq_len)",
            )
        # Built from scratch, the table is as long as the config says: size it and count again.
        config = arch.with_position_rows(config, seq_len)
        counted, how = _counted(config)
        if counted.max_positions is None or counted.max_positions < seq_len:
            raise InputError(
                "seq_len",
                f"{name} has learned position embeddings for {rows} tokens and its config "
                f"cannot be sized to {seq_len} (use seq_len <= {rows})",
            )
        origin = "catalog config" if source.startswith("catalog") else "config"
        notes.append(
            f"pretraining from scratch: {name}'s learned position table sized to {seq_len} "
            f"rows (its {origin} has {rows})"
        )
    return ModelSpec(
        name=name,
        params=counted.params,
        layers=counted.layers,
        hidden=counted.hidden,
        heads=counted.heads,
        vocab=counted.vocab,
        seq_len=seq_len,
        largest_layer_params=counted.largest_layer_params,
        active_params=counted.active_params,
        intermediate=counted.intermediate,
        kv_heads=counted.kv_heads,
        family=str(config["model_type"]),
        hf_config=config,
        source=f"{source}; {how}",
        notes=notes,
    )


def _counted(config: dict[str, Any]) -> tuple[_Counted, str]:
    """The config's meta-device count (shipped for this exact config, else live) and how."""
    config_json = _canonical_json(config)
    counted = _shipped_counts().get(config_key(config_json))
    if counted is None:
        counted = _count(config_json)
        return counted, f"parameters counted by instantiating {counted.model_class} on meta"
    return counted, (
        f"parameters counted by instantiating {counted.model_class} on meta, stored for this "
        f"exact config in knowledge/models/{COUNTS_FILE}"
    )


def _canonical_json(config: dict[str, Any]) -> str:
    """The config as JSON with sorted keys: equal configs give equal text, whatever the order."""
    return json.dumps(config, sort_keys=True)


def config_key(config_json: str) -> str:
    """The cache key of a canonical config JSON: its SHA-256, so any change to the config misses."""
    return hashlib.sha256(config_json.encode("utf-8")).hexdigest()


def _transformers_version() -> str | None:
    # Read from the installed metadata: importing transformers is what the cache avoids.
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def _shipped_counts() -> dict[str, _Counted]:
    """The shipped counts by config key; empty if the file is absent, damaged or another version's.

    The version matters: transformers decides the module layout (e.g. fused MoE expert blocks),
    hence ``largest_layer_params`` and the model class, so another version counts live.
    """
    try:
        text = _models_dir().joinpath(COUNTS_FILE).read_text(encoding="utf-8")
        document = json.loads(text)
    except (OSError, ValueError):
        return {}
    if not isinstance(document, dict) or document.get("transformers") != _transformers_version():
        return {}
    fields = [f.name for f in dataclasses.fields(_Counted)]
    shipped: dict[str, _Counted] = {}
    for entry in (document.get("models") or {}).values():
        try:
            shipped[str(entry["config_sha256"])] = _Counted(**{k: entry[k] for k in fields})
        except (KeyError, TypeError):
            continue  # a damaged entry is counted live; tests/unit/research/test_models.py flags it
    return shipped


def catalog_counts() -> dict[str, Any]:
    """What knowledge/models/counts.json must hold: a live meta count of every catalog config."""
    models: dict[str, Any] = {}
    for model_id in list_models():
        config_json = _canonical_json(_catalog_config(model_id))
        models[model_id] = {
            "config_sha256": config_key(config_json),
            **dataclasses.asdict(_count(config_json)),
        }
    return {
        "generated_by": "python -m tools.research.model_catalog --refresh-counts",
        "transformers": _transformers_version(),
        "models": models,
    }


def refresh_counts() -> Path:
    """Count every catalog model live and rewrite knowledge/models/counts.json; return its path."""
    from tools.core.files import write_atomic

    path = Path(str(_models_dir().joinpath(COUNTS_FILE)))
    write_atomic(path, json.dumps(catalog_counts(), indent=2) + "\n")
    _shipped_counts.cache_clear()
    return path


@lru_cache(maxsize=128)
def _count(config_json: str) -> _Counted:
    """Instantiate the config on the meta device and count; cached since 405B takes a moment."""
    import torch  # lazy: heavy imports stay out of `app.py --help`

    config_dict = json.loads(config_json)
    model_type = config_dict["model_type"]
    config = arch.hf_config(config_dict)
    model_class = arch.model_class(config_dict, config)
    try:
        with torch.device("meta"):
            model = model_class._from_config(config)
    except Exception as exc:  # transformers raises many types for inconsistent configs
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            "model", f"transformers cannot build this {model_type} config: {message}"
        ) from None

    # model.parameters() yields a tied weight once (identity), which is what DeepSpeed's
    # model_to_params gets from data_ptr; on meta every data_ptr is 0, so identity it is.
    params = sum(p.numel() for p in model.parameters())
    # Mirrors deepspeed.runtime.zero.stage3.model_to_params.
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return _Counted(
        active_params=arch.active_params(model, config, params),
        params=params,
        largest_layer_params=largest,
        model_class=type(model).__name__,
        layers=arch.layer_count(config),
        # A convolutional network (ResNet, ConvNeXt) has stages of widths, no attention heads:
        # its widest stage stands for the width, one "head" for the heads.
        hidden=int(getattr(config, "hidden_size", None) or config.hidden_sizes[-1]),
        heads=int(getattr(config, "num_attention_heads", None) or 1),
        kv_heads=int(
            getattr(config, "num_key_value_heads", None)
            or getattr(config, "num_attention_heads", None)
            or 1
        ),
        # Vision encoders have no token vocabulary; their output layer is the label set,
        # which is what the planner's logits term (s*b*V) then sizes.
        vocab=int(getattr(config, "vocab_size", None) or getattr(config, "num_labels", None) or 1),
        intermediate=arch.intermediate_size(config),
        max_positions=arch.learned_positions(model, config),
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.research.model_catalog --refresh-counts``: regenerate the shipped parameter counts."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.research.model_catalog", description=main.__doc__
    )
    parser.add_argument(
        "--refresh-counts",
        action="store_true",
        help=f"count every catalog model on meta and rewrite knowledge/models/{COUNTS_FILE}",
    )
    args = parser.parse_args(argv)
    if not args.refresh_counts:
        parser.print_help()
        return 2
    print(f"wrote {refresh_counts()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
