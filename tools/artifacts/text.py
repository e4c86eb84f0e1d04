"""Every terminal line and summary of a plan, a smoke run, an estimate and a machine profile.

The CLI, the chat, batch reports and the adapters print what these functions write; the plan's
facts are read once (``plan_facts``) from the plan contract JSON.
"""

from __future__ import annotations

from typing import Any

from tools.artifacts.budget import budget_line
from tools.artifacts.headline import headline_caveats, headline_notes
from tools.artifacts.inference_report import inference_line
from tools.core.errors import printable
from tools.core.schemas import (
    HardwareSpec,
    MemoryPlan,
    ModelSpec,
    SmokeResult,
    SpeedEstimate,
    TrainingBrief,
)
from tools.core.units import GB, gb_text
from tools.planning.alternatives import fit_line
from tools.planning.vision import image_notes
from tools.research.hardware import PACKAGES
from tools.review import memory_comparison


def plan_facts(plan: dict[str, Any]) -> dict[str, Any]:
    """The facts every summary of a plan (contract JSON) states, read in one place."""
    brief, memory = (
        plan.get("brief") or {},
        MemoryPlan.model_validate(plan["memory"]) if plan.get("memory") else None,
    )
    row = memory.chosen_row if memory else None
    hw = plan.get("hardware") or {}
    gpu = hw.get("gpu")
    model = brief.get("model")
    smoke, review = plan.get("smoke_test") or {}, plan.get("review") or {}
    launch = plan.get("launch") or {}
    speed = plan.get("speed") or {}
    return {
        "model": (plan.get("model") or {}).get("name") or model,
        "name": model if isinstance(model, str) else "custom model" if model else brief.get("task"),
        "hardware": brief.get("hardware"),
        "machine": f"{hw.get('nodes')}x{hw.get('gpus_per_node')} {gpu['name']}"
        if gpu
        else f"{hw.get('nodes')} node(s), CPU only",
        # The brief named no hardware, or said this machine: every summary says so.
        "local": (
            (f"{hw.get('gpus_per_node')} x {gpu['name']}" if gpu else "CPU only")
            + (f", {hw['cpu_cores']} CPU cores" if hw.get("cpu_cores") else "")
            + (f", {hw['ram_gb']:.0f} GB RAM" if hw.get("ram_gb") else "")
        )
        if hw.get("source") == "local"
        else None,
        "framework": (plan.get("framework") or {}).get("primary"),
        "strategy": memory.chosen_label if memory else None,
        "micro_batch_size": memory.micro_batch_size if memory else None,
        "gradient_accumulation_steps": memory.gradient_accumulation_steps if memory else None,
        "activation_checkpointing": memory.activation_checkpointing if memory else None,
        "per_gpu_bytes": row.per_gpu_bytes.total if row else None,
        "capacity_bytes": memory.capacity_bytes if memory else None,
        "tokens_per_s": speed.get("tokens_per_s") or (row.tokens_per_s if row else None),
        "deepspeed_config": (launch.get("files") or {}).get("ds_config.json")
        if plan.get("deepspeed_config")
        else None,
        "launch_command": " ".join(launch.get("command") or []) or None,
        "smoke_status": smoke.get("status"),
        "smoke_reason": smoke.get("reason") or "",
        "verdict": review.get("verdict"),
        "rounds": review.get("rounds"),
        "report": (plan.get("report") or {}).get("markdown"),
        "fit_line": fit_line(memory.binding, memory.fit_options)
        if memory and memory.binding
        else None,
    }


def setup_text(facts: dict[str, Any]) -> str:
    """The chosen setup in words: ``zero1, micro-batch 2 x accumulation 2``."""
    if facts["strategy"] is None:
        return "nothing to train"
    return (
        f"{facts['strategy']}, micro-batch {facts['micro_batch_size']} x accumulation "
        f"{facts['gradient_accumulation_steps']}"
    )


