"""Model catalog and exact parameter counts from meta-device instantiation."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.core.errors import InputError
from tools.core.schemas import ModelParams, ModelShape
from tools.research import model_catalog as models
from tools.research.model_catalog import list_models, load_model_catalog, lookup_model

COUNTS_PATH = Path(__file__).resolve().parents[3] / "knowledge" / "models" / models.COUNTS_FILE

REQUIRED_MODELS = {
    "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-2-7b", "llama-2-13b", "llama-2-70b",
    "llama-3-8b", "llama-3-70b", "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "qwen2.5-0.5b",
    "qwen2.5-7b", "qwen2.5-72b", "phi-3-mini", "gemma-2-9b", "bert-base", "t5-base",
}  # fmt: skip

# Models with learned absolute positions cannot take longer sequences.
SHORT_CONTEXT = {"gpt2": 1024, "gpt2-medium": 1024, "gpt2-large": 1024, "gpt2-xl": 1024}
SHORT_CONTEXT["bert-base"] = 512


def test_catalog_lists_the_required_models() -> None:
    assert REQUIRED_MODELS <= set(list_models())


@pytest.mark.parametrize("model_id", sorted(REQUIRED_MODELS))
def test_meta_count_agrees_with_the_published_count(model_id: str) -> None:
    entry = load_model_catalog()[model_id]
    spec = lookup_model(model_id, SHORT_CONTEXT.get(model_id, 512))
    published = entry["published_params"]
    assert spec.params == pytest.approx(published, rel=0.01), entry["published_params_source"]
    assert entry["hf_repo"] and entry["published_params_source"]
    assert spec.name == model_id and spec.hf_config and spec.family == spec.hf_config["model_type"]
    assert 0 < spec.largest_layer_params < spec.params


def test_exact_counts_and_shapes() -> None:
    gpt2 = lookup_model("gpt2", 1024)
    assert gpt2.params == 124_439_808  # tied lm_head counted once
    assert (gpt2.layers, gpt2.hidden, gpt2.heads, gpt2.vocab) == (12, 768, 12, 50257)
    assert gpt2.intermediate == 3072
    assert gpt2.largest_layer_params == 50257 * 768  # the token embedding

    llama = lookup_model("llama-3-8b", 4096)
    assert llama.params == 8_030_261_248
    assert (llama.layers, llama.hidden, llama.heads, llama.kv_heads) == (32, 4096, 32, 8)
    assert (llama.vocab, llama.intermediate, llama.family) == (128256, 14336, "llama")
    assert llama.seq_len == 4096
    assert llama.largest_layer_params == 128256 * 4096

    mixtral = lookup_model("mixtral-8x7b", 4096)
    assert mixtral.params == pytest.approx(46.7e9, rel=0.001)
    # One fused expert block outweighs the embedding: that is what ZeRO-3 gathers at once.
    assert mixtral.largest_layer_params > 32000 * 4096

    t5 = lookup_model("t5-base", 512)
    assert t5.layers == 24  # encoder and decoder blocks


def test_names_match_aliases_case_and_punctuation() -> None:
    for ref in ("Llama-3-8B", "llama3-8b", "meta-llama/Meta-Llama-3-8B", "LLAMA 3 8B"):
        assert lookup_model(ref, 2048).name == "llama-3-8b"


def test_unknown_model_suggests_close_matches() -> None:
    with pytest.raises(InputError) as err:
        lookup_model("lama-3-8b", 2048)
    assert err.value.field == "model"
    assert "unknown model 'lama-3-8b'; close matches: llama-3-8b" in err.value.message


def test_paths_must_be_existing_json_configs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        lookup_model("some/dir/missing.json", 2048)
    with pytest.raises(InputError, match="does not exist"):
        lookup_model("./gpt2", 512)  # a path, so not the catalog's gpt2
    notes = tmp_path / "notes.txt"
    notes.write_text("hello")
    with pytest.raises(InputError, match="not a .json file"):
        lookup_model(str(notes), 2048)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(InputError, match="broken.json' is not valid JSON"):
        lookup_model(str(broken), 2048)
    untyped = tmp_path / "untyped.json"
    untyped.write_text('{"hidden_size": 8}')
    with pytest.raises(InputError, match="untyped.json' .*no model_type"):
        lookup_model(str(untyped), 2048)
    alien = tmp_path / "alien.json"
    alien.write_text('{"model_type": "my-secret-arch", "auto_map": {}}')
    with pytest.raises(InputError, match="my-secret-arch"):
        lookup_model(str(alien), 2048)


def test_user_config_file_and_folder(tmp_path: Path) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    }
    folder = tmp_path / "my-tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    spec = lookup_model(str(folder / "config.json"), 128)
    assert spec.name == "my-tiny-llama" and spec.family == "llama" and spec.kv_heads == 2
    assert str(folder / "config.json") in spec.source
    # Counted by transformers, so the tied head is not counted twice.
    head_dim = 256 // 4
    attention = 256 * 256 * 2 + 2 * 256 * 2 * head_dim
    expected = 1000 * 256 + 2 * (attention + 3 * 256 * 688 + 2 * 256) + 256
    assert spec.params == expected
    assert lookup_model(str(folder), 128).params == expected


def test_params_only_gives_a_llama_shape_of_that_size() -> None:
    spec = lookup_model(ModelParams(params=7e9), 4096)
    assert spec.params == pytest.approx(7e9, rel=0.02)
    assert spec.family == "llama" and spec.hidden == 4096 and 28 <= spec.layers <= 36
    assert "derived" in spec.source
    assert lookup_model({"params": 7e9}, 4096).params == spec.params
    big = lookup_model(ModelParams(params=1e12), 4096)
    assert big.params == pytest.approx(1e12, rel=0.02)
    with pytest.raises(InputError, match="cannot derive"):
        lookup_model(ModelParams(params=1000), 128)


def test_shape_only_builds_a_llama_config() -> None:
    spec = lookup_model(ModelShape(layers=32, hidden=4096, heads=32, vocab=32000), 4096)
    assert spec.params == lookup_model("llama-2-7b", 4096).params  # Llama rule FFN: 11008
    assert spec.intermediate == 11008
    shape = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "intermediate": 128}
    as_dict = lookup_model(shape, 64)
    assert (as_dict.layers, as_dict.intermediate, as_dict.vocab) == (2, 128, 100)
    with pytest.raises(InputError, match="divisible"):
        lookup_model({"layers": 2, "hidden": 100, "heads": 3, "vocab": 10}, 64)
    with pytest.raises(InputError) as err:
        lookup_model({"layers": 2}, 64)
    assert err.value.field == "model"


def test_sequence_length_is_checked() -> None:
    with pytest.raises(InputError) as err:
        lookup_model("gpt2", 2048)
    assert err.value.field == "seq_len" and "1024" in err.value.message
    with pytest.raises(InputError) as err:
        lookup_model("llama-3-8b", 0)
    assert err.value.field == "seq_len"
    # RoPE models have no hard limit: a long context is the user's call.
    assert lookup_model("llama-3-8b", 32768).seq_len == 32768


def test_largest_models_are_fast_enough_to_count_live() -> None:
    configs = [
        json.dumps(models._catalog_config(model_id), sort_keys=True)
        for model_id in ("gpt2", "llama-3.1-405b", "mixtral-8x7b", "qwen2.5-72b")
    ]
    models._count.__wrapped__(configs[0])  # pays the torch/transformers import once
    started = time.perf_counter()
    for config_json in configs[1:]:
        models._count.__wrapped__(config_json)  # bypass the in-process cache: really count
    assert time.perf_counter() - started < 30


def test_mixture_of_experts_counts_active_parameters() -> None:
    """Mixtral routes each token to 2 of 8 experts: 46.7 B total, 12.9 B active (Jiang et al. 2024)."""
    spec = lookup_model("mixtral-8x7b", 4096)
    assert spec.params == 46_702_792_704
    assert abs(spec.active_params - 12.9e9) / 12.9e9 < 0.01
    dense = lookup_model("llama-3-8b", 4096)
    assert dense.active_params == dense.params


# ---- the shipped counts (knowledge/models/counts.json) -------------------------------------------


@pytest.fixture
def count_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every live meta-device count lookup_model asks for, with shipped counts reloaded."""
    calls: list[str] = []
    live: Callable[[str], Any] = models._count

    def spy(config_json: str) -> Any:
        calls.append(config_json)
        return live(config_json)

    monkeypatch.setattr(models, "_count", spy)
    models._shipped_counts.cache_clear()
    return calls


