"""GPU recipes check (issue 18): five training recipes on one GPU, each predicted before it runs.

Run through ``bash bench/gpu/gpu_recipes.sh [OUT_DIR]`` on a GPU machine. Each case trains a
~1.1B llama-style model (bench/configs/llama-1.1b.json, random init on the GPU, Hugging Face
``LlamaForCausalLM`` with ``attn_implementation="sdpa"``) at seq 2048, micro-batch 2, in a
fresh subprocess with its own timeout:

1. ``pure-bf16``: a plain PyTorch loop, bf16 weights, no fp32 master, torch AdamW (fused),
   whose states follow the parameters' dtype; priced as recipe fsdp / pure-bf16, ``ddp``.
2. ``adam8bit``: the same with bitsandbytes' AdamW8bit (else torchao's); skipped, with the
   reason, where the machine has neither. Priced with optimizer ``adam8bit``.
3. ``grad-accum-4``: DeepSpeed ZeRO-2 bf16 (the planner's config, ``torch_adam``) with
   gradient_accumulation_steps 4; where DeepSpeed does not import, the plain loop with bf16
   autocast over fp32 weights, accumulating 4 micro-batches (recipe fsdp / bf16, ``ddp``).
4. ``fsdp2``: ``fully_shard`` per decoder layer and the root, MixedPrecisionPolicy(param_dtype
   bf16, reduce_dtype fp32), a process group of one; recipe fsdp / bf16, ``zero3``.
5. ``lora``: rank-16 adapters (alpha 32) on q/k/v/o/gate/up/down of the frozen bf16 base, fp32
   adapters under bf16 autocast (peft's default adapter dtype), fused AdamW on the adapters;
   peft where installed, else a small LoRA wrapper here. Task ``lora``, rank 16.

The order is the point: for every case the memory model's prediction (``estimate_strategy``:
allocated peak, reserved peak, device used) is computed and written to the JSON *before* the
case's process starts; that process reads the JSON back as its first act and records the
prediction it found (``run.prediction_on_disk``) and its start time. It then measures
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` from the first step on (peaks
reset after the model and optimizer are built) and, where NVML answers, the process's
device memory. ``error_*`` is predicted / measured - 1.

``--device cpu --tiny`` is a dry run of the whole flow on CPU (a 2-layer model, 2 steps, the
predictions still made for an H200 so the recipe code paths are the GPU ones); its "measured"
figure is the process's anonymous RSS above its baseline, labelled as such, and no error is
computed from it. The JSON is rewritten after every case, so a run stopped by its time limit
keeps what it did.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODEL_CONFIG = ROOT / "bench" / "configs" / "llama-1.1b.json"
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
    "tie_word_embeddings": False,
}
SEQ_LEN, TINY_SEQ_LEN = 2048, 64
MICRO_BATCH = 2
STEPS, TINY_STEPS = 6, 2
LORA_RANK, LORA_ALPHA = 16, 32
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LR = 1e-4
# The cases share this budget; each has its own timeout. About 30-45 s a case on an H200
# (interpreter and import start-up, a 1.1B init on the GPU, a few steps).
BUDGET_S = 300.0
CASE_TIMEOUT_S = 120.0
PROBE_TIMEOUT_S = 90.0
# The dry run's predictions are for this GPU (the recipe paths are GPU ones: on a CPU target
# the memory model prices everything as fp32).
DRY_RUN_TARGET = "H200"


@dataclass(frozen=True)
class Case:
    """One recipe: how it runs (``runner``) and how the memory model prices it."""

    label: str
    runner: str  # plain | deepspeed | fsdp2 | lora
    strategy: str
    task: str
    recipe: dict[str, Any]
    precision: str = "pure-bf16"  # what the runner trains in: pure-bf16 | bf16 (mixed)
    optimizer: str = "adamw"  # adamw | adam8bit
    accumulation: int = 1
    notes: tuple[str, ...] = field(default=())


def cases(deepspeed_ok: bool) -> list[Case]:
    """The five cases; ``grad-accum-4`` runs DeepSpeed where it imports, else the plain loop."""
    if deepspeed_ok:
        accum = Case(
            "grad-accum-4", "deepspeed", "zero2", "pretrain",
            {"framework": "deepspeed", "precision": "bf16", "gradient_accumulation_steps": 4},
            precision="bf16", accumulation=4,
            notes=("DeepSpeed ZeRO-2 bf16, the planner's config with torch_adam",),
        )  # fmt: skip
    else:
        accum = Case(
            "grad-accum-4", "plain", "ddp", "pretrain",
            {"framework": "fsdp", "precision": "bf16", "gradient_accumulation_steps": 4},
            precision="bf16", accumulation=4,
            notes=("DeepSpeed does not import here: plain loop, bf16 autocast over fp32",),
        )  # fmt: skip
    return [
        Case("pure-bf16", "plain", "ddp", "pretrain",
             {"framework": "fsdp", "precision": "pure-bf16"}),
        Case("adam8bit", "plain", "ddp", "pretrain",
             {"framework": "fsdp", "precision": "pure-bf16", "optimizer": "adam8bit"},
             optimizer="adam8bit"),
        accum,
        Case("fsdp2", "fsdp2", "zero3", "pretrain",
             {"framework": "fsdp", "precision": "bf16"}, precision="bf16"),
        Case("lora", "lora", "ddp", "lora",
             {"framework": "fsdp", "precision": "bf16", "lora_rank": LORA_RANK},
             precision="bf16"),
    ]  # fmt: skip


# --- the driver: predict, write, run, measure ---------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Predict and run every case that fits the time budget, writing the JSON after each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model (the dry run)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "gpu_out" / "gpu_recipes.json")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    parser.add_argument("--case-timeout-s", type=float, default=CASE_TIMEOUT_S)
    parser.add_argument("--only", nargs="*", help="labels of the cases to run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.spec)

    from bench.common import BenchError, run_cmd
    from tools.core.settings import disable_telemetry

    disable_telemetry()
    start = time.monotonic()
    dry_run = args.device == "cpu"
    steps = args.steps or (TINY_STEPS if args.tiny else STEPS)
    seq = TINY_SEQ_LEN if args.tiny else SEQ_LEN
    config = dict(TINY_CONFIG) if args.tiny else _read_config(MODEL_CONFIG)
    work = args.out.parent / "gpu_recipes_runs"
    work.mkdir(parents=True, exist_ok=True)
    config_path = work / "model_config.json"
    config_path.write_text(json.dumps(config, indent=2))

    probe = _probe(args.device, work, run_cmd, BenchError)
    if probe.get("status") != "ok":
        print(f"gpu_recipes: the probe failed: {probe}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "what": (
            "DRY RUN on CPU: the flow only; 'measured' is CPU RSS, not a measurement of the recipes"
            if dry_run
            else "issue 18 recipes on one GPU, predicted before each run"
        ),
        "dry_run": dry_run,
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {**probe["machine"], "python": platform.python_version()},
        "libraries": probe["libraries"],
        "model": "tiny llama (2 layers)" if args.tiny else str(MODEL_CONFIG.relative_to(ROOT)),
        "seq_len": seq,
        "micro_batch_size": MICRO_BATCH,
        "steps": steps,
        "error_is": "predicted / measured - 1",
        "cases": [],
    }
    model_spec, hardware = _prediction_inputs(config, seq, probe, dry_run)
    report["predicted_for"] = hardware.gpu.name if hardware.gpu else "cpu"
    _write(args.out, report)
    for case in cases(bool(probe["libraries"].get("deepspeed"))):
        if args.only and case.label not in args.only:
            continue
        left = args.budget_s - (time.monotonic() - start)
        record: dict[str, Any] = {
            "label": case.label,
            "runner": case.runner,
            "notes": list(case.notes),
        }
        report["cases"].append(record)
        if left < 30:
            record["status"] = "skipped"
            record["reason"] = f"time budget ({left:.0f} s left)"
            _write(args.out, report)
            continue
        print(f"== {case.label}", flush=True)
        record["prediction"] = _predict(case, model_spec, hardware, seq)
        record["status"] = "predicted"
        _write(args.out, report)  # on disk before the case's process exists

        spec = {
            "label": case.label,
            "runner": case.runner,
            "precision": case.precision,
            "optimizer": case.optimizer,
            "accumulation": case.accumulation,
            "device": args.device,
            "model_config": str(config_path),
            "seq_len": seq,
            "micro_batch_size": MICRO_BATCH,
            "steps": steps * case.accumulation,
            "prediction_file": str(args.out),
            "result": str(work / f"{case.label}.json"),
            "ds_config": _ds_config(model_spec, hardware, case)
            if case.runner == "deepspeed"
            else None,
        }
        spec_path = work / f"{case.label}.spec.json"
        spec_path.write_text(json.dumps(spec, indent=2))
        Path(spec["result"]).unlink(missing_ok=True)
        case_start = time.monotonic()
        timeout = min(args.case_timeout_s, left)
        try:
            done = run_cmd(
                [sys.executable, str(Path(__file__).resolve()), "--worker", case.label,
                 "--spec", str(spec_path)],
                timeout=timeout, env=_worker_env(), check=False,
            )  # fmt: skip
            tail, code = done.output[-3000:], done.returncode
        except BenchError as exc:
            tail, code = str(exc), None
        record["wall_s"] = round(time.monotonic() - case_start, 1)
        (work / f"{case.label}.log").write_text(tail)
        for line in tail.splitlines()[-6:]:
            print("   " + line, flush=True)
        run = _read_json(Path(spec["result"]))
        if run is None:
            record["status"] = "timeout" if code is None else "failed"
            record["reason"] = (
                f"exit {code}" if code is not None else f"timed out after {timeout:.0f} s"
            )
            record["output_tail"] = tail[-1500:]
        else:
            record["run"] = run
            record["status"] = run.get("status", "failed")
            if code not in (0, None) and record["status"] == "ok":
                record["status"] = "failed"
            if record["status"] != "ok":
                record["output_tail"] = tail[-1500:]
            _compare(record, dry_run)
        _write(args.out, report)
        print(f"   {_summary(record)}", flush=True)
    report["wall_s"] = round(time.monotonic() - start, 1)
    _write(args.out, report)
    print(f"wrote {args.out}")
    return 0


def _read_config(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_") and k != "architectures"}


def _probe(device: str, work: Path, run_cmd: Any, bench_error: type[Exception]) -> dict[str, Any]:
    """The machine and which optional libraries import, asked of a worker-like process."""
    spec_path = work / "probe.spec.json"
    result = work / "probe.json"
    result.unlink(missing_ok=True)
    spec_path.write_text(json.dumps({"device": device, "result": str(result)}))
    try:
        done = run_cmd(
            [sys.executable, str(Path(__file__).resolve()), "--worker", "probe", "--spec",
             str(spec_path)],
            timeout=PROBE_TIMEOUT_S, env=_worker_env(), check=False,
        )  # fmt: skip
        output = done.output
    except bench_error as exc:
        return {"status": "timeout", "output": str(exc)}
    data = _read_json(result)
    return data if data else {"status": "failed", "output": output[-2000:]}


def _prediction_inputs(
    config: dict[str, Any], seq: int, probe: dict[str, Any], dry_run: bool
) -> tuple[Any, Any]:
    from tools.core.schemas import HardwareSpec
    from tools.research.hardware import find_gpu
    from tools.research.model_catalog import lookup_model

    model = lookup_model(config, seq)
    gpu = find_gpu(DRY_RUN_TARGET if dry_run else str(probe["machine"]["gpu"]))
    hardware = HardwareSpec(source="local", nodes=1, gpus_per_node=1, gpu=gpu)
    return model, hardware


def _predict(case: Case, model: Any, hardware: Any, seq: int) -> dict[str, Any]:
    """The memory model's figures for ``case``, stamped with the time they were made."""
    from tools.planning import estimate_strategy
    from tools.planning.recipe import Recipe

    recipe = Recipe(**case.recipe)
    est = estimate_strategy(
        model,
        hardware,
        case.strategy,  # type: ignore[arg-type]
        task=case.task,  # type: ignore[arg-type]
        seq_len=seq,
        micro_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=case.accumulation if case.accumulation > 1 else None,
        lora_rank=LORA_RANK,
        recipe=recipe,
    )
    b = est.per_gpu_bytes
    return {
        "predicted_at": time.time(),
        "strategy": case.strategy,
        "task": case.task,
        "recipe": case.recipe,
        "peak_allocated_bytes": b.peak_allocated,
        "peak_reserved_bytes": b.peak_reserved,
        "device_used_bytes": b.device_used,
        "terms_bytes": {
            "params": b.params,
            "gradients": b.gradients,
            "optimizer": b.optimizer,
            "activations": b.activations,
            "buffers": b.buffers,
        },
        "fits": est.fits,
        "notes": est.notes,
    }


