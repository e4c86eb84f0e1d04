"""trainwright command line: plan, chat, report, profile, estimate, size, smoke.

A thin client: each command parses its flags, calls one graphs.run or tools function, and
prints through tools.artifacts.text. Exit codes: 0 a plan was produced (whatever the smoke
verdict); 2 invalid input (one line on stderr naming the field); 1 an unexpected failure. Set
TRAINWRIGHT_DEBUG=1 for tracebacks. Heavy libraries are imported inside the commands so
``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

from tools.core.errors import MAX_ERROR_CHARS, InputError, TrainwrightError, one_line, shown
from tools.core.paths import PATH_ERRNOS, check_output_path

# `--help` imports only what the parser needs (bench/suite/plan_cold.py measures it against
# `python -c pass`): typing and tools.core.settings (dataclasses, inspect) load after parsing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from tools.core.settings import Settings


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Report a usage error as one line (of bounded length) and exit 2."""
        self.exit(2, one_line(f"{self.prog}: error: {message} (see --help)") + "\n")


# Bounds no flag's own meaning sets: briefs planned at once, and the world a hardware spec
# describes (tools/research/hardware.py MAX_NODES x MAX_GPUS_PER_NODE).
MAX_JOBS = 64
MAX_WORLD = 4096 * 16


def number_flags() -> dict[str, dict[str, tuple[float, float]]]:
    """Every number a flag takes, by command: its least and most value.

    A count is a whole number from the least to the most; a time (a float flag) is a finite
    number of seconds above 0 and at most the most. Anything else is one line naming the flag,
    exit 2 (``_check_numbers``). tests/unit/cli/test_cli_bounds.py fails for an int or float flag of any
    command without a row here.
    """
    from tools.core.schemas import (
        MAX_EXPERT_PARALLEL,
        MAX_GLOBAL_BATCH,
        MAX_LORA_RANK,
        MAX_PIPELINE_PARALLEL,
        MAX_SEQ_LEN,
        MAX_TENSOR_PARALLEL,
    )
    from tools.core.settings import (
        SMOKE_LOCAL_RANKS_MAX,
        SMOKE_MICRO_BATCH_MAX,
        SMOKE_STEPS_MAX,
        SMOKE_STEPS_MIN,
        SMOKE_TIMEOUT_MAX_S,
    )

    local = (1, SMOKE_LOCAL_RANKS_MAX)  # each is at least one process on this machine
    return {
        "estimate": {
            "--seq-len": (1, MAX_SEQ_LEN),
            "--global-batch": (1, MAX_GLOBAL_BATCH),
            "--micro-batch": (1, MAX_GLOBAL_BATCH),
            "--grad-accum": (1, MAX_GLOBAL_BATCH),
            "--lora-rank": (1, MAX_LORA_RANK),
            "--cp": (1, MAX_WORLD),
            "--ep": (1, MAX_EXPERT_PARALLEL),
            "--tp": (1, MAX_TENSOR_PARALLEL),
            "--pp": (1, MAX_PIPELINE_PARALLEL),
        },
        "size": {
            "--max-gpus": (1, 1024),
            "--seq-len": (1, MAX_SEQ_LEN),
            "--global-batch": (1, MAX_GLOBAL_BATCH),
        },
        "smoke": {
            "--tp": local,
            "--pp": local,
            "--dp": local,
            "--nodes": local,
            "--world-size": (1, MAX_WORLD),
            "--steps": (SMOKE_STEPS_MIN, SMOKE_STEPS_MAX),
            "--inject-step": (1, SMOKE_STEPS_MAX),
            "--micro-batch": (1, SMOKE_MICRO_BATCH_MAX),
            "--seq-len": (1, MAX_SEQ_LEN),
            "--timeout": (0, SMOKE_TIMEOUT_MAX_S),
        },
        "report": {"--jobs": (1, MAX_JOBS)},
    }


def _check_numbers(args: argparse.Namespace) -> None:
    """InputError (one line, exit 2) for a number flag of ``args.command`` out of its bounds."""
    from tools.core.settings import check_count, check_seconds

    for flag, (least, most) in number_flags().get(args.command, {}).items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if isinstance(value, float):
            check_seconds(flag, value, most)
        elif value is not None:
            check_count(flag, value, int(least), int(most))


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per command (tests/unit/cli/test_cli_flags.py freezes the flags)."""
    p = _Parser(
        prog="trainwright", description="Plan, configure and smoke-test distributed training."
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (
        _add_plan,
        _add_chat,
        _add_profile,
        _add_estimate,
        _add_size,
        _add_smoke,
        _add_report,
    ):
        add(sub)
    return p


def _path_arg(text: str) -> Path:
    """A path flag's value; an empty string (which Path would read as '.') is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("give a path, not an empty string")
    if text.strip() == "-":
        # Read by convention as standard input/output, it would be a file named '-' here.
        raise argparse.ArgumentTypeError(
            "'-' (standard input/output) is not supported; give a file path"
        )
    return Path(text)


