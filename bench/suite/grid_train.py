"""Run a grid of DeepSpeed configurations in one launch and time each: the search baseline.

Started by bench/suite/choice_grid.py through DeepSpeed's launcher, once for the whole grid::

    deepspeed --num_gpus 2 bench/suite/grid_train.py --model-config model.json --grid grid.json \
        --warmup 2 --steps 5 --rounds 2 --out results.json

``grid.json`` is a list of ``{"label", "strategy", "micro_batch", "accumulation", "ds_config"}``.
For each entry, every rank builds the same random-init model (same seed), wraps it with
``deepspeed.initialize``, runs ``--warmup`` optimizer steps, then ``--steps`` timed optimizer
steps (each ``accumulation`` micro-steps of ``micro_batch`` sequences), between barriers, and
frees the engine before the next entry; ``--rounds`` passes over the grid interleave the
entries in time. One launch avoids paying the launcher, interpreter,
torch and DeepSpeed imports and the process-group set-up once per configuration.

Standalone like tools/smoke/scripts/train.py: torch, transformers, deepspeed and the standard library.
Rank 0 writes ``--out`` (one record per entry and round: step times, tokens/s at the median
step, losses, or the error).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import transformers


def parse_args() -> argparse.Namespace:
    """Parse the command line (the launcher adds ``--local_rank``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-config", required=True, type=Path)
    parser.add_argument("--grid", required=True, type=Path)
    parser.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps")
    parser.add_argument("--steps", type=int, default=5, help="timed optimizer steps")
    parser.add_argument("--rounds", type=int, default=1, help="passes over the whole grid")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    return parser.parse_args()


def build_model(config_dict: dict[str, Any]) -> torch.nn.Module:
    """A random-init causal LM from a Hugging Face config dict, in fp32 (CPU ranks)."""
    cfg = dict(config_dict)
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    return transformers.AutoModelForCausalLM.from_config(config).float()


def skip_shm_comm_build() -> None:
    """Keep DeepSpeed from JIT-building its CPU shared-memory op (as tools/smoke/scripts/job_deepspeed.py does)."""
    try:
        import deepspeed
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    except (ImportError, AttributeError, TypeError):
        pass


def run_entry(
    entry: dict[str, Any], model_config: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Initialise one configuration, warm it up, time it, free it."""
    import deepspeed

    dist = torch.distributed
    world = dist.get_world_size()
    rank = dist.get_rank()
    micro, accumulation = int(entry["micro_batch"]), int(entry["accumulation"])
    record: dict[str, Any] = {
        k: entry[k] for k in ("label", "strategy", "micro_batch", "accumulation")
    }
    torch.manual_seed(args.seed)
    dist.barrier()
    start = time.perf_counter()
    model = build_model(model_config)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=entry["ds_config"]
    )
    engine.train()
    vocab = int(model_config["vocab_size"])
    generator = torch.Generator().manual_seed(args.seed + rank)
    losses: list[float] = []

    def optimizer_step(engine: Any) -> None:
        for _ in range(accumulation):
            batch = torch.randint(0, vocab, (micro, args.seq_len), generator=generator)
            loss = engine(input_ids=batch, labels=batch).loss
            engine.backward(loss)
            engine.step()
        losses.append(float(loss.detach()))

    dist.barrier()
    record["init_s"] = time.perf_counter() - start
    for _ in range(args.warmup):
        optimizer_step(engine)
    dist.barrier()
    step_times = []
    for _ in range(args.steps):
        step_start = time.perf_counter()
        optimizer_step(engine)
        dist.barrier()  # the step ends when the slowest rank is done
        step_times.append(time.perf_counter() - step_start)
    tokens_per_step = micro * accumulation * world * args.seq_len
    step_median = sorted(step_times)[len(step_times) // 2]
    record.update(
        status="ok",
        world_size=world,
        seq_len=args.seq_len,
        warmup_steps=args.warmup,
        timed_steps=args.steps,
        step_times_s=step_times,
        tokens_per_step=tokens_per_step,
        # The median step: one slow step (another process on the machine) does not decide it.
        tokens_per_s=tokens_per_step / step_median,
        tokens_per_s_mean=tokens_per_step * args.steps / sum(step_times),
        losses=losses,
    )
    # Free the engine before the next entry: its hooks (ZeRO-3), buffers and optimizer state.
    destroy = getattr(engine, "destroy", None)
    if callable(destroy):
        destroy()
    del engine, model
    gc.collect()
    return record


def main() -> int:
    """Run every grid entry in order; rank 0 writes the records."""
    import deepspeed

    args = parse_args()
    skip_shm_comm_build()
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    model_config = json.loads(args.model_config.read_text())
    grid = json.loads(args.grid.read_text())
    records: list[dict[str, Any]] = []
    # Rounds interleave the configurations, so a busy spell on the machine hits several.
    schedule = [(r, entry) for r in range(args.rounds) for entry in grid]
    for i, (round_index, entry) in enumerate(schedule):
        try:
            record = run_entry(entry, model_config, args)
        except Exception as exc:  # one failing setup is a result too; a hang is the caller's
            record = {k: entry.get(k) for k in ("label", "strategy", "micro_batch", "accumulation")}
            record.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:300])
        record["round"] = round_index
        records.append(record)
        if rank == 0:
            rate = record.get("tokens_per_s")
            print(
                f"grid {i + 1}/{len(schedule)} {record['label']}: "
                + (f"{rate:,.0f} tokens/s" if rate else record.get("error", "?")),
                flush=True,
            )
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(records, indent=1) + "\n")
            os.replace(tmp, args.out)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
