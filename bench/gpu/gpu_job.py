"""GPU job check (issue 19): the plan's own ``launch.sh`` fine-tunes a saved 1.2B llama, full and LoRA.

Run through ``bash bench/gpu/gpu_job.sh [OUT_DIR]`` on a GPU machine. Issue 19's last check is that
the folder a plan writes is the job: not a benchmark loop written for the occasion, but the
generated ``launch.sh`` and ``train.py`` loading weights from disk and training on a JSONL file,
with step time and memory close to what the plan said. So, in order:

1. A worker process saves the "pretrained" model: the shape of knowledge/models/llama-3.2-1b.json
   (1.24B parameters, tied embeddings, vocab 128256) with random weights, in bf16 safetensors
   (``save_pretrained``), and a byte-level BPE tokenizer trained here on generated text (the
   machine has no network; the model's vocab stays larger than the tokenizer's, which only
   leaves rows unused). It also writes the JSONL dataset: generated text with enough tokens
   that no step repeats a block. The saving runs in its own process so that the driver holds no
   CUDA context while the jobs run.
2. For ``full`` (task finetune) and ``lora`` (task lora, rank 16), the driver plans in-process
   as the engineer role does: ``lookup_model`` of the saved folder, a TrainingBrief for one
   H200 141GB, ``search_strategy`` (the memory plan and its speed estimate), the framework
   (``select_framework`` then ``follow_setup``), the DeepSpeed config where the framework is a
   DeepSpeed one, and ``emit_launch`` into the case's folder. The prediction (peak allocated,
   peak reserved, device used, step time, tokens/s, micro-batch and accumulation) is written
   to the JSON before the job starts.
3. It runs ``bash launch.sh --steps N --log-every 1`` there with ``MODEL_PATH`` and ``DATA``
   set (arguments to launch.sh reach train.py after the plan's), under a per-run timeout that
   stops the launcher and its ranks together. A ``deepspeed`` / ``torchrun`` shim goes on PATH
   when the CLI is not installed (the wheels are unpacked with ``--target``, which installs no
   scripts). From ``metrics/rank0.json`` and ``metrics/metrics.jsonl`` it records the step
   times, their median after the warm-up steps, tokens/s from that median, the peak allocated
   memory (``torch.cuda.max_memory_allocated``, which train.py resets before step 1), the
   driver's view of the process (NVML, when it answers), trainable and local parameter bytes.
   ``error_*`` is predicted / measured - 1, as in bench/gpu/gpu_recipes.py.

``--device cpu --tiny`` is a dry run of the same flow on CPU: a 2-layer llama, 2 steps, seq 64,
micro-batch 2 (the plan for the tiny model on an H200 picks a batch a CPU has no business
running); train.py runs fp32 over gloo there. The plan is still made for the H200, so the
launch files are the GPU ones. Its "measured" memory is CPU RSS and no error is computed from
it. The JSON is rewritten after every case, so a run stopped by its time limit keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The recipes check's JSON helpers: a reader that tolerates a missing or half-written file, and
# an atomic writer (a run stopped mid-write leaves the previous report).
from bench.gpu.gpu_recipes import _read_json, _write  # noqa: E402

MODEL_CONFIG = ROOT / "knowledge" / "models" / "llama-3.2-1b.json"
TINY_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": True,
}
SEQ_LEN, TINY_SEQ_LEN = 2048, 64
STEPS, TINY_STEPS = 8, 2
# Step 1 carries the allocator's growth and kernel autotuning, step 2 can still settle; the
# median of the rest is the steady step the speed model prices.
WARMUP_STEPS = 2
TINY_MICRO_BATCH = 2
LORA_RANK = 16
TARGET = "1xH200"
TOKENIZER_VOCAB = 4096
# Text for the tokenizer and the dataset: words of two to four syllables, so the BPE has
# something to merge and the packed blocks are not one repeated token.
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pha", "dro", "gui", "sten")
SAVE_TIMEOUT_S = 240.0
# A job: torchrun start-up, the 2.5 GB load, tokenizing, 8 steps of ~1-2 s, the final checkpoint
# (full fine-tune: fp32 weights and Adam states, ~15 GB).
RUN_TIMEOUT_S = 180.0
BUDGET_S = 420.0


def main(argv: list[str] | None = None) -> int:
    """Save the model and data, then plan, write and run each case's launch folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (the dry run)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "gpu_out" / "gpu_job.json")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--run-timeout-s", type=float, default=RUN_TIMEOUT_S)
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    parser.add_argument("--only", nargs="*", help="labels of the cases to run (full, lora)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker == "save":
        return save_worker(json.loads(args.spec.read_text()))

    from bench.common import QUIET_ENV, BenchError, run_cmd
    from tools.core.settings import disable_telemetry

    disable_telemetry()
    start = time.monotonic()
    dry_run = args.device == "cpu"
    steps = args.steps or (TINY_STEPS if args.tiny else STEPS)
    seq = TINY_SEQ_LEN if args.tiny else SEQ_LEN
    work = args.out.parent / "gpu_job_runs"
    if work.exists():
        shutil.rmtree(work)  # a job folder left from a run before would resume its checkpoint
    work.mkdir(parents=True)
    model_dir, data_path = work / "model", work / "train.jsonl"
    config = dict(TINY_CONFIG) if args.tiny else _read_config(MODEL_CONFIG)
    report: dict[str, Any] = {
        "what": (
            "DRY RUN on CPU: the flow only; 'measured' is CPU RSS and CPU step times"
            if dry_run
            else "issue 19: the plan's launch.sh fine-tunes a saved 1.2B llama on one GPU"
        ),
        "dry_run": dry_run,
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"python": platform.python_version(), "host": platform.node()},
        "model": "tiny llama (2 layers)" if args.tiny else str(MODEL_CONFIG.relative_to(ROOT)),
        "predicted_for": TARGET,
        "seq_len": seq,
        "steps": steps,
        "warmup_steps": min(WARMUP_STEPS, steps - 1),
        "error_is": "predicted / measured - 1",
        "cases": [],
    }

    # The plans first (a fraction of a second): the dataset must cover the largest step.
    cases = [("full", "finetune"), ("lora", "lora")]
    cases = [c for c in cases if not args.only or c[0] in args.only]
    plans = {label: _plan(config, seq, task) for label, task in cases}
    tiny_batch = ["--micro-batch", str(TINY_MICRO_BATCH)] if args.tiny else []
    tokens_needed = max(
        (TINY_MICRO_BATCH if args.tiny else p["micro_batch_size"])
        * seq
        * p["gradient_accumulation_steps"]
        for p in plans.values()
    ) * (steps + 1)
    save_spec = {
        "device": args.device,
        "config": config,
        "model_dir": str(model_dir),
        "data": str(data_path),
        "tokens": tokens_needed,
        "result": str(work / "save.json"),
    }
    spec_path = work / "save.spec.json"
    spec_path.write_text(json.dumps(save_spec, indent=2))
    print(f"== saving the model and {tokens_needed:,}+ tokens of data", flush=True)
    env = {**os.environ, **QUIET_ENV, "PYTHONUNBUFFERED": "1"}
    try:
        done = run_cmd(
            [sys.executable, str(Path(__file__).resolve()), "--worker", "save", "--spec",
             str(spec_path)],
            timeout=SAVE_TIMEOUT_S, env=env, check=False,
        )  # fmt: skip
        save_tail, save_code = done.output[-3000:], done.returncode
    except BenchError as exc:
        save_tail, save_code = str(exc), None
    saved = _read_json(work / "save.json")
    report["saved"] = saved or {"status": "failed", "exit": save_code, "output_tail": save_tail}
    _write(args.out, report)
    if saved is None or save_code != 0:
        print(f"gpu_job: saving the model failed:\n{save_tail}", file=sys.stderr)
        return 2
    print(f"   {saved['params']:,} parameters, {saved['data_tokens']:,} tokens", flush=True)

    bin_dir = _shims(work)
    for label, task in cases:
        left = args.budget_s - (time.monotonic() - start)
        record: dict[str, Any] = {"label": label, "task": task}
        report["cases"].append(record)
        if left < 40:
            record.update(status="skipped", reason=f"time budget ({left:.0f} s left)")
            _write(args.out, report)
            continue
        print(f"== {label}", flush=True)
        job_dir = work / label
        record["prediction"] = _emit(job_dir, model_dir, seq, task, config)
        record["status"] = "predicted"
        _write(args.out, report)  # on disk before the job starts

        extra = ["--steps", str(steps), "--log-every", "1", *tiny_batch]
        record["command"] = ["bash", "launch.sh", *extra]
        run_env = _job_env(env, bin_dir, model_dir, data_path, args.device)
        timeout = min(args.run_timeout_s, left)
        t0 = time.monotonic()
        try:
            done = run_cmd(
                record["command"], timeout=timeout, env=run_env, cwd=job_dir, check=False
            )
            tail, code = done.output, done.returncode
        except BenchError as exc:
            tail, code = str(exc), None
        record["wall_s"] = round(time.monotonic() - t0, 1)
        record["exit"] = code
        (work / f"{label}.log").write_text(tail)
        for line in tail.splitlines()[-8:]:
            print("   " + line, flush=True)
        record["measured"] = _measured(job_dir, report["warmup_steps"])
        ok = code == 0 and record["measured"].get("status") == "ok"
        record["status"] = "ok" if ok else ("timeout" if code is None else "failed")
        if not ok:
            record["output_tail"] = tail[-2000:]
        _compare(record, dry_run)
        _write(args.out, report)
        print(f"   {_summary(record)}", flush=True)
    report["wall_s"] = round(time.monotonic() - start, 1)
    _write(args.out, report)
    print(f"wrote {args.out}")
    return 0 if all(c["status"] == "ok" for c in report["cases"]) else 1


