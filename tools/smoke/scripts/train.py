r"""Train one planned setup: the real job on the user's model and data, or its smoke test.

Run it from the plan's folder (``launch.sh`` does); ``python train.py --help`` lists every flag::

    deepspeed --num_gpus 8 train.py --deepspeed_config ds_config.json --init pretrained \
        --model-path /models/llama-3-8b --data data/train.jsonl --checkpoint-dir checkpoints
    torchrun --nproc_per_node 8 train.py --fsdp --model-config model_config.json --bf16 ...
    torchrun --nproc_per_node 8 train.py --model-config model_config.json --bf16 ...   # DDP
    python train.py --model-config model_config.json --metrics-dir metrics             # 1 process

- Modes: DeepSpeed with ``--deepspeed_config`` (job_deepspeed.py); FSDP2 with ``--fsdp``, plain
  DDP otherwise (job_torch.py), neither needing DeepSpeed installed.
- Model: ``--init random`` from ``--model-config``, or ``--init pretrained --model-path``;
  ``--lora-rank R`` trains adapters only, ``--qlora`` on a 4-bit base (job_model.py).
- Data: ``--data`` (JSON lines, text, a saved ``datasets`` folder, or the token shards
  ``prepare_data.py`` writes, streamed per rank), else synthetic patterns (job_data.py).
- Checkpoints: ``--checkpoint-dir DIR --save-every N``; the same command again resumes, and
  SIGTERM saves and exits 0 (job_checkpoints.py, job_lock.py, job_loop.py).
- Evaluation: ``--eval-every N`` and/or ``--eval-holdout FRACTION``: the loss and perplexity on
  the last FRACTION of ``--data`` (never trained on), every N steps and at the end
  (job_eval.py, holdout.py).
- Output: rank 0 prints a line per ``--log-every`` steps; each rank writes
  ``metrics-dir/rank{R}.json``. ``--inject`` fails the run on purpose (job_probes.py).

Each rank ends when the process that started it is gone (its launcher, or ``launch.sh`` through
``$TRAINWRIGHT_JOB_PID``), even after SIGKILL. On a machine without CUDA the ranks run on CPU
over gloo, in fp32. The modules beside this file are imported by plain name: this folder is first
on the import path however the script is started.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness import (
    EXIT_USAGE,
    UsageError,
    launch_script,
    launcher,
    supervisor,
    tee_rank_log,
    watch,
    whole_lines,
)
from holdout import DEFAULT_EVAL_BATCHES, DEFAULT_HOLDOUT

# ---- defaults ------------------------------------------------------------------------------------
# The FSDP/DDP modes' learning rate: the constant rate the smoke runner gives DeepSpeed
# (tools/smoke/ds_adapt.py SMOKE_LR), large enough for a random-init tiny model to learn in ~30
# steps. DeepSpeed's comes from its config.
DEFAULT_LR = 3e-3
STEPS = 30
SEQ_LEN = 64
SEED = 1234
KEEP_CHECKPOINTS = 2
INJECT_STEP = 3
INIT_KINDS = ("random", "pretrained")
SCHEDULES = ("constant", "linear", "cosine")
FSDP_SHARDING = ("full", "grad-op", "hybrid")
INJECT_KINDS = ("oom", "nan", "hang", "crash", "alloc")


def main(argv: list[str] | None = None) -> int:
    """Run the training and write this rank's metrics; returns the exit code."""
    whole_lines()
    watch("train.py", [*supervisor(), *launch_script(), *launcher()])
    args = parse_args(argv)
    if args.log_dir is not None:
        tee_rank_log(args.log_dir, os.environ.get("RANK", "0"))
    # Imported once the arguments are read: --help needs no torch.
    import torch
    from job_lock import JobLock

    try:
        return run(args)
    except UsageError as exc:
        if exc.shown:
            print(f"train.py: error: {exc}", file=sys.stderr, flush=True)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        return EXIT_USAGE
    finally:
        JobLock.release()


def run(args: argparse.Namespace) -> int:
    """The mode the arguments name: DeepSpeed, FSDP2 or DDP."""
    if args.deepspeed_config is not None:
        from job_deepspeed import run_deepspeed

        return run_deepspeed(args)
    from job_torch import run_ddp, run_fsdp

    return run_fsdp(args) if args.fsdp else run_ddp(args)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (the DeepSpeed launcher adds ``--local_rank``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _model_arguments(parser)
    _data_arguments(parser)
    _run_arguments(parser)
    _output_arguments(parser)
    _eval_arguments(parser)
    _ddp_arguments(parser)
    args = parser.parse_args(argv)
    args.eval_holdout_given = args.eval_holdout is not None
    if args.eval_every and args.eval_holdout is None:
        args.eval_holdout = DEFAULT_HOLDOUT
    if args.init is None:
        args.init = "pretrained" if args.model_path else "random"
    if args.lr is None and args.deepspeed_config is None:
        args.lr = DEFAULT_LR
    problem = _argument_problem(args)
    if problem:
        parser.error(problem)
    return args


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and its LoRA adapters."""
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


def _data_arguments(parser: argparse.ArgumentParser) -> None:
    """The user's data (without it: synthetic patterns)."""
    data = parser.add_argument_group("data")
    data.add_argument(
        "--data",
        type=Path,
        default=None,
        help=".jsonl/.txt file or folder, a datasets folder, or a prepare_data.py folder of "
        "token shards (pretraining: each rank streams its slice)",
    )
    data.add_argument("--text-field", default="text", help="the JSON field holding the text")
    data.add_argument(
        "--tokenizer", default=None, help="tokenizer folder or hub id (default: --model-path)"
    )


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    """The mode and the run's size: steps, sequence, batch, seed, learning rate."""
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
    parser.add_argument("--steps", type=int, default=STEPS, help="optimizer steps to run")
    parser.add_argument("--seq-len", type=int, default=SEQ_LEN, help="tokens per sequence")
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per rank per step")
    parser.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="micro-batches per optimizer step (FSDP/DDP; DeepSpeed: the config's)",
    )
    parser.add_argument("--metrics-dir", required=True, type=Path, help="where rank{R}.json go")
    parser.add_argument("--seed", type=int, default=SEED, help="seed for model init and data")
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"peak learning rate (DDP/FSDP default {DEFAULT_LR:g}; DeepSpeed: the config's)",
    )