def summary_lines(plan: dict[str, Any], *, headline: str = "plan") -> list[str]:
    """A few lines on a plan: what, where, which setup, the smoke and review verdicts, the report.

    ``headline`` ``plan`` (the chat) opens with the model, hardware and setup; ``framework``
    (the CLI's ``plan``, whose stdout scripts read) with the framework and strategy.
    """
    f = plan_facts(plan)
    reason = f["smoke_reason"].splitlines()[0] if f["smoke_reason"] else ""
    first = (
        f"plan: {f['name']} on {f['hardware']}: {f['framework']}, {setup_text(f)}"
        if headline == "plan"
        else f"framework: {f['framework']}; strategy: "
        f"{f['strategy'] or ('none (inference plan)' if plan.get('inference') else 'none (nothing to train)')}"
    )
    if f["local"]:
        first += f"; planned for this machine ({f['local']})"
    lines = [
        first,
        *([inference_line(plan["inference"])] if plan.get("inference") else []),
        f"smoke test: {f['smoke_status']}" + (f" ({reason})" if reason else ""),
        f"review: {f['verdict']} after {f['rounds']} round(s)",
        f"report: {f['report']}",
    ]
    if f["fit_line"]:
        lines.insert(3, f["fit_line"])
    if budget := budget_line(plan):
        lines.insert(1, budget)
    if images := images_text(plan):
        lines.insert(1, f"speed: {images}, predicted (an image model: one sample is one image)")
    lines[1:1] = [f"not as asked: {note}" for note in headline_notes(plan)] + [
        f"note: {note}" for note in headline_caveats(plan)
    ]
    if plan.get("sizing"):
        from tools.artifacts.sizing_text import sizing_lines
        from tools.core.schemas import SizingPlan

        lines[1:1] = sizing_lines(SizingPlan.model_validate(plan["sizing"]))
    # Names, paths and reasons come from briefs, files and runs: no escapes reach the terminal.
    return [printable(line) for line in lines]


def summary_paragraph(summary: dict[str, Any]) -> str:
    """One readable paragraph of an adapter's plan summary (graphs/adapters), for chat replies."""
    status = summary.get("status")
    if status == "needs_input":
        return f"I need one more detail ({summary['field']}): {summary['question']}"
    if status != "planned":
        where = f" ({summary['field']})" if summary.get("field") else ""
        return f"I could not plan this{where}: {summary.get('error')}"
    memory = (
        f"{summary['per_gpu_gb']} GB per GPU of {summary['gpu_memory_gb']} GB"
        if summary.get("per_gpu_gb") is not None
        else "no per-GPU estimate"
    )
    smoke = summary["smoke_test"]
    setup = (
        f"{summary['inference']}; launch: {summary['launch_command']}"
        if summary.get("inference")
        else f"{summary['framework']} with strategy {summary['strategy']}, micro-batch "
        f"{summary['micro_batch_size']} x accumulation {summary['gradient_accumulation_steps']}, "
        f"{memory}"
    )
    parts = [
        f"Plan for {summary['model']} on {summary['hardware']}: {setup}.",
        f"DeepSpeed config: {summary['deepspeed_config']}." if summary["deepspeed_config"] else "",
        f"Smoke test: {smoke['status']}"
        + (f" ({smoke['reason']})." if smoke.get("reason") else "."),
        f"Review: {summary['review']['verdict']} after {summary['review']['rounds']} round(s).",
        f"Report: {summary['report']}.",
    ]
    return " ".join(p for p in parts if p)


def smoke_lines(result: SmokeResult) -> str:
    """A short human summary of a smoke run."""
    how, mode = result.strategy, result.run_mode
    if mode is not None and mode.launcher in ("fsdp", "layout", "tensorflow"):
        alone = result.strategy in ("fsdp", "multi_worker_mirrored")
        how = mode.text() if alone else f"{how}, as {mode.text()}"
    lines = [f"smoke test: {result.status} ({how}, {result.world_size} {result.device} rank(s))"]
    lines.append(f"  {result.reason.splitlines()[0] if result.reason else ''}")
    if result.step_time_s:
        lines.append(
            f"  median step {result.step_time_s:.3f} s, {result.tokens_per_s:,.0f} tokens/s"
            + (f", MFU {result.mfu:.1%}" if result.mfu is not None else "")
        )
    memory = memory_comparison(result)
    if memory:
        lines.append(f"  memory per rank: {memory}")
    if result.run_dir:
        lines.append(f"  run dir: {result.run_dir}")
    return "\n".join(printable(line) for line in lines)