def _read_config(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_") and k != "architectures"}


# --- planning: what the engineer role calls, in its order --------------------------------------


def _brief(model: str, seq: int, task: str) -> Any:
    from tools.core.schemas import MemoryRecipe, TrainingBrief

    return TrainingBrief(
        goal=f"issue 19 GPU job check ({task})",
        model=model,
        task=task,  # type: ignore[arg-type]
        seq_len=seq,
        hardware=TARGET,
        recipe=MemoryRecipe(lora_rank=LORA_RANK) if task == "lora" else None,
    )


def _plan_parts(model_ref: str | dict[str, Any], seq: int, task: str) -> tuple[Any, ...]:
    from tools.planning import search_strategy
    from tools.research.framework import follow_setup, select_framework
    from tools.research.hardware import parse_hardware
    from tools.research.model_catalog import lookup_model

    model = lookup_model(model_ref, seq)
    hardware = parse_hardware(TARGET)
    brief = _brief(model_ref if isinstance(model_ref, str) else model.name, seq, task)
    memory = search_strategy(model, hardware, brief)
    framework = follow_setup(select_framework(brief, hardware, model, memory), model, memory)
    return model, hardware, brief, memory, framework


def _plan(config: dict[str, Any], seq: int, task: str) -> dict[str, Any]:
    """The plan for the config before it is saved (its batch sizes the dataset)."""
    memory = _plan_parts(config, seq, task)[3]
    return {
        "micro_batch_size": memory.micro_batch_size,
        "gradient_accumulation_steps": memory.gradient_accumulation_steps,
    }


def _emit(
    job_dir: Path, model_dir: Path, seq: int, task: str, config: dict[str, Any]
) -> dict[str, Any]:
    """Plan for the saved folder, write its launch files; the prediction, as JSON."""
    from tools.artifacts.deepspeed_config import emit_deepspeed_config, planned_total_steps
    from tools.artifacts.launch import emit_launch
    from tools.planning.states import lora_adapter_params
    from tools.research.framework import DEEPSPEED_FRAMEWORKS

    # As plan_parallelism does (agents/toolkit.py): one search; a replicating framework keeps
    # a DDP choice as it is, which is what one GPU gets here.
    model, hardware, brief, memory, framework = _plan_parts(str(model_dir), seq, task)
    ds_config = None
    if framework.primary in DEEPSPEED_FRAMEWORKS:
        ds_config = emit_deepspeed_config(
            memory, model, hardware, brief, total_steps=planned_total_steps(brief),
            autotp=framework.primary == "deepspeed",
        )  # fmt: skip
    # The plan's default length: the run's --steps overrides it, the schedule stays the plan's.
    emit_launch(job_dir, brief, hardware, model, framework, ds_config, memory=memory)
    setup, speed = memory.setup, memory.speed
    return {
        "predicted_at": time.time(),
        "model": model.name,
        "params": model.params,
        "framework": framework.primary,
        "strategy": memory.chosen,
        "micro_batch_size": memory.micro_batch_size,
        "gradient_accumulation_steps": memory.gradient_accumulation_steps,
        "activation_checkpointing": memory.activation_checkpointing,
        "lora_rank": LORA_RANK if task == "lora" else None,
        # What the plan priced as trained: the adapters (peft's all-linear) or every parameter.
        "trainable_params": (
            lora_adapter_params(model, LORA_RANK) if task == "lora" else model.params
        ),
        "peak_allocated_bytes": setup.peak_allocated_bytes if setup else None,
        "peak_reserved_bytes": setup.peak_reserved_bytes if setup else None,
        "device_used_bytes": setup.device_used_bytes if setup else None,
        "terms_bytes": setup.per_gpu_bytes if setup else None,
        "step_time_s": speed.step_time_s if speed else None,
        "tokens_per_s": speed.tokens_per_s if speed else None,
        "tokens_per_step": speed.tokens_per_step if speed else None,
        "ds_config": ds_config,
        "launch_sh": (job_dir / "launch.sh").read_text(),
        "hf_config_vocab": config.get("vocab_size"),
    }


# --- running the job --------------------------------------------------------------------------


def _shims(work: Path) -> Path:
    """``deepspeed`` and ``torchrun`` commands for the launchers the machine lacks as scripts."""
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    modules = {"deepspeed": "deepspeed.launcher.runner", "torchrun": "torch.distributed.run"}
    for name, module in modules.items():
        if shutil.which(name):
            continue
        shim = bin_dir / name
        shim.write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" -m {module} "$@"\n')
        shim.chmod(0o755)
    return bin_dir


def _job_env(
    env: dict[str, str], bin_dir: Path, model_dir: Path, data: Path, device: str
) -> dict[str, str]:
    from tools.smoke.commands import free_port

    run_env = dict(env)
    # The launchers are found by name, as in a user's shell: the shims, then this python's bin.
    run_env["PATH"] = os.pathsep.join(
        [str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")]
    )
    run_env.update(
        MODEL_PATH=str(model_dir.resolve()),
        DATA=str(data.resolve()),
        # torchrun reads its --master_port default from PET_MASTER_PORT; a free one avoids 29500.
        PET_MASTER_PORT=str(free_port()),
        MASTER_PORT=str(free_port()),
    )
    if device == "cpu":
        run_env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return run_env


def _measured(job_dir: Path, warmup: int) -> dict[str, Any]:
    """What the job wrote: rank 0's metrics and its interval log."""
    rank0 = _read_json(job_dir / "metrics" / "rank0.json")
    if rank0 is None:
        return {"status": "failed", "reason": "no metrics/rank0.json"}
    rows = []
    log = job_dir / "metrics" / "metrics.jsonl"
    if log.exists():
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    times = [float(t) for t in rank0.get("step_times_s", [])]
    steady = times[warmup:] or times
    median = statistics.median(steady) if steady else None
    tokens = rank0.get("tokens_per_step")
    keep = (
        "status", "device", "device_name", "steps", "losses", "step_times_s", "tokens_per_step",
        "peak_memory_bytes", "process_gpu_memory_bytes", "baseline_memory_bytes",
        "allocated_at_start_bytes", "allocated_after_step1_bytes", "local_param_bytes",
        "params", "trainable_params", "micro_batch", "grad_accum", "seq_len", "lora_rank",
        "attn_implementation", "data_tokens", "torch",
    )  # fmt: skip
    out: dict[str, Any] = {k: rank0.get(k) for k in keep}
    out.update(
        status="ok" if rank0.get("status") == "ok" and len(times) > 0 else "failed",
        step_time_median_s=round(median, 4) if median else None,
        steady_steps=len(steady),
        tokens_per_s=round(tokens / median, 1) if median and tokens else None,
        logged_rows=len(rows),
        logged_tokens_per_s=[round(r["tokens_per_s"], 1) for r in rows if "tokens_per_s" in r],
    )
    if out["device"] == "cpu":
        out["measured_is"] = "DRY RUN: CPU peak RSS and CPU step times, not a GPU measurement"
    return out


def _compare(record: dict[str, Any], dry_run: bool) -> None:
    pred, run = record.get("prediction") or {}, record.get("measured") or {}
    if record["status"] != "ok":
        return
    # The plan's trained parameters are the job's (the dry run checks this too: it is exact).
    record["same_trainable_params"] = pred.get("trainable_params") == run.get("trainable_params")
    if dry_run:
        return
    pairs = {
        "error_peak_allocated": ("peak_allocated_bytes", "peak_memory_bytes"),
        "error_device_used": ("device_used_bytes", "process_gpu_memory_bytes"),
        "error_step_time": ("step_time_s", "step_time_median_s"),
        "error_tokens_per_s": ("tokens_per_s", "tokens_per_s"),
    }
    for key, (p, m) in pairs.items():
        if pred.get(p) and run.get(m):
            record[key] = round(pred[p] / run[m] - 1, 4)
    # The batch the plan priced is the batch that ran (else the comparison is of two jobs).
    record["same_batch"] = (run.get("micro_batch"), run.get("grad_accum")) == (
        pred.get("micro_batch_size"),
        pred.get("gradient_accumulation_steps"),
    )


def _summary(record: dict[str, Any]) -> str:
    if record["status"] != "ok":
        return f"{record['status']}: exit {record.get('exit')}"
    pred, run = record["prediction"], record["measured"]
    if run.get("device") == "cpu":
        return (
            f"dry run ok: {run['steps']} steps, median {run['step_time_median_s']:.3f} s on CPU; "
            f"predicted on the H200 {pred['peak_allocated_bytes'] / 2**30:.2f} GiB allocated, "
            f"{pred['step_time_s']:.3f} s/step"
        )
    return (
        f"ok: peak allocated {run['peak_memory_bytes'] / 2**30:.2f} GiB vs predicted "
        f"{pred['peak_allocated_bytes'] / 2**30:.2f} ({record.get('error_peak_allocated', 0):+.1%});"
        f" step {run['step_time_median_s']:.3f} s vs {pred['step_time_s']:.3f} s "
        f"({record.get('error_step_time', 0):+.1%})"
    )


# --- the save worker: model, tokenizer and data on disk -----------------------------------------


def _words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(n)]


def _sentences(rng: random.Random, count: int) -> list[str]:
    vocab = _words(rng, 3000)
    return [" ".join(rng.choices(vocab, k=rng.randint(6, 14))) + "." for _ in range(count)]


def save_worker(spec: dict[str, Any]) -> int:
    """Save the random-weight model (bf16 on CUDA), its tokenizer and the JSONL dataset."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    started = time.perf_counter()
    model_dir, data = Path(spec["model_dir"]), Path(spec["data"])
    rng = random.Random(0)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # Every token id must have an embedding row: the tiny model's vocab bounds the tokenizer's.
    vocab = min(TOKENIZER_VOCAB, int(spec["config"]["vocab_size"]))
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(_sentences(rng, 5000), trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(model_dir)

    # The dataset: records of a few sentences until the tokenizer counts enough tokens.
    tokens, records = 0, 0
    with open(data, "w") as fh:
        while tokens < spec["tokens"]:
            chunk = [" ".join(_sentences(rng, 8)) for _ in range(256)]
            tokens += sum(len(ids) for ids in fast(chunk)["input_ids"])
            records += len(chunk)
            fh.writelines(json.dumps({"text": text}) + "\n" for text in chunk)

    config = transformers.LlamaConfig(**spec["config"])
    config.bos_token_id, config.eos_token_id = fast.bos_token_id, fast.eos_token_id
    on_cuda = spec["device"] == "cuda" and torch.cuda.is_available()
    dtype = torch.bfloat16 if on_cuda else torch.float32
    torch.manual_seed(0)
    # Built in its dtype on the GPU: the random init of 1.2B parameters takes seconds there, not
    # a minute of CPU, and no fp32 copy is made (this process does nothing else).
    torch.set_default_dtype(dtype)
    with torch.device("cuda" if on_cuda else "cpu"):
        model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(model_dir, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    _write(
        Path(spec["result"]),
        {
            "status": "ok",
            "model_dir": str(model_dir),
            "params": params,
            "dtype": sorted({str(p.dtype) for p in model.parameters()}),
            "model_vocab": config.vocab_size,
            "tokenizer_vocab": len(fast),
            "safetensors_bytes": sum(p.stat().st_size for p in model_dir.glob("*.safetensors")),
            "data": str(data),
            "data_records": records,
            "data_tokens": tokens,
            "wall_s": round(time.perf_counter() - started, 1),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
