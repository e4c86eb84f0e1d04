"""Brief loading and the offline free-text parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.core.errors import InputError
from tools.intake.brief import brief_from_dict, load_brief, parse_request
from tools.research.model_catalog import list_models

SHARED = Path(__file__).parents[2] / "data"


@pytest.mark.parametrize("path", sorted(SHARED.glob("*.yaml")), ids=lambda p: p.name)
def test_shared_briefs_load(path: Path) -> None:
    brief = load_brief(path)
    assert brief.global_batch_size > 0 and brief.seq_len > 0


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"goal": "x"}, "brief.model"),
        ({"model": "gpt2", "global_batch_size": -4}, "brief.global_batch_size"),
        ({"model": "gpt2", "seq_len": 0}, "brief.seq_len"),
        ({"model": {"params": -1}}, "brief.model.params"),
        ({"model": "gpt2", "task": "dance"}, "brief.task"),
        ({"model": "gpt2", "colour": "red"}, "brief.colour"),
        ({"model": "gpt2", "team": {"experience": "guru"}}, "brief.team.experience"),
        (["model", "gpt2"], "brief"),
    ],
)
def test_invalid_briefs_name_the_field(data: object, field: str) -> None:
    with pytest.raises(InputError) as err:
        brief_from_dict(data)
    assert str(err.value).startswith(field + ":")
    assert "\n" not in str(err.value)


def test_brief_files_that_are_not_briefs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [gpt2\n  : : {\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_brief(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(InputError, match="empty"):
        load_brief(empty)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00model")
    with pytest.raises(InputError):
        load_brief(binary)
    with pytest.raises(InputError, match="no such file"):
        load_brief(tmp_path / "missing.yaml")


def test_json_brief(tmp_path: Path) -> None:
    p = tmp_path / "b.json"
    p.write_text('{"model": "llama-3-8b", "hardware": "1x8xA100-80GB", "seq_len": 4096}')
    assert load_brief(p).hardware == "1x8xA100-80GB"


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        (
            "fine-tune llama 3 8b on 8 A100s",
            {"model": "llama-3-8b", "hardware": "1x8xA100-80GB", "task": "finetune"},
        ),
        (
            "pretrain Llama-3-70B on 2 nodes of 8 H100, sequence length 8k",
            {
                "model": "llama-3-70b",
                "hardware": "2x8xH100-80GB",
                "task": "pretrain",
                "seq_len": 8192,
            },
        ),
        (
            "LoRA on mistral-7b with 1 RTX 4090, batch size 16",
            {
                "model": "mistral-7b",
                "hardware": "1x1xRTX4090",
                "task": "lora",
                "global_batch_size": 16,
            },
        ),
        ("pretrain gpt2 here", {"model": "gpt2", "seq_len": 1024, "hardware": "local"}),
    ],
)
def test_parse_request(text: str, expect: dict) -> None:
    brief = parse_request(text, list_models()).model_dump()
    for key, value in expect.items():
        assert brief[key] == value, (key, brief)


def test_parse_request_sizes_and_missing_model() -> None:
    # Issue 28: a size the catalog has is that model; one it lacks is a llama-style shape.
    assert parse_request("train a 7B model on 4 H100", list_models()).model == "llama-2-7b"
    assert parse_request("train a 20B model on 4 H100", list_models()).model.params == 2e10  # type: ignore[union-attr]
    with pytest.raises(InputError, match="names no model"):
        parse_request("train something big on 8 GPUs", list_models())