def estimate_lines(
    model: ModelSpec, hw: HardwareSpec, brief: TrainingBrief, memory: MemoryPlan
) -> list[str]:
    """Every setup's memory per GPU, term by term, the choice, and why the others lost."""
    gpu = f"{hw.gpu.name} {hw.gpu.memory_gb:g} GB" if hw.gpu else "CPU"
    lines = [
        f"{model.name} ({model.params / 1e9:.2f} B) on {hw.nodes}x{hw.gpus_per_node} {gpu}, seq {brief.seq_len}",
        *[f"  note: {note}" for note in model.notes],
        f"  {'strategy':<24}{'mb':>3} {'params':>8}{'grads':>8}{'optim':>8}{'activ':>8}{'buffers':>8}{'total':>9}  fits  (GB per GPU)",
    ]
    for s in memory.strategies:
        t = s.per_gpu_bytes
        mark = "*" if memory.is_chosen(s) else " "
        name = s.label
        terms = "".join(
            f"{v / 1e9:8.2f}"
            for v in (t.params, t.gradients, t.optimizer, t.activations, t.buffers)
        )
        speed = f"{s.tokens_per_s:>10,.0f}" if s.tokens_per_s else f"{'-':>10}"
        fits = "yes" if s.fits else "no"
        lines.append(
            f"{mark} {name:<24}{s.micro_batch_size:>3} {terms}{t.total / 1e9:9.2f}  {fits:<4}{speed}"
        )
    lines += [
        f"chosen: {memory.chosen_label}, micro-batch {memory.micro_batch_size} x accumulation "
        f"{memory.gradient_accumulation_steps}"
        + (", activation checkpointing" if memory.activation_checkpointing else ""),
        "  (total = device memory used: params + optimizer + the larger of grads and "
        "activations, which are not live together unless gradients accumulate, + buffers)",
    ]
    if memory.setup is not None and memory.setup.device_used_bytes:
        c = memory.setup
        lines.append(
            f"  peak allocated {c.peak_allocated_bytes / 1e9:.2f} GB, reserved "
            f"{c.peak_reserved_bytes / 1e9:.2f} GB, device used {c.device_used_bytes / 1e9:.2f} GB"
        )
    lines += [f"  not as asked: {n}" for n in memory.not_honoured]
    lines += [
        f"  {a}"
        for a in memory.assumptions
        # What the search left out is said too (a split Megatron cannot build, a refused one).
        if a.startswith(
            (
                "fit check",
                "memory priced",
                "fp8 linears",
                "attention:",
                "not searched",
                "expert parallelism not searched",
            )
        )
    ]
    lines += image_lines(memory.speed, hw)
    lines += [f"  error band: {band.text}" for band in memory.error_bands]
    lines += candidate_lines(memory)
    lines += [f"  not {name}: {why}" for name, why in memory.why_not.items()]
    if memory.smallest_fitting_hardware:
        lines.append(f"  would fit on: {memory.smallest_fitting_hardware}")
    if memory.binding:
        lines.append("  " + fit_line(memory.binding, memory.fit_options))
    return [printable(line) for line in lines]


def image_lines(speed: SpeedEstimate | None, hw: HardwareSpec) -> list[str]:
    """An image model's images/s and the input pipeline it assumes (nothing for other models)."""
    if speed is None or not speed.images_per_s:
        return []
    lines = [
        f"  images/s: {speed.images_per_s:,.0f} ({speed.images_per_s / hw.world_size:,.0f} per "
        f"GPU; {speed.tokens_per_s or 0:,.0f} tokens/s is images x {speed.seq_len} positions)"
    ]
    return lines + [f"  {a}" for a in image_notes(speed.assumptions)]