def _smoke_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--smoke", dest="smoke", action="store_true", default=None, help=f"run {what}")
    p.add_argument("--no-smoke", dest="smoke", action="store_false", help=f"skip {what}")


def _llm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--llm", help="'offline' (default) or provider:model, e.g. openai:gpt-4o-mini")
    p.add_argument(
        "--base-url", help="OpenAI-compatible server URL (vLLM, llama.cpp, LM Studio, Ollama)"
    )


def _add_plan(sub: Any) -> None:
    plan = sub.add_parser("plan", help="plan a training setup from a request or a brief file")
    plan.add_argument("text", nargs="?", help="the request, e.g. 'fine-tune llama-3-8b on 8 A100s'")
    plan.add_argument("--brief", type=Path, help="YAML or JSON brief file")
    plan.add_argument("--hardware", help="override: local or NODESxGPUSxTYPE, e.g. 1x8xA100-80GB")
    plan.add_argument(
        "--interconnect",
        help="between nodes of a described cluster: ib400, ib200, roce100, eth25, nvlink",
    )
    _smoke_flags(plan, "the smoke test")
    plan.add_argument(
        "--out",
        type=_path_arg,
        help="directory for the report and launch files (default out/<model>-<digest>); "
        "a non-empty folder trainwright did not write is refused",
    )
    plan.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty --out folder trainwright did not write (its files are "
        "never touched; one in the way is refused)",
    )
    plan.add_argument(
        "--json", dest="json_path", type=_path_arg, help="also write the plan JSON here"
    )
    _llm_args(plan)
    plan.add_argument(
        "--thread",
        help="checkpoint thread id: an unfinished run on it resumes from its last checkpoint "
        "(default: a new id, printed at the start)",
    )
    plan.add_argument(
        "--wait",
        action="store_true",
        help="if another run holds --thread, wait for it to end (default: refuse, exit 2)",
    )
    plan.add_argument(
        "--answer",
        help="answer to the clarifying question, if the request leaves one (else read from stdin)",
    )


def _add_chat(sub: Any) -> None:
    chat = sub.add_parser(
        "chat", help="a REPL: plan requests, follow-ups ('what if I only had 4 GPUs?'), /help"
    )
    _llm_args(chat)
    chat.add_argument("--thread", help="checkpoint thread id to start on or resume")
    _smoke_flags(chat, "smoke tests")


def _add_profile(sub: Any) -> None:
    prof = sub.add_parser(
        "profile", help="profile this machine: CPU, RAM, disk, GPUs, topology, libraries"
    )
    prof.add_argument(
        "--hardware", default="local", help="local (default), or a NODESxGPUSxTYPE spec to resolve"
    )
    prof.add_argument(
        "--json",
        dest="json_path",
        type=_path_arg,
        help="write the profile JSON here (and print it)",
    )


def _add_estimate(sub: Any) -> None:
    est = sub.add_parser("estimate", help="memory per GPU for each strategy, without agents")
    est.add_argument("--brief", type=Path, help="YAML or JSON brief (or give --model)")
    est.add_argument("--model", help="catalog id or config.json path, e.g. llama-3-8b")
    est.add_argument("--hardware", help="local or NODESxGPUSxTYPE (overrides the brief's)")
    est.add_argument("--task", help="pretrain | finetune | lora")
    est.add_argument("--seq-len", type=int, help="tokens per sequence")
    est.add_argument("--global-batch", type=int, help="sequences per optimizer step")
    est.add_argument("--micro-batch", type=int, help="sequences per GPU per step (default: chosen)")
    est.add_argument(
        "--precision",
        help="bf16 | fp16 | fp32 | pure-bf16 | fp8 | tf32 | auto (bf16/fp16: fp32 masters)",
    )
    est.add_argument(
        "--framework",
        help="price memory as this framework runs it: deepspeed (default) | fsdp | torchtitan "
        "| torchtune | megatron | nanotron",
    )
    est.add_argument(
        "--optimizer", help="adamw (default) | adam8bit | paged-adam8bit | adafactor | sgd"
    )
    est.add_argument(
        "--grad-accum", type=int, help="micro-batches per optimizer step (sets the micro-batch)"
    )
    est.add_argument("--lora-rank", type=int, help="train rank-R LoRA adapters on a frozen base")
    est.add_argument("--qlora", action="store_true", help="LoRA over a 4-bit NF4 base (QLoRA)")
    est.add_argument("--cp", type=int, help="pin the context-parallel degree (default: searched)")
    est.add_argument(
        "--activation-offload",
        action="store_true",
        help="saved activations go to host memory (torchtune's activation offloading)",
    )
    est.add_argument(
        "--interconnect",
        help="network between nodes: ib400 | ib200 | roce100 | eth25, NICSxRATE (8x400G) or "
        "a rate per GPU (400Gbps per GPU)",
    )
    est.add_argument(
        "--strategy",
        help="pin the strategy: ddp | zero1 | zero2 | zero3 | zero2_offload_optimizer | "
        "zero3_offload_optimizer | zero3_offload_all (default: searched)",
    )
    est.add_argument("--tp", type=int, help="pin the tensor-parallel degree (default: searched)")
    est.add_argument("--pp", type=int, help="pin the pipeline-parallel degree (default: searched)")
    est.add_argument(
        "--ep",
        type=int,
        help="pin the expert-parallel degree of a mixture of experts (default: searched)",
    )
    est.add_argument(
        "--checkpointing",
        help="pin activation recompute: none | selective (Megatron's) | selective-op "
        "(torchtitan's per-op policy) | full (default: searched)",
    )
    est.add_argument(
        "--json", dest="json_path", type=_path_arg, help="write the estimate JSON here"
    )
    est.add_argument(
        "--batch",
        type=_path_arg,
        help="estimate every line of a JSON Lines file (the flags above as keys, seq_len for "
        "--seq-len); one --json object per line to stdout or --json FILE; exit 1 when a line "
        "was skipped",
    )


