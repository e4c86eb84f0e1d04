"""Do the launch files run the job plan.json describes? A sweep of requests, checked value by value.

``python bench/suite/launch_agreement.py [--n N] [--seed S] [--out DIR] [--md FILE] [--json FILE]``

Plans ``N`` requests drawn from a grid of models, machines, tasks and request words (offline,
no smoke run), then reads every launch file the plan folder holds (launch.sh, launch_node*.sh,
train.sbatch, ds_config.json, the torchtitan TOML) and compares what each would run with the
plan: the world size (nodes x GPUs per node = tp x pp x cp x dp), the tensor, pipeline and
context degrees, the micro-batch, gradient accumulation and global batch, the sequence length,
the step count, the peak learning rate, the ZeRO stage and CPU offload, and whether activations
are recomputed. A value a file passes that differs from the plan is
a finding; a value the plan names that no file passes is listed per launcher (not a finding:
some launchers take it from another file). Exit 0 when no finding, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import random
import re
import shlex
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.suite.request_honour import silent_parts  # noqa: E402
from tools.planning.batch_layout import autotp_degree  # noqa: E402

MODELS = [
    "gpt2",
    "llama-3-8b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "mistral-7b",
    "qwen2.5-7b",
    "qwen2.5-32b",
    "mixtral-8x7b",
    "gemma-2-9b",
    "phi-3-mini",
    "llama-3.2-1b",
    "llama-3.1-405b",
    "deepseek-v2-lite",
    "gpt-3-6.7b",
]
MACHINES = [
    "1 A100 80GB",
    "8 A100 80GB",
    "8 A100 40GB",
    "8 H100",
    "2 nodes of 8 H100",
    "4 nodes of 8 H100",
    "2 nodes of 8 A100 80GB",
    "8 L40S",
    "2 RTX 4090",
    "16 nodes of 8 H100",
    "64 nodes of 8 H100",
    "8 B200",
]
TASKS = ["fine-tune", "pretrain", "LoRA fine-tune", "continue pretraining"]
WORDS = [
    "",
    "seq len 4096",
    "global batch 256",
    "lr 1e-4",
    "for 300 steps",
    "with megatron",
    "with fsdp",
    "with deepspeed zero-3",
    "tensor parallel 2",
    "pipeline parallel 2",
    "context length 16384",
    "micro batch 2",
    "on 20B tokens",
    "with torchtitan",
    "expert parallel 8",
    "in fp8",
    "eval every 100 steps",
]

# Flags on a launch command line -> the plan quantity they carry.
CLI_FLAGS = {
    "--tensor-model-parallel-size": "tp",
    "--pipeline-model-parallel-size": "pp",
    "--context-parallel-size": "cp",
    "--micro-batch-size": "mb",
    "--micro-batch": "mb",
    "--global-batch-size": "gbs",
    "--grad-accum": "accum",
    "--seq-length": "seq",
    "--seq-len": "seq",
    "--train-iters": "steps",
    "--steps": "steps",
    "--lr": "lr",
}
LAUNCH_FILES = ("launch.sh", "train.sbatch")
# The plan's ZeRO family -> (stage, offload: 0 none, 1 optimizer, 2 optimizer and parameters).
ZERO = {
    "ddp": (0, 0),
    "zero1": (1, 0),
    "zero2": (2, 0),
    "zero3": (3, 0),
    "zero2_offload_optimizer": (2, 1),
    "zero3_offload_optimizer": (3, 1),
    "zero3_offload_all": (3, 2),
}
FSDP_STAGE = {"full": 3, "grad-op": 2, "hybrid": 3}
# Launch words that turn activation recomputation on (train.py, Megatron-DeepSpeed).
RECOMPUTE_FLAGS = (
    "--gradient-checkpointing",
    "--recompute-granularity",
    "--recompute-activations",
    "--checkpoint-activations",
    "--deepspeed-activation-checkpointing",
)


@dataclass
class Check:
    """One plan folder's comparison."""

    request: str
    folder: str
    framework: str = ""
    setup: str = ""
    findings: list[str] = field(default_factory=list)
    # Parts of the request the plan neither carries nor says it changed (request_honour.py).
    silent: list[str] = field(default_factory=list)
    unpassed: list[str] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True)
