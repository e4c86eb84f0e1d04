"""Train one planned setup: the real job on the user's model and data, or its smoke test.

Standalone on purpose, and so one file (longer than our other modules): it imports torch,
transformers, deepspeed and peft (LoRA only) and the standard library, so it can be copied to
any GPU box; ``datasets`` (a dataset folder saved with ``save_to_disk``), TensorBoard and W&B are
imported only when asked for. Three modes:

- DeepSpeed, when ``--deepspeed_config`` is given; start it with the DeepSpeed launcher:
  ``deepspeed --num_gpus 8 train.py --deepspeed_config ds_config.json --init pretrained
  --model-path /models/llama-3-8b --data data/train.jsonl --checkpoint-dir checkpoints``.
  The optimizer, precision, ZeRO stage, learning-rate schedule, gradient clipping and
  accumulation come from the config. Under ZeRO-3 the model is built or loaded already
  partitioned (``deepspeed.zero.Init`` through transformers' DeepSpeed integration), so no rank
  ever holds the whole model.
- FSDP, with ``--fsdp``; start it with torchrun. FSDP2 (``fully_shard``) wraps every decoder
  layer and then the model; the model is built on the meta device, sharded, and filled from rank
  0, which alone loads the weights (or draws the random init) on CPU and broadcasts each shard
  (``set_model_state_dict(..., broadcast_from_rank0=True)``, as Accelerate's
  ``cpu_ram_efficient_loading`` does). ``--bf16`` computes in bf16 over fp32 shards.
- Plain PyTorch DDP otherwise; start it with torchrun (``--bf16``/``--fp16`` autocast). Run as a
  single process without torchrun's environment, it trains without DDP. DeepSpeed need not be
  installed for the FSDP and DDP modes.

Model: ``--init random`` (the default) builds from ``--model-config`` (a Hugging Face
config.json); ``--init pretrained --model-path PATH`` loads a local folder or a hub id with
``from_pretrained`` in the run's dtype (the hub needs the network on the training machine).
``--lora-rank R`` trains LoRA adapters only (peft; ``--lora-targets all-linear`` by default:
every linear projection of every layer) with the base frozen; ``--qlora`` also loads the base
in 4-bit NF4 (bitsandbytes, CUDA only).

Data: ``--data PATH`` is a JSON-lines file (``--text-field``, default ``text``), a text file, a
folder of them, or a ``datasets`` folder saved with ``save_to_disk``. It is tokenized with
``--tokenizer`` (default: ``--model-path``), documents joined with the EOS token and packed into
``--seq-len`` blocks, shuffled with ``--seed`` each epoch and dealt to the data-parallel ranks in
turn. Every rank reads and checks it before the model is built: an empty, unreadable or
non-UTF-8 file or a line that is not JSON stops every rank with one line naming the file (exit
2). A long document is tokenized in pieces of at most 64 Ki characters, never whole. Without
``--data`` the run draws synthetic repeated-pattern sequences (the smoke test).

A step is one optimizer step (the config's gradient accumulation, or ``--grad-accum``, of
``--micro-batch`` sequences per rank each). ``--checkpoint-dir DIR --save-every N`` saves every N
steps (DeepSpeed's own checkpoint format in DeepSpeed mode, ``torch.distributed.checkpoint``
otherwise) into ``DIR/stepN``; once every rank has saved, ``stepN/manifest.json`` (each file's
size and SHA-256) marks it complete and ``latest`` names it. Of the checkpoints this job saved
(``DIR/saved.json``) the newest ``--keep-checkpoints`` are kept; nothing else in ``DIR`` is
deleted but the job's own unfinished saves, and a complete checkpoint in the way of a save is
moved aside (``stepN.replaced``). A run started again with the same directory resumes, data
position and schedule included, from the checkpoint ``latest`` names when it verifies and
loads, else from the newest one that does, saying so; a checkpoint whose files do not match its
manifest is never loaded. Rank 0 holds ``DIR/job.lock`` for the whole run: a second job on the
directory is refused (exit 2) naming the holder, and a lock whose holder died is taken over.
Each rank ends when the process that started it is gone (its launcher, or ``launch.sh`` through
``$TRAINWRIGHT_JOB_PID``), even after SIGKILL. With a checkpoint directory, SIGTERM (SLURM's
preemption signal) ends the run after the current step with a final checkpoint and exit code 0
(within the launcher's grace period: 30 s). Without DeepSpeed the schedule is
``--lr-schedule constant|linear|cosine`` with ``--warmup-steps``. Rank 0 prints loss, learning
rate, tokens/s and memory every ``--log-every`` steps and appends the same to
``metrics-dir/metrics.jsonl`` (and to TensorBoard with ``--tensorboard DIR``, W&B with
``--wandb PROJECT``).

``--inject oom|nan|hang|crash|alloc`` (with ``--inject-step N``) makes the run fail for real at step N,
to test whatever supervises it: ``oom`` caps the memory just above what the process holds (an
address-space limit on CPU, ``torch.cuda.set_per_process_memory_fraction`` on GPU) and gives
that step a 16x batch; ``nan`` turns the input embeddings' output into NaN; ``hang`` makes rank
0 sleep inside the step, so every other rank blocks in its next collective; ``crash`` raises on
the last rank; ``alloc`` makes rank 0 allocate (and touch) memory steadily until something
stops it, for the supervisor's memory cap to catch.

Each rank writes ``metrics-dir/rank{R}.json`` (losses, step times, tokens, peak memory);
rank 0 prints one progress line per logged step. On a machine without CUDA the ranks run on CPU
over gloo, in fp32.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import hashlib
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers

# Token patterns are drawn from a small alphabet, so even a tiny random-init model sees a
# large, quick drop from ln(vocab): first by learning which tokens occur at all, then by
# copying the repeated pattern (an induction-style task).
_ALPHABET_SIZE = 16
_NUM_PATTERNS = 8
_PATTERN_LEN = (3, 6)
_METRICS_EVERY = 5
# The DDP mode's default learning rate: the constant rate the smoke runner gives DeepSpeed
# (tools/smoke/ds_adapt.py SMOKE_LR), large enough for a random-init tiny model to learn in ~30 steps.
DEFAULT_LR = 3e-3
# torchrun (and any env:// launcher) sets these for every rank.
_DIST_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
INJECT_KINDS = ("oom", "nan", "hang", "crash", "alloc")
# The oom injection: bytes left above what the process holds, and the batch multiplier.
_OOM_MARGIN_BYTES = 1 << 20
_OOM_BATCH_FACTOR = 16
# The alloc injection: a block of this size every interval (~1 GiB/s), written so it is resident.
_ALLOC_BLOCK_BYTES = 64 << 20
_ALLOC_INTERVAL_S = 0.05
# Checkpoints: one folder per saved step (exactly ``stepN``: the only names the job resumes from
# or removes); in it, once every rank has saved, a manifest of its files (sizes, SHA-256) that
# marks it complete; then ``latest`` names it. ``saved.json`` records the folders this job
# saved (the only ones rotation deletes); ``job.lock`` keeps a second job out of the folder.
_STEP_DIR = "step{step}"
_STEP_NAME = re.compile(r"step([0-9]+)")
LATEST = "latest"
MANIFEST = "manifest.json"
RECORD = "saved.json"
LOCK = "job.lock"
_TRAINER_STATE = "trainer_state.json"
_HASH_BLOCK_BYTES = 1 << 20
_DATA_SUFFIXES = (".jsonl", ".json", ".txt")
# Text is handed to the tokenizer in pieces of at most this many characters (cut at a space
# where there is one): a 200 MB line tokenized whole takes many GB in a fast tokenizer.
_PIECE_CHARS = 1 << 16
# Documents (or pieces of one long document) per tokenizer call.
_ENCODE_BATCH = 256
_PIECES_PER_CALL = 16
INIT_KINDS = ("random", "pretrained")
SCHEDULES = ("constant", "linear", "cosine")
FSDP_SHARDING = ("full", "grad-op", "hybrid")
# Exit code of a bad argument or input, as argparse uses.
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad argument or input: one line, exit code 2.

    ``shown`` False: another rank prints the line (every rank stops, one says why).
    """

    def __init__(self, message: str, *, shown: bool = True) -> None:
        super().__init__(message)
        self.shown = shown


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (the DeepSpeed launcher adds ``--local_rank``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model-config", type=Path, default=None, help="HF config.json (for --init random)"
    )
    model.add_argument(
        "--init",
        choices=INIT_KINDS,
        default=None,
        help="random weights, or --model-path's (default: pretrained with --model-path, else random)",
    )
    model.add_argument(
        "--model-path", default=None, help="a local model folder or a hub id (--init pretrained)"
    )
    model.add_argument(
        "--attn-implementation",
        default=None,
        help="transformers attention kernel: eager, sdpa, ... (default: transformers' choice)",
    )
    model.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute each layer in backward (DeepSpeed mode: on when the config has "
        "activation_checkpointing)",
    )
    lora = parser.add_argument_group("LoRA (peft)")
    lora.add_argument("--lora-rank", type=int, default=0, help="train rank-R adapters only")
    lora.add_argument(
        "--lora-alpha", type=float, default=None, help="LoRA alpha (default 2 x rank)"
    )
    lora.add_argument("--lora-dropout", type=float, default=0.0, help="LoRA dropout")
    lora.add_argument(
        "--lora-targets",
        default="all-linear",
        help="comma-separated module names, or all-linear (every projection, not the output head)",
    )
    lora.add_argument(
        "--qlora", action="store_true", help="load the base in 4-bit NF4 (CUDA + bitsandbytes)"
    )
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data", type=Path, default=None, help=".jsonl/.txt file or folder, or a datasets folder"
    )
    data.add_argument("--text-field", default="text", help="the JSON field holding the text")
    data.add_argument(
        "--tokenizer", default=None, help="tokenizer folder or hub id (default: --model-path)"
    )
    parser.add_argument(
        "--deepspeed_config",
        type=Path,
        default=None,
        help="ds_config.json; without it the run is FSDP (--fsdp) or plain PyTorch DDP",
    )
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) under torchrun")
    parser.add_argument(
        "--fsdp-sharding",
        choices=FSDP_SHARDING,
        default="full",
        help="full: reshard after forward (ZeRO-3-like); grad-op: keep parameters gathered "
        "until backward (ZeRO-2-like); hybrid: shard within a node, replicate across nodes",
    )
    parser.add_argument(
        "--fsdp-offload", action="store_true", help="keep shards on the CPU, step there"
    )
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per rank per step")
    parser.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="micro-batches per optimizer step (FSDP/DDP; DeepSpeed: the config's)",
    )
    parser.add_argument("--metrics-dir", required=True, type=Path, help="where rank{R}.json go")
    parser.add_argument("--seed", type=int, default=1234, help="seed for model init and data")
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"peak learning rate (DDP/FSDP default {DEFAULT_LR:g}; DeepSpeed: the config's)",
    )
    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument("--checkpoint-dir", type=Path, default=None, help="save and resume here")
    ckpt.add_argument(
        "--save-every", type=int, default=0, help="save every N steps (0: at the end only)"
    )
    ckpt.add_argument("--keep-checkpoints", type=int, default=2, help="newest checkpoints kept")
    log = parser.add_argument_group("logging")
    log.add_argument("--log-every", type=int, default=1, help="print and record every N steps")
    log.add_argument("--tensorboard", type=Path, default=None, help="also log to TensorBoard here")
    log.add_argument("--wandb", default=None, help="also log to this W&B project")
    parser.add_argument(
        "--inject", choices=INJECT_KINDS, default=None, help="fail for real at --inject-step"
    )
    parser.add_argument("--inject-step", type=int, default=3, help="step of the injected fault")
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="also write each rank's output to rank{R}.log"
    )
    ddp = parser.add_argument_group("FSDP and DDP modes (ignored with --deepspeed_config)")
    ddp.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    ddp.add_argument(
        "--max-grad-norm", type=float, default=1.0, help="gradient clipping norm (0: off)"
    )
    ddp.add_argument("--lr-schedule", choices=SCHEDULES, default="constant", help="after warm-up")
    ddp.add_argument("--warmup-steps", type=int, default=0, help="linear warm-up steps")
    half = ddp.add_mutually_exclusive_group()
    half.add_argument(
        "--bf16", action="store_true", help="bf16 compute on CUDA (fp16 where unsupported)"
    )
    half.add_argument("--fp16", action="store_true", help="fp16 autocast with loss scaling on CUDA")
    parser.add_argument(
        "--local_rank", "--local-rank", type=int, default=None, help="set by the launcher"
    )
    args = parser.parse_args(argv)
    if args.init is None:
        args.init = "pretrained" if args.model_path else "random"
    problem = _argument_problem(args)
    if problem:
        parser.error(problem)
    return args