def _add_size(sub: Any) -> None:
    size = sub.add_parser(
        "size", help="which GPUs, how many, how long and how much, for a model and a task"
    )
    size.add_argument("--model", required=True, help="catalog id or config.json path")
    size.add_argument("--task", help="pretrain | finetune (default) | lora")
    size.add_argument("--tokens", help="tokens to train on, e.g. 1e9, 300B or 1T (time and cost)")
    size.add_argument("--deadline-days", help="finish within this many days")
    size.add_argument("--budget", help="spend at most this many US dollars, e.g. 50000 or 50k")
    size.add_argument(
        "--gpus",
        help="GPU types to answer for, comma-separated, each optionally with your price per "
        "GPU-hour: A100-40GB=1.20,H100-80GB (the table also covers every priced type)",
    )
    size.add_argument("--refuse", help="GPU types never to size, comma-separated")
    size.add_argument("--max-gpus", type=int, help="at most this many GPUs (default 1024)")
    size.add_argument("--one-node", action="store_true", help="one node only")
    size.add_argument("--seq-len", type=int, help="tokens per sequence (default 2048)")
    size.add_argument(
        "--global-batch", type=int, help="sequences per optimizer step (default: by model size)"
    )
    size.add_argument("--json", dest="json_path", type=_path_arg, help="write the sizing JSON here")


def _add_smoke(sub: Any) -> None:
    smoke = sub.add_parser(
        "smoke",
        help="a short real training run (DeepSpeed or torchrun) that proves a setup starts, "
        "fits and learns",
    )
    smoke.add_argument("--model", required=True, help="catalog id or config.json path")
    smoke.add_argument(
        "--strategy",
        default="zero2",
        help="ddp or fsdp (torchrun); zero1, zero2, zero3, zero2_offload_optimizer, "
        "zero3_offload_optimizer, zero3_offload_all (DeepSpeed); default zero2",
    )
    smoke.add_argument(
        "--fsdp-sharding",
        choices=("full", "grad-op", "hybrid"),
        help="with --strategy fsdp: full (ZeRO-3-like), grad-op (ZeRO-2-like) or hybrid "
        "(shard within a node, replicate across --nodes); default full",
    )
    smoke.add_argument(
        "--framework",
        choices=("pytorch", "tensorflow", "horovod"),
        default="pytorch",
        help="tensorflow: MultiWorkerMirroredStrategy workers in .venv-tf (a small Keras model "
        "of the model's kind); horovod: its maintained equivalent, DDP (Horovod does not build "
        "against current PyTorch); default pytorch",
    )
    smoke.add_argument(
        "--tp",
        type=int,
        help="tensor-parallel degree: run the layout with the torch-native stand-in "
        "(DTensor TP, torch.distributed.pipelining PP) on tp x pp x dp CPU ranks",
    )
    smoke.add_argument("--pp", type=int, help="pipeline-parallel degree (stages), as --tp")
    smoke.add_argument(
        "--dp", type=int, help="with --tp/--pp: data-parallel degree, ZeRO-1 above 1 (default 1)"
    )
    smoke.add_argument(
        "--pp-schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule"
    )
    smoke.add_argument(
        "--recompute",
        action="store_true",
        help="with ddp or fsdp: recompute every layer in backward (activation checkpointing)",
    )
    smoke.add_argument(
        "--world-size", type=int, help="planned GPUs: caps the local GPUs used (CPU: 2 ranks)"
    )
    smoke.add_argument("--steps", type=int, help="optimizer steps (default 30)")
    smoke.add_argument("--nodes", type=int, default=1, help="run as N nodes on this machine")
    smoke.add_argument("--timeout", type=float, help="wall-clock limit in seconds")
    smoke.add_argument(
        "--memory-cap",
        help="most resident memory the run's processes may hold together, e.g. 8GiB or 512MiB, "
        "or 'off' (default: TRAINWRIGHT_SMOKE_MEMORY_CAP, else half the machine's RAM, at most "
        "the available memory less a tenth of the RAM)",
    )
    smoke.add_argument("--inject", help="fail on purpose: oom, nan, hang, crash or alloc")
    smoke.add_argument("--inject-step", type=int, default=3, help="step of the injected fault")
    smoke.add_argument("--micro-batch", type=int, default=1, help="sequences per rank per step")
    smoke.add_argument("--seq-len", type=int, help="tokens per sequence (capped locally)")
    smoke.add_argument(
        "--run-dir",
        type=_path_arg,
        help="where logs and metrics go; a non-empty folder trainwright did not write is refused",
    )
    smoke.add_argument(
        "--force",
        action="store_true",
        help="run in a non-empty --run-dir trainwright did not write (its files are never touched)",
    )
    smoke.add_argument(
        "--json", dest="json_path", type=_path_arg, help="write the result JSON here"
    )