class Request:
    """A drawn request and the grid parts it was written from."""

    text: str
    model: str
    machine: str
    words: tuple[str, ...]


def requests(n: int, seed: int) -> list[Request]:
    """``n`` distinct requests drawn from the grid."""
    rng = random.Random(seed)
    out: list[Request] = []
    seen: set[str] = set()
    while len(out) < n:
        words = [w for w in rng.sample(WORDS, k=rng.choice([0, 1, 2])) if w]
        task, model, machine = rng.choice(TASKS), rng.choice(MODELS), rng.choice(MACHINES)
        text = ", ".join([f"{task} {model} on {machine}", *words])
        if text not in seen:
            seen.add(text)
            out.append(Request(text, model, machine, tuple(words)))
    return out


def expected(plan: dict[str, Any]) -> dict[str, float]:
    """What the plan says the launch runs."""
    setup, brief, hw = plan["memory"]["setup"], plan["brief"], plan["hardware"]
    want: dict[str, float] = {
        "world": hw["nodes"] * hw["gpus_per_node"],
        "tp": setup["tensor_parallel"],
        "pp": setup["pipeline_parallel"],
        "cp": setup["context_parallel"],
        "mb": setup["micro_batch_size"],
        "accum": setup["gradient_accumulation_steps"],
        "seq": brief["seq_len"],
        "gbs": brief["global_batch_size"],
    }
    stage, offload = ZERO[setup["strategy"]]
    if plan["framework"]["primary"] == "pytorch_fsdp" and stage == 1:
        stage = 2  # FSDP has no ZeRO-1 mode: SHARD_GRAD_OP, as FSDP.md says
    want["zero"], want["offload"] = stage, offload
    want["recompute"] = int(setup["checkpointing"] != "none")
    if brief.get("learning_rate"):
        want["lr"] = brief["learning_rate"]
    if brief.get("train_steps"):
        want["steps"] = brief["train_steps"]
    elif brief.get("dataset_tokens"):
        # The brief keeps a step count as the tokens it trains; the launch runs them whole.
        want["steps"] = math.ceil(
            brief["dataset_tokens"] / (brief["global_batch_size"] * brief["seq_len"])
        )
    return want


def command_values(text: str) -> list[tuple[str, str]]:
    """(quantity, value) for every known flag on the file's command lines."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        try:
            words = shlex.split(line, posix=True)
        except ValueError:
            continue
        for i, w in enumerate(words[:-1]):
            if w in CLI_FLAGS:
                out.append((CLI_FLAGS[w], words[i + 1]))
            elif w == "--zero-stage":
                out.append(("zero", words[i + 1]))
            elif w == "--fsdp-sharding":
                out.append(("zero", str(FSDP_STAGE.get(words[i + 1], -1))))
    return out


def recomputes(text: str) -> bool:
    """Whether a launch file's command lines turn activation recomputation on."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return any(flag in ln.split() for ln in lines for flag in RECOMPUTE_FLAGS)


def world_of(text: str) -> int | None:
    """GPUs a launch line starts: torchrun/deepspeed per-node count x nodes."""
    per = re.search(r"--(?:nproc_per_node|num_gpus)[ =](\d+)", text)
    nodes = re.search(r"--(?:nnodes|num_nodes)[ =](\d+)", text)
    if per is None:
        return None
    return int(per[1]) * (int(nodes[1]) if nodes else 1)


def ds_values(cfg: dict[str, Any]) -> list[tuple[str, Any]]:
    """(quantity, value) a ds_config.json carries.

    Under AutoTP, ``train_batch_size`` counts every rank (DeepSpeed checks it against the whole
    world; tools/planning/batch_layout.py ``deepspeed_batch_ranks``): the sequences per step are
    it over the tensor degree.
    """
    tp = autotp_degree(cfg)
    batch = cfg.get("train_batch_size")
    out: list[tuple[str, Any]] = [
        ("gbs", batch / tp if batch is not None else None),
        ("mb", cfg.get("train_micro_batch_size_per_gpu")),
        ("accum", cfg.get("gradient_accumulation_steps")),
        ("lr", ((cfg.get("optimizer") or {}).get("params") or {}).get("lr")),
        ("tp", (cfg.get("tensor_parallel") or {}).get("autotp_size")),
    ]
    sched = (cfg.get("scheduler") or {}).get("params") or {}
    out.append(("steps", sched.get("total_num_steps")))
    zero = cfg.get("zero_optimization") or {}
    out.append(("zero", zero.get("stage", 0)))
    device = ((zero.get("offload_optimizer") or {}).get("device") or "none") != "none"
    params = ((zero.get("offload_param") or {}).get("device") or "none") != "none"
    out.append(("offload", 2 if params else 1 if device else 0))
    return [(k, v) for k, v in out if v is not None]


