"""A run's seed, W&B logging and data path are read with their words, never dropped.

"seed 1234" was listed as not understood, "log to wandb" and "dataset at /data/train.jsonl" were
dropped without a word, though train.py takes --seed, --wandb and --data.
"""

from __future__ import annotations

import pytest

from tools.intake.brief import brief_from_request, request_fields
from tools.intake.run_text import DEFAULT_WANDB_PROJECT, run_reads
from tools.research.model_catalog import list_models


@pytest.mark.parametrize(
    ("text", "field", "value", "quote"),
    [
        ("full SFT of phi-3-mini on 8 A100, seed 1234", "seed", 1234, "seed 1234"),
        ("fine-tune llama-3-8b on 8 H100, random seed of 7", "seed", 7, "random seed of 7"),
        ("DPO on mistral-7b, wandb logging to project dpo-runs", "wandb_project", "dpo-runs", "wandb logging to project dpo-runs"),
        ("fine-tune llama-3-8b on 8 H100 with W&B project chat-ft", "wandb_project", "chat-ft", "W&B project chat-ft"),
        ("SFT llama-3.2-1b on 1 RTX 3090, log to wandb", "wandb_project", DEFAULT_WANDB_PROJECT, "log to wandb"),
        ("fine-tune on 8 H100, log metrics to Weights & Biases", "wandb_project", DEFAULT_WANDB_PROJECT, "log metrics to Weights & Biases"),
        ("SFT on 8 H100 with packing, dataset at /data/sft/train.jsonl", "data_path", "/data/sft/train.jsonl", "dataset at /data/sft/train.jsonl"),
        ("fine-tune llama-3-8b on 8 H100 on ~/data/chat.jsonl", "data_path", "~/data/chat.jsonl", "~/data/chat.jsonl"),
        ("pretrain on 8 H100 with data from corpus/web.parquet", "data_path", "corpus/web.parquet", "data from corpus/web.parquet"),
    ],
)  # fmt: skip
def test_a_run_setting_is_read_with_its_words(
    text: str, field: str, value: object, quote: str
) -> None:
    got = {r.field: r for r in run_reads(text)}
    assert got[field].value == value
    assert got[field].quote.endswith(quote) and quote in text


@pytest.mark.parametrize(
    "text",
    [
        "fine-tune llama-3-8b on 8 A100/H100",
        "fine-tune llama-3-8b on 1x8xA100-80GB with 1/2 of the data",
        "pretrain gpt2 on 8 V100 with the seeded shuffle",
    ],
)
def test_no_setting_is_read_from_other_words(text: str) -> None:
    assert run_reads(text) == []


def test_the_settings_are_brief_fields() -> None:
    text = "fine-tune llama-3-8b on 8 H100 on /data/x.jsonl, seed 3, log to wandb project ft"
    brief = brief_from_request(request_fields(text, list_models()))
    assert (brief.seed, brief.wandb_project, brief.data_path) == (3, "ft", "/data/x.jsonl")


def test_a_lora_alpha_is_read_for_lora_only() -> None:
    lora = "LoRA fine-tune qwen2.5-14b on a single A100 80GB, rank 16, alpha 32"
    assert brief_from_request(request_fields(lora, list_models())).lora_alpha == 32.0
    assert [r.quote for r in run_reads("lora_alpha=16, r=8") if r.field == "lora_alpha"] == [
        "lora_alpha=16"
    ]
    full = "fine-tune llama-3-8b on 8 H100 with alpha 32"
    assert "lora_alpha" not in request_fields(full, list_models())
