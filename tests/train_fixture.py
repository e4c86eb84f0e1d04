"""A tiny Llama-style model saved to disk with its tokenizer, and a small JSONL dataset.

The "pretrained" checkpoint of the train.py job tests: random weights, but saved and loaded
exactly as a real one (safetensors, config.json, tokenizer.json), and text whose sentences
repeat a small grammar, so a few steps of fine-tuning lower the loss. Built offline: the
tokenizer is trained here (a byte-level BPE) rather than downloaded.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

_SUBJECTS = ("the cat", "a dog", "the model", "my GPU", "the cluster", "a rank")
_VERBS = ("trains", "sleeps", "shards", "waits", "learns", "saves")
_OBJECTS = ("on the mat", "all night", "the weights", "a checkpoint", "with ZeRO", "in bf16")
SENTENCES = 400
PER_RECORD = 4


def sentences(seed: int = 0) -> list[str]:
    """Sentences of subject, verb and object drawn from small sets."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."
        for _ in range(SENTENCES)
    ]


def write_dataset(path: Path) -> Path:
    """``path`` as JSON lines of ``{"text": ...}``, four sentences a record."""
    lines = sentences()
    with open(path, "w") as fh:
        for i in range(0, len(lines), PER_RECORD):
            fh.write(json.dumps({"text": " ".join(lines[i : i + PER_RECORD])}) + "\n")
    return path


def save_model(folder: Path, *, layers: int = 2, hidden: int = 64) -> Path:
    """A random-init Llama (grouped-query attention, gated MLP) and its tokenizer in ``folder``."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(sentences(), trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder
