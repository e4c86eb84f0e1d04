"""Where a CPU rank's memory goes: RssAnon at the points a smoke run samples, per rank.

``python bench/calibration/cpu_rank_probe.py --model gpt2 --strategy zero1`` builds the smoke run's scaled
model (tools/smoke/scale.py), takes the smoke baseline (tools/smoke/scripts/job_probes.py
``cpu_baseline_bytes``: after the process group and the model's code), then prints, per rank,
anonymous RSS above it after the model, after ``deepspeed.initialize`` (or the DDP wrap and
AdamW) and after each forward, backward and optimizer step, with the environment the smoke
run gives its ranks (tools/smoke/commands.py: DS_ACCELERATOR=cpu, MALLOC_MMAP_THRESHOLD_,
OMP threads split). ``--trace`` adds RssAnon around DeepSpeedEngine's set-up methods, which
is how tools/planning/host_ranks.py ``ZERO_IMPORT_BYTES`` was found. The constants in
host_ranks.py come from this script's output.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ds_config(stage: int) -> dict[str, Any]:
    """The smoke run's DeepSpeed config at ZeRO ``stage`` (as tools/smoke writes it for CPU)."""
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 65536,
    }
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=58982, stage3_param_persistence_threshold=2560)
    return {
        "train_batch_size": 2,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**9,
        "zero_optimization": zero,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1, "torch_adam": True},
        },
        "gradient_clipping": 1.0,
    }


def launch(model: str, strategy: str, steps: int, trace: bool, timeout: float) -> int:
    """Run this script's rank half on 2 CPU ranks under DeepSpeed's launcher or torchrun."""
    sys.path.insert(0, str(ROOT))
    from tools.research.model_catalog import lookup_model
    from tools.smoke.scale import llama_config_from_shape, scale_model_config

    if Path(model).is_file():
        hf = json.loads(Path(model).read_text())
    else:
        spec = lookup_model(model, 64)
        hf = spec.hf_config or llama_config_from_shape(spec)
    config, shape = scale_model_config(hf, seq_len=64)
    with tempfile.TemporaryDirectory(prefix="cpu-rank-probe-") as tmp:
        cfg = Path(tmp) / "model.json"
        cfg.write_text(json.dumps(config))
        ds = Path(tmp) / "ds.json"
        ds.write_text(
            json.dumps({"mode": "ddp"} if strategy == "ddp" else _ds_config(int(strategy[-1])))
        )
        env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1")
        env.update(
            MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // 2))
        )
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        port = str(_free_port())
        rank_args = [__file__, "--rank-half", str(cfg), str(ds), str(steps)] + (
            ["--trace"] if trace else []
        )
        if strategy == "ddp":
            argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
            argv += ["--master_port", port, *rank_args]
        else:
            argv = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2"]
            argv += ["--master_addr", "127.0.0.1", "--master_port", port, *rank_args]
        print(
            f"model {model}: {shape['params']:,} parameters ({4 * shape['params'] / MiB:.2f} MiB fp32)"
        )
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            print("timed out")
            return 1
        for line in out.splitlines():
            if line.startswith(("RANK", "TRACE")):
                print(line)
        return proc.returncode


def rank_half(cfg_path: str, ds_path: str, steps: int, trace: bool) -> None:
    """One rank: the smoke run's baseline, then RssAnon above it at each sample point."""
    import deepspeed
    import torch

    sys.path.insert(0, str(ROOT / "tools" / "smoke" / "scripts"))
    import harness
    import job_data
    import job_deepspeed
    import job_model
    import job_probes

    cfg = json.loads(Path(cfg_path).read_text())
    ds = json.loads(Path(ds_path).read_text())
    ddp = ds.get("mode") == "ddp"
    job_deepspeed.skip_shm_comm_build()
    if ddp:
        torch.distributed.init_process_group(backend="gloo")
    else:
        deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    base = job_probes.cpu_baseline_bytes(cfg)
    marks: list[tuple[str, int]] = []

    def mark(name: str) -> None:
        marks.append((name, harness.anon_rss_bytes() - base))

    if trace and not ddp and rank == 0:
        from deepspeed.runtime.engine import DeepSpeedEngine

        def wrap(name: str) -> None:
            f = getattr(DeepSpeedEngine, name)

            @functools.wraps(f)
            def g(*a: Any, **k: Any) -> Any:
                before = harness.anon_rss_bytes() - base
                out = f(*a, **k)
                after = harness.anon_rss_bytes() - base
                print(f"TRACE DeepSpeedEngine.{name}: {before / MiB:.1f} -> {after / MiB:.1f} MiB")
                return out

            setattr(DeepSpeedEngine, name, g)

        for name in ("_configure_distributed_model", "_configure_basic_optimizer",
                     "_do_optimizer_sanity_check", "_configure_zero_optimizer"):  # fmt: skip
            wrap(name)
    model = job_model.build_model(cfg).float()
    mark("model")
    data = job_data.PatternData(int(model.config.vocab_size), 64, 1, 0, rank)
    if ddp:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(list(model.parameters()), lr=3e-3, weight_decay=0.1)
        mark("init")
        for s in range(steps):
            b = data.next()
            opt.zero_grad(set_to_none=True)
            loss = wrapped(input_ids=b, labels=b).loss
            mark(f"fwd{s}")
            loss.backward()
            mark(f"bwd{s}")
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
            opt.step()
            mark(f"step{s}")
    else:
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=list(model.parameters()), config=ds
        )
        mark("init")
        for s in range(steps):
            b = data.next()
            loss = engine(input_ids=b, labels=b).loss
            mark(f"fwd{s}")
            engine.backward(loss)
            mark(f"bwd{s}")
            engine.step()
            mark(f"step{s}")
    print(
        f"RANK {rank} MiB above baseline: " + " ".join(f"{k}={v / MiB:.1f}" for k, v in marks),
        flush=True,
    )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def main() -> int:
    """Parse the command line; the launcher's ranks re-enter with ``--rank-half``."""
    if "--rank-half" in sys.argv:
        args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
        i = args.index("--rank-half")
        rank_half(args[i + 1], args[i + 2], int(args[i + 3]), "--trace" in args)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2", help="catalog id or config.json path")
    parser.add_argument("--strategy", default="zero1", choices=["ddp", "zero1", "zero2", "zero3"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--timeout", type=float, default=300)
    a = parser.parse_args()
    return launch(a.model, a.strategy, a.steps, a.trace, a.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
