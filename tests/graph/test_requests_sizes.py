"""Issue 28, item 5: a size in a request always reads as a model, and what was taken is said.

"a 70B policy" is the catalog's 70B model, "a 1B llama" the catalog's 1B llama, "a 20B llama"
(no catalog size) a llama shape of 20B; each says it was assumed, with the words it came from
and the alternatives. GPT sizes keep their own rule ("a 3B GPT" asks between GPT-3 shapes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from inproc import run_main

from tools.core.errors import InputError
from tools.core.settings import Settings
from tools.intake.brief import merge_answer, model_reading, parse_request, request_fields
from tools.intake.readings import MODEL_ASSUMED
from tools.research.model_catalog import list_models, lookup_model
from tools.research.model_shapes import FAMILY_ORDER, family_shape, models_of_size

MODELS = list_models()

# (request, the catalog id it must read as, the words quoted, alternatives that must be named)
SIZES: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("RLHF: PPO on a 70B policy with 64 H100", "llama-3.1-70b", "70B policy", ("llama-3-70b", "llama-2-70b")),
    ("we want to fine-tune a 70B model on 4 nodes of 8 A100 80GB", "llama-3.1-70b", "70B model", ("llama-2-70b",)),
    ("LoRA a 1B llama on one RTX 4090", "llama-3.2-1b", "1B llama", ()),
    ("continue pretraining a 8B Llama 3 on 16 H100", "llama-3-8b", "8B Llama 3", ("llama-3.1-8b",)),
    ("distill into a 3B Llama on 2 L40S", "llama-3.2-3b", "3B Llama", ()),
    ("fine-tune a 7 billion parameter LLM on 8 V100 32GB", "llama-2-7b", "7 billion parameter LLM", ("mistral-7b", "qwen2.5-7b")),
    ("SFT a 14B phi on 8 H100", "phi-4", "14B phi", ("phi-3-medium",)),
    ("fine-tune a 27B gemma on 8 H100", "gemma-3-27b", "27B gemma", ("gemma-2-27b",)),
    ("instruction-tune a 12B mistral on 8 A100", "mistral-nemo-12b", "12B mistral", ()),
    ("pretrain a 1.3B OPT from scratch on 8 A100", "opt-1.3b", "1.3B OPT", ()),
    ("fine-tune a 40B falcon on 2 nodes of 8 A100", "falcon-40b", "40B falcon", ()),
    ("RL on a 32B Qwen with 16 H800", "qwen3-32b", "32B Qwen", ("qwen2.5-32b",)),
    ("train a 67B deepseek on 8 nodes of 8 H800", "deepseek-llm-67b", "67B deepseek", ()),
    ("用 8 张 H800 微调一个 70B 的模型", "llama-3.1-70b", "70B 的模型", ("llama-3-70b",)),
    ("在 4 张 A100 上微调 1B 的 llama", "llama-3.2-1b", "1B 的 llama", ()),
    ("用 16 张 H20 训练 70亿参数的模型", "llama-2-7b", "70亿参数的模型", ("qwen2.5-7b",)),
    ("我们想在 8 张 A800 上做一个 6B 的 yi 模型的全参微调", "yi-6b", "6B 的 yi", ()),
]  # fmt: skip


@pytest.mark.parametrize(("text", "model", "said", "others"), SIZES, ids=[s[0] for s in SIZES])
def test_a_size_reads_as_the_catalog_model_of_that_size_said_to_be_assumed(
    text: str, model: str, said: str, others: tuple[str, ...]
) -> None:
    fields = request_fields(text, MODELS)
    assert fields["model"] == model
    reading = model_reading(text, MODELS)
    assert reading is not None and reading.said == said
    assert set(others) <= set(reading.alternatives)
    assumption = reading.assumption
    assert assumption is not None and assumption.field == "model"
    assert (assumption.value, assumption.quote) == (model, said)
    (line,) = fields[MODEL_ASSUMED]
    assert line.startswith(f"intake: assumed {model} for {said!r}: ")
    assert all(o in line for o in others)
    assert parse_request(text, MODELS).model == model  # a valid brief, never "names no model"


# (request, the family's catalog model the shape is built on, the words quoted)
SHAPED = [
    ("fine-tune a 20B llama on 8 A100", "llama-2-13b", "20B llama"),
    ("pretrain a llama with 20B parameters on 4 nodes of 8 H100", "llama-2-13b", "llama with 20B parameters"),
    ("train a 2B qwen3 on 8 L4", "qwen3-1.7b", "2B qwen3"),
    ("预训练一个 100B 的 opt 模型，用 16 台 8 卡 A800", "opt-66b", "100B 的 opt"),
    ("fine-tune a 10B gemma on 4 A100", "gemma-2-9b", "10B gemma"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "like", "said"), SHAPED, ids=[s[0] for s in SHAPED])
def test_a_family_at_a_size_the_catalog_lacks_is_its_shape_said_to_be_assumed(
    text: str, like: str, said: str
) -> None:
    fields = request_fields(text, MODELS)
    shape = fields["model"]
    assert isinstance(shape, dict) and shape["like"] == like
    reading = model_reading(text, MODELS)
    assert reading is not None and reading.said == said and reading.assumption is not None
    (line,) = fields[MODEL_ASSUMED]
    assert f"a {like}-like shape for {said!r}" in line and f"{shape['layers']} layers" in line
    brief = parse_request(text, MODELS)
    spec = lookup_model(brief.model, 512)  # type: ignore[arg-type]
    base = lookup_model(like, 512)
    # The family's own config at the new sizes: same kind of model, vocabulary and head size.
    assert spec.family == base.family and spec.vocab == base.vocab
    assert spec.name.startswith(f"{like}-like-")
    target = float(said.split("B")[0].split()[-1]) * 1e9
    assert spec.params == pytest.approx(target, rel=0.03)


def test_the_shape_rule_keeps_the_family_and_grows_width_and_depth() -> None:
    shape = family_shape("llama-2-13b", 20e9)
    base = lookup_model("llama-2-13b", 4096)
    assert base.hidden < shape["hidden"] < 8192 and base.layers < shape["layers"] < 80
    assert shape["hidden"] // shape["heads"] == base.hidden // base.heads  # head size kept
    assert shape["intermediate"] % 256 == 0 and shape["like"] == "llama-2-13b"
    # Grouped-query attention keeps its grouping (qwen3-1.7b: 16 heads, 8 KV heads).
    qwen = family_shape("qwen3-1.7b", 3e9)
    assert qwen["heads"] == 2 * qwen["kv_heads"]


def test_gpt_sizes_keep_their_rule() -> None:
    # Between GPT-3's shapes a size is asked about, listing the two nearest; never llama.
    fields = request_fields("pretrain a 3B GPT on 8 A100", MODELS)
    assert "model" not in fields
    reading = model_reading("pretrain a 3B GPT on 8 A100", MODELS)
    assert reading is not None and reading.candidates == ("gpt3-2.7b", "gpt3-6.7b")
    assert request_fields("pretrain a 2.7B GPT on 8 A100", MODELS)["model"] == "gpt3-2.7b"


def test_a_size_the_catalog_lacks_without_a_family_is_the_llama_style_size() -> None:
    fields = request_fields("pretrain a 20B model on 8 H100", MODELS)
    assert fields["model"] == {"params": 2e10}
    (line,) = fields[MODEL_ASSUMED]
    assert "no catalog model is 20B" in line and "nearest catalog models" in line


def test_only_mixtures_of_experts_of_a_family_are_asked_about() -> None:
    # Mixtral has no dense model to shape from: the question lists its models.
    reading = model_reading("fine-tune a 30B mixtral on 8 H100", MODELS)
    assert reading is not None and reading.value is None
    assert set(reading.candidates) == {"mixtral-8x7b", "mixtral-8x22b"}
    with pytest.raises(InputError, match="'30B mixtral' could be mixtral-8x7b or mixtral-8x22b"):
        parse_request("fine-tune a 30B mixtral on 8 H100", MODELS)


def test_names_still_win_over_sizes() -> None:
    assert request_fields("fine-tune llama-3-70b, a 70B model, on 16 H100", MODELS)["model"] == (
        "llama-3-70b"
    )
    assert MODEL_ASSUMED not in request_fields("fine-tune llama-3-70b on 16 H100", MODELS)
    # A family and size written as a name is a name: asked about, not shaped.
    assert "model" not in request_fields("fine-tune llama-3-7b on 8 A100", MODELS)


def test_generic_sizes_take_dense_models_in_the_stated_family_order() -> None:
    assert FAMILY_ORDER[0] == "llama"
    assert models_of_size(30e9) == ["opt-30b"]  # qwen3-30b-a3b is a mixture of experts
    assert models_of_size(30e9, "qwen") == ["qwen3-30b-a3b"]  # named family: any of its models
    assert models_of_size(8e9)[:2] == ["llama-3.1-8b", "llama-3-8b"]  # newest version first


def test_an_answered_size_is_said_to_be_assumed_too() -> None:
    fields = request_fields("train a model on 4 A100s", MODELS)
    merged = merge_answer(fields, "model", "13B", MODELS)
    assert merged["model"] == "llama-2-13b"
    assert merged[MODEL_ASSUMED][0].startswith("intake: assumed llama-2-13b for '13B model'")


def test_the_plan_states_the_assumption(settings: Settings, tmp_path: Path) -> None:
    from graphs import build_graph

    state = build_graph(settings=settings).invoke(
        {
            "request": "RLHF a 70B policy on 8 nodes of 8 H100",
            "overrides": {"smoke": False},
            "out_dir": str(tmp_path / "p"),
        }
    )
    plan: dict[str, Any] = state["plan"]
    assert plan["brief"]["model"] == "llama-3.1-70b"
    line = "intake: assumed llama-3.1-70b for '70B policy': the request gives a size (70B)"
    assert line in plan["narrative"]["fallbacks"]
    assert line in Path(plan["report"]["markdown"]).read_text(encoding="utf-8")


def test_cli_plans_a_shaped_family_model(tmp_path: Path) -> None:
    out = tmp_path / "p"
    done = run_main(
        "plan", "fine-tune a 20B llama on 8 A100", "--no-smoke", "--out", out,
        "--json", tmp_path / "plan.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads((tmp_path / "plan.json").read_text(encoding="utf-8"))
    assert plan["model"]["name"].startswith("llama-2-13b-like-")
    assert plan["model"]["params"] == pytest.approx(20e9, rel=0.03)
    assert "assumed a llama-2-13b-like shape for '20B llama'" in done.stderr
