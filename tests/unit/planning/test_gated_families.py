"""Which families' MLPs are gated: GATED_MLP_FAMILIES against the modeling code transformers runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tools.planning.activations import activation_bytes, layer_coefficient
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
    # 24 + 8·i/h bytes per s·b·h (Llama-style layers in Hugging Face's code), not GPT's 34.
    for name in ("gemma-3-1b", "deepseek-v2-lite", "qwen3-30b-a3b"):
        model = lookup_model(name, 1024)
        assert model.intermediate
        assert layer_coefficient(model) == 24 + 8 * model.intermediate / model.hidden, name
        # Megatron's and nanotron's own layers keep the earlier count.
        assert layer_coefficient(model, hf=False) == 22 + 8 * model.intermediate / model.hidden


def test_llama_rmsnorm_returns_a_new_tensor_after_keeping_its_inputs():
    # The 16 bytes per s·b·h of the two norms in layer_coefficient: LlamaRMSNorm keeps its fp32
    # input (pow, multiply), and its last line multiplies the weight by the 16-bit normalised
    # tensor: the multiply keeps that tensor (for the weight's gradient) and returns a new one,
    # the norm's output, which the next projections keep. A fused norm would change the count.
    source = _modeling_source("llama")
    norm = source[source.index("class LlamaRMSNorm") :]
    norm = norm[: norm.index("\nclass ")]
    assert "hidden_states = hidden_states.to(torch.float32)" in norm
    assert "return self.weight * hidden_states.to(input_dtype)" in norm


def test_only_hugging_face_launches_take_its_layer_count():
    model = lookup_model("gemma-3-1b", 1024)
    common = {"seq_len": 1024, "micro_batch_size": 1, "precision": "bf16"}
    hf = activation_bytes(model, activation_checkpointing=False, **common)
    own = activation_bytes(model, activation_checkpointing=False, modeling="megatron", **common)
    assert hf - own == 2 * 1024 * model.hidden * model.layers