@pytest.fixture(autouse=True)
def _fresh_shipped_counts() -> Iterator[None]:
    """Forget counts a test loaded from a patched place; torn down after monkeypatch's undo."""
    yield
    models._shipped_counts.cache_clear()


@pytest.mark.slow  # builds every catalog model on the meta device (tens of seconds)
def test_shipped_counts_equal_a_live_meta_count() -> None:
    """Every catalog model's stored counts are what meta instantiation gives now (about 5 s)."""
    shipped = json.loads(COUNTS_PATH.read_text(encoding="utf-8"))
    live = models.catalog_counts()
    stale = "stale: run `python -m tools.research.model_catalog --refresh-counts`"
    assert shipped["transformers"] == live["transformers"], stale
    assert sorted(shipped["models"]) == sorted(live["models"]) == sorted(list_models()), stale
    for model_id, counts in live["models"].items():
        assert shipped["models"][model_id] == counts, f"{model_id}: {stale}"
    assert shipped == live, stale


def test_every_catalog_model_is_served_without_counting(count_calls: list[str]) -> None:
    for model_id in list_models():
        spec = lookup_model(model_id, 512)
        assert f"stored for this exact config in knowledge/models/{models.COUNTS_FILE}" in (
            spec.source
        )
    assert count_calls == []