def toml_values(cfg: dict[str, Any]) -> list[tuple[str, Any]]:
    """(quantity, value) a torchtitan job config carries.

    With pipeline stages, torchtitan's ``local_batch_size`` is a data-parallel rank's batch per
    step, split into ``pipeline_parallel_microbatch_size`` micro-batches (the accumulation);
    without, it is the micro-batch and the accumulation is global / (local x data-parallel).
    """
    par, tr = cfg.get("parallelism") or {}, cfg.get("training") or {}
    local, total = tr.get("local_batch_size") or tr.get("batch_size"), tr.get("global_batch_size")
    dp = (par.get("data_parallel_shard_degree") or 1) * (
        par.get("data_parallel_replicate_degree") or 1
    )
    pp = par.get("pipeline_parallel_degree") or 1
    mb, accum = local, None
    if local and pp > 1:
        mb = par.get("pipeline_parallel_microbatch_size") or 1
        accum = local / mb
    elif local and total and total > 0:
        accum = total / (local * dp)
    out = [
        ("tp", par.get("tensor_parallel_degree")),
        ("pp", pp),
        ("cp", par.get("context_parallel_degree")),
        ("seq", tr.get("seq_len")),
        ("mb", mb),
        ("accum", accum),
        ("gbs", total),
        ("steps", tr.get("steps")),
        ("lr", (cfg.get("optimizer") or {}).get("lr")),
    ]
    mode = (cfg.get("activation_checkpoint") or {}).get("mode", "none")
    out.append(("recompute", int(mode != "none")))
    return [(k, v) for k, v in out if v is not None and v != -1]


def same(a: float, b: float) -> bool:
    """Equal up to the rounding a file's decimal text brings."""
    return abs(float(a) - float(b)) <= 1e-6 * max(abs(float(a)), abs(float(b)), 1.0)


def compare(folder: Path, plan: dict[str, Any], check: Check) -> None:
    """Every value each launch file passes against the plan's."""
    want = expected(plan)
    seen: Counter[str] = Counter()
    found: list[tuple[str, str, Any]] = []
    recompute = []
    for path in sorted(folder.iterdir()):
        if path.name in LAUNCH_FILES or re.fullmatch(r"launch_node\d+\.sh", path.name):
            text = path.read_text()
            found += [(path.name, k, v) for k, v in command_values(text)]
            if (world := world_of(text)) is not None:
                found.append((path.name, "world", world))
            recompute.append((path.name, recomputes(text)))
        elif path.name == "ds_config.json":
            cfg = json.loads(path.read_text())
            found += [(path.name, k, v) for k, v in ds_values(cfg)]
            recompute.append((path.name, "activation_checkpointing" in cfg))
        elif path.suffix == ".toml":
            found += [(path.name, k, v) for k, v in toml_values(tomllib.loads(path.read_text()))]
    if recompute and not any(k == "recompute" for _, k, _v in found):
        # On when any file turns it on (train.py under DeepSpeed reads ds_config.json's
        # activation_checkpointing; Megatron and train.py under torchrun take flags).
        names = "+".join(n for n, on in recompute if on) or "launch files"
        found.append((names, "recompute", int(any(on for _, on in recompute))))
    setup = plan["memory"]["setup"]
    dp = setup["data_parallel"]
    if (
        want["tp"] * want["pp"] * want["cp"] * dp * 1 != want["world"]
        and setup.get("expert_parallel", 1) == 1
    ):
        check.findings.append(
            f"plan: tp {want['tp']} x pp {want['pp']} x cp {want['cp']} x dp {dp} != "
            f"{want['world']} GPUs"
        )
    if want["mb"] * want["accum"] * dp != want["gbs"]:
        check.findings.append(
            f"plan: micro-batch {want['mb']} x accum {want['accum']} x dp {dp} != global "
            f"batch {want['gbs']}"
        )
    for name, key, value in found:
        seen[key] += 1
        if key not in want:
            continue
        try:
            ok = same(value, want[key])
        except (TypeError, ValueError):
            ok = False
        if not ok:
            check.findings.append(f"{name}: {key} {value} (plan: {want[key]:g})")
    check.unpassed = sorted(k for k in want if not seen[k])


