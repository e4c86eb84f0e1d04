"""The job trains a mixture of experts with its router's balance loss (issue 29, item 1).

Mixtral's released config.json has ``output_router_logits: false`` (an inference setting), and
transformers adds ``router_aux_loss_coef x`` the load-balancing loss to the training loss only
when it is on: a plan that builds Mixtral from model_config.json (or loads its weights) would
train the router on the language-model loss alone. job_model turns it on for training.
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import torch

# transformers' Mixtral modules import here, at collection, not inside the first test's CPU
# budget (the unit tier's 2 s per test; the import alone is about 1.5 s).
import transformers.models.mixtral.modeling_mixtral  # noqa: F401
from job_model import build_model, load_model, training_overrides

# A Mixtral of Mixtral 8x7B's config keys, tiny.
TINY_MIXTRAL = {
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 64,
    "max_position_embeddings": 64,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.02,
}


def test_only_a_router_with_a_balance_loss_switch_gets_it_on() -> None:
    assert training_overrides(TINY_MIXTRAL) == {"output_router_logits": True}
    assert training_overrides(TINY_MIXTRAL | {"router_aux_loss_coef": 0.0}) == {}
    dense = {k: v for k, v in TINY_MIXTRAL.items() if "router" not in k}
    assert training_overrides(dense | {"model_type": "llama"}) == {}


def _loss_parts(model: Any) -> tuple[float, float, float]:
    """The training loss, the language-model loss alone and the balance loss of one batch."""
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    logits = out.logits[:, :-1].reshape(-1, 64)
    lm = torch.nn.functional.cross_entropy(logits, ids[:, 1:].reshape(-1))
    assert out.aux_loss is not None, "the router's balance loss is not computed"
    return out.loss.item(), lm.item(), out.aux_loss.item()


def test_a_mixtral_built_from_its_config_trains_with_the_balance_loss() -> None:
    torch.manual_seed(0)
    model = build_model(TINY_MIXTRAL)
    assert model.config.output_router_logits is True
    loss, lm, aux = _loss_parts(model)
    assert aux > 0
    assert loss == pytest.approx(lm + 0.02 * aux, rel=1e-5)


def test_a_mixtral_loaded_from_weights_trains_with_the_balance_loss(tmp_path: Any) -> None:
    torch.manual_seed(0)
    build_model(TINY_MIXTRAL | {"output_router_logits": False}).save_pretrained(tmp_path)
    args = argparse.Namespace(
        init="pretrained", model_path=str(tmp_path), attn_implementation=None, qlora=False
    )
    model = load_model(args, TINY_MIXTRAL, torch.float32, None)
    assert model.config.output_router_logits is True
    loss, lm, aux = _loss_parts(model)
    assert loss == pytest.approx(lm + 0.02 * aux, rel=1e-5)