def _argument_problem(args: argparse.Namespace) -> str | None:
    """The first inconsistent argument, as one line, or None."""
    if args.init == "pretrained" and not args.model_path:
        return "--init pretrained needs --model-path (a local model folder or a hub id)"
    if args.init == "random" and args.model_config is None and not args.model_path:
        return "--init random needs --model-config (or --model-path for its config.json)"
    if args.fsdp and args.deepspeed_config is not None:
        return "--fsdp and --deepspeed_config are two different modes; give one"
    if args.qlora and not args.lora_rank:
        return "--qlora needs --lora-rank"
    if args.qlora and args.init != "pretrained":
        return "--qlora quantizes pretrained weights: give --model-path"
    for name in ("steps", "seq_len", "micro_batch", "grad_accum", "log_every", "keep_checkpoints"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    if args.save_every < 0 or args.lora_rank < 0 or args.warmup_steps < 0:
        return "--save-every, --lora-rank and --warmup-steps cannot be negative"
    if args.save_every and args.checkpoint_dir is None:
        return "--save-every needs --checkpoint-dir"
    if args.data is not None and args.tokenizer is None and not args.model_path:
        return "--data needs a tokenizer: --tokenizer, or --model-path with one"
    return None


def model_config_dict(args: argparse.Namespace) -> dict[str, Any]:
    """The model's config.json: ``--model-config``, else the one ``--model-path`` holds."""
    if args.model_config is not None:
        return dict(json.loads(args.model_config.read_text()))
    config = transformers.AutoConfig.from_pretrained(args.model_path)
    return dict(config.to_dict())


def build_model(
    config_dict: dict[str, Any],
    attn_implementation: str | None = None,
    dtype: torch.dtype | None = None,
) -> transformers.PreTrainedModel:
    """Build a random-init causal LM from a Hugging Face config dict (no download).

    Under an active ``HfDeepSpeedConfig`` with ZeRO-3 (``zero3_context``) transformers builds it
    inside ``deepspeed.zero.Init``: each parameter is partitioned as it is created.
    """
    cfg = dict(config_dict)
    model_type = cfg.pop("model_type")
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype"):
        cfg.pop(key, None)
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    kwargs: dict[str, Any] = {}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if dtype is not None:
        kwargs["dtype"] = dtype
    return transformers.AutoModelForCausalLM.from_config(config, **kwargs)


def load_model(
    args: argparse.Namespace,
    config_dict: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device | None,
) -> transformers.PreTrainedModel:
    """The model the run trains: random init or ``--model-path``'s weights, in ``dtype``.

    ``device`` is where the weights are created (None: where transformers puts them, which
    under ZeRO-3 is the partitioned home DeepSpeed picks).
    """
    where = torch.device(device) if device is not None else contextlib.nullcontext()
    if args.init == "random":
        with where:
            return build_model(config_dict, args.attn_implementation, dtype)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if args.attn_implementation:
        kwargs["attn_implementation"] = args.attn_implementation
    if args.qlora:
        kwargs["quantization_config"] = qlora_config(dtype)
        # bitsandbytes quantizes as it loads, on this rank's GPU (ZeRO-3 leaves quantized
        # models whole: transformers skips zero.Init for them).
        kwargs["device_map"] = {"": device if device is not None else torch.cuda.current_device()}
        return transformers.AutoModelForCausalLM.from_pretrained(args.model_path, **kwargs)
    with where:
        return transformers.AutoModelForCausalLM.from_pretrained(args.model_path, **kwargs)


def qlora_config(compute_dtype: torch.dtype) -> Any:
    """4-bit NF4 with double quantization (Dettmers et al. 2023), bitsandbytes on CUDA only."""
    if not torch.cuda.is_available():
        raise UsageError(
            "--qlora needs a CUDA GPU (bitsandbytes' 4-bit kernels); this machine has none"
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise UsageError("--qlora needs bitsandbytes: pip install bitsandbytes") from exc
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
        # Stored as the compute dtype, so ZeRO-3 and FSDP can shard the packed weights.
        bnb_4bit_quant_storage=compute_dtype,
    )


def add_lora(args: argparse.Namespace, model: torch.nn.Module) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (``--lora-rank``); the base is frozen. No-op without."""
    if not args.lora_rank:
        return model
    try:
        import peft
    except ImportError as exc:
        raise UsageError("--lora-rank needs peft: pip install peft") from exc
    if args.qlora:
        model = peft.prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=args.gradient_checkpointing
        )
    targets: str | list[str] = args.lora_targets
    if args.lora_targets != "all-linear":
        targets = [name.strip() for name in args.lora_targets.split(",") if name.strip()]
    config = peft.LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha if args.lora_alpha is not None else 2 * args.lora_rank,
        lora_dropout=args.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)


def trainable_params(model: torch.nn.Module) -> int:
    """Parameters the optimizer updates (ZeRO-3 partitions report their full size)."""
    return sum(_numel(p) for p in model.parameters() if p.requires_grad)


def total_params(model: torch.nn.Module) -> int:
    """Every parameter, at its full size also where ZeRO-3 or FSDP shards it."""
    return sum(_numel(p) for p in model.parameters())


def local_param_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters this rank holds: its ZeRO-3 partition or FSDP shard, else all of it."""
    total = 0
    for param in model.parameters():
        local: Any = getattr(param, "ds_tensor", None)  # a ZeRO-3 partition
        if local is None:
            to_local = getattr(param, "to_local", None)  # an FSDP2 DTensor shard
            local = to_local() if callable(to_local) else param
        total += int(local.numel()) * int(local.element_size())
    return total


def _numel(param: torch.nn.Parameter) -> int:
    ds_numel = getattr(param, "ds_numel", None)  # a ZeRO-3 partition's full size
    if isinstance(ds_numel, int):
        return ds_numel
    return int(param.numel())  # a DTensor (FSDP2) reports its global size


# ---- the user's data: tokenized, packed into blocks, dealt to the data-parallel ranks ----------


def read_texts(path: Path, text_field: str) -> list[str]:
    """Every document under ``path``: JSON lines, text files, or a saved ``datasets`` folder.

    A problem (no such file, not UTF-8, a line that is not JSON, nothing in it) is a UsageError
    naming the file (and line).
    """
    if not path.exists():
        raise UsageError(f"--data {path}: no such file or folder")
    if path.is_dir() and (path / "state.json").exists() and (path / "dataset_info.json").exists():
        texts = _dataset_texts(path, text_field)
    else:
        files = (
            sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _DATA_SUFFIXES)
            if path.is_dir()
            else [path]
        )
        if not files:
            raise UsageError(f"--data {path}: no {'/'.join(_DATA_SUFFIXES)} files in it")
        texts = []
        for file in files:
            if file.suffix in (".jsonl", ".json"):
                texts += _json_lines(file, text_field)
            else:
                texts.append(_decoded(_read_bytes(file), f"--data {file}"))
    texts = [text for text in texts if text]
    if not texts:
        raise UsageError(f"--data {path}: no text in it (empty, or every {text_field!r} is empty)")
    return texts


def _dataset_texts(path: Path, text_field: str) -> list[str]:
    try:
        import datasets
    except ImportError as exc:
        raise UsageError(f"--data {path} is a datasets folder: pip install datasets") from exc
    table = datasets.load_from_disk(str(path))
    if isinstance(table, datasets.DatasetDict):
        table = table["train"] if "train" in table else next(iter(table.values()))
    if text_field not in table.column_names:
        raise UsageError(
            f"--data {path}: no column {text_field!r} (columns {table.column_names}); "
            "set --text-field"
        )
    return [str(text) for text in table[text_field]]