def _ds_config(model: Any, hardware: Any, case: Case) -> dict[str, Any]:
    """The planner's ZeRO config for one GPU, adapted as the smoke runner adapts it."""
    from tools.artifacts.deepspeed_config import smoke_ds_config
    from tools.smoke.ds_adapt import adapt_ds_config

    planned = smoke_ds_config(
        model, case.strategy, world_size=1, micro_batch_size=MICRO_BATCH, gpu=hardware.gpu
    )
    assert planned is not None
    # On CUDA: bf16 kept; the dry run's CPU worker drops it as job_deepspeed.py does.
    cfg, _notes = adapt_ds_config(
        planned, device="cuda", ranks=1, micro_batch_size=MICRO_BATCH, scaled=model, lr=LR
    )
    cfg["gradient_accumulation_steps"] = case.accumulation
    cfg["train_batch_size"] = MICRO_BATCH * case.accumulation
    return cfg


def _worker_env() -> dict[str, str]:
    from bench.common import QUIET_ENV

    env = dict(os.environ)
    env.update(QUIET_ENV)
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
        }
    )
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _compare(record: dict[str, Any], dry_run: bool) -> None:
    run, pred = record.get("run") or {}, record.get("prediction") or {}
    if record["status"] != "ok" or dry_run:
        return
    pairs = {
        "error_allocated": ("peak_allocated_bytes", "max_memory_allocated_bytes"),
        "error_reserved": ("peak_reserved_bytes", "max_memory_reserved_bytes"),
        "error_device_used": ("device_used_bytes", "process_gpu_memory_bytes"),
    }
    for key, (p, m) in pairs.items():
        if pred.get(p) and run.get(m):
            record[key] = round(pred[p] / run[m] - 1, 4)


