"""The global batch when the request gives none: tokens per step for the model's size.

The rule (``default_global_batch``):

- **pretraining** takes the tokens per optimizer step that published runs of that size used:
  GPT-3 (Brown et al. 2020, Table 2.1) 0.5M tokens up to 760M parameters, 1M at 1.3B-2.7B,
  2M at 6.7B-13B, 3.2M at 175B; Llama 2 (Touvron et al. 2023, sec. 2.2) 4M tokens at 7B-70B;
  so 0.5M below 1B, 1M below 5B, 2M below 20B, 4M from 20B;
- **fine-tuning and LoRA** take 64K tokens per step: Alpaca's 128 sequences of 512 (Taori et
  al. 2023) and about a quarter of Llama 2's SFT step (64 x 4096, sec. 3.1), i.e. 32 sequences
  of 2048, the default this project used before;
- **inference** plans take one sequence per GPU.

Tokens become sequences at the brief's ``seq_len`` (a power of two, at least 1), then the count
is raised to a multiple of the world size (nodes x GPUs). The world size is a multiple of the
data-parallel degree of every layout the search may choose (data = world / (tensor x
pipeline)), so the default is valid whatever tensor/pipeline split wins, with micro-batch 1 at
the least. A user's own value is never changed; the search checks it and names it.
"""

from __future__ import annotations

from tools.core.schemas import HardwareSpec, ModelSpec, TrainingBrief

# (parameters below, tokens per step): pretraining, GPT-3 Table 2.1 and Llama 2 (see above).
PRETRAIN_TOKENS = ((1e9, 524_288), (5e9, 1_048_576), (20e9, 2_097_152), (float("inf"), 4_194_304))
FINETUNE_TOKENS = 65_536


def _scale(params: float) -> str:
    return f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"


def default_global_batch(model: ModelSpec, hardware: HardwareSpec, brief: TrainingBrief) -> int:
    """Sequences per optimizer step by the rule in the module docstring."""
    world = hardware.world_size
    if brief.task == "inference":
        return world
    if brief.task == "pretrain":
        tokens = next(t for limit, t in PRETRAIN_TOKENS if model.params < limit)
    else:
        tokens = FINETUNE_TOKENS
    sequences = max(1, tokens // max(1, brief.seq_len))
    sequences = 1 << (sequences.bit_length() - 1)  # the power of two at or below
    return -(-sequences // world) * world


def resolve_batch(
    brief: TrainingBrief, model: ModelSpec, hardware: HardwareSpec
) -> tuple[TrainingBrief, str | None]:
    """The brief with its global batch filled in when it had none, and the note saying why."""
    if brief.global_batch_size is not None:
        return brief, None
    batch = default_global_batch(model, hardware, brief)
    what = {
        "pretrain": "pretraining tokens per step for the model size, after GPT-3 Table 2.1 "
        "and Llama 2",
        "inference": "one sequence per GPU",
    }.get(brief.task, "64K tokens per step for fine-tuning, after Alpaca and Llama 2 SFT")
    world = hardware.world_size
    note = (
        f"global batch {batch}: default for a {_scale(model.params)} model at seq {brief.seq_len} "
        f"({what}; rounded to a multiple of the {world} GPUs, which every data-parallel degree "
        "divides), "
        "not given in the request; set global_batch_size to change it"
    )
    return brief.model_copy(update={"global_batch_size": batch}), note


def resolve_steps(brief: TrainingBrief) -> tuple[TrainingBrief, str | None]:
    """The brief with the tokens its ``train_steps`` train (steps x global batch x seq_len).

    The run's length is then the tokens, as when the request gives them, so the launch's
    steps, the schedule and the time to train all follow it; the note says so, and the steps
    field is cleared (a brief states one of the two).
    """
    if brief.train_steps is None or brief.dataset_tokens is not None:
        return brief, None
    tokens = brief.train_steps * brief.batch * brief.seq_len
    note = (
        f"dataset_tokens {tokens:,}: the request's {brief.train_steps} optimizer steps x "
        f"{brief.batch} sequences x {brief.seq_len} tokens"
    )
    # The tokens carry the length from here on (a brief states one of the two).
    return brief.model_copy(update={"dataset_tokens": float(tokens), "train_steps": None}), note