def _output_arguments(parser: argparse.ArgumentParser) -> None:
    """Checkpoints, logging, metrics and the injected fault."""
    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument("--checkpoint-dir", type=Path, default=None, help="save and resume here")
    ckpt.add_argument(
        "--save-every", type=int, default=0, help="save every N steps (0: at the end only)"
    )
    ckpt.add_argument(
        "--keep-checkpoints", type=int, default=KEEP_CHECKPOINTS, help="newest checkpoints kept"
    )
    log = parser.add_argument_group("logging")
    log.add_argument("--log-every", type=int, default=1, help="print and record every N steps")
    log.add_argument("--tensorboard", type=Path, default=None, help="also log to TensorBoard here")
    log.add_argument("--wandb", default=None, help="also log to this W&B project")
    parser.add_argument(
        "--inject", choices=INJECT_KINDS, default=None, help="fail for real at --inject-step"
    )
    parser.add_argument(
        "--inject-step", type=int, default=INJECT_STEP, help="step of the injected fault"
    )
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="also write each rank's output to rank{R}.log"
    )


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Evaluation on held-out data (job_eval.py)."""
    evals = parser.add_argument_group("evaluation")
    evals.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="evaluate every N steps and at the end (default: no evaluation, or at the end only "
        "with --eval-holdout)",
    )
    evals.add_argument(
        "--eval-holdout",
        type=float,
        default=None,
        help="hold out the last FRACTION of --data's sequences, never trained on, and evaluate "
        f"on them (default with --eval-every: {DEFAULT_HOLDOUT:g}; synthetic data: sequences "
        "drawn with another seed)",
    )
    evals.add_argument(
        "--eval-batches",
        type=int,
        default=DEFAULT_EVAL_BATCHES,
        help=f"micro-batches per rank per evaluation at most (default {DEFAULT_EVAL_BATCHES})",
    )


def _ddp_arguments(parser: argparse.ArgumentParser) -> None:
    """What only the FSDP and DDP modes read (DeepSpeed's come from its config)."""
    ddp = parser.add_argument_group("FSDP and DDP modes (ignored with --deepspeed_config)")
    ddp.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    ddp.add_argument(
        "--max-grad-norm", type=float, default=1.0, help="gradient clipping norm (0: off)"
    )
    ddp.add_argument(
        "--adam-betas",
        type=float,
        nargs=2,
        default=(0.9, 0.999),
        metavar=("BETA1", "BETA2"),
        help="AdamW's betas (torch's default 0.9 0.999)",
    )
    ddp.add_argument("--adam-eps", type=float, default=1e-8, help="AdamW's epsilon")
    ddp.add_argument("--lr-schedule", choices=SCHEDULES, default="constant", help="after warm-up")
    ddp.add_argument("--warmup-steps", type=int, default=0, help="linear warm-up steps")
    ddp.add_argument(
        "--min-lr-ratio",
        type=float,
        default=0.0,
        help="where the linear or cosine decay ends, as a fraction of --lr (Llama 2: 0.1)",
    )
    half = ddp.add_mutually_exclusive_group()
    half.add_argument(
        "--bf16", action="store_true", help="bf16 compute on CUDA (fp16 where unsupported)"
    )
    half.add_argument("--fp16", action="store_true", help="fp16 autocast with loss scaling on CUDA")
    parser.add_argument(
        "--local_rank", "--local-rank", type=int, default=None, help="set by the launcher"
    )


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
    if args.eval_every is not None and args.eval_every < 1:
        return "--eval-every must be at least 1 (leave it out for no evaluation)"
    if args.eval_holdout is not None and not 0.0 < args.eval_holdout < 1.0:
        return "--eval-holdout is a fraction of the data: above 0 and below 1 (0.01 for 1%)"
    if args.eval_batches < 1:
        return "--eval-batches must be at least 1"
    if args.save_every < 0 or args.lora_rank < 0 or args.warmup_steps < 0:
        return "--save-every, --lora-rank and --warmup-steps cannot be negative"
    if not 0.0 <= args.min_lr_ratio < 1.0:
        return "--min-lr-ratio must be at least 0 and below 1"
    if not all(0.0 <= beta < 1.0 for beta in args.adam_betas) or args.adam_eps <= 0:
        return "--adam-betas must be at least 0 and below 1, --adam-eps above 0"
    if args.weight_decay < 0 or args.max_grad_norm < 0:
        return "--weight-decay and --max-grad-norm cannot be negative"
    if args.save_every and args.checkpoint_dir is None:
        return "--save-every needs --checkpoint-dir"
    if args.data is not None and args.tokenizer is None and not args.model_path:
        from token_shards import is_shard_folder

        if not is_shard_folder(args.data):
            return (
                f"--data {args.data} is text: give --tokenizer (or --model-path with one), or "
                "tokenize it first with prepare_data.py (python trainer/prepare_data.py --help) "
                "and give its --out folder"
            )
    return None


if __name__ == "__main__":
    sys.exit(main())