def images_text(plan: dict[str, Any]) -> str | None:
    """``8,930 images/s (1,116 per GPU)`` for an image model's plan, else None."""
    images = (plan.get("speed") or {}).get("images_per_s")
    if not images:
        return None
    hw = plan.get("hardware") or {}
    gpus = max(1, int(hw.get("nodes") or 1) * int(hw.get("gpus_per_node") or 1))
    return f"{images:,.0f} images/s ({images / gpus:,.0f} per GPU)"


def batch_error_line(line: int, error: str) -> str:
    """The stderr line for a batch line that was skipped (``estimate --batch``)."""
    return printable(f"trainwright: estimate --batch: line {line}: {error}")


def batch_progress_line(line: int, total: int, seconds: float) -> str:
    """The stderr line on a long batch: how far it is and how long it has run."""
    return f"trainwright: estimate --batch: line {line:,} of {total:,} ({seconds:.0f} s)"


def batch_summary_line(setups: int, skipped: list[int], seconds: float) -> str:
    """The stderr line that ends a batch: setups estimated, and the lines skipped."""
    shown = ", ".join(str(n) for n in skipped[:20]) + (", ..." if len(skipped) > 20 else "")
    return (
        f"trainwright: estimate --batch: {setups - len(skipped):,} of {setups:,} setup(s) "
        f"estimated in {seconds:.1f} s"
        + (f"; {len(skipped):,} line(s) skipped: {shown}" if skipped else "")
    )


# How many of the search's best setups the terminal and the report list.
CANDIDATES_SHOWN = 5


def candidate_rows(memory: MemoryPlan) -> list[tuple[str, list[str]]]:
    """The search's best setups, best first: (setup label, its cells), for a short table.

    Cells: tensor, pipeline, data and context parallel, virtual stages, micro-batch,
    accumulation, recompute, GB per GPU, cluster tokens/s, MFU, and the margin to the first
    (the chosen setup).
    """
    rows: list[tuple[str, list[str]]] = []
    best = memory.candidates[0].tokens_per_s if memory.candidates else None
    for c in memory.candidates[:CANDIDATES_SHOWN]:
        # Signed: a simpler setup is listed first when the faster one is within the model's
        # resolution, so a later row can be ahead ("+0.2%"); it read "--0.2%".
        margin = f"{c.tokens_per_s / best - 1:+.1%}" if best and c.tokens_per_s and rows else "best"
        rows.append(
            (
                c.label,
                [
                    str(c.tensor_parallel),
                    str(c.pipeline_parallel),
                    str(c.data_parallel),
                    str(c.context_parallel),
                    str(c.virtual_stages),
                    str(c.micro_batch_size),
                    str(c.gradient_accumulation_steps),
                    c.checkpointing,
                    f"{c.per_gpu_bytes['total'] / 1e9:.1f}",
                    f"{c.tokens_per_s:,.0f}" if c.tokens_per_s else "-",
                    f"{c.mfu:.1%}" if c.mfu is not None else "-",
                    margin,
                ],
            )
        )
    return rows


CANDIDATE_HEADER = (
    "tp", "pp", "dp", "cp", "v", "mb", "accum", "recompute", "GB/GPU", "tokens/s", "MFU", "margin"
)  # fmt: skip


def candidate_lines(memory: MemoryPlan) -> list[str]:
    """The terminal's table of the search's best setups (nothing when it did not search)."""
    rows = candidate_rows(memory)
    if len(rows) < 2:
        return []
    widths = (3, 4, 5, 3, 3, 4, 6, 10, 7, 12, 7, 8)
    head = "".join(f"{h:>{w}}" for h, w in zip(CANDIDATE_HEADER, widths, strict=True))
    lines = [f"  best setups searched ({len(memory.candidates)} listed in the JSON):"]
    lines.append(f"    {'setup':<24}{head}")
    for label, cells in rows:
        lines.append(
            f"    {label:<24}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
        )
    return lines


