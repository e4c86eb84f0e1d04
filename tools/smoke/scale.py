"""Scale a planned model down to what this machine runs in seconds, keeping its family.

The scaled config is the model a smoke run builds; its shape (layers, width, parameters) is
what the memory prediction and the report speak about.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

from tools.core.files import write_atomic
from tools.core.schemas import ModelSpec

# Local budgets for the scaled model. On CPU a step must take well under a second on two
# cores; on a GPU a few layers at moderate width still start in seconds.
CPU_BUDGET = {"layers": 2, "hidden": 256, "heads": 4, "vocab": 8192, "seq_len": 64, "experts": 4}
GPU_BUDGET = {
    "layers": 4,
    "hidden": 1024,
    "heads": 16,
    "vocab": 32768,
    "seq_len": 512,
    "experts": 4,
}
# A safety net for families whose extra dimensions (e.g. MLA ranks) we do not scale.
MAX_SCALED_PARAMS = {"cpu": 20_000_000, "cuda": 500_000_000}
# The sequence length a full-size GPU run is capped to (memory, not the model, sets the limit).
FULL_SIZE_MAX_SEQ = 2048
# How families spell the feed-forward width, key/value heads and expert counts.
_FFN_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff")
_MOE_FFN_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size")
_KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
_NOT_CONFIG_KEYS = (
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "quantization_config",
    "auto_map",
)


def llama_config_from_shape(model: ModelSpec) -> dict[str, Any]:
    """Build a llama-style Hugging Face config dict from a model's layers/hidden/heads/vocab."""
    config: dict[str, Any] = {
        "model_type": "llama",
        "num_hidden_layers": model.layers,
        "hidden_size": model.hidden,
        "num_attention_heads": model.heads,
        "num_key_value_heads": model.kv_heads or model.heads,
        "vocab_size": model.vocab,
        "max_position_embeddings": model.seq_len,
    }
    if model.intermediate:
        config["intermediate_size"] = model.intermediate
    return config


