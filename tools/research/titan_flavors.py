"""torchtitan's Llama 3 flavors, and whether a model is one of them, whole.

torchtitan builds a llama3 model from a named flavor, not from the model's config: the flavor
fixes the architecture, and its TOML (``[model] flavor``) can change none of it (only the
sequence length, ``[training] seq_len``, reaches ``TransformerModelArgs.max_seq_len``). So a
model runs on torchtitan only when a flavor builds exactly it; a Llama of the same shape with
another vocabulary, rotary base or scaling (Llama 2 70B, Llama 3 8B/70B) is not one, and the
plan uses a launcher that builds the model from its config instead.

The table is torchtitan v0.2.2 (pytorch/torchtitan tag v0.2.2, commit
73a0e6979dd10b6b1904098eb3c8f62c18ab87ce): ``llama3_args`` in torchtitan/models/llama3/__init__.py,
the defaults of ``TransformerModelArgs`` and ``RoPEScalingArgs`` in
torchtitan/models/llama3/model/args.py (vocab_size 128256, norm_eps 1e-5, RoPE scaling factor 8,
low/high frequency factors 1 and 4, original context 8192: Llama 3.1's), and the SwiGLU width
``FeedForward`` computes in torchtitan/models/llama3/model/model.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.core.schemas import ModelSpec

TORCHTITAN_RELEASE = "0.2.2"
TORCHTITAN_RELEASE_COMMIT = "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce"
# Llama 3.1's RoPE scaling as torchtitan's RoPEScalingArgs defaults (rope_type "llama3").
_ROPE_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True)
class Flavor:
    """One ``llama3_args`` entry: the arguments it sets and the defaults it keeps."""

    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim_multiplier: float
    multiple_of: int
    rope_theta: float = 500000.0
    vocab_size: int = 128256
    norm_eps: float = 1e-5

    @property
    def ffn_hidden(self) -> int:
        """The SwiGLU width torchtitan's ``FeedForward`` builds from (dim, multiple_of, mult)."""
        hidden = int(2 * (4 * self.dim) / 3)
        hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


FLAVORS = (
    Flavor("8B", 4096, 32, 32, 8, ffn_dim_multiplier=1.3, multiple_of=1024),
    Flavor("70B", 8192, 80, 64, 8, ffn_dim_multiplier=1.3, multiple_of=4096),
    Flavor("405B", 16384, 126, 128, 8, ffn_dim_multiplier=1.2, multiple_of=4096),
)


def _same_shape(model: ModelSpec) -> Flavor | None:
    """The flavor with the model's layers, width and (grouped) heads, if any."""
    shape = (model.layers, model.hidden, model.heads, model.kv_heads or model.heads)
    for flavor in FLAVORS:
        if shape == (flavor.n_layers, flavor.dim, flavor.n_heads, flavor.n_kv_heads):
            return flavor
    return None


def _rope_scaling(cfg: dict[str, Any]) -> dict[str, float] | None:
    """The config's llama3-type RoPE scaling as numbers, else None (none, or another kind)."""
    scaling = cfg.get("rope_scaling") or None
    if not isinstance(scaling, dict):
        return None
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind != "llama3":
        return {"type": -1.0}  # another kind: never torchtitan's
    return {key: float(scaling.get(key, -1)) for key in _ROPE_SCALING}


def differences(model: ModelSpec, flavor: Flavor) -> list[str]:
    """How the model differs from a flavor of its shape, one phrase each (empty: it is it).

    Absent config keys read as Hugging Face's ``LlamaConfig`` defaults (rope_theta 10000, no
    RoPE scaling, rms_norm_eps 1e-6, untied embeddings), as transformers builds the model.
    """
    cfg = model.hf_config or {}
    found: list[str] = []
    ffn = model.intermediate or cfg.get("intermediate_size")
    if ffn != flavor.ffn_hidden:
        found.append(f"MLP width {ffn} (flavor {flavor.ffn_hidden})")
    if model.vocab != flavor.vocab_size:
        found.append(f"vocabulary {model.vocab} (flavor {flavor.vocab_size})")
    if not cfg.get("model_type"):
        return [*found, "no Hugging Face config to show its rotary base, RoPE scaling, norm eps"]
    theta = float(cfg.get("rope_theta") or 10000.0)
    if theta != flavor.rope_theta:
        found.append(f"rope theta {theta:g} (flavor {flavor.rope_theta:g})")
    scaling = _rope_scaling(cfg)
    if scaling != {k: float(v) for k, v in _ROPE_SCALING.items()}:
        said = "none" if scaling is None else str(cfg.get("rope_scaling"))
        found.append(f"RoPE scaling {said} (flavor llama3, factor 8, original context 8192)")
    eps = float(cfg.get("rms_norm_eps") or 1e-6)
    if eps != flavor.norm_eps:
        found.append(f"RMSNorm eps {eps:g} (flavor {flavor.norm_eps:g})")
    if cfg.get("tie_word_embeddings"):
        found.append("tied embeddings (flavor untied)")
    return found


def _llama(model: ModelSpec | None) -> bool:
    if model is None:
        return False
    return str((model.hf_config or {}).get("model_type") or model.family or "").lower() == "llama"


def torchtitan_flavor(model: ModelSpec | None) -> str | None:
    """The torchtitan ``llama3`` flavor that builds exactly this model, else None."""
    if model is None or not _llama(model):
        return None
    flavor = _same_shape(model)
    return flavor.name if flavor is not None and not differences(model, flavor) else None


def flavor_refusal(model: ModelSpec | None) -> str | None:
    """Why a Llama of a torchtitan flavor's shape does not run on torchtitan, else None."""
    if model is None or not _llama(model):
        return None
    flavor = _same_shape(model)
    if flavor is None:
        return None
    found = differences(model, flavor)
    if not found:
        return None
    return (
        f"torchtitan's llama3 flavor {flavor.name} has {model.name}'s shape but is Llama 3.1 "
        f"(torchtitan {TORCHTITAN_RELEASE}); {model.name} differs in {', '.join(found)}, which "
        "torchtitan's job config cannot set, so torchtitan would train another model"
    )


def build_refusal(model: ModelSpec | None) -> str | None:
    """Why torchtitan cannot build the model, in words (None: one of its flavors builds it)."""
    if torchtitan_flavor(model) is not None:
        return None
    name = model.name if model is not None else "the model"
    return flavor_refusal(model) or (
        f"torchtitan {TORCHTITAN_RELEASE} builds only the Llama 3.1 8B, 70B and 405B of its "
        f"llama3 flavors, and {name} is none of them"
    )


def titan_refusal(model: ModelSpec | None, task: str) -> str | None:
    """Why torchtitan cannot run this training job (None: it can): LoRA, or a model it cannot build.

    The torchtitan launch here trains every weight; LoRA adapters train with the Hugging Face
    job (train.py with peft).
    """
    if task == "lora":
        return (
            "torchtitan's launch here trains every weight, not LoRA adapters (those train with "
            "the Hugging Face job, train.py with peft)"
        )
    return build_refusal(model)