def _summary(record: dict[str, Any]) -> str:
    if record["status"] != "ok":
        return f"{record['status']}: {record.get('reason') or (record.get('run') or {}).get('reason', '')}"
    run, pred = record["run"], record["prediction"]
    if run.get("device") == "cpu":
        return (
            f"dry run ok: predicted {pred['peak_allocated_bytes'] / 2**20:.1f} MiB allocated on "
            f"the GPU; CPU RSS above baseline {run['cpu_rss_above_baseline_bytes'] / 2**20:.1f} MiB"
        )
    return (
        f"ok: allocated {run['max_memory_allocated_bytes'] / 2**30:.2f} GiB vs predicted "
        f"{pred['peak_allocated_bytes'] / 2**30:.2f} ({record.get('error_allocated', 0):+.1%}); "
        f"reserved {run['max_memory_reserved_bytes'] / 2**30:.2f} vs "
        f"{pred['peak_reserved_bytes'] / 2**30:.2f} ({record.get('error_reserved', 0):+.1%})"
    )


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, path)


# --- the worker: one case in its own process --------------------------------------------------


def worker(label: str, spec_path: Path) -> int:
    """Run one case (or the probe) from its spec file and write its result JSON."""
    started_at = time.time()
    spec = json.loads(spec_path.read_text())
    result_path = Path(spec["result"])
    if label == "probe":
        _write(result_path, _probe_here(spec["device"]))
        return 0
    # First act: read back the prediction the driver wrote for this case.
    seen = None
    on_disk = _read_json(Path(spec["prediction_file"])) or {}
    for rec in on_disk.get("cases", []):
        if rec.get("label") == label and rec.get("prediction"):
            pred = rec["prediction"]
            seen = {k: pred.get(k) for k in ("predicted_at", "peak_allocated_bytes",
                                             "peak_reserved_bytes")}  # fmt: skip
    result: dict[str, Any] = {
        "label": label,
        "started_at": started_at,
        "prediction_on_disk": seen,
        "device": spec["device"],
    }
    try:
        result.update(_run_case(spec))
    except _Skip as skip:
        result.update(status="skipped", reason=str(skip))
    except Exception as exc:  # the record says what failed; the driver carries on
        import torch

        oom = isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)
        result.update(
            status="oom" if oom else "failed", reason=f"{type(exc).__name__}: {exc}"[:800]
        )
        if spec["device"] == "cuda" and torch.cuda.is_available():
            result.update(_cuda_peaks())
        _write(result_path, result)
        raise
    result["finished_at"] = time.time()
    _write(result_path, result)
    return 0


