"""Which families' MLPs are gated: GATED_MLP_FAMILIES against the modeling code transformers runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tools.planning.activations import layer_coefficient
from tools.planning.states import GATED_MLP_FAMILIES
from tools.research.model_catalog import list_models, lookup_model

MODELS = Path(__file__).resolve().parents[3] / "knowledge" / "models"


def _modeling_source(model_type: str) -> str:
    """The text of transformers' modeling file for ``model_type`` (read, not imported)."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type)
    spec = importlib.util.find_spec(f"transformers.models.{module}")
    assert spec is not None and spec.submodule_search_locations, model_type
    folder = Path(next(iter(spec.submodule_search_locations)))
    return (folder / f"modeling_{module}.py").read_text(encoding="utf-8")


def _catalog_model_types() -> set[str]:
    types = set()
    for name in list_models():
        path = MODELS / f"{name}.json"
        if path.is_file():
            config = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(config.get("model_type"), str):
                types.add(config["model_type"])
    return types


def test_every_catalog_family_is_gated_exactly_when_its_mlp_has_a_gate_projection():
    types = _catalog_model_types()
    assert {"qwen3_moe", "deepseek_v2", "deepseek_v3", "gemma3_text"} <= types
    wrong = {}
    for model_type in sorted(types):
        source = _modeling_source(model_type)
        has_gate = "self.gate_proj" in source or "self.gate_up_proj" in source
        if has_gate != (model_type in GATED_MLP_FAMILIES):
            wrong[model_type] = has_gate
    assert not wrong, f"gate projection in the modeling file (True) or not, vs the set: {wrong}"


def test_gemma3_and_deepseek_layers_keep_the_gated_activation_memory():
    # 22 + 8·i/h bytes per s·b·h (Llama-style layers), not GPT's 34.
    for name in ("gemma-3-1b", "deepseek-v2-lite", "qwen3-30b-a3b"):
        model = lookup_model(name, 1024)
        assert model.intermediate
        assert layer_coefficient(model) == 22 + 8 * model.intermediate / model.hidden, name