def _add_report(sub: Any) -> None:
    rep = sub.add_parser(
        "report", help="plan many briefs: one report folder each, plus index.md and index.html"
    )
    rep.add_argument("paths", nargs="+", type=Path, help="brief files or directories of them")
    rep.add_argument(
        "--out",
        type=_path_arg,
        required=True,
        help="directory for reports and index (new, empty, or one report wrote before)",
    )
    rep.add_argument("--jobs", type=int, default=2, help="briefs planned at once (default 2)")
    _smoke_flags(rep, "every smoke test")
    rep.add_argument("--force", action="store_true", help="re-plan briefs that did not change")
    _llm_args(rep)


def _emit(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def write_json(path: Path | None, data: Any) -> None:
    """Write ``data`` to what the user named (a device, FIFO or symlink is written through).

    Into a folder of ours (``--json out/x/plan.json``) it goes through the folder's manifest,
    so a later run may replace it, and a file of the user's or a link there is refused, as is
    a folder reached through a link inside one of ours.
    """
    if path is None:
        return
    import json

    write_text(path, json.dumps(data, indent=2) + "\n")


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to the ``--json`` path the user named, as ``write_json`` does."""
    from tools.core.files import write_through
    from tools.core.outputs import check_no_link, owned, write_file

    check_no_link(path.parent, "--json")
    if (path.is_symlink() or path.is_file() or not path.exists()) and owned(path.parent):
        write_file(path.parent, path.name, text, field="--json")
    else:
        write_through(path, text)


def _plan_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The graph's input: a brief file or a request text, and the flags that override either."""
    if args.brief is not None and args.text:
        raise InputError("plan", "give either a request text or --brief, not both")
    overrides: dict[str, Any] = {}
    if args.hardware:
        overrides["hardware"] = args.hardware
    if args.interconnect:
        overrides["interconnect"] = args.interconnect
    if args.smoke is not None:
        overrides["smoke"] = args.smoke
    out_dir = str(args.out) if args.out else None
    if args.brief is not None:
        from tools.intake.brief import brief_from_dict, load_brief

        brief = brief_from_dict(
            {**load_brief(args.brief).model_dump(mode="json", exclude_unset=True), **overrides}
        )
        return {
            "request": None,
            # The fields the file (or a flag) states: intake quotes these and names the rest
            # as assumed (every field here read as "from 'brief: seq_len'", defaults included).
            "brief": brief.model_dump(mode="json", exclude_unset=True),
            "overrides": overrides,
            "out_dir": out_dir,
        }
    if args.text:
        # Intake parses it inside the graph, so that it can ask about what is missing.
        return {"request": args.text, "brief": None, "overrides": overrides, "out_dir": out_dir}
    raise InputError("plan", "give a request text or --brief FILE")


def _check_out(out: Path | None, force: bool = False, names: tuple[str, ...] = ()) -> None:
    """Check, then claim, the output directory before any work.

    Refused: a path that cannot be a directory (tools/core/paths.py: NUL, /proc, under a file,
    too long), a non-empty folder trainwright did not write (unless ``force``), and any of
    ``names`` there that is a file of the user's (tools/core/outputs.py ``claim``).
    """
    check_output_path(out, "--out", "dir")
    if out is None:
        return
    from tools.core.outputs import claim

    claim(out, force=force, field="--out", names=names)


def cmd_plan(args: argparse.Namespace, settings: Settings) -> int:
    """Run the whole graph, checkpointed per thread, and write the report; print where it is.

    Every run is checkpointed under its thread id, durably after each node, so a run killed at
    any point resumes with the same ``--thread``: finished nodes are not run again. A
    clarifying question from intake is answered by ``--answer`` or one line of stdin.
    """
    from graphs.run import check_thread_id, plan_on_thread
    from graphs.terminal import LineWatcher

    check_output_path(args.json_path, "--json", "file")
    if args.thread is not None:
        check_thread_id(args.thread, "--thread")
    inputs = _plan_inputs(args)
    from tools.artifacts.report import REPORT_FILES

    names: tuple[str, ...] = REPORT_FILES
    if args.out is not None and args.json_path is not None:
        if args.json_path.parent.resolve() == args.out.resolve():
            names = (*names, args.json_path.name)
    _check_out(args.out, args.force, names)
    started = time.perf_counter()
    thread = args.thread or f"plan-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"
    watcher = LineWatcher(thread, announce=args.thread is None, answer=args.answer)
    # One plan in this process: no other thread imports, so no import warm-up (Settings).
    single = settings.with_(warm_imports=False)
    result = plan_on_thread(single, inputs, thread, watcher, wait=args.wait)
    plan = result.plan
    if not plan:
        raise TrainwrightError("the graph finished without a plan")
    write_json(args.json_path, plan)
    from tools.artifacts.text import summary_lines

    print("\n".join(summary_lines(plan, headline="framework")))
    if args.json_path:
        print(f"plan json: {args.json_path}")
    _emit(f"done in {time.perf_counter() - started:.1f} s")
    return 0


def cmd_chat(args: argparse.Namespace, settings: Settings) -> int:
    """Run the chat REPL (graphs/chat.py) on the planning graph."""
    from graphs.chat import run_chat

    return run_chat(settings, thread=args.thread, smoke=args.smoke)


def cmd_profile(args: argparse.Namespace, settings: Settings) -> int:
    """Print this machine's profile as a summary, or as JSON when --json is given."""
    import json

    from tools.artifacts.text import profile_text
    from tools.research.hardware import describe_local_machine, parse_hardware

    check_output_path(args.json_path, "--json", "file")
    assumed: list[str] = []
    if args.hardware.strip().lower() == "local":
        profile = describe_local_machine(settings.out_dir)
    else:
        from tools.intake.hardware_text import spec_assumed

        profile = {"hardware": parse_hardware(args.hardware).model_dump(mode="json")}
        assumed = [f"assumed: hardware: {why}" for why in spec_assumed(args.hardware)]
    if args.json_path:
        write_json(args.json_path, profile)
        print(json.dumps(profile, indent=2))
        for line in assumed:  # stdout stays JSON
            print(line, file=sys.stderr)
    else:
        print("\n".join([profile_text(profile), *assumed]))
    return 0


def estimate_request(args: argparse.Namespace) -> Any:
    """The ``EstimateRequest`` the estimate flags describe (one field per flag)."""
    from tools.planning.estimate import EstimateRequest

    return EstimateRequest(**{name: getattr(args, name) for name in EstimateRequest.model_fields})


def cmd_estimate(args: argparse.Namespace, settings: Settings) -> int:
    """Print every strategy's memory per GPU, term by term, and the choice."""
    from tools.artifacts.text import estimate_lines
    from tools.planning.estimate import estimate

    if args.batch is not None:
        return estimate_batch(args)
    request = estimate_request(args)
    request.check_source()
    check_output_path(args.json_path, "--json", "file")
    found = estimate(request)
    write_json(args.json_path, found.memory.model_dump(mode="json"))
    lines = estimate_lines(found.model, found.hardware, found.brief, found.memory)
    from tools.intake.hardware_text import spec_assumed

    notes = [f"hardware: {why}" for why in spec_assumed(args.hardware or "")]
    notes += [found.batch_note] if found.batch_note else []
    print("\n".join([*lines, *(f"  assumed: {note}" for note in notes)]))
    return 0


def estimate_batch(args: argparse.Namespace) -> int:
    """``estimate --batch FILE``: each line's estimate JSON, one per line, in one process.

    Output goes to stdout (a line as soon as it is estimated) or, with ``--json``, to that file
    when all are done. A skipped line is a line on stderr and ``{line, error}`` in the output.
    Exit 0 when every line was estimated, 1 when a line was skipped, 2 when the file cannot be
    read (nothing is written).
    """
    import json

    from tools.artifacts.text import batch_error_line, batch_progress_line, batch_summary_line
    from tools.planning.estimate_batch import estimate_lines

    given = estimate_request(args).model_dump(exclude_defaults=True)
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise InputError("--batch", f"goes with --json only; put {flags} in each line")
    check_output_path(args.json_path, "--json", "file")
    try:
        lines = args.batch.read_bytes().splitlines()
    except OSError as exc:
        raise InputError("--batch", f"{shown(args.batch, 120)}: {exc.strerror or exc}") from None
    start = time.monotonic()
    skipped: list[int] = []
    out: list[str] = []

    def progress(line: int, seconds: float) -> None:
        print(batch_progress_line(line, len(lines), seconds), file=sys.stderr, flush=True)

    for answer in estimate_lines(lines, number_flags()["estimate"], progress):
        if answer.error is not None:
            skipped.append(answer.line)
            print(batch_error_line(answer.line, answer.error), file=sys.stderr, flush=True)
        text = json.dumps(answer.record(), separators=(",", ":"))
        if args.json_path is None:
            print(text, flush=True)
        else:
            out.append(text + "\n")
    if args.json_path is not None:
        write_text(args.json_path, "".join(out))
    setups = sum(1 for line in lines if line.strip())
    summary = batch_summary_line(setups, skipped, time.monotonic() - start)
    print(summary, file=sys.stderr)
    return 1 if skipped else 0


def cmd_size(args: argparse.Namespace, settings: Settings) -> int:
    """Print the sizing: how many of the asked GPUs, the table per type, the pick, the Pareto set."""
    from tools.artifacts.sizing_text import sizing_lines
    from tools.planning.size_request import SizeRequest, size

    check_output_path(args.json_path, "--json", "file")
    request = SizeRequest(**{name: getattr(args, name) for name in SizeRequest.model_fields})
    found = size(request)
    write_json(args.json_path, found.sizing.model_dump(mode="json"))
    print("\n".join(sizing_lines(found.sizing)))
    return 0


def check_smoke_args(args: argparse.Namespace) -> int | None:
    """One line and exit 2 for a bad smoke flag; the memory cap in bytes (None: default)."""
    from tools.core.settings import SMOKE_FAULTS, SMOKE_LOCAL_RANKS_MAX, parse_memory_cap
    from tools.core.strategies import check_strategy

    ranks = (args.tp or 1) * (args.pp or 1) * (args.dp or 1)
    if ranks > SMOKE_LOCAL_RANKS_MAX:
        raise InputError(
            "--tp",
            f"--tp x --pp x --dp = {ranks:,} ranks; a layout run starts at most "
            f"{SMOKE_LOCAL_RANKS_MAX} on this machine",
        )
    if args.dp is not None and args.tp is None and args.pp is None:
        raise InputError("--dp", "goes with --tp or --pp (plain data parallelism is --strategy)")
    if args.framework != "pytorch":
        mine = {
            "--tp": args.tp,
            "--pp": args.pp,
            "--dp": args.dp,
            "--fsdp-sharding": args.fsdp_sharding,
        }
        for flag, value in mine.items():
            if value is not None:
                raise InputError(flag, f"does not go with --framework {args.framework}")
    strategy = _smoke_strategy(args)
    if strategy != "fsdp":
        check_strategy(strategy, "--strategy")
        if args.fsdp_sharding is not None:
            raise InputError("--fsdp-sharding", "needs --strategy fsdp")
    if args.recompute and strategy not in ("ddp", "fsdp"):
        raise InputError(
            "--recompute", "is for ddp and fsdp; a DeepSpeed run recomputes as its config says"
        )
    if args.inject is not None and args.inject not in SMOKE_FAULTS:
        raise InputError("--inject", f"must be one of {', '.join(SMOKE_FAULTS)}")
    check_output_path(args.run_dir, "--run-dir", "dir")
    check_output_path(args.json_path, "--json", "file")
    return None if args.memory_cap is None else parse_memory_cap(args.memory_cap)


def _smoke_strategy(args: argparse.Namespace) -> str:
    """The strategy a smoke run uses: ``--strategy``, or DDP for Horovod (its equivalent)."""
    return "ddp" if args.framework == "horovod" else args.strategy


def smoke_spec(
    args: argparse.Namespace, settings: Settings, model: Any, memory_cap: int | None
) -> Any:
    """The ``SmokeSpec`` the smoke flags describe (tools/smoke/spec.py), flags already checked."""
    from tools.smoke import DeepSpeedRun, LayoutRun, SmokeSpec, TensorFlowRun, TorchrunRun

    common: dict[str, Any] = {
        "steps": args.steps,
        "run_dir": args.run_dir,
        "inject": args.inject,
        "inject_step": args.inject_step,
        "timeout_s": args.timeout,
        "memory_cap": memory_cap,
        "force": args.force,
    }
    if args.framework == "tensorflow":
        return SmokeSpec(mode=TensorFlowRun(), **common)
    strategy = _smoke_strategy(args)
    if args.tp is not None or args.pp is not None:
        # The layout's data-parallel part: ZeRO-1 over dp > 1, else none.
        mode: Any = LayoutRun.of(args.tp or 1, args.pp or 1, args.dp or 1, args.pp_schedule)
        strategy = mode.setup.strategy
    elif strategy in ("ddp", "fsdp"):
        fsdp: Any = (args.fsdp_sharding or "full") if strategy == "fsdp" else None
        mode = TorchrunRun(fsdp=fsdp, recompute=args.recompute)
    else:
        from tools.artifacts.deepspeed_config import smoke_ds_config
        from tools.research.hardware import profile_local

        config = smoke_ds_config(
            model,
            strategy,
            world_size=args.world_size or settings.smoke_cpu_ranks,
            nodes=args.nodes,
            micro_batch_size=args.micro_batch,
            gpu=profile_local().gpu,
        )
        mode = DeepSpeedRun(config) if config is not None else TorchrunRun()
    return SmokeSpec(
        mode=mode,
        micro_batch_size=args.micro_batch,
        seq_len=args.seq_len,
        world_size=args.world_size,
        strategy=strategy,
        nodes=args.nodes,
        **common,
    )


def cmd_smoke(args: argparse.Namespace, settings: Settings) -> int:
    """Run one smoke test; exit 0 when it passed, 1 when it failed, 2 on bad input."""
    from tools.artifacts.text import smoke_lines
    from tools.research.model_catalog import lookup_model
    from tools.smoke import run_smoke_test, stop_on_sigterm

    memory_cap = check_smoke_args(args)
    # A SIGTERM to the CLI then stops the run's process groups too (finally blocks run).
    stop_on_sigterm()
    # A smoke run builds its scaled model from the config (random weights, tools/smoke/scale.py):
    # a learned position table is sized to --seq-len, as pretraining from scratch sizes it.
    model = lookup_model(args.model, args.seq_len or 1024, from_scratch=True)
    result = run_smoke_test(
        model, smoke_spec(args, settings, model, memory_cap), settings, on_progress=_emit
    )
    if args.framework == "horovod":
        from tools.smoke.policy import horovod_note

        result = result.model_copy(update={"reason": f"{result.reason}; {horovod_note(False)}"})
    write_json(args.json_path, result.model_dump(mode="json"))
    print(smoke_lines(result))
    return 0 if result.status == "passed" else 1


def cmd_report(args: argparse.Namespace, settings: Settings) -> int:
    """Plan every brief into its own report folder and write the index; 1 if any brief failed."""
    from graphs.batch import run_batch
    from tools.core.outputs import claim

    claim(args.out, field="--out", force_flag=None)  # report's --force re-plans, see --help
    outcomes = run_batch(
        args.paths, args.out, settings, jobs=args.jobs, smoke=args.smoke, force=args.force
    )
    failed = [o for o in outcomes if o.status == "failed"]
    print(
        f"{len(outcomes) - len(failed)} of {len(outcomes)} brief(s) planned "
        f"({sum(o.status == 'skipped' for o in outcomes)} unchanged); index: {args.out / 'index.html'}"
    )
    return 1 if failed else 0


COMMANDS = {
    "plan": cmd_plan,
    "chat": cmd_chat,
    "report": cmd_report,
    "profile": cmd_profile,
    "estimate": cmd_estimate,
    "size": cmd_size,
    "smoke": cmd_smoke,
}


# How long ``plan`` and ``report`` take, at most, to be gone after Ctrl-C or SIGTERM: smoke runs
# stop (their groups get SIGTERM, then SIGKILL after 1 s), then the process exits at once.
STOP_WITHIN_S = 1.6
# The commands that end the process after Ctrl-C or SIGTERM (the chat goes on; smoke has its
# own handling of SIGTERM).
_STOPPED_AT_ONCE = ("plan", "report")


class _Stopper:
    """Ctrl-C (SIGINT) and SIGTERM end ``plan`` and ``report`` within ``STOP_WITHIN_S``.

    The handler asks smoke runs to stop and raises KeyboardInterrupt (``Terminated`` for
    SIGTERM) in the main thread, whose ``except`` then calls ``finish``. A node still working
    in a worker thread (an LLM request, a model lookup, a knowledge search) would keep the
    interpreter alive at exit, so ``finish`` waits only for the smoke runs' process groups to
    go, kills what is left of them, and ends the process with ``os._exit``. A watchdog thread
    does the same at the deadline if the main thread is still busy. Checkpoints are SQLite
    transactions and outputs atomic renames, so an exit at any point loses no finished work.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deadline: float | None = None
        self.code = 130

    def install(self) -> None:
        """Handle SIGINT (unless started with it ignored, as a background job) and SIGTERM."""
        import tools.smoke.stopping  # noqa: F401 - imported now, not in the signal handler

        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        from tools.smoke.stopping import Terminated, request_stop

        # Smoke runs in worker threads stop, and none starts from now on.
        request_stop()
        if self.deadline is not None:
            return  # a second signal: the stop is under way, and the watchdog bounds it
        self.code = 128 + signum
        self.deadline = time.monotonic() + STOP_WITHIN_S
        threading.Thread(target=self._watchdog, name="stop-watchdog", daemon=True).start()
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt

    @property
    def stopping(self) -> bool:
        """Whether a signal asked this process to stop."""
        return self.deadline is not None

    def _watchdog(self) -> None:
        assert self.deadline is not None
        time.sleep(max(0.0, self.deadline - time.monotonic()))
        self.finish(self.code)

    def finish(self, code: int) -> NoReturn:
        """Stop the smoke runs, say why on stderr, and end the process now with ``code``."""
        from tools.smoke.stopping import kill_child_groups, stop_all_runs

        with self.lock:  # the main thread and the watchdog: the first one ends the process
            deadline = self.deadline or time.monotonic() + STOP_WITHIN_S
            stop_all_runs(wait_s=max(0.0, deadline - time.monotonic() - 0.2))
            kill_child_groups()
            word = "terminated" if code == 128 + signal.SIGTERM else "interrupted"
            with contextlib.suppress(Exception):
                print(f"trainwright: {word}", file=sys.stderr, flush=True)
            with contextlib.suppress(Exception):
                sys.stdout.flush()
            os._exit(code)


def _quiet_broken_pipe() -> int:
    """End quietly when the reader of stdout went away (``estimate | head``), as ``yes`` does.

    The Python documentation's recipe: point stdout at /dev/null so the flush at exit cannot
    fail again; 141 is what a shell reports for a writer killed by SIGPIPE.
    """
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python app.py`` and the ``trainwright`` console script."""
    args = build_parser().parse_args(argv)
    from tools.core.settings import Settings, disable_telemetry

    disable_telemetry()
    debug = os.environ.get("TRAINWRIGHT_DEBUG") == "1"
    stopper = _Stopper()
    try:
        _check_numbers(args)
        settings = Settings.load(
            llm=getattr(args, "llm", None), base_url=getattr(args, "base_url", None)
        )
        if args.command in _STOPPED_AT_ONCE:
            stopper.install()
        elif args.command in ("chat", "smoke"):
            from tools.smoke import stop_runs_on_interrupt

            # Ctrl-C also stops smoke runs that graph nodes supervise in worker threads.
            stop_runs_on_interrupt()
        code = COMMANDS[args.command](args, settings)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except TrainwrightError as exc:
        if stopper.stopping:
            stopper.finish(stopper.code)
        if debug:
            raise
        print(f"trainwright: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if args.command in _STOPPED_AT_ONCE:
            stopper.finish(stopper.code)
        print("trainwright: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence: one line
        if stopper.stopping:
            stopper.finish(stopper.code)
        if debug:
            raise
        problem = _input_problem(exc)
        if problem is not None:
            # A path the user named that cannot be written, or input too deep or too large.
            print(f"trainwright: error: {one_line(problem)}", file=sys.stderr)
            return 2
        first = one_line(f"{type(exc).__name__}: {exc}", MAX_ERROR_CHARS - 80)
        print(
            f"trainwright: unexpected error: {first} (set TRAINWRIGHT_DEBUG=1 for a traceback)",
            file=sys.stderr,
        )
        return 1


def _input_problem(exc: BaseException) -> str | None:
    """The one-line message when ``exc`` is the input's fault (exit 2), else None (exit 1).

    An OS error on a path (a file where a folder must be, /proc, a name too long, no
    permission) names the path; input nested too deeply or a number too large for a count
    say so. Other OS errors (a full disk) stay unexpected.
    """
    if isinstance(exc, RecursionError):
        return "input: nested too deeply to read"
    if isinstance(exc, OverflowError):
        return f"input: a number is too large to count with ({exc})"
    if isinstance(exc, OSError) and exc.filename is not None and exc.errno in PATH_ERRNOS:
        return f"{shown(exc.filename, 120)}: {exc.strerror or type(exc).__name__}"
    return None


def cli() -> NoReturn:
    """``python app.py`` and the ``trainwright`` console script: ``main()`` as a whole process.

    A plan imports thousands of modules (LangGraph, LangChain, pydantic models, chromadb) whose
    objects live until the process ends, so the cyclic GC runs far less often than Python's
    default (each full pass walks them all) and not again at exit (``gc.freeze``): about 1.5 s
    of CPU less per plan (bench/suite/plan_cold.py). In-process callers of ``main`` keep theirs.
    """
    import gc

    gc.set_threshold(50_000, 20, 100)
    code = main()
    gc.freeze()  # what is left dies with the process
    sys.exit(code)


if __name__ == "__main__":
    cli()