class _Skip(Exception):
    """The case cannot run on this machine (a library it needs is missing)."""


def _probe_here(device: str) -> dict[str, Any]:
    import torch
    import transformers

    if device == "cuda" and not torch.cuda.is_available():
        return {"status": "failed", "reason": "no CUDA device"}
    machine: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        machine.update(gpu=torch.cuda.get_device_name(0), gpu_memory_bytes=props.total_memory)
    else:
        machine.update(gpu=None, cpu=platform.processor() or platform.machine())
    libraries: dict[str, Any] = {}
    for name in ("deepspeed", "bitsandbytes", "torchao", "peft", "pynvml"):
        try:
            module = __import__(name)
            libraries[name] = str(getattr(module, "__version__", "yes"))
        except Exception as exc:  # not installed, or installed and broken: either way not used
            libraries[name] = None
            libraries[f"{name}_why_not"] = f"{type(exc).__name__}: {exc}"[:200]
    return {"status": "ok", "machine": machine, "libraries": libraries}


def _run_case(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["optimizer"] == "adam8bit" and not any(
        importlib.util.find_spec(name) for name in ("bitsandbytes", "torchao")
    ):
        raise _Skip("no 8-bit Adam on this machine (neither bitsandbytes nor torchao installed)")
    import torch

    anon_rss_bytes = _script_module("harness").anon_rss_bytes
    build_model = _script_module("job_model").build_model
    process_gpu_memory_bytes = _script_module("job_probes").process_gpu_memory_bytes
    on_cuda = spec["device"] == "cuda"
    device = torch.device("cuda", 0) if on_cuda else torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    config = json.loads(Path(spec["model_config"]).read_text())
    runner, precision = spec["runner"], spec["precision"]
    accumulation = int(spec["accumulation"])
    info: dict[str, Any] = {"runner": runner, "precision": precision}
    baseline = 0 if on_cuda else _cpu_baseline(config, build_model, anon_rss_bytes)
    half = torch.bfloat16
    ctx: Any = contextlib.nullcontext
    engine = None
    with torch.device(device):
        model = build_model(config, "sdpa")  # fp32 weights, random init on the device
    if runner == "deepspeed":
        engine, step_fn = _deepspeed(model, spec, on_cuda, info)
    elif runner == "fsdp2":
        step_fn = _fsdp2(model, device, on_cuda, info)
    elif runner == "lora":
        model.to(half)
        for p in model.parameters():
            p.requires_grad_(False)
        _add_lora(model, info)
        step_fn = _adamw(model, on_cuda, info)
        ctx = _autocast(device)
    else:  # plain
        if precision == "pure-bf16":
            model.to(half)
        else:
            ctx = _autocast(device)
        if spec["optimizer"] == "adam8bit":
            step_fn = _adam8bit(model, on_cuda, info)
        else:
            step_fn = _adamw(model, on_cuda, info)
    info["params"] = sum(p.numel() for p in model.parameters())
    info["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    info["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    gc.collect()
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # init's freed blocks (e.g. the fp32 copy before .to(bf16))
        torch.cuda.reset_peak_memory_stats(device)
        info["allocated_before_step1_bytes"] = int(torch.cuda.memory_allocated(device))
    vocab = int(config["vocab_size"])
    gen = torch.Generator().manual_seed(1)
    losses: list[float] = []
    step_times: list[float] = []
    rss_peak = 0
    model.train()
    for step in range(1, int(spec["steps"]) + 1):
        batch = torch.randint(0, vocab, (int(spec["micro_batch_size"]), int(spec["seq_len"])),
                              generator=gen).to(device)  # fmt: skip
        t0 = time.perf_counter()
        if engine is not None:
            loss = engine(input_ids=batch, labels=batch).loss
            rss_peak = max(rss_peak, 0 if on_cuda else anon_rss_bytes())
            engine.backward(loss)
            engine.step()
        else:
            with ctx():
                loss = model(input_ids=batch, labels=batch).loss
            rss_peak = max(rss_peak, 0 if on_cuda else anon_rss_bytes())
            (loss / accumulation).backward()
            rss_peak = max(rss_peak, 0 if on_cuda else anon_rss_bytes())
            if step % accumulation == 0:
                step_fn()
        rss_peak = max(rss_peak, 0 if on_cuda else anon_rss_bytes())
        if on_cuda:
            torch.cuda.synchronize()
            if step == accumulation:
                info["allocated_after_first_update_bytes"] = int(torch.cuda.memory_allocated())
        step_times.append(round(time.perf_counter() - t0, 4))
        losses.append(round(float(loss.detach().float().item()), 4))
        print(
            f"step {step}/{spec['steps']} loss {losses[-1]:.4f} {step_times[-1]:.2f}s", flush=True
        )
    ok = all(v == v and abs(v) != float("inf") for v in losses)
    out: dict[str, Any] = {
        "status": "ok" if ok else "failed",
        "reason": None if ok else "non-finite loss",
        "micro_steps": len(losses),
        "accumulation": accumulation,
        "losses": losses,
        "step_times_s": step_times,
        **info,
    }
    if on_cuda:
        out.update(_cuda_peaks())
        out["process_gpu_memory_bytes"] = process_gpu_memory_bytes(device)
        free, total = torch.cuda.mem_get_info(device)
        out["device_used_now_bytes"] = int(total - free)
    else:
        out["measured_is"] = "DRY RUN: CPU anonymous RSS above baseline, not a GPU measurement"
        out["cpu_rss_above_baseline_bytes"] = max(0, rss_peak - baseline)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return out


def _script_module(name: str) -> Any:
    """A module of the training script (tools/smoke/scripts/), imported as train.py imports it.

    Its folder goes first on sys.path; torch and transformers only, no package init of ours.
    """
    scripts = str(ROOT / "tools" / "smoke" / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    return importlib.import_module(name)


def _cuda_peaks() -> dict[str, int]:
    import torch

    return {
        "max_memory_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "max_memory_reserved_bytes": int(torch.cuda.max_memory_reserved()),
    }


def _cpu_baseline(config: dict[str, Any], build_model: Any, anon_rss_bytes: Any) -> int:
    import torch

    with torch.device("meta"):
        build_model(config, "sdpa")  # imports the modeling code before the baseline
    return int(anon_rss_bytes())


def _autocast(device: Any) -> Any:
    import torch

    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def _adamw(model: Any, on_cuda: bool, info: dict[str, Any]) -> Any:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    # Fused on CUDA, as torchtitan, the HF Trainer (adamw_torch_fused) and DeepSpeed run it.
    kind = {"fused": True} if on_cuda else {"foreach": False}
    optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0, **kind)
    info["optimizer"] = f"torch.optim.AdamW ({'fused' if on_cuda else 'for-loop'})"
    return _stepper(optimizer)


def _adam8bit(model: Any, on_cuda: bool, info: dict[str, Any]) -> Any:
    params = [p for p in model.parameters() if p.requires_grad]
    why: list[str] = []
    if on_cuda and importlib.util.find_spec("bitsandbytes"):
        try:
            import bitsandbytes as bnb

            optimizer = bnb.optim.AdamW8bit(params, lr=LR, weight_decay=0.0)
            info["optimizer"] = f"bitsandbytes {bnb.__version__} AdamW8bit"
            return _stepper(optimizer)
        except Exception as exc:  # a broken install: try torchao, else skip
            why.append(f"bitsandbytes: {type(exc).__name__}: {exc}"[:200])
    elif not on_cuda:
        why.append("bitsandbytes: CUDA only here")
    else:
        why.append("bitsandbytes not installed")
    if importlib.util.find_spec("torchao"):
        try:
            try:
                from torchao.optim import AdamW8bit
            except ImportError:
                from torchao.prototype.low_bit_optim import AdamW8bit  # older torchao
            import torchao

            optimizer = AdamW8bit(params, lr=LR, weight_decay=0.0)
            info["optimizer"] = f"torchao {torchao.__version__} AdamW8bit"
            return _stepper(optimizer)
        except Exception as exc:
            why.append(f"torchao: {type(exc).__name__}: {exc}"[:200])
    else:
        why.append("torchao not installed")
    raise _Skip("no 8-bit Adam on this machine (" + "; ".join(why) + ")")


def _stepper(optimizer: Any) -> Any:
    def step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _add_lora(model: Any, info: dict[str, Any]) -> None:
    """Rank-16 adapters on every projection: peft where it imports, else ``LoRALinear`` here."""
    import torch

    try:
        import peft

        cfg = peft.LoraConfig(
            r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=list(LORA_TARGETS)
        )
        peft.inject_adapter_in_model(cfg, model)
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)
            if "lora_" in name:
                p.data = p.data.float()  # peft's default adapter dtype (autocast_adapter_dtype)
        info["lora"] = f"peft {peft.__version__}"
        return
    except Exception as exc:  # not installed, or at odds with this transformers: our own layer
        info["lora_peft_why_not"] = f"{type(exc).__name__}: {exc}"[:200]
    wrapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in LORA_TARGETS and isinstance(child, torch.nn.Linear):
                setattr(module, name, _wrap_lora(child))
                wrapped += 1
    info["lora"] = f"bench/gpu/gpu_recipes.py LoRALinear on {wrapped} linears"


def _lora_class() -> Any:
    import torch

    class LoRALinear(torch.nn.Module):
        """``base(x) + B(A(x)) * alpha / r`` with a frozen base; B starts at zero (Hu et al.)."""

        def __init__(self, base: torch.nn.Linear) -> None:
            super().__init__()
            self.base = base
            device = base.weight.device
            self.lora_A = torch.nn.Linear(base.in_features, LORA_RANK, bias=False, device=device)
            self.lora_B = torch.nn.Linear(LORA_RANK, base.out_features, bias=False, device=device)
            torch.nn.init.zeros_(self.lora_B.weight)
            self.scale = LORA_ALPHA / LORA_RANK

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + self.lora_B(self.lora_A(x)) * self.scale

    return LoRALinear


def _wrap_lora(base: Any) -> Any:
    return _lora_class()(base)


def _fsdp2(model: Any, device: Any, on_cuda: bool, info: dict[str, Any]) -> Any:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.distributed.init_process_group(backend="nccl" if on_cuda else "gloo")
    mesh = init_device_mesh(device.type, (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    info["fsdp"] = "fully_shard per decoder layer + root, bf16 params, fp32 reduce, world 1"
    return _adamw(model, on_cuda, info)


def _deepspeed(model: Any, spec: dict[str, Any], on_cuda: bool, info: dict[str, Any]) -> Any:
    import deepspeed

    job_deepspeed = _script_module("job_deepspeed")
    cfg = job_deepspeed.adapt_precision(dict(spec["ds_config"]), on_cuda)
    job_deepspeed.skip_shm_comm_build()
    deepspeed.init_distributed()
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=cfg
    )
    info["deepspeed"] = deepspeed.__version__
    info["ds_config"] = cfg
    return engine, None


if __name__ == "__main__":
    sys.exit(main())