def _read_bytes(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as exc:
        raise UsageError(f"--data {file}: cannot read it ({exc.strerror or exc})") from exc


def _decoded(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8 text, or a UsageError saying where it is not."""
    if b"\0" in raw:
        raise UsageError(f"{where}: binary data (a NUL byte at byte {raw.index(0) + 1}), not text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1}); "
            "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from exc


def _json_lines(file: Path, text_field: str) -> list[str]:
    texts = []
    try:
        with open(file, "rb") as fh:
            # Lines end at \n only: JSON strings may hold U+2028 and other line separators.
            for number, raw in enumerate(fh, start=1):
                if number == 1:
                    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
                line = _decoded(raw, f"--data {file}:{number}")
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise UsageError(f"--data {file}:{number}: not JSON ({exc.msg})") from exc
                if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                    raise UsageError(
                        f"--data {file}:{number}: no string field {text_field!r}; set --text-field"
                    )
                texts.append(record[text_field])
    except OSError as exc:
        raise UsageError(f"--data {file}: cannot read it ({exc.strerror or exc})") from exc
    return texts


def split_text(text: str, limit: int = _PIECE_CHARS) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters.

    Each piece ends before a space or newline in its second half where there is one, so a
    word is rarely cut.
    """
    pieces = []
    start = 0
    while len(text) - start > limit:
        end = start + limit
        cut = max(
            text.rfind(" ", start + limit // 2, end), text.rfind("\n", start + limit // 2, end)
        )
        if cut > start:
            end = cut
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces


def special_ends(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text (BOS, ...)."""
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return full[:i], full[i + len(plain) :]
    return [], []


def encode_texts(tokenizer: Any, texts: Iterable[str]) -> Iterator[list[int] | array.array]:
    """Each document's token ids, special tokens included, in order.

    A document longer than ``_PIECE_CHARS`` characters is tokenized in pieces (``split_text``)
    and its ids joined between the tokenizer's special tokens: the tokenizer never sees more
    than ``_PIECE_CHARS`` characters of one text at once.
    """
    prefix, suffix = special_ends(tokenizer)
    batch: list[str] = []
    for text in texts:
        if len(text) <= _PIECE_CHARS:
            batch.append(text)
            if len(batch) == _ENCODE_BATCH:
                yield from tokenizer(batch, add_special_tokens=True)["input_ids"]
                batch = []
            continue
        if batch:
            yield from tokenizer(batch, add_special_tokens=True)["input_ids"]
            batch = []
        ids = array.array("q", prefix)
        pieces = split_text(text)
        for first in range(0, len(pieces), _PIECES_PER_CALL):
            chunk = pieces[first : first + _PIECES_PER_CALL]
            for piece_ids in tokenizer(chunk, add_special_tokens=False)["input_ids"]:
                ids.extend(piece_ids)
        ids.extend(suffix)
        yield ids
    if batch:
        yield from tokenizer(batch, add_special_tokens=True)["input_ids"]


def pack_tokens(
    token_lists: Iterable[list[int] | array.array], eos: int | None, seq_len: int
) -> torch.Tensor:
    """Join the documents (EOS after each) and cut the stream into ``[blocks, seq_len]``.

    The tail shorter than a block is dropped, as packed pretraining and fine-tuning recipes do.
    The stream is kept as 8-byte integers, not a list of Python ints (a tenth of the memory).
    """
    stream = array.array("q")
    for ids in token_lists:
        stream.extend(ids)
        if eos is not None:
            stream.append(eos)
    blocks = len(stream) // seq_len
    if blocks == 0:
        return torch.empty((0, seq_len), dtype=torch.long)
    flat = torch.frombuffer(stream, dtype=torch.long, count=blocks * seq_len)
    return flat.clone().view(blocks, seq_len)


class TokenData:
    """Packed blocks of the user's data, shuffled each epoch and dealt round-robin to the ranks.

    Which blocks micro-batch ``i`` of a rank holds depends only on (seed, i, rank), so a resumed
    run continues with the batches the stopped one would have drawn next.
    """

    def __init__(self, blocks: torch.Tensor, batch: int, seed: int, rank: int, ranks: int) -> None:
        per_rank = blocks.shape[0] // ranks
        if per_rank < batch:
            raise UsageError(
                f"--data gives {blocks.shape[0]} blocks of {blocks.shape[1]} tokens: fewer than "
                f"{batch} per data-parallel rank ({ranks} ranks); add data or lower --seq-len"
            )
        self.blocks = blocks
        self.batch = batch
        self.seed = seed
        self.rank = rank
        self.ranks = ranks
        self.per_rank = per_rank
        self.position = 0  # micro-batches drawn so far

    def skip(self, batches: int) -> None:
        """Continue after ``batches`` micro-batches (a resumed run)."""
        self.position += batches

    def batches_per_epoch(self) -> int:
        """Micro-batches a rank draws before the data repeats (in a new order)."""
        return self.per_rank // self.batch

    def next(self) -> torch.Tensor:
        """Return the next ``[batch, seq_len]`` LongTensor of this rank's shard."""
        epoch, index = divmod(self.position, self.batches_per_epoch())
        order = torch.randperm(
            self.blocks.shape[0], generator=torch.Generator().manual_seed(self.seed + epoch)
        )
        mine = order[self.rank :: self.ranks][: self.per_rank]
        self.position += 1
        return self.blocks[mine[index * self.batch : (index + 1) * self.batch]]


def load_token_data(args: argparse.Namespace, rank: int, ranks: int) -> tuple[TokenData, int]:
    """The user's dataset for this rank, and how many tokens it holds in all."""
    name = args.tokenizer or args.model_path
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--tokenizer {name}: cannot load a tokenizer ({exc})") from exc
    texts = read_texts(args.data, args.text_field)
    blocks = pack_tokens(encode_texts(tokenizer, texts), tokenizer.eos_token_id, args.seq_len)
    if blocks.shape[0] // ranks < args.micro_batch:
        raise UsageError(
            f"--data {args.data}: {blocks.shape[0]} blocks of {args.seq_len} tokens, fewer than "
            f"{args.micro_batch} per data-parallel rank ({ranks} ranks); add data or lower --seq-len"
        )
    return TokenData(blocks, args.micro_batch, args.seed, rank, ranks), int(blocks.numel())


class PatternData:
    """Endless batches of sequences that repeat a short token pattern."""

    def __init__(self, vocab_size: int, seq_len: int, batch: int, seed: int, rank: int) -> None:
        # Patterns are shared by all ranks (same seed); the draws differ per rank, as data
        # parallelism would shard a real dataset.
        shared = torch.Generator().manual_seed(seed)
        alphabet_size = min(_ALPHABET_SIZE, vocab_size)
        alphabet = torch.randperm(vocab_size, generator=shared)[:alphabet_size]
        self.patterns: list[torch.Tensor] = []
        for _ in range(_NUM_PATTERNS):
            length = int(
                torch.randint(_PATTERN_LEN[0], _PATTERN_LEN[1] + 1, (1,), generator=shared)
            )
            idx = torch.randint(0, alphabet_size, (length,), generator=shared)
            self.patterns.append(alphabet[idx])
        self.gen = torch.Generator().manual_seed(seed * 1000 + 17 + rank)
        self.seq_len = seq_len
        self.batch = batch
        self.position = 0  # batches drawn so far

    def skip(self, batches: int) -> None:
        """Draw and drop ``batches`` batches (a resumed run continues the same stream)."""
        for _ in range(batches):
            self.next()

    def next(self) -> torch.Tensor:
        """Return one ``[batch, seq_len]`` LongTensor."""
        self.position += 1
        rows = []
        for _ in range(self.batch):
            pattern = self.patterns[
                int(torch.randint(0, len(self.patterns), (1,), generator=self.gen))
            ]
            reps = self.seq_len // len(pattern) + 2
            offset = int(torch.randint(0, len(pattern), (1,), generator=self.gen))
            rows.append(pattern.repeat(reps)[offset : offset + self.seq_len])
        return torch.stack(rows)


class CpuPeak:
    """The peak of this process's anonymous resident memory (heap), sampled during training.

    On CPU a rank's tensors live in anonymous memory (``RssAnon`` in /proc/self/status), while
    the libraries' code pages that the first steps touch show up in file-backed RSS; the
    kernel's own high-water mark (``VmHWM``) mixes both. Samples are taken after each forward,
    backward and optimizer step, where parameters, gradients, optimizer states and activations
    peak together. 0 where /proc is unavailable.
    """

    peak = 0
    enabled = False

    @classmethod
    def sample(cls) -> int:
        """Read RssAnon now and keep the maximum."""
        now = anon_rss_bytes()
        cls.peak = max(cls.peak, now)
        return now


def anon_rss_bytes() -> int:
    """This process's anonymous resident memory (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cpu_baseline_bytes(model_config: dict[str, Any]) -> int:
    """Anonymous memory before the model exists, with the model's code already imported.

    Building the model once on the meta device imports its modeling code (for a small model
    that import holds more memory than the weights), so the baseline leaves it out.
    """
    with torch.device("meta"):
        build_model(model_config)
    CpuPeak.peak = 0
    CpuPeak.enabled = True
    return anon_rss_bytes()


def sample() -> None:
    """Sample the CPU memory peak (a no-op on GPU, where torch tracks the peak itself)."""
    if CpuPeak.enabled:
        CpuPeak.sample()


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory on CUDA, else this process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if CpuPeak.peak:
        return CpuPeak.peak
    # ru_maxrss is in KiB on Linux (bytes on macOS, where this over-reports harmlessly large).
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def process_gpu_memory_bytes(device: torch.device) -> int | None:
    """This process's memory on its GPU as the driver sees it (NVML), or None where unavailable.

    It includes the CUDA context and the caching allocator's reserved blocks, which
    ``max_memory_allocated`` leaves out. NVML comes with nvidia-ml-py (a DeepSpeed dependency);
    without it, or where the driver does not report per-process use, this returns None.
    """
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            handle = None
            for i in range(pynvml.nvmlDeviceGetCount()):
                candidate = pynvml.nvmlDeviceGetHandleByIndex(i)
                found = pynvml.nvmlDeviceGetUUID(candidate)
                found = found.decode() if isinstance(found, bytes) else str(found)
                if found.replace("GPU-", "") == uuid.replace("GPU-", ""):
                    handle = candidate
                    break
            if handle is None:
                return None
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory:
                    return int(proc.usedGpuMemory)
            return None
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML is an extra reading: any failure just means "not measured"
        return None


class FaultInjector:
    """Make the run fail for real at one step (``--inject``), to test what supervises it."""

    def __init__(self, kind: str | None, step: int, rank: int, world_size: int) -> None:
        self.kind = kind
        self.step = step
        self.rank = rank
        self.world_size = world_size
        self._cpu_limit: tuple[int, int] | None = None

    def batch(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        """The batch for ``step``: 16 copies of it at the oom step."""
        if self.kind == "oom" and step == self.step:
            return batch.repeat(_OOM_BATCH_FACTOR, 1)
        return batch

    def before_step(self, step: int, model: torch.nn.Module, device: torch.device) -> None:
        """Arm the fault due at ``step``."""
        if self.kind is None or step != self.step:
            return
        print(f"[inject] {self.kind} at step {step} on rank {self.rank}", flush=True)
        if self.kind == "crash" and self.rank == self.world_size - 1:
            raise RuntimeError(f"injected crash on rank {self.rank} at step {step}")
        if self.kind == "hang" and self.rank == 0:
            # The other ranks block in their next collective; only a supervisor's kill ends this.
            time.sleep(10**7)
        if self.kind == "alloc" and self.rank == 0:
            # A leak: memory grows until a cap (or the address-space limit) stops the run.
            held: list[bytearray] = []
            while True:
                held.append(bytearray(b"\x01") * _ALLOC_BLOCK_BYTES)
                time.sleep(_ALLOC_INTERVAL_S)
        if self.kind == "nan":
            embeddings: torch.nn.Module = model.get_input_embeddings()  # type: ignore[operator]
            embeddings.register_forward_hook(lambda _m, _i, out: out * float("nan"))
        if self.kind == "oom":
            self._cap_memory(device)

    def _cap_memory(self, device: torch.device) -> None:
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            held = torch.cuda.memory_reserved(device) + _OOM_MARGIN_BYTES
            torch.cuda.set_per_process_memory_fraction(min(1.0, held / total), device)
            return
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as fh:
            vm_bytes = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = vm_bytes + _OOM_MARGIN_BYTES
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)  # under a supervisor's address-space limit
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        self._cpu_limit = (soft, hard)

    def release(self) -> None:
        """Lift the CPU cap again (so the error's traceback can still be printed)."""
        if self._cpu_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, self._cpu_limit)
            self._cpu_limit = None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` so that a reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def adapt_precision(ds_config: dict[str, Any], on_cuda: bool) -> dict[str, Any]:
    """Drop half precision where the device cannot train in it (fp32 on CPU)."""
    cfg = dict(ds_config)
    if not on_cuda:
        for key in ("bf16", "fp16"):
            cfg.pop(key, None)
    elif cfg.get("bf16", {}).get("enabled") and not torch.cuda.is_bf16_supported():
        # Pre-Ampere GPUs have no bf16 math; fp16 with loss scaling is the usual fallback.
        cfg.pop("bf16")
        cfg["fp16"] = {"enabled": True}
    return cfg


def skip_shm_comm_build() -> bool:
    """Stop DeepSpeed JIT-building its CPU shared-memory all-reduce op (training never uses it)."""
    # On the CPU accelerator, deepspeed.comm's TorchBackend builds the "deepspeed_shm_comm" op
    # (gcc + ninja, ~30-60 s the first time, cached under TORCH_EXTENSIONS_DIR) whenever the
    # process group starts. Its only caller is inference_all_reduce (tensor-parallel inference,
    # deepspeed/comm/torch.py); training collectives go through torch.distributed/gloo.
    # build_shm_op() returns None when deepspeed.ops.__compatible_ops__ marks the op
    # incompatible; that dict is probed once per process and, as deepspeed/ops/__init__.py
    # notes, edits to it persist. If a later DeepSpeed drops the dict, nothing breaks: the op
    # is built (and cached) as before. SMOKE_BUILD_SHM_COMM=1 restores the build.
    if torch.cuda.is_available() or os.environ.get("SMOKE_BUILD_SHM_COMM") == "1":
        return False
    try:
        import deepspeed
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    except (ImportError, AttributeError, TypeError):
        return False
    return True


def dist_env_present() -> bool:
    """Whether a launcher (torchrun) set up this process as one rank of a process group."""
    return all(os.environ.get(key) for key in _DIST_ENV)


def has_experts(model: torch.nn.Module) -> bool:
    """Whether the model routes tokens to experts (so a step may leave some weights unused)."""
    config = getattr(model, "config", None)
    for key in _EXPERT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return True
    return False


class _Tee:
    """A text stream that writes to the console stream and to a per-rank log file."""

    def __init__(self, stream: Any, log: Any) -> None:
        self.stream = stream
        self.log = log

    def write(self, text: str) -> int:
        self.log.write(text)
        self.log.flush()
        return int(self.stream.write(text))

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def tee_rank_log(log_dir: Path) -> None:
    """Copy this rank's Python-level stdout and stderr into ``log_dir/rank{RANK}.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("RANK", "0")
    log = open(log_dir / f"rank{rank}.log", "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    sys.stdout = _Tee(sys.stdout, log)
    sys.stderr = _Tee(sys.stderr, log)


# ---- supervision: a run must not outlive the process that started it --------------------------
# Launchers put ranks in sessions of their own (torchrun does), so killing the group of the
# script that started them does not reach them. Each rank watches the processes it was started
# under and ends its own process group when one goes (SIGKILL included): the smoke runner
# (tools/smoke/runner.py puts its pid in SUPERVISOR_ENV), the job's launch.sh or train.sbatch
# (which export ``JOB_ENV=PID@HOST``: only ranks on that host watch it), and the launcher that
# is this rank's parent (torchrun, DeepSpeed's launch.py) when a launcher started it.
SUPERVISOR_ENV = "TRAINWRIGHT_SMOKE_SUPERVISOR_PID"
JOB_ENV = "TRAINWRIGHT_JOB_PID"
_SUPERVISOR_POLL_S = 0.5
_SAY_S = 0.2  # how long a rank that is ending waits for its last line to go out


def _start_ticks(pid: int) -> str | None:
    """A live process's start time (/proc/PID/stat field 22); None when gone or a zombie."""
    if not os.path.exists("/proc/self/stat"):  # not Linux: liveness only
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def watched_processes() -> list[tuple[int, str]]:
    """(pid, what it is) of each process this rank must not outlive."""
    found = []
    value = os.environ.get(SUPERVISOR_ENV, "")
    if value.isdigit():
        found.append((int(value), "supervising process"))
    pid, _, host = os.environ.get(JOB_ENV, "").partition("@")
    if pid.isdigit() and host == socket.gethostname():
        found.append((int(pid), "launch script"))
    parent = os.getppid()
    if dist_env_present() and parent > 1:
        found.append((parent, "launcher"))
    return found


def watch_supervisor() -> None:
    """End this process group when a process of ``watched_processes`` dies (checked every second)."""
    # Comparing start times guards against a pid being reused by another process.
    watched = [(pid, what, _start_ticks(pid)) for pid, what in watched_processes()]
    if not watched:
        return

    def watch() -> None:
        while True:
            for pid, what, started in watched:
                if started is None or _start_ticks(pid) != started:
                    # Said from another thread: with nobody reading the output any more, a
                    # full pipe would block the print, and the rank would never end.
                    line = f"train.py: {what} {pid} is gone; stopping the run"
                    threading.Thread(target=_print_err, args=(line,), daemon=True).start()
                    time.sleep(_SAY_S)
                    with contextlib.suppress(OSError):
                        os.killpg(os.getpgid(0), signal.SIGKILL)
                    os._exit(137)
            time.sleep(_SUPERVISOR_POLL_S)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def _print_err(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


# ---- one job per checkpoint folder --------------------------------------------------------------


class JobLock:
    """Rank 0 holds ``DIR/job.lock`` for the whole run: an flock, and a line saying who holds it.

    A second job on the folder is refused, naming the holder. The kernel drops the flock when
    its process dies however it dies; the file then still names the dead holder, whose lock the
    next job takes over, saying so. Where the filesystem has no flock (some network mounts) the
    holder's pid decides on its own host; another host's holder is taken to be alive.
    """

    fd: int | None = None

    @classmethod
    def take(cls, root: Path) -> None:
        """Hold the lock of ``root``, or raise UsageError naming the job that holds it."""
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--checkpoint-dir {root}: cannot create it ({exc.strerror})") from exc
        path = root / LOCK
        for _ in range(5):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise UsageError(
                    f"--checkpoint-dir {root}: cannot open {path} ({exc.strerror})"
                ) from exc
            locked = _flock(fd)
            try:
                same = locked is not True or os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # replaced or removed while we locked it: try the new one
                os.close(fd)
                continue
            holder = _read_holder(fd)
            if locked is False or (holder and _holder_alive(holder, flock_works=locked is True)):
                os.close(fd)
                hint = "" if locked is False else f"; if that job is gone, delete {path}"
                raise UsageError(
                    f"--checkpoint-dir {root} is in use by another job ({_holder_text(holder)}, "
                    f"lock {path}); wait for it to end or use another folder{hint}"
                )
            if holder:
                print(
                    f"{path}: taking over the lock of {_holder_text(holder)}, which is gone",
                    flush=True,
                )
            _write_holder(fd)
            cls.fd = fd
            return
        raise UsageError(
            f"--checkpoint-dir {root}: {path} keeps changing; is another job starting?"
        )

    @classmethod
    def release(cls) -> None:
        """Empty the file (no holder) and drop the flock; a no-op where not held."""
        if cls.fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(cls.fd, 0)
        with contextlib.suppress(OSError):
            os.close(cls.fd)
        cls.fd = None


def _flock(fd: int) -> bool | None:
    """True: locked; False: another process holds it; None: the filesystem has no flock."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        holder = json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {"unreadable": True}
    return holder if isinstance(holder, dict) else {"unreadable": True}


def _write_holder(fd: int) -> None:
    pid = os.getpid()
    holder = {
        "pid": pid,
        "host": socket.gethostname(),
        "start": _start_ticks(pid),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    data = (json.dumps(holder) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    with contextlib.suppress(OSError):
        os.fsync(fd)


def _holder_alive(holder: dict[str, Any], *, flock_works: bool) -> bool:
    """Whether the process the lock file names may still run (the flock being free)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname():
        # Where flock works it is the answer (network filesystems pass it between hosts).
        return not flock_works
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    started = _start_ticks(pid)
    return started is not None and started == holder.get("start")


def _holder_text(holder: dict[str, Any]) -> str:
    if not holder or "pid" not in holder:
        return "holder unknown"
    since = f", since {holder['since']}" if holder.get("since") else ""
    return f"pid {holder['pid']} on {holder.get('host', '?')}{since}"


# ---- the three modes: each builds the model its way and gives the loop one Job ---------------


class Job:
    """What the training loop drives: micro-steps, optimizer steps, checkpoints.

    ``model`` is the module whose config and embeddings the loop reads (inside any wrapper).
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, grad_accum: int) -> None:
        self.model = model
        self.device = device
        self.grad_accum = grad_accum

    def micro_step(self, batch: torch.Tensor, last: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch; ``last`` ends the optimizer step."""
        raise NotImplementedError

    def optimizer_step(self) -> None:
        """Apply the accumulated gradients (clipped), step the schedule, clear the gradients."""
        raise NotImplementedError

    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        raise NotImplementedError

    def save(self, root: Path, tag: str, state: dict[str, Any]) -> None:
        """Save a checkpoint ``root/tag`` with ``state`` (step, data position); every rank calls it."""
        raise NotImplementedError

    def load(self, root: Path, tag: str) -> dict[str, Any]:
        """Load checkpoint ``root/tag`` into the model and optimizer; returns its ``state``."""
        raise NotImplementedError


class DeepSpeedJob(Job):
    """The engine ``deepspeed.initialize`` builds: it accumulates, clips and schedules itself."""

    def __init__(self, engine: Any, model: torch.nn.Module, lora: bool) -> None:
        device = (
            engine.device
            if isinstance(engine.device, torch.device)
            else torch.device(engine.device)
        )
        super().__init__(model, device, int(engine.gradient_accumulation_steps()))
        self.engine = engine
        self.lora = lora

    def micro_step(self, batch: torch.Tensor, last: bool) -> torch.Tensor:
        """Forward, backward, and the engine's step (a no-op before the boundary)."""
        loss = self.engine(input_ids=batch, labels=batch).loss
        sample()
        self.engine.backward(loss)
        sample()
        # The engine steps the optimizer only at the accumulation boundary it counts itself.
        self.engine.step()
        return loss

    def optimizer_step(self) -> None:
        """Nothing left to do: the engine stepped at the boundary."""
        sample()

    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return float(self.engine.optimizer.param_groups[0]["lr"])

    def save(self, root: Path, tag: str, state: dict[str, Any]) -> None:
        """DeepSpeed's own checkpoint format (``latest`` is ours: written once it is complete)."""
        # LoRA: the frozen base comes from --model-path again; only the adapters are saved.
        self.engine.save_checkpoint(
            str(root),
            tag=tag,
            client_state=state,
            save_latest=False,
            exclude_frozen_parameters=self.lora,
        )

    def load(self, root: Path, tag: str) -> dict[str, Any]:
        """DeepSpeed's load_checkpoint; returns the client state."""
        path, state = self.engine.load_checkpoint(
            str(root), tag=tag, load_module_strict=not self.lora
        )
        if path is None:
            raise UsageError(f"--checkpoint-dir {root}: DeepSpeed could not load {tag}")
        return dict(state or {})


class TorchJob(Job):
    """FSDP2 or DDP (or one process): AdamW, clipping, a LambdaLR schedule, DCP checkpoints."""

    def __init__(
        self,
        args: argparse.Namespace,
        model: torch.nn.Module,
        train_model: torch.nn.Module,
        device: torch.device,
        amp_dtype: torch.dtype | None,
    ) -> None:
        super().__init__(model, device, args.grad_accum)
        self.args = args
        self.train_model = train_model  # DDP's wrapper, or the (FSDP-sharded) model itself
        self.amp_dtype = amp_dtype if not args.fsdp else None  # FSDP casts in its own policy
        self.params = [p for p in model.parameters() if p.requires_grad]
        lr = args.lr if args.lr is not None else DEFAULT_LR
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=args.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: schedule_factor(args, step)
        )
        self.scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None

    def micro_step(self, batch: torch.Tensor, last: bool) -> torch.Tensor:
        """Forward and backward (the loss divided over the accumulation); reduce on the last."""
        with self._sync(last), self._autocast():
            loss = self.train_model(input_ids=batch, labels=batch).loss
        sample()
        scaled = loss / self.grad_accum
        with self._sync(last):
            if self.scaler is not None:
                self.scaler.scale(scaled).backward()
            else:
                scaled.backward()
        sample()
        return loss

    def optimizer_step(self) -> None:
        """Unscale (fp16), clip, step, advance the schedule, clear the gradients."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.args.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        sample()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return float(self.scheduler.get_last_lr()[0])

    def _sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Reduce gradients only on an optimizer step's last micro-batch."""
        if last or self.grad_accum == 1:
            return contextlib.nullcontext()
        if isinstance(self.train_model, torch.nn.parallel.DistributedDataParallel):
            return self.train_model.no_sync()
        if hasattr(self.train_model, "set_requires_gradient_sync"):  # FSDP2
            return _GradientSync(self.train_model)
        return contextlib.nullcontext()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _options(self) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # LoRA: the frozen base comes from --model-path again; only the adapters are saved.
        lora = bool(self.args.lora_rank)
        return StateDictOptions(ignore_frozen_params=lora, strict=not lora)

    def save(self, root: Path, tag: str, state: dict[str, Any]) -> None:
        """torch.distributed.checkpoint of the (sharded) model and optimizer, plus a JSON state."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(
            self.model, self.optimizer, options=self._options()
        )
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(root / tag))
        extra = {
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }
        if _rank() == 0:
            write_json_atomic(root / tag / _TRAINER_STATE, {**state, **extra})

    def load(self, root: Path, tag: str) -> dict[str, Any]:
        """Load the DCP checkpoint in place; returns the JSON state."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optim_state = get_state_dict(
            self.model, self.optimizer, options=self._options()
        )
        loaded: dict[str, Any] = {"model": model_state, "optim": optim_state}
        dcp.load(loaded, checkpoint_id=str(root / tag))
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=loaded["model"],
            optim_state_dict=loaded["optim"],
            options=self._options(),
        )
        state = json.loads((root / tag / _TRAINER_STATE).read_text())
        self.scheduler.load_state_dict(state.pop("scheduler"))
        scaler = state.pop("scaler", None)
        if self.scaler is not None and scaler:
            self.scaler.load_state_dict(scaler)
        return dict(state)


class _GradientSync:
    """FSDP2: keep the gradients unsharded and unreduced until the step's last micro-batch."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.model.set_requires_gradient_sync(False)

    def __exit__(self, *exc: object) -> None:
        self.model.set_requires_gradient_sync(True)


def schedule_factor(args: argparse.Namespace, step: int) -> float:
    """The learning-rate multiplier after ``step`` optimizer steps: warm-up, then the decay."""
    if step < args.warmup_steps:
        return (step + 1) / args.warmup_steps
    if args.lr_schedule == "constant":
        return 1.0
    span = max(1, args.steps - args.warmup_steps)
    done = min(1.0, (step - args.warmup_steps) / span)
    if args.lr_schedule == "linear":
        return max(0.0, 1.0 - done)
    return 0.5 * (1.0 + math.cos(math.pi * done))


def _rank() -> int:
    return int(torch.distributed.get_rank()) if torch.distributed.is_initialized() else 0


def _world() -> int:
    return int(torch.distributed.get_world_size()) if torch.distributed.is_initialized() else 1


def _local_rank(args: argparse.Namespace) -> int:
    if args.local_rank is not None:
        return int(args.local_rank)
    return int(os.environ.get("LOCAL_RANK", 0))


def enable_checkpointing(args: argparse.Namespace, model: Any) -> None:
    """Recompute each layer in backward; LoRA needs the non-reentrant form (frozen inputs)."""
    kwargs = {"use_reentrant": False} if args.lora_rank else None
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def main(argv: list[str] | None = None) -> int:
    """Run the training and write this rank's metrics; returns the exit code."""
    watch_supervisor()
    args = parse_args(argv)
    if args.log_dir is not None:
        tee_rank_log(args.log_dir)
    try:
        if args.deepspeed_config is not None:
            return run_deepspeed(args)
        if args.fsdp:
            return run_fsdp(args)
        return run_ddp(args)
    except UsageError as exc:
        if exc.shown:
            print(f"train.py: error: {exc}", file=sys.stderr, flush=True)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        return EXIT_USAGE
    finally:
        JobLock.release()


def run_deepspeed(args: argparse.Namespace) -> int:
    """DeepSpeed mode: the engine that ``deepspeed.initialize`` builds from the config."""
    # Imported here so the FSDP and DDP modes run where DeepSpeed is not installed.
    import deepspeed

    on_cuda = torch.cuda.is_available()
    local_rank = _local_rank(args)
    if on_cuda:
        torch.cuda.set_device(local_rank)

    model_config = model_config_dict(args)
    ds_config = adapt_precision(json.loads(args.deepspeed_config.read_text()), on_cuda)
    if args.lr is not None and isinstance(ds_config.get("optimizer"), dict):
        ds_config["optimizer"].setdefault("params", {})["lr"] = args.lr

    skip_shm_comm_build()
    # The process group first, so that its buffers are in the CPU baseline, not the model's.
    deepspeed.init_distributed()
    tensor_parallel = int((ds_config.get("tensor_parallel") or {}).get("autotp_size") or 1)
    data = preflight(args, tensor_parallel)

    # Same seed on every rank: the replicas must start identical for data parallelism.
    torch.manual_seed(args.seed)
    # On CPU the peak is anonymous RSS; what the run itself adds is the peak minus what the
    # interpreter, torch, DeepSpeed and the model's code already hold.
    baseline_bytes = 0 if on_cuda else cpu_baseline_bytes(model_config)
    zero3 = int((ds_config.get("zero_optimization") or {}).get("stage", 0)) == 3
    # The config's dtype from the start (fp32 on CPU, where adapt_precision drops half
    # precision); DeepSpeed keeps the fp32 master copy in its optimizer.
    dtype = torch.float32
    if (ds_config.get("bf16") or {}).get("enabled"):
        dtype = torch.bfloat16
    elif (ds_config.get("fp16") or {}).get("enabled"):
        dtype = torch.float16
    keep_alive = zero3_context(ds_config) if zero3 else None
    # ZeRO-3: transformers builds or loads inside deepspeed.zero.Init (each parameter is
    # partitioned as it is created, on the device the config names). Otherwise on this rank's
    # device: a billion-parameter init on CPU takes long.
    where = None if zero3 else torch.device(f"cuda:{local_rank}" if on_cuda else "cpu")
    model: torch.nn.Module = add_lora(args, load_model(args, model_config, dtype, where))
    if "activation_checkpointing" in ds_config or args.gradient_checkpointing:
        enable_checkpointing(args, model)

    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config,
    )
    del keep_alive  # transformers' integration holds its own reference while it matters
    engine.train()
    code = train_loop(
        args,
        DeepSpeedJob(engine, model, bool(args.lora_rank)),
        data,
        baseline_bytes=baseline_bytes,
        extra={
            "mode": "deepspeed",
            "deepspeed": deepspeed.__version__,
            "construction": "zero.Init" if zero3 else "full",
            "zero_stage": int((ds_config.get("zero_optimization") or {}).get("stage", 0)),
        },
        tensor_parallel=tensor_parallel,
    )
    if code == 0 and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return code


def zero3_context(ds_config: dict[str, Any]) -> Any:
    """Transformers' DeepSpeed integration, told the config: models build under zero.Init."""
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(ds_config)


def _amp_dtype(args: argparse.Namespace, on_cuda: bool) -> torch.dtype | None:
    """The compute dtype of ``--bf16``/``--fp16`` on CUDA; CPU runs stay fp32."""
    if on_cuda and args.bf16:
        # Pre-Ampere GPUs have no bf16 math; fp16 with loss scaling is the usual fallback.
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if on_cuda and args.fp16:
        return torch.float16
    return None


def _precision_name(amp_dtype: torch.dtype | None) -> str:
    names: dict[torch.dtype | None, str] = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    return names.get(amp_dtype, "fp32")


def run_ddp(args: argparse.Namespace) -> int:
    """Plain PyTorch mode: DistributedDataParallel over torchrun's ranks, AdamW, optional autocast."""
    on_cuda = torch.cuda.is_available()
    local_rank = _local_rank(args)
    device = torch.device("cuda", local_rank) if on_cuda else torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(device)
    distributed = dist_env_present()
    if distributed:
        # env:// reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun sets them.
        torch.distributed.init_process_group(backend="nccl" if on_cuda else "gloo")
    try:
        data = preflight(args)
        model_config = model_config_dict(args)
        # Same seed on every rank: the replicas must start identical (DDP also broadcasts
        # rank 0's weights when it wraps the model).
        torch.manual_seed(args.seed)
        baseline_bytes = 0 if on_cuda else cpu_baseline_bytes(model_config)
        amp_dtype = _amp_dtype(args, on_cuda)
        # fp32 weights (autocast computes in half precision); QLoRA's base is 4-bit.
        model = add_lora(args, load_model(args, model_config, torch.float32, device))
        if args.gradient_checkpointing:
            enable_checkpointing(args, model)
        train_model: torch.nn.Module = model
        if distributed:
            train_model = torch.nn.parallel.DistributedDataParallel(
                model,
                device_ids=[device.index] if on_cuda else None,
                # Routed experts that get no token in a step have no gradient; DDP must be told.
                find_unused_parameters=has_experts(model),
            )
        train_model.train()
        code = train_loop(
            args,
            TorchJob(args, model, train_model, device, amp_dtype),
            data,
            baseline_bytes=baseline_bytes,
            extra={
                "mode": "ddp",
                "deepspeed": None,
                "precision": _precision_name(amp_dtype),
                "construction": "full",
            },
        )
        if code == 0 and distributed:
            torch.distributed.barrier()
        return code
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the longest ModuleList of one module class."""
    best: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best):
            children = list(module)
            if len({type(child) for child in children}) == 1:
                best = children
    return best


def run_fsdp(args: argparse.Namespace) -> int:
    """FSDP2 mode: meta-device model, one fully_shard unit per layer, weights from rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist_env_present():
        raise UsageError(
            "--fsdp runs under torchrun (torchrun --nproc_per_node N train.py --fsdp ...)"
        )
    on_cuda = torch.cuda.is_available()
    local_rank = _local_rank(args)
    device = torch.device("cuda", local_rank) if on_cuda else torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(device)
    torch.distributed.init_process_group(backend="nccl" if on_cuda else "gloo")
    try:
        data = preflight(args)
        if args.qlora:
            raise UsageError(
                "--qlora runs in the DDP mode (bitsandbytes' 4-bit layers); drop --fsdp"
            )
        model_config = model_config_dict(args)
        torch.manual_seed(args.seed)
        baseline_bytes = 0 if on_cuda else cpu_baseline_bytes(model_config)
        amp_dtype = _amp_dtype(args, on_cuda)
        with torch.device("meta"):
            model = add_lora(args, build_model(model_config, args.attn_implementation))
        if args.gradient_checkpointing:
            enable_checkpointing(args, model)
        policy = (
            MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32)
            if amp_dtype is not None
            else MixedPrecisionPolicy()
        )
        shard_args = fsdp_arguments(args, device, policy)
        for layer in decoder_layers(model):
            fully_shard(layer, **shard_args)
        fully_shard(model, **shard_args)
        model.to_empty(device=device)
        fill_from_rank0(args, model, model_config, set_model_state_dict, StateDictOptions)
        model.train()
        code = train_loop(
            args,
            TorchJob(args, model, model, device, amp_dtype),
            data,
            baseline_bytes=baseline_bytes,
            extra={
                "mode": "fsdp",
                "deepspeed": None,
                "precision": _precision_name(amp_dtype),
                "construction": "meta+broadcast",
            },
        )
        if code == 0:
            torch.distributed.barrier()
        return code
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def fsdp_arguments(args: argparse.Namespace, device: torch.device, policy: Any) -> dict[str, Any]:
    """``fully_shard``'s keywords for ``--fsdp-sharding`` and ``--fsdp-offload``."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    kwargs: dict[str, Any] = {
        "mp_policy": policy,
        "reshard_after_forward": args.fsdp_sharding != "grad-op",
        "offload_policy": CPUOffloadPolicy() if args.fsdp_offload else OffloadPolicy(),
    }
    if args.fsdp_sharding == "hybrid":
        from torch.distributed.device_mesh import init_device_mesh

        # Shard over a node's ranks, replicate across nodes (HSDP).
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", _world()))
        kwargs["mesh"] = init_device_mesh(
            device.type, (_world() // per_node, per_node), mesh_dim_names=("replicate", "shard")
        )
    return kwargs


def fill_from_rank0(
    args: argparse.Namespace,
    model: torch.nn.Module,
    model_config: dict[str, Any],
    set_model_state_dict: Any,
    options: Any,
) -> None:
    """Rank 0 loads (or draws) the full weights on CPU; every rank receives its shards.

    Buffers left out of the state dict (rotary frequencies) are broadcast too: ``to_empty``
    left them uninitialised.
    """
    full: dict[str, torch.Tensor] = {}
    source: torch.nn.Module | None = None
    if _rank() == 0:
        source = add_lora(args, load_model(args, model_config, torch.float32, torch.device("cpu")))
        full = source.state_dict()
    set_model_state_dict(
        model, full, options=options(full_state_dict=True, broadcast_from_rank0=True)
    )
    persistent = set(model.state_dict())
    source_buffers = dict(source.named_buffers()) if source is not None else {}
    for name, buffer in model.named_buffers():
        if name in persistent:
            continue
        if source is not None:
            buffer.copy_(source_buffers[name])
        torch.distributed.broadcast(buffer, src=0)
    del source, full


# ---- the loop: steps, logging, checkpoints, resume, preemption --------------------------------


class StopRequest:
    """SIGTERM (SLURM preemption, a launcher stopping): finish the step, save, exit 0.

    Installed only when the run has a checkpoint directory (something to save). Every rank
    learns of a request on any rank at the step's end (``train_loop`` all-reduces it with the
    loss), so they all save the same step. Later SIGTERMs change nothing: SLURM signals the
    launcher and the ranks together and the launcher then forwards its own, and a save cut
    short by a second one would lose the step. What ends a rank that cannot finish (one stuck
    in a collective) is the launcher's SIGKILL after its grace period (torchrun's and
    DeepSpeed's: 30 s), or Ctrl-C.
    """

    requested = False

    @classmethod
    def install(cls) -> None:
        """Catch SIGTERM from now on."""

        def handler(_signum: int, _frame: Any) -> None:
            if not cls.requested:
                print(
                    f"[rank {_rank()}] SIGTERM: saving a checkpoint after this step, then exiting",
                    file=sys.stderr,
                    flush=True,
                )
            cls.requested = True

        signal.signal(signal.SIGTERM, handler)


# ---- ranks agreeing: every rank stops, or none ------------------------------------------------


def _gather(value: Any) -> list[Any]:
    """Every rank's ``value`` in rank order (this rank's alone outside a process group)."""
    if not torch.distributed.is_initialized():
        return [value]
    values: list[Any] = [None] * _world()
    torch.distributed.all_gather_object(values, value)
    return values


def _from_rank0(value: Any) -> Any:
    """Rank 0's ``value``, on every rank."""
    if not torch.distributed.is_initialized():
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def _say(text: str) -> None:
    """One line from rank 0."""
    if _rank() == 0:
        print(text, flush=True)


def agree(problem: str | None) -> None:
    """Stop every rank when any rank found ``problem`` (``stop_every_rank``)."""
    for rank, found in enumerate(_gather(problem)):
        if found:
            stop_every_rank(found if rank == 0 else f"rank {rank}: {found}")


def stop_every_rank(problem: str) -> None:
    """Raise the UsageError every rank raises for the same ``problem``, rank 0 printing it first.

    Every rank waits until the line is out, and ignores SIGTERM from here on: a launcher
    stops the other ranks when the first one exits, and they are ending with exit code 2.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if _rank() == 0:
        print(f"train.py: error: {problem}", file=sys.stderr, flush=True)
    _barrier()
    raise UsageError(problem, shown=False)


def preflight(args: argparse.Namespace, tensor_parallel: int = 1) -> TokenData | None:
    """Before any model is built: take the checkpoint folder (rank 0), read the data (every rank).

    A problem on any rank stops all of them with one line (exit 2), so that no rank waits for
    the others in a collective and no rank of a refused job (another node's included) trains.
    Returns this rank's data (None without ``--data``).
    """
    if args.checkpoint_dir is None and args.data is None:
        return None
    rank, world = _rank(), _world()
    problem = None
    if rank == 0 and args.checkpoint_dir is not None:
        try:
            JobLock.take(args.checkpoint_dir)
        except UsageError as exc:
            problem = str(exc)
    agree(problem)
    if args.data is None:
        return None
    data = None
    try:
        data = load_token_data(args, rank // tensor_parallel, max(1, world // tensor_parallel))[0]
    except UsageError as exc:
        problem = str(exc)
    agree(problem)
    return data


# ---- checkpoints: complete once their manifest is written, resumed only when they verify -------


def _step_of(tag: str) -> int | None:
    """N of a folder named exactly ``stepN``; None for any other name."""
    match = _STEP_NAME.fullmatch(tag)
    return int(match[1]) if match else None


def checkpoint_files(folder: Path) -> list[str]:
    """Every file under ``folder`` but its manifest, as sorted relative paths."""
    names = []
    for path in folder.rglob("*"):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and not path.is_symlink() and name != MANIFEST:
            names.append(name)
    return sorted(names)


def _file_entry(path: Path) -> dict[str, Any]:
    """A file's size and SHA-256."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK_BYTES):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


def write_manifest(root: Path, tag: str, step: int) -> None:
    """Mark ``root/tag`` complete: every file's size and SHA-256, in ``manifest.json``.

    Every rank hashes a share of the files (rank 0 lists them); rank 0 writes the manifest.
    """
    folder = root / tag
    names = _from_rank0(checkpoint_files(folder) if _rank() == 0 else None)
    parts = _gather({name: _file_entry(folder / name) for name in names[_rank() :: _world()]})
    if _rank() == 0:
        files = {name: entry for part in parts for name, entry in part.items()}
        write_json_atomic(folder / MANIFEST, {"step": step, "files": dict(sorted(files.items()))})


def _read_manifest(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest's files, or why there is no usable manifest."""
    path = folder / MANIFEST
    if not path.is_file():
        return None, f"no {MANIFEST}: a save cut short, or an older train.py's"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, f"{MANIFEST} is unreadable"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (
        not isinstance(files, dict)
        or not files
        or not all(_entry_ok(*item) for item in files.items())
    ):
        return None, f"{MANIFEST} is not a checkpoint manifest"
    return files, None


def _entry_ok(name: Any, entry: Any) -> bool:
    return (
        isinstance(name, str)
        and not name.startswith("/")
        and ".." not in name.split("/")
        and isinstance(entry, dict)
        and isinstance(entry.get("bytes"), int)
        and isinstance(entry.get("sha256"), str)
    )


def _file_problem(folder: Path, name: str, entry: dict[str, Any]) -> str | None:
    try:
        size = (folder / name).stat().st_size
    except OSError:
        return f"{name} is missing"
    if size != entry["bytes"]:
        return f"{name} has {size:,} bytes, not the {entry['bytes']:,} saved"
    try:
        if _file_entry(folder / name)["sha256"] != entry["sha256"]:
            return f"{name} changed after it was saved (SHA-256)"
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror})"
    return None


def checkpoint_problem(root: Path, tag: str) -> str | None:
    """Why ``root/tag`` is not a complete checkpoint, or None; every rank checks a share."""
    files, problem = _from_rank0(_read_manifest(root / tag) if _rank() == 0 else None)
    if problem is not None:
        return str(problem)
    names = sorted(files)
    for name in names[_rank() :: _world()]:
        problem = _file_problem(root / tag, name, files[name])
        if problem:
            break
    found = [p for p in _gather(problem) if p]
    return found[0] if found else None


def checkpoint_candidates(root: Path) -> tuple[list[str], list[str]]:
    """The checkpoints to try in order, and what is wrong with ``latest`` (if anything).

    First the ``stepN`` folder ``latest`` names, then every other ``stepN`` folder with a
    manifest, newest first. ``latest`` naming anything but a ``stepN`` folder of ``root``
    (``../other``, an absolute path, a missing step) is not followed.
    """
    if not root.is_dir():
        return [], []
    complete = sorted(
        (
            p.name
            for p in root.iterdir()
            if _step_of(p.name) is not None and _real_dir(p) and (p / MANIFEST).is_file()
        ),
        key=lambda name: _step_of(name) or 0,
        reverse=True,
    )
    latest, named, notes = root / LATEST, None, []
    if latest.is_file():
        try:
            text = latest.read_text().strip()
        except (OSError, UnicodeDecodeError):
            text = "(unreadable)"
        if _step_of(text) is None:
            notes.append(f"{latest} names {text!r}, not a step folder of {root}")
        elif not _real_dir(root / text):
            notes.append(f"{latest} names {text}, which is missing")
        else:
            named = text
    elif latest.exists() or latest.is_symlink():
        notes.append(f"{latest} is not a file")
    elif complete:
        notes.append(f"{latest} is missing")
    return ([named] if named else []) + [tag for tag in complete if tag != named], notes


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def resume(job: Job, root: Path) -> tuple[str | None, dict[str, Any]]:
    """Load the checkpoint to continue from; returns its tag and state (None, {}: none).

    ``latest``'s when it is complete (its manifest verifies) and loads, else the newest
    complete one that loads, saying in one line why. A checkpoint that does not verify is never
    loaded: this job's own is moved aside (``stepN.corrupt``; an unfinished save is removed).
    When complete checkpoints exist and none of them loads, the job stops (exit 2): a
    half-loaded model must not train, nor save over them.
    """
    record = read_record(root) if _rank() == 0 and root.is_dir() else None
    candidates, notes = _from_rank0(checkpoint_candidates(root) if _rank() == 0 else None)
    load_failed = False
    for tag in candidates:
        problem = checkpoint_problem(root, tag)
        if problem:
            notes.append(f"{root / tag} is incomplete or corrupt ({problem})")
            if record is not None:
                notes[-1] += _dispose(root, tag, record)
            continue
        failure = None
        try:
            state = job.load(root, tag)
        except Exception as exc:  # on any rank: every rank falls back together
            failure = _one_line(exc)
        failures = [f for f in _gather(failure) if f]
        if failures:
            load_failed = True
            notes.append(f"{root / tag} did not load ({failures[0]})")
            continue
        if notes:
            _say(f"{'; '.join(notes)}; resuming from {root / tag}, the newest complete checkpoint")
        return tag, state
    if load_failed:
        stop_every_rank(
            f"--checkpoint-dir {root}: no checkpoint loads ({'; '.join(notes)}); move them "
            "elsewhere to start afresh"
        )
    if notes:
        _say(f"{'; '.join(notes)}; no complete checkpoint in {root}, so starting from step 1")
    return None, {}


def read_record(root: Path) -> dict[str, Any]:
    """``saved.json``: the ``stepN`` folders this job saved (oldest first) and the one it is saving."""
    path = root / RECORD
    record: dict[str, Any] = {"saved": [], "saving": None}
    if not path.exists():
        return record
    try:
        found = json.loads(path.read_text())
        saved = [tag for tag in found["saved"] if _step_of(tag) is not None]
        saving = found.get("saving")
        record = {"saved": saved, "saving": saving if _step_of(saving or "") is not None else None}
    except (OSError, ValueError, TypeError, KeyError):
        print(f"{path} is unreadable: starting a new record of saved checkpoints", flush=True)
    return record


def _unfinished(root: Path, tag: str, record: dict[str, Any]) -> bool:
    """Whether ``root/tag`` is a save of this job cut short (recorded as saving, no manifest)."""
    return (
        tag == record["saving"] and _real_dir(root / tag) and not (root / tag / MANIFEST).exists()
    )


def _set_aside(root: Path, tag: str, record: dict[str, Any], suffix: str) -> Path:
    """Rename ``root/tag`` to a free ``tag.suffix[-N]`` and drop it from the record."""
    aside, n = root / f"{tag}.{suffix}", 1
    while aside.exists() or aside.is_symlink():
        n += 1
        aside = root / f"{tag}.{suffix}-{n}"
    os.rename(root / tag, aside)
    record["saved"] = [t for t in record["saved"] if t != tag]
    if record["saving"] == tag:
        record["saving"] = None
    return aside


def _dispose(root: Path, tag: str, record: dict[str, Any]) -> str:
    """Out of the way with a checkpoint of this job that failed to verify; what was done."""
    if _unfinished(root, tag, record):
        shutil.rmtree(root / tag)
        record["saving"] = None
        write_json_atomic(root / RECORD, record)
        return ": removed it, a save of this job that did not finish"
    if tag not in record["saved"]:
        return ""  # not this job's: left where it is
    aside = _set_aside(root, tag, record, "corrupt")
    write_json_atomic(root / RECORD, record)
    return f": moved it to {aside}"


def _make_way(root: Path, tag: str, record: dict[str, Any]) -> None:
    """Clear the way to save ``root/tag``, never overwriting a checkpoint.

    An unfinished save of this job there is removed; anything else (a checkpoint an earlier
    run completed, something this job did not save) is moved aside, saying so.
    """
    folder = root / tag
    if not (folder.exists() or folder.is_symlink()):
        return
    if _unfinished(root, tag, record):
        shutil.rmtree(folder)
        print(f"removed {folder}: a save of this job that did not finish", flush=True)
        return
    ours = tag in record["saved"]
    aside = _set_aside(root, tag, record, "replaced")
    what = "a checkpoint an earlier run saved" if ours else "not a checkpoint this job saved"
    print(f"{folder} exists ({what}): moved it to {aside} to save this run's {tag}", flush=True)


def _rotate(root: Path, record: dict[str, Any], keep: int, current: str) -> None:
    """Delete this job's recorded checkpoints beyond the newest ``keep`` (never ``current``)."""
    saved = [tag for tag in record["saved"] if _real_dir(root / tag)]
    for tag in sorted(saved, key=lambda name: _step_of(name) or 0)[:-keep]:
        if tag != current:
            shutil.rmtree(root / tag, ignore_errors=True)
            saved.remove(tag)
    record["saved"] = saved


def save_checkpoint(job: Job, root: Path, step: int, position: int, keep: int) -> None:
    """Save ``root/stepN``; once every rank has, its manifest, ``latest`` and the record.

    Rotation then deletes this job's own recorded checkpoints beyond the newest ``keep`` and
    nothing else (a ``step6_good`` copy, a ``steps-notes/`` folder stay).
    """
    tag = _STEP_DIR.format(step=step)
    started = time.perf_counter()
    record: dict[str, Any] = {}
    if _rank() == 0:
        record = read_record(root)
        _make_way(root, tag, record)
        record["saving"] = tag
        write_json_atomic(root / RECORD, record)
    _barrier()
    job.save(root, tag, {"step": step, "data_position": position})
    _barrier()
    write_manifest(root, tag, step)
    if _rank() == 0:
        tmp = root / f".{LATEST}.tmp"
        tmp.write_text(tag)
        os.replace(tmp, root / LATEST)
        record["saved"] = [t for t in record["saved"] if t != tag] + [tag]
        record["saving"] = None
        _rotate(root, record, keep, tag)
        write_json_atomic(root / RECORD, record)
        print(f"checkpoint {root / tag} saved in {time.perf_counter() - started:.1f}s", flush=True)
    _barrier()


class MetricLog:
    """Rank 0's interval log: stdout, ``metrics.jsonl``, TensorBoard and W&B when enabled."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.active = rank == 0
        self.path = args.metrics_dir / "metrics.jsonl"
        self.writer: Any = None
        self.wandb: Any = None
        if not self.active:
            return
        args.metrics_dir.mkdir(parents=True, exist_ok=True)
        if args.tensorboard is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise UsageError(
                    "--tensorboard needs tensorboard: pip install tensorboard"
                ) from exc
            self.writer = SummaryWriter(str(args.tensorboard))
        if args.wandb:
            try:
                import wandb
            except ImportError as exc:
                raise UsageError("--wandb needs wandb: pip install wandb") from exc
            self.wandb = wandb.init(project=args.wandb, config=_plain(vars(args)), resume="allow")

    def record(self, row: dict[str, Any], text: str) -> None:
        """Print ``text`` and append ``row`` (with a step) to every enabled sink."""
        if not self.active:
            return
        print(text, flush=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        step = int(row["step"])
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and self.writer is not None:
                self.writer.add_scalar(f"train/{key}", value, step)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self) -> None:
        """Flush and close TensorBoard and W&B."""
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}


def train_loop(
    args: argparse.Namespace,
    job: Job,
    token_data: TokenData | None,
    *,
    baseline_bytes: int,
    extra: dict[str, Any],
    tensor_parallel: int = 1,
) -> int:
    """Run up to ``args.steps`` optimizer steps, log them, checkpoint, and write this rank's metrics.

    The ranks of one tensor-parallel group (``tensor_parallel`` consecutive ranks, as DeepSpeed
    AutoTP groups them) draw the same batches: they hold shards of one replica. Returns 0 after
    all steps (or a SIGTERM's final checkpoint), 3 at the first non-finite loss.
    """
    model, device = job.model, job.device
    on_cuda = device.type == "cuda"
    rank, world_size = _rank(), _world()
    data_rank, data_ranks = rank // tensor_parallel, max(1, world_size // tensor_parallel)
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    # On a GPU: what the model states hold before the first step, and after it (when the
    # optimizer has created its states), to split the peak into states and activations.
    memory_marks: dict[str, int] = {}
    if on_cuda:
        memory_marks["allocated_at_start_bytes"] = int(torch.cuda.memory_allocated(device))
    # What this rank holds of the model once it is built and sharded, before any step.
    memory_marks["local_param_bytes"] = local_param_bytes(model)

    vocab_size = int(getattr(model, "config").vocab_size)  # noqa: B009 - any HF model, peft's too
    data_info: dict[str, Any] = {"data": "synthetic"}
    data: TokenData | PatternData
    if token_data is not None:  # read and checked by preflight, before the model was built
        data, tokens = token_data, int(token_data.blocks.numel())
        data_info = {"data": str(args.data), "data_tokens": tokens}
        if rank == 0:
            print(
                f"data: {tokens:,} tokens in {data.blocks.shape[0]:,} blocks of {args.seq_len}; "
                f"{data.batches_per_epoch()} micro-batches per rank per epoch",
                flush=True,
            )
    else:
        data = PatternData(vocab_size, args.seq_len, args.micro_batch, args.seed, data_rank)
        if rank == 0:
            print("data: synthetic repeated-pattern sequences (no --data given)", flush=True)
    start_step = 0
    tag, state = resume(job, args.checkpoint_dir) if args.checkpoint_dir else (None, {})
    if tag is not None:
        start_step = int(state.get("step", 0))
        data.skip(int(state.get("data_position", start_step * job.grad_accum)))
        if rank == 0:
            print(f"resumed from {args.checkpoint_dir / tag} at step {start_step}", flush=True)
    if args.checkpoint_dir is not None:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        StopRequest.install()
    log = MetricLog(args, rank)
    losses: list[float] = []
    step_times_s: list[float] = []
    tokens_per_step = args.micro_batch * args.seq_len * job.grad_accum
    metrics_path = args.metrics_dir / f"rank{rank}.json"
    injector = FaultInjector(args.inject, args.inject_step, rank, world_size)
    interval_start, interval_steps = time.perf_counter(), 0

    def metrics(status: str) -> dict[str, Any]:
        return {
            "rank": rank,
            "world_size": world_size,
            "device": str(device.type),
            "device_name": torch.cuda.get_device_name(device) if on_cuda else "cpu",
            "status": status,
            "steps": len(losses),
            "first_step": start_step + 1,
            "resumed_from": tag,
            "losses": losses,
            "step_times_s": step_times_s,
            "tokens_per_step": tokens_per_step,
            "tokens_processed": tokens_per_step * len(losses),
            "peak_memory_bytes": peak_memory_bytes(device),
            "process_gpu_memory_bytes": process_gpu_memory_bytes(device),
            "baseline_memory_bytes": baseline_bytes,
            "seq_len": args.seq_len,
            "micro_batch": args.micro_batch,
            "grad_accum": job.grad_accum,
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            **memory_marks,
            "params": total_params(model),
            "trainable_params": trainable_params(model),
            "init": args.init,
            "lora_rank": args.lora_rank,
            "qlora": args.qlora,
            **data_info,
            "torch": torch.__version__,
            **extra,
        }

    for step in range(start_step + 1, args.steps + 1):
        if on_cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step_loss, step_lr = 0.0, job.lr()
        try:
            injector.before_step(step, model, device)
            for micro in range(job.grad_accum):
                batch = injector.batch(step, data.next()).to(device)
                loss = job.micro_step(batch, last=micro == job.grad_accum - 1)
                step_loss += float(loss.detach().float().item()) / job.grad_accum
            job.optimizer_step()
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
            injector.release()
            if _is_oom(exc):
                write_json_atomic(metrics_path, metrics("oom"))
            raise
        injector.release()
        if on_cuda:
            torch.cuda.synchronize(device)
            if step == start_step + 1:
                memory_marks["allocated_after_step1_bytes"] = int(
                    torch.cuda.memory_allocated(device)
                )
        elapsed_s = time.perf_counter() - start
        # One small all-reduce per step: the mean loss over the ranks, and whether any rank was
        # asked to stop (all must save the same step).
        mean_loss, stop = step_loss, StopRequest.requested
        if torch.distributed.is_initialized():
            flags = torch.tensor([step_loss, float(stop)], device=device, dtype=torch.float64)
            torch.distributed.all_reduce(flags)
            mean_loss, stop = float(flags[0]) / world_size, bool(flags[1] > 0)
        losses.append(step_loss if math.isfinite(step_loss) else float("nan"))
        step_times_s.append(elapsed_s)
        interval_steps += 1
        if step % args.log_every == 0 or step == args.steps or stop:
            span = time.perf_counter() - interval_start
            rate = tokens_per_step * data_ranks * interval_steps / span if span > 0 else 0.0
            memory = peak_memory_bytes(device) - baseline_bytes
            row = {
                "step": step,
                "loss": mean_loss,
                "lr": step_lr,
                "tokens_per_s": rate,
                "step_time_s": elapsed_s,
                "peak_memory_bytes": memory,
                "time": time.time(),
            }
            text = (
                f"step {step}/{args.steps} loss {mean_loss:.4f} lr {step_lr:.3g} "
                f"{rate:,.0f} tokens/s {elapsed_s:.2f}s/step peak memory {memory / 2**30:.2f} GiB"
            )
            log.record(row, text)
            interval_start, interval_steps = time.perf_counter(), 0
        if step % _METRICS_EVERY == 0:
            # Partial metrics let a run that is stopped (timeout, Ctrl-C) still report progress.
            write_json_atomic(metrics_path, metrics("running"))
        if not (math.isfinite(step_loss) and math.isfinite(mean_loss)):
            # Nothing after a NaN loss tells us more; stop early so the verdict comes fast. The
            # all-reduced mean is NaN on every rank when any rank's loss is, so all stop here.
            write_json_atomic(metrics_path, metrics("nan"))
            log.close()
            return 3
        due = args.save_every and step % args.save_every == 0
        if args.checkpoint_dir is not None and (due or stop or step == args.steps):
            save_checkpoint(job, args.checkpoint_dir, step, data.position, args.keep_checkpoints)
        if stop:
            write_json_atomic(metrics_path, metrics("preempted"))
            log.close()
            if rank == 0:
                print(
                    f"stopped at step {step} on SIGTERM; rerun the same command to resume",
                    flush=True,
                )
            return 0

    write_json_atomic(metrics_path, metrics("ok"))
    log.close()
    return 0


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return "out of memory" in text or "can't allocate memory" in text


if __name__ == "__main__":
    sys.exit(main())