def run(n: int, seed: int, out: Path) -> list[Check]:
    """Plan ``n`` requests into ``out`` in this process and check each plan folder."""
    import app

    checks: list[Check] = []
    for i, req in enumerate(requests(n, seed)):
        text = req.text
        folder = out / f"r{i:03d}"
        check = Check(text, folder.name)
        stderr = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
            rc = app.main(["plan", text, "--no-smoke", "--out", str(folder)])
        if rc != 0:
            lines = [ln for ln in stderr.getvalue().splitlines() if ln.strip()]
            check.error = f"exit {rc}: {lines[-1] if lines else ''}"[:200]
        else:
            plan = json.loads((folder / "plan.json").read_text())
            check.framework = plan["framework"]["primary"]
            check.setup = plan["memory"].get("chosen_label") or plan["memory"]["chosen"]
            if plan["memory"].get("setup"):
                compare(folder, plan, check)
                check.silent = silent_parts(plan, req.model, req.machine, list(req.words))
        print(
            f"[{i + 1}/{n}] {check.framework or '-':12} {check.setup or '-':22} "
            f"{len(check.findings)} launch, {len(check.silent)} silent  {text}",
            file=sys.stderr,
        )
        checks.append(check)
    return checks


def render(checks: list[Check], n: int, seed: int) -> str:
    """The Markdown summary: plans per launcher, findings, refusals, values no file passes."""
    planned = [c for c in checks if not c.error]
    bad = [c for c in planned if c.findings]
    lines = [
        "# Launch files against plan.json",
        "",
        f"Command: `python bench/suite/launch_agreement.py --n {n} --seed {seed}`. {len(checks)} "
        f"requests, {len(planned)} planned ({len(checks) - len(planned)} refused or asked in "
        f"one line), {len(bad)} with a launch value that differs from the plan.",
        "",
        "| framework | plans | with findings |",
        "|---|---:|---:|",
    ]
    for fw, k in sorted(Counter(c.framework for c in planned).items()):
        lines.append(f"| {fw} | {k} | {sum(1 for c in bad if c.framework == fw)} |")
    lines += ["", "## Findings", ""]
    for c in bad:
        lines.append(f"- `{c.request}` ({c.framework}, {c.setup}): " + "; ".join(c.findings))
    if not bad:
        lines.append("none")
    quiet = [c for c in planned if c.silent]
    lines += ["", f"## Parts of the request neither planned nor said ({len(quiet)} plans)", ""]
    lines += [f"- `{c.request}` ({c.framework}, {c.setup}): " + "; ".join(c.silent) for c in quiet]
    lines += [] if quiet else ["none"]
    lines += ["", "## Refused or asked", ""]
    lines += [f"- `{c.request}`: {c.error}" for c in checks if c.error] or ["none"]
    unpassed = Counter(f"{c.framework}: {k}" for c in planned for k in c.unpassed)
    lines += ["", "## Plan values no launch file passes (per launcher; not findings)", ""]
    lines += [f"- {k} ({v} plans)" for k, v in sorted(unpassed.items())] or ["none"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; 0 without findings, 1 with, 2 for bad input."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("/tmp/launch_agreement"))
    p.add_argument("--md", type=Path)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.n < 1:
        print("launch_agreement: --n must be at least 1", file=sys.stderr)
        return 2
    checks = run(args.n, args.seed, args.out)
    text = render(checks, args.n, args.seed)
    print(text)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps([c.__dict__ for c in checks], indent=1) + "\n")
    return 1 if any(c.findings or c.silent for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
