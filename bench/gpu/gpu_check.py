"""GPU check: real DeepSpeed smoke runs on one GPU, measured against the planner's prediction.

Run through ``bash bench/gpu/gpu_check.sh [OUT_DIR]`` on a GPU machine (it installs DeepSpeed and
its missing requirements from the wheels in ``.whl/`` when they are not installed). Each case
is a 30-step smoke run of the real architecture at full size (tools/smoke/predict.py
``_fits_local_gpu`` decides: full size when the planner says it fits the GPU with 10% free),
bf16, one rank. For each case the JSON holds the smoke result (losses, step time, tokens/s,
MFU, ``torch.cuda.max_memory_allocated``, the NVML per-process reading) and the planner's
figures for the same shape:

- ``predicted_tensor_bytes``: the memory model's total without the CUDA context and the 10%
  fragmentation margin, like for like with ``max_memory_allocated`` (tensors only);
- ``predicted_total_bytes``: the full per-GPU estimate (context and margin included), to set
  beside the NVML reading, which includes the context and the allocator's cache.

The JSON is rewritten after every case, so a run stopped by its time limit keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# (label, model, strategy, micro-batch, seq len, attention kernel, activation checkpointing)
CASES: list[tuple[str, str, str, int, int, str | None, bool]] = [
    ("gpt2-medium zero2", "gpt2-medium", "zero2", 8, 1024, None, False),
    ("gpt2-medium zero3", "gpt2-medium", "zero3", 8, 1024, None, False),
    ("llama-1.1b zero2", "bench/configs/llama-1.1b.json", "zero2", 4, 2048, None, False),
    ("llama-1.1b zero3", "bench/configs/llama-1.1b.json", "zero3", 4, 2048, None, False),
    ("llama-1.1b zero2 eager", "bench/configs/llama-1.1b.json", "zero2", 4, 2048, "eager", False),
    ("gpt2-medium ddp", "gpt2-medium", "ddp", 8, 1024, None, False),
]
# Cases the memory model was not fitted on (other families, ZeRO-1, checkpointing):
# ``--cases validation``.
VALIDATION_CASES: list[tuple[str, str, str, int, int, str | None, bool]] = [
    ("qwen2.5-0.5b zero2", "qwen2.5-0.5b", "zero2", 8, 2048, None, False),
    ("gpt2-large zero1", "gpt2-large", "zero1", 4, 1024, None, False),
    ("llama-1.1b zero2 ckpt", "bench/configs/llama-1.1b.json", "zero2", 8, 2048, None, True),
    ("phi-3-mini zero2 ckpt", "phi-3-mini", "zero2", 4, 2048, None, True),
]
BUDGET_S = 420.0
CASE_TIMEOUT_S = 150.0


def main() -> int:
    """Run every case that fits the time budget and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "gpu_out" / "gpu_check.json")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    parser.add_argument("--only", nargs="*", help="labels of the cases to run")
    parser.add_argument(
        "--cases", choices=("check", "validation"), default="check", help="which case set"
    )
    args = parser.parse_args()

    import deepspeed
    import torch
    import transformers

    from tools.artifacts.deepspeed_config import smoke_ds_config
    from tools.core.settings import Settings, disable_telemetry
    from tools.research.hardware import profile_local
    from tools.research.model_catalog import lookup_model
    from tools.smoke import DeepSpeedRun, SmokeSpec, TorchrunRun, run_smoke_test, stop_on_sigterm

    disable_telemetry()
    stop_on_sigterm()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing to check", file=sys.stderr)
        return 2
    hardware = profile_local()
    settings = Settings.load()
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "gpu": torch.cuda.get_device_name(0),
            "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
            "catalog_gpu": hardware.gpu.name if hardware.gpu else None,
            "bf16_tflops": hardware.gpu.bf16_tflops if hardware.gpu else None,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "deepspeed": deepspeed.__version__,
        },
        "cases": [],
    }
    start = time.monotonic()
    run_root = args.out.parent / "gpu_check_runs"
    cases = VALIDATION_CASES if args.cases == "validation" else CASES
    report["cases_set"] = args.cases
    for label, model_ref, strategy, micro, seq, attn, ckpt in cases:
        if args.only and label not in args.only:
            continue
        left = args.budget_s - (time.monotonic() - start)
        if left < 60:
            report["cases"].append({"label": label, "skipped": f"time budget ({left:.0f} s left)"})
            continue
        print(f"== {label}", flush=True)
        model = lookup_model(model_ref, seq)
        config = smoke_ds_config(
            model,
            strategy,
            world_size=1,
            micro_batch_size=micro,
            gpu=hardware.gpu,
            activation_checkpointing=ckpt,
        )
        case_start = time.monotonic()
        spec = SmokeSpec(
            mode=DeepSpeedRun(config) if config is not None else TorchrunRun(),  # ddp: torchrun
            steps=args.steps,
            micro_batch_size=micro,
            seq_len=seq,
            world_size=1,
            strategy=strategy,
            run_dir=run_root / label.replace(" ", "-"),
            timeout_s=min(CASE_TIMEOUT_S, left),
            attn_implementation=attn,
        )
        result = run_smoke_test(
            model, spec, settings, on_progress=lambda line: print("  " + line, flush=True)
        )
        case: dict[str, Any] = {
            "label": label,
            "model": model.name,
            "params": model.params,
            "strategy": strategy,
            "micro_batch_size": micro,
            "seq_len": seq,
            "wall_s": round(time.monotonic() - case_start, 1),
            "result": result.model_dump(mode="json"),
        }
        if result.model_shape:
            case["predicted_tensor_bytes"] = result.predicted_peak_memory_bytes
            case["predicted_total_bytes"] = _full_estimate(result, hardware.gpu)
        report["cases"].append(case)
        _write(args.out, report)
        gap = f"{result.memory_gap:+.1%}" if result.memory_gap is not None else "-"
        mfu = f"{result.mfu:.1%}" if result.mfu is not None else "-"
        print(
            f"   {result.status}: step {result.step_time_s or 0:.3f} s, MFU {mfu}, "
            f"peak {(result.peak_memory_bytes or 0) / 2**30:.2f} GiB vs predicted "
            f"{(result.predicted_peak_memory_bytes or 0) / 2**30:.2f} GiB ({gap})",
            flush=True,
        )
    report["wall_s"] = round(time.monotonic() - start, 1)
    _write(args.out, report)
    print(f"wrote {args.out}")
    return 0


def _full_estimate(result: Any, gpu: Any) -> int:
    from tools.core.schemas import HardwareSpec
    from tools.planning import estimate_strategy
    from tools.smoke import shape_spec

    shape = result.model_shape
    hardware = HardwareSpec(source="local", nodes=1, gpus_per_node=1, gpu=gpu)
    est = estimate_strategy(
        shape_spec(shape),
        hardware,
        result.strategy,
        task="pretrain",
        precision="bf16",
        micro_batch_size=int(shape.get("micro_batch_size", 1)),
        seq_len=int(shape["seq_len"]),
        attention="eager" if shape.get("attn_implementation") == "eager" else "sdpa",
        activation_checkpointing=bool(shape.get("activation_checkpointing")),
    )
    return int(est.per_gpu_bytes.total)


def _write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