def profile_text(profile: dict[str, Any]) -> str:
    """A readable summary of ``describe_local_machine()`` (or of just a ``hardware`` dict)."""
    hw = profile["hardware"]
    gpu = hw.get("gpu")
    lines = []
    if "cpu" in profile:
        cpu, ram, disk = profile["cpu"], profile["ram"], profile["disk"]
        lines += [
            f"host: {profile['host']['hostname']} ({profile['host']['os']}, "
            f"Python {profile['host']['python']})",
            f"cpu: {cpu['model'] or 'unknown model'}; {cpu['physical_cores'] or '?'} physical / "
            f"{cpu['logical_cores'] or '?'} logical cores ({cpu['usable_cores']} usable)",
            f"ram: {ram['total_gb']} GB total, {ram['available_gb']} GB available",
            f"disk: {_in_gb(disk['free_gb'])} free of {_in_gb(disk['total_gb'])} at {disk['path']}",
        ]
        lines.append(f"gpus: {profile['gpu_summary']}")
        for device in profile["gpus"]:
            cap = device.get("compute_capability")
            catalog = (
                f"catalog {device['catalog_id']}, {device['bf16_tflops'] or '-'} bf16 TFLOP/s"
                if device.get("catalog_id")
                else "not in the catalog"
            )
            lines.append(
                f"  gpu {device['index']}: {device['name']}, {device['memory_gb']} GB"
                + (f", compute {cap}" if cap else "")
                + f" ({catalog})"
            )
        driver = profile["gpu_driver"]
        if driver["driver_version"] or driver["cuda_version"]:
            lines.append(
                f"driver: {driver['driver_version'] or '?'}, CUDA {driver['cuda_version'] or '?'}"
            )
        if profile["gpus"]:
            lines.append(f"topology: {_topology_line(profile['topology'])}")
        sw = profile["software"]
        versions = ", ".join(f"{name} {sw[name] or '-'}" for name in PACKAGES)
        torch_gpu = "yes" if sw["torch_cuda_available"] else "no"
        lines.append(f"software: {versions}; torch sees a GPU: {torch_gpu}")
    if hw["gpus_per_node"] and gpu:
        tflops = f" ({gpu['bf16_tflops']} bf16 TFLOP/s)" if gpu.get("bf16_tflops") else ""
        gpus = f"{hw['gpus_per_node']}x {gpu['name']}{tflops}"
    else:
        gpus = "CPU only"
    lines.append(
        f"hardware ({hw['source']}): {hw['nodes']} node(s), {gpus}, "
        f"interconnect {hw['interconnect'] or '-'}"
    )
    return "\n".join(lines)


def _topology_line(topology: dict[str, Any] | None) -> str:
    if topology is None:
        return "unknown (no nvidia-smi topo -m)"
    count = topology["gpu_count"]
    if count < 2:
        return f"{count} GPU, no GPU-to-GPU links"
    if topology["all_nvlink"]:
        widths = sorted({link["nvlinks"] for link in topology["links"]})
        return f"all {count} GPUs NVLink-connected ({', '.join(f'NV{w}' for w in widths)})"
    paths = sorted({link["path"] for link in topology["links"]})
    nvlinked = sum(1 for link in topology["links"] if link["kind"] == "nvlink")
    return f"{nvlinked} of {len(topology['links'])} GPU pairs NVLink; paths {', '.join(paths)}"


# How each kind of custom stream event (agents/events.py Events) reads after "[agent] ".
_EVENT_TEXT = {
    "start": "started",
    "tool": "{text}",
    "tool_error": "! {text}",
    "progress": "  {text}",
    "answer": "answer: {text}",
}


def event_text(chunk: dict[str, Any]) -> str:
    """The text of one node event, as the CLI and the chat show it after ``[agent] ``."""
    fmt = _EVENT_TEXT.get(str(chunk.get("kind")), "{text}")
    return fmt.format(text=chunk.get("text", ""))


def _in_gb(value: float | None) -> str:
    """A profile's figure that is already in GB (one decimal), as a line shows it."""
    return gb_text(value * GB if value is not None else None, missing="?")