def scale_model_config(
    hf_config: dict[str, Any], *, seq_len: int, device: str = "cpu", full_size: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Shrink a Hugging Face config to the local budget (same family); return it and its shape.

    With ``full_size`` the dimensions stay as they are (only the position table follows
    ``seq_len``), for a GPU on which the planner says the whole model fits.
    """
    import transformers

    # Default configs of a family warn about special-token ids outside the vocabulary we are
    # about to shrink; those ids are cleared below, so the warnings would only mislead.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return _scale_model_config(hf_config, seq_len=seq_len, device=device, full_size=full_size)
    finally:
        transformers.logging.set_verbosity(verbosity)


def scale_model_config_cached(
    hf_config: dict[str, Any], *, seq_len: int, device: str, full_size: bool, cache_dir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``scale_model_config``, remembered on disk: the same inputs give the same result.

    Scaling imports transformers and torch and builds the model on the meta device to count
    its parameters: seconds before every launch, for a result that only depends on the
    inputs, the installed transformers and torch, and this file (the budgets and the scaling
    code). The cache key covers all of them; a missing or unreadable entry is recomputed.
    """
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for package in ("transformers", "torch"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    key = hashlib.sha256(
        json.dumps(
            [hf_config, seq_len, device, full_size, versions, _source_digest()],
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()[:32]
    path = cache_dir / f"{key}.json"
    try:
        cached = json.loads(path.read_text())
        return dict(cached["model_config"]), dict(cached["shape"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    model_config, shape = scale_model_config(
        hf_config, seq_len=seq_len, device=device, full_size=full_size
    )
    with contextlib.suppress(OSError):
        cache_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"model_config": model_config, "shape": shape}, indent=2))
    # What the caller gets is what a later cache hit returns: the JSON form.
    return json.loads(json.dumps(model_config)), json.loads(json.dumps(shape))


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _scale_model_config(
    hf_config: dict[str, Any], *, seq_len: int, device: str, full_size: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    import transformers

    budget = GPU_BUDGET if device == "cuda" else CPU_BUDGET
    if full_size:
        budget = {key: 10**12 for key in budget}
        budget["seq_len"] = seq_len
    source = {k: v for k, v in hf_config.items() if k not in _NOT_CONFIG_KEYS}
    family = str(source.pop("model_type", None) or "llama")
    orig: dict[str, Any] | None = None
    out: dict[str, Any] | None = None
    fallback = ""
    try:
        config = transformers.AutoConfig.for_model(family, **source)
        orig = _dims(config)
        scaled = _scale_dims(orig, budget, seq_len)
        if scaled != orig:
            _apply_dims(config, orig, scaled)
        _clear_out_of_range_token_ids(config, scaled["vocab"])
        out = {"model_type": family, **_config_dict(config)}
        params, largest = _count_params(out)
        if not full_size and params > MAX_SCALED_PARAMS.get(device, MAX_SCALED_PARAMS["cpu"]):
            fallback = f"{family} scaled to {params:,} params, over budget; used llama"
            out = None
    except Exception as exc:  # a family that cannot be built or scaled here falls back to llama
        fallback = f"{family} not buildable here ({first_line(exc)}); used llama"
        out = None
    if orig is None:
        orig = _dims_from_dict(source)
    if out is None:
        # A llama-style decoder of the same shape still exercises the parallelism setup.
        scaled = _scale_dims(orig, budget, seq_len)
        family = "llama"
        llama = transformers.AutoConfig.for_model("llama", **_llama_kwargs(scaled))
        out = {"model_type": "llama", **_config_dict(llama)}
        params, largest = _count_params(out)
    changed = scaled != orig

    shape: dict[str, Any] = {
        "family": family,
        "params": params,
        "largest_layer_params": largest,
        "layers": scaled["layers"],
        "hidden": scaled["hidden"],
        "heads": scaled["heads"],
        "kv_heads": scaled["kv_heads"],
        "intermediate": scaled["intermediate"],
        "vocab": scaled["vocab"],
        "scaled": changed,
        "original": {k: orig[k] for k in ("layers", "hidden", "heads", "vocab")},
    }
    if fallback:
        shape["fallback"] = fallback
    return out, shape


def first_line(exc: BaseException, limit: int = 160) -> str:
    """The first line of ``exc``'s message (its type's name when empty), at most ``limit`` long."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


def _llama_kwargs(dims: dict[str, Any]) -> dict[str, Any]:
    return {
        "num_hidden_layers": dims["layers"],
        "hidden_size": dims["hidden"],
        "num_attention_heads": dims["heads"],
        "num_key_value_heads": dims["kv_heads"] or dims["heads"],
        "intermediate_size": dims["intermediate"] or 4 * dims["hidden"],
        "vocab_size": dims["vocab"],
        "max_position_embeddings": dims["max_positions"],
    }


def _dims_from_dict(source: dict[str, Any]) -> dict[str, Any]:
    # For configs transformers cannot load: read the usual spellings of each dimension.
    def first(*keys: str, default: int | None) -> int | None:
        for key in keys:
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value
        return default

    return {
        "layers": first("num_hidden_layers", "n_layer", "num_layers", "n_layers", default=2),
        "hidden": first("hidden_size", "n_embd", "d_model", "dim", default=128),
        "heads": first("num_attention_heads", "n_head", "num_heads", "n_heads", default=4),
        "kv_heads": first("num_key_value_heads", "n_kv_heads", default=None),
        "intermediate": first("intermediate_size", "n_inner", "ffn_dim", "d_ff", default=None),
        "vocab": first("vocab_size", default=512),
        "max_positions": first("max_position_embeddings", "n_positions", default=None),
        "experts": None,
    }


def _dims(config: Any) -> dict[str, Any]:
    return {
        "layers": int(config.num_hidden_layers),
        "hidden": int(config.hidden_size),
        "heads": int(config.num_attention_heads),
        "kv_heads": _first_present(config, _KV_KEYS),
        "intermediate": _first_present(config, _FFN_KEYS),
        "vocab": int(config.vocab_size),
        "max_positions": getattr(config, "max_position_embeddings", None),
        "experts": _first_present(config, _EXPERT_KEYS),
    }


def _scale_dims(orig: dict[str, Any], budget: dict[str, int], seq_len: int) -> dict[str, Any]:
    hidden = min(orig["hidden"], budget["hidden"])
    heads = min(orig["heads"], budget["heads"])
    while hidden % heads:
        heads -= 1
    kv = orig["kv_heads"]
    if kv:
        # Keep grouped-query attention grouped: the same heads-per-kv-head ratio, capped.
        group = max(1, orig["heads"] // kv)
        kv = max(1, heads // group)
        while heads % kv:
            kv -= 1
    intermediate = orig["intermediate"]
    if hidden != orig["hidden"] and intermediate is not None:
        intermediate = 4 * hidden
    # Position tables beyond the smoke sequence only cost memory; keep at least seq_len.
    max_positions = max(seq_len, min(int(orig["max_positions"] or 10**9), 2 * budget["seq_len"]))
    experts = orig["experts"]
    if experts is not None:
        experts = min(experts, budget["experts"])
    return {
        "layers": min(orig["layers"], budget["layers"]),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv,
        "intermediate": intermediate,
        "vocab": min(orig["vocab"], budget["vocab"]),
        "max_positions": max_positions,
        "experts": experts,
    }


def _apply_dims(config: Any, orig: dict[str, Any], dims: dict[str, Any]) -> None:
    # The generic names go through each config's attribute_map (gpt2: n_layer, n_embd, ...).
    config.num_hidden_layers = dims["layers"]
    config.hidden_size = dims["hidden"]
    config.num_attention_heads = dims["heads"]
    config.vocab_size = dims["vocab"]
    if dims["kv_heads"] is not None:
        _set_present(config, _KV_KEYS, dims["kv_heads"])
    if dims["intermediate"] != orig["intermediate"]:
        _set_present(config, _FFN_KEYS, dims["intermediate"])
    if orig["max_positions"] is not None:
        # Long-context RoPE variants (llama3, yarn) scale relative to the pre-training length,
        # which must stay below the position table; shrink it first, as setting the table
        # size re-validates the RoPE parameters.
        for key in ("rope_parameters", "rope_scaling"):
            rope = getattr(config, key, None)
            if not isinstance(rope, dict):
                continue
            original = rope.get("original_max_position_embeddings")
            if isinstance(original, int) and original >= dims["max_positions"]:
                half = max(1, dims["max_positions"] // 2)
                setattr(config, key, {**rope, "original_max_position_embeddings": half})
        config.max_position_embeddings = dims["max_positions"]
    reshaped = (dims["hidden"], dims["heads"]) != (orig["hidden"], orig["heads"])
    if reshaped and getattr(config, "head_dim", None) is not None:
        # Some configs derive head_dim (a read-only property); those follow hidden/heads anyway.
        with contextlib.suppress(AttributeError):
            config.head_dim = dims["hidden"] // dims["heads"]
    if dims["hidden"] != orig["hidden"]:
        _set_present(config, _MOE_FFN_KEYS, 2 * dims["hidden"])
        if isinstance(getattr(config, "word_embed_proj_dim", None), int):
            config.word_embed_proj_dim = dims["hidden"]  # OPT's embedding projection
    if dims["experts"] is not None:
        _set_present(config, _EXPERT_KEYS, dims["experts"])
        per_token = getattr(config, "num_experts_per_tok", None)
        if isinstance(per_token, int):
            config.num_experts_per_tok = min(per_token, dims["experts"])
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list):
        config.layer_types = layer_types[: dims["layers"]]


def _set_present(config: Any, keys: tuple[str, ...], value: int) -> None:
    for key in keys:
        if isinstance(getattr(config, key, None), int):
            with contextlib.suppress(AttributeError):
                setattr(config, key, value)


def _first_present(config: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _clear_out_of_range_token_ids(config: Any, vocab: int) -> None:
    # Special-token ids of the full vocabulary (gpt2's 50256) point outside the scaled one;
    # the synthetic data needs none of them.
    for key in _TOKEN_ID_KEYS:
        value = getattr(config, key, None)
        ids = value if isinstance(value, list) else [value]
        if any(isinstance(i, int) and i >= vocab for i in ids):
            setattr(config, key, None)


def _config_dict(config: Any) -> dict[str, Any]:
    data = config.to_diff_dict()
    for key in (*_NOT_CONFIG_KEYS, "model_type", "architectures"):
        data.pop(key, None)
    return dict(json.loads(json.dumps(data, default=str)))


def _count_params(config_dict: dict[str, Any]) -> tuple[int, int]:
    # Total parameters, and the most owned directly by one module (what ZeRO-3 gathers at once;
    # tools/research/model_catalog.py counts largest_layer_params the same way).
    import torch
    import transformers

    data = dict(config_dict)
    config = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    # The meta device gives exact shapes without allocating weights.
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return int(total), int(largest)