def test_a_changed_config_misses_the_shipped_counts_and_is_counted_live(
    count_calls: list[str],
) -> None:
    config = models._catalog_config("llama-3-8b")
    # The same config with its keys in another order is the same canonical JSON: a hit.
    assert lookup_model(dict(reversed(list(config.items()))), 4096).params == 8_030_261_248
    assert count_calls == []

    changed = {**config, "vocab_size": 128000}
    spec = lookup_model(changed, 4096)
    assert len(count_calls) == 1 and json.loads(count_calls[0])["vocab_size"] == 128000
    # Untied input and output embeddings each lose 256 rows of 4096.
    assert spec.params == 8_030_261_248 - 2 * 256 * 4096
    assert spec.source.endswith("on meta")


def test_counts_from_another_transformers_version_are_ignored(
    count_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "_transformers_version", lambda: "0.0.1")
    models._shipped_counts.cache_clear()
    assert models._shipped_counts() == {}
    assert lookup_model("llama-3-8b", 4096).params == 8_030_261_248
    assert len(count_calls) == 1


def test_a_missing_or_damaged_counts_file_falls_back_to_live_counting(
    count_calls: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(models, "_models_dir", lambda: tmp_path)
    for model_id in ("gpt2", "llama-3-8b"):
        (tmp_path / f"{model_id}.json").write_text(
            json.dumps(json.loads((COUNTS_PATH.parent / f"{model_id}.json").read_text()))
        )
    (tmp_path / "catalog.yaml").write_text((COUNTS_PATH.parent / "catalog.yaml").read_text())
    shipped = json.loads(COUNTS_PATH.read_text())
    shipped["models"]["gpt2"].pop("params")  # a damaged entry is skipped, the rest still serve
    (tmp_path / models.COUNTS_FILE).write_text(json.dumps(shipped))
    models._shipped_counts.cache_clear()
    assert lookup_model("llama-3-8b", 4096).params == 8_030_261_248 and count_calls == []
    assert lookup_model("gpt2", 1024).params == 124_439_808 and len(count_calls) == 1

    (tmp_path / models.COUNTS_FILE).write_text("{not json")
    models._shipped_counts.cache_clear()
    assert lookup_model("llama-3-8b", 4096).params == 8_030_261_248 and len(count_calls) == 2


# (catalog id, the config key its position table's length is under, rows in its config)
LEARNED_POSITIONS = [("gpt2", "n_positions", 1024), ("opt-125m", "max_position_embeddings", 2048),
                     ("bert-base", "max_position_embeddings", 512)]  # fmt: skip


@pytest.mark.parametrize(("model_id", "key", "rows"), LEARNED_POSITIONS)
def test_a_model_built_from_scratch_gets_a_position_table_of_seq_len(
    model_id: str, key: str, rows: int
) -> None:
    with pytest.raises(InputError) as err:  # a checkpoint's table is what it is
        lookup_model(model_id, 2 * rows)
    assert err.value.field == "seq_len"
    assert f"{model_id}'s checkpoint has learned position embeddings for {rows} tokens" in str(
        err.value
    )
    assert f"use seq_len <= {rows}" in err.value.message
    catalog = lookup_model(model_id, rows)
    scratch = lookup_model(model_id, 2 * rows, from_scratch=True)
    assert scratch.hf_config is not None and scratch.hf_config[key] == 2 * rows
    # Only the table grew, by the added rows x the embedding width (the live meta count).
    assert scratch.params - catalog.params == rows * (catalog.hf_config or {}).get(
        "word_embed_proj_dim", catalog.hidden
    )
    assert (scratch.layers, scratch.hidden, scratch.vocab) == (
        catalog.layers, catalog.hidden, catalog.vocab
    )  # fmt: skip
    assert scratch.notes == [
        f"pretraining from scratch: {model_id}'s learned position table sized to {2 * rows} "
        f"rows (its catalog config has {rows})"
    ]
    assert catalog.notes == [] and lookup_model(model_id, rows, from_scratch=True) == catalog
    # The catalog's own config is untouched (a cached dict changed in place would leak).
    assert models._catalog_config(model_id)[key] == rows


def test_a_brief_looks_its_model_up_as_its_job_builds_it() -> None:
    from tools.intake.brief_load import brief_from_dict

    pretrain = models.brief_model(
        brief_from_dict({"model": "gpt2", "task": "pretrain", "seq_len": 2048})
    )
    assert pretrain.seq_len == 2048 and (pretrain.hf_config or {})["n_positions"] == 2048
    assert pretrain.notes
    for loads in ({"task": "finetune"}, {"task": "lora"}, {"objective": "continued-pretraining"}):
        brief = brief_from_dict({"model": "gpt2", "seq_len": 2048, "task": "pretrain", **loads})
        assert brief.loads_weights
        with pytest.raises(InputError, match="checkpoint"):
            models.brief_model(brief)
    # A RoPE model has no table to size: nothing changes, nothing to say.
    llama = models.brief_model(
        brief_from_dict({"model": "llama-3-8b", "task": "pretrain", "seq_len": 16384})
    )
    assert llama.notes == [] and llama.hf_config == models._catalog_config("llama-3-8b")
