"""Render a TrainingPlan as Markdown, HTML and JSON, written atomically into the output directory."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

from tools.artifacts.budget import plan_budget
from tools.artifacts.headline import headline_caveats, headline_notes
from tools.artifacts.launch import PREPARE_SCRIPT, pretraining_data
from tools.artifacts.request_lists import report_request_section
from tools.artifacts.sizing_report import sizing_section
from tools.artifacts.text import CANDIDATE_HEADER, candidate_rows
from tools.core.errors import printable
from tools.core.outputs import check_files, write_file
from tools.core.schemas import MemoryPlan, ReportPaths, ScalingRow, TrainingPlan
from tools.core.smoke_types import RunMode
from tools.core.units import gb_text
from tools.review import memory_comparison

# ---- text from briefs, files, tools and LLMs, made inert ---------------------------------------
# A terminal escape sequence (CSI ... final byte, OSC ... BEL/ST, or ESC and one character).
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|.?)", re.S
)
# Line breaks of any kind (a Markdown line is a paragraph, a heading, a table row).
_LINE_BREAKS = re.compile(r"[\r\n\t\f\v\x85\u2028\u2029]+")
# What Markdown reads as markup inline: emphasis, code, links and images (``[``), autolinks and
# raw HTML (``<``), entities, table cells; ``_`` only where it can be emphasis (zero3_offload
# stays). Line breaks become spaces first, so ``#`` and ``>`` are markup only at the start.
_MARKUP = re.compile(r"([\\`*\[\]<|~&]|(?<![^\W_])_|_(?![^\W_]))")
# What Markdown reads as markup at the start of a line: a list item, a rule, a heading, a quote,
# a numbered item.
_LINE_START = re.compile(r"^([-+=#>])|^(\d+)([.)])")


def one_line(value: object) -> str:
    """``value`` as one line of plain text: no line breaks, no control characters or escapes.

    Line breaks and tabs become spaces; a terminal escape sequence is dropped; any other control
    character is written as its backslash escape, visible and inert.
    """
    text = _LINE_BREAKS.sub(" ", _ESCAPE_SEQUENCE.sub("", str(value)))
    return printable(text).strip()


def md_text(value: object) -> str:
    """Text from a brief, a file, a tool or an LLM as inert Markdown: one line, no markup.

    A newline cannot start a heading or a fake verdict line, and ``![x](http://...)`` stays
    text, so neither report.md nor report.html can make a reader fetch anything.
    """
    text = _MARKUP.sub(r"\\\1", one_line(value))
    return _LINE_START.sub(lambda m: f"\\{m[1]}" if m[1] else f"{m[2]}\\{m[3]}", text)


def md_code(value: object) -> str:
    """A name or path as a one-line Markdown code span (literal: nothing in it is markup)."""
    text = one_line(value).replace("`", "'")
    return f"`{text}`" if text else "-"


def _no_controls(text: str) -> str:
    """A whole report without control characters or escapes (newlines kept): the safety net."""
    return "\n".join(line if line.isprintable() else one_line(line) for line in text.split("\n"))


def render_markdown(plan: TrainingPlan) -> str:
    """The human report: decision first, then the numbers behind it."""
    sections = (
        _headline,
        lambda p: sizing_section(p.sizing, md_text),
        lambda p: report_request_section(p.request, md_text),
        _brief_section,
        _framework_section,
        _inference_section,
        _memory_section,
        _speed_section,
        _time_and_cost_section,
        _config_and_launch,
        _smoke_section,
        _review_section,
    )
    lines = [line for section in sections for line in section(plan)]
    return _no_controls("\n".join(lines).rstrip() + "\n")


def _headline(plan: TrainingPlan) -> list[str]:
    b, mem, inf = plan.brief, plan.memory, plan.inference
    strategy = (
        f"**Serving:** {inf.engine}, tensor parallel {inf.tensor_parallel}, up to "
        f"{inf.max_concurrency} sequences of {inf.context_len} tokens. "
        if inf
        else f"**Strategy:** {mem.chosen_label}, "
        f"micro-batch {mem.micro_batch_size}, gradient accumulation "
        f"{mem.gradient_accumulation_steps}{', activation checkpointing' if mem.activation_checkpointing else ''}. "
        if mem
        else "**Strategy:** none (nothing is trained). "
    )
    hw = plan.hardware
    where = (
        "**Hardware:** planned for this machine ("
        + (f"{hw.gpus_per_node} x {md_text(hw.gpu.name)}" if hw.gpu else "CPU only")
        + (f", {hw.cpu_cores} CPU cores" if hw.cpu_cores else "")
        + (f", {hw.ram_gb:.0f} GB RAM" if hw.ram_gb else "")
        + ")."
        if hw.source == "local"
        else None
    )
    budget = plan_budget(plan)
    data = plan.model_dump(mode="json")
    notes, caveats = headline_notes(data), headline_caveats(data)
    return [
        f"# {md_text(plan_title(plan))}",
        "",
        f"**Verdict:** {plan.review.verdict} after {plan.review.rounds} review round(s). "
        f"**Framework:** {plan.framework.primary}. {strategy}**Smoke test:** {plan.smoke_test.status}."
        + (f" {budget.text}" if budget else ""),
        "",
        *([f"**Not as asked:** {md_text(' '.join(notes))}", ""] if notes else []),
        *([f"**Note:** {md_text(' '.join(caveats))}", ""] if caveats else []),
        *([where, ""] if where else []),
        *([f"**Request:** {md_text(b.goal)}", ""] if b.goal else []),
    ]


_TASK_WORDS = {
    "pretrain": "pretrain",
    "finetune": "fine-tune",
    "lora": "LoRA fine-tune",
    "inference": "serve",
    "agent-app": "agent application",
}


def plan_title(plan: TrainingPlan) -> str:
    """The report's title, from the plan's own brief and hardware: what is planned, on what.

    Not the first words of a chat: after a follow-up ("what if I only had 4 GPUs?") the title
    names the brief the plan was made for; the request itself follows as its own line.
    """
    b, hw, m = plan.brief, plan.hardware, plan.model
    what = f"{_TASK_WORDS[b.task]} {m.name}" if m else _TASK_WORDS[b.task]
    if hw.gpu is not None and hw.gpus_per_node:
        where = f"{hw.nodes}x{hw.gpus_per_node} {hw.gpu.name}"
    else:
        where = f"{hw.nodes} node(s), CPU only"
    if hw.source == "local":
        where = f"this machine ({where})"
    kind = "Inference plan" if plan.inference is not None else "Training plan"
    return f"{kind}: {what} on {where}"


def _brief_section(plan: TrainingPlan) -> list[str]:
    b, hw, m = plan.brief, plan.hardware, plan.model
    gpu = f"{md_text(hw.gpu.name)} ({hw.gpu.memory_gb:g} GB)" if hw.gpu else "no GPU (CPU only)"
    model_line = (
        f"- Model: {md_code(m.name)} ({m.params / 1e9:.3f} B parameters"
        + (
            f", {m.active_params / 1e9:.2f} B active per token"
            if m.active_params and m.active_params != m.params
            else ""
        )
        + f", {m.layers} layers, hidden {m.hidden}, "
        f"{m.heads} heads, vocab {m.vocab})"
        if m
        else "- Model: none to train"
    )
    return [
        "## Brief",
        "",
        model_line,
        f"- Task: inference; context {plan.inference.context_len} tokens; "
        f"{plan.inference.concurrency} concurrent sequences; {plan.inference.weight_dtype} weights"
        if plan.inference
        else f"- Task: {b.task}; sequence length {b.seq_len}; global batch {b.global_batch_size}; precision {b.precision}",
        f"- Hardware ({hw.source}): {hw.nodes} node(s) x {hw.gpus_per_node} GPU(s), {gpu}"
        + (f", interconnect {hw.interconnect}" if hw.interconnect else "")
        + (
            f"; {hw.cpu_cores} CPU cores, {hw.ram_gb:.0f} GB RAM"
            if hw.cpu_cores and hw.ram_gb
            else ""
        ),
        "",
    ]


def _framework_section(plan: TrainingPlan) -> list[str]:
    fw = plan.framework
    lines = ["## Framework", "", md_text(fw.rationale), "", f"Stack: {', '.join(fw.stack)}.", ""]
    lines += [f"- Alternative **{a.name}**: {md_text(a.reason)}" for a in fw.alternatives]
    sources = "Sources: " + "; ".join(md_text(c) for c in fw.citations) if fw.citations else ""
    return [*lines, "", sources, ""]


def _inference_section(plan: TrainingPlan) -> list[str]:
    if plan.inference is None:
        return []
    from tools.artifacts.inference_report import inference_section

    return inference_section(plan.inference, md_text, one_line)


def _memory_section(plan: TrainingPlan) -> list[str]:
    mem = plan.memory
    if mem is None and plan.inference is not None:
        return []  # the Inference section has the memory per GPU
    if mem is None:
        return ["## Memory per GPU", "", "Not applicable: nothing is trained.", ""]
    lines = [
        "## Memory per GPU (GB)",
        "",
        "| strategy | params | gradients | optimizer | activations | buffers | total | CPU/node | fits |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for s in mem.strategies:
        t = s.per_gpu_bytes
        mark = " (chosen)" if mem.is_chosen(s) else ""
        name = s.label
        terms = (t.params, t.gradients, t.optimizer, t.activations, t.buffers, t.total)
        cells = [gb_text(n, 2, unit=False) for n in (*terms, s.cpu_bytes_per_node)]
        lines.append(f"| {name}{mark} | " + " | ".join(cells) + f" | {'yes' if s.fits else 'no'} |")
    candidates = candidate_rows(mem)
    if len(candidates) > 1:
        lines += [
            "",
            "Fastest setups searched (estimates; margin to the first):",
            "",
            "| setup | " + " | ".join(CANDIDATE_HEADER) + " |",
            "|---|" + "---:|" * len(CANDIDATE_HEADER),
        ]
        for number, (label, cells) in enumerate(candidates):
            mark = " (chosen)" if number == 0 and label == mem.chosen_label else ""
            lines.append(f"| {label}{mark} | " + " | ".join(cells) + " |")
    if mem.why_not:
        lines += ["", f"Why not the others (chosen: {mem.chosen_label}):", ""]
        lines += [f"- {md_text(name)}: {md_text(why)}" for name, why in mem.why_not.items()]
    if mem.smallest_fitting_hardware:
        lines += ["", f"The same GPU would fit at {mem.smallest_fitting_hardware}."]
    if mem.binding:
        lines += ["", "What would fit instead (estimates, tools/planning/alternatives.py):", ""]
        lines += [f"- **Binding:** {md_text(mem.binding)}"]
        for o in mem.fit_options:
            figures = ", ".join(
                part
                for part in (
                    f"{o.gb_per_gpu:g} GB/GPU" if o.gb_per_gpu is not None else "",
                    f"{o.host_ram_gb:g} GB host RAM/node" if o.host_ram_gb else "",
                    o.setup,
                )
                if part
            )
            lines.append(
                f"- {md_text(o.name)}: {'fits' if o.fits else 'does not fit'}"
                + (f" ({md_text(figures)})" if figures else "")
                + (f"; {md_text(o.detail)}" if o.detail else "")
            )
    bands = [b for b in mem.error_bands if b.quantity == "peak_memory"]
    lines += ["", *[f"Error band: {md_text(b.text)}." for b in bands]] if bands else []
    if mem.assumptions:
        lines += ["", "Assumptions:", ""] + [f"- {md_text(a)}" for a in mem.assumptions]
    return lines


def _speed_section(plan: TrainingPlan) -> list[str]:
    sp = plan.speed
    if not sp:
        return []
    lines = [
        "",
        "## Estimated speed (tools/planning/speed.py; a model, not a measurement)",
        "",
        f"- Step: {sp.step_time_s:.2f} s (compute {sp.compute_time_s:.2f} s, exposed communication "
        f"{sp.exposed_comm_time_s:.2f} s, offload {sp.offload_time_s:.2f} s); bottleneck: {sp.bottleneck}",
        f"- Throughput: {sp.tokens_per_s:,.0f} tokens/s; MFU {sp.mfu:.0%} at an assumed efficiency of "
        f"{sp.efficiency:.0%} of {sp.peak_tflops:g} TFLOP/s peak",
    ]
    if sp.images_per_s:
        gpus = max(1, plan.hardware.nodes * plan.hardware.gpus_per_node)
        lines.append(
            f"- Images: {sp.images_per_s:,.0f} images/s ({sp.images_per_s / gpus:,.0f} per GPU); "
            f"one image is {sp.seq_len} positions of the tokens/s above"
        )
    if sp.error_band is not None:
        lines.append(f"- Error band: {md_text(sp.error_band.text)}")
    return lines + [f"- {md_text(a)}" for a in sp.assumptions]


def _hours_text(hours: float | None) -> str:
    if hours is None:
        return "-"
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:,.1f} h"


def _money_text(value: float | None) -> str:
    return "-" if value is None else (f"{value:,.0f}" if value >= 100 else f"{value:,.2f}")


def scaling_picks(plan: TrainingPlan) -> list[tuple[str, ScalingRow]]:
    """The rows of the Time and cost table: the chosen, smallest and fastest sizes, each once.

    A row that plays several roles is labelled with all of them (e.g. ``chosen, fastest``).
    """
    sc = plan.scaling
    roles: dict[int, list[str]] = {}
    for role, gpus in (
        ("chosen", next((r.gpus for r in sc.rows if r.chosen), None)),
        ("smallest that fits", sc.smallest_gpus),
        ("fastest", sc.fastest_gpus),
    ):
        if gpus is not None:
            roles.setdefault(gpus, []).append(role)
    by_gpus = {r.gpus: r for r in sc.rows}
    return [(", ".join(names), by_gpus[gpus]) for gpus, names in roles.items() if gpus in by_gpus]


def _time_and_cost_section(plan: TrainingPlan) -> list[str]:
    sc = plan.scaling
    if not sc.rows:
        notes = [f"- {md_text(n)}" for n in sc.notes]
        return ["", "## Time and cost", "", *notes] if notes and plan.model else []
    unit = f" ({sc.currency})" if sc.currency else ""
    lines = [
        "",
        "## Time and cost (the strategy search at other cluster sizes of the same GPU)",
        "",
        "| setup | size | GPUs | tokens/s | MFU | time to train | cost"
        f"{unit} | cost per 1B tokens{unit} |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for role, r in scaling_picks(plan):
        # The setup first, as in the memory table: a row names its own setup, not the plan's.
        lines.append(
            f"| {r.setup or 'does not fit'} | {role} | {r.gpus} ({r.nodes}x{r.gpus_per_node}) | "
            + (f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "-")
            + f" | {f'{r.mfu:.0%}' if r.mfu is not None else '-'} | {_hours_text(r.hours)} | "
            f"{_money_text(r.cost)} | {_money_text(r.cost_per_billion_tokens)} |"
        )
    sizes = ", ".join(
        f"{r.gpus}{' (chosen)' if r.chosen else ''}{'' if r.fits else ' (does not fit)'}"
        for r in sc.rows
    )
    lines += ["", f"Sizes searched (GPUs): {sizes}; the chart draws them all."]
    if sc.dataset_tokens is None:
        lines.append("Time to train: give dataset_tokens (tokens to train on) for hours and cost.")
    if sc.price_per_gpu_hour is not None:
        lines.append(
            f"Price: {sc.price_per_gpu_hour:g} per GPU-hour{unit}, {md_text(sc.price_source)}."
        )
    else:
        lines.append("Price: give price_per_gpu_hour (no list price for this GPU).")
    return lines + [f"- {md_text(n)}" for n in sc.notes]


def _config_and_launch(plan: TrainingPlan) -> list[str]:
    lines = ["", "## DeepSpeed config", ""]
    if plan.deepspeed_config is not None:
        lines += ["```json", json.dumps(plan.deepspeed_config, indent=2), "```"]
    elif plan.inference is not None:
        lines.append("None: an inference plan has no training config.")
    else:
        lines.append(f"None: {plan.framework.primary} does not use DeepSpeed.")
    if plan.launch.command:
        command = one_line(" ".join(plan.launch.command)).replace("`", "'")
        lines += ["", "## Launch", "", "```bash", command, "```", ""]
    else:
        lines += ["", "## Launch", "", "No launch files were generated for this plan.", ""]
    lines += [f"- {md_code(name)}: {md_code(path)}" for name, path in plan.launch.files.items()]
    if plan.launch.notes:
        lines += ["", "Launch notes:", ""] + [f"- {md_text(n)}" for n in plan.launch.notes]
    return lines + _pretraining_data_section(plan)


def _pretraining_data_section(plan: TrainingPlan) -> list[str]:
    """How a pretraining plan's corpus reaches its job: prepare_data.py, then launch.sh."""
    steps = pretraining_data(plan.brief, plan.model) if plan.model is not None else None
    if steps is None or PREPARE_SCRIPT not in plan.launch.files:
        return []
    return [
        "",
        "## Pretraining data",
        "",
        f"Tokenize the corpus once with {md_code(PREPARE_SCRIPT)} (.txt/.jsonl files or "
        "folders, in parallel worker processes, into memory-mapped token shards with an index; "
        "the same command again finishes an interrupted run), then start the job on the "
        "shards: each rank streams only its own slice, and a resumed job continues at the "
        "sample where it stopped.",
        "",
        "```bash",
        *(one_line(step).replace("`", "'") for step in steps),
        "```",
    ]


def _smoke_section(plan: TrainingPlan) -> list[str]:
    smoke = plan.smoke_test
    if smoke.status == "skipped":
        return ["", "## Smoke test", "", f"Skipped: {md_text(smoke.reason)}"]
    return [
        "",
        "## Smoke test",
        "",
        f"- Status: **{smoke.status}**{': ' + md_text(smoke.reason) if smoke.reason else ''}",
        f"- Ranks: {smoke.world_size} on {smoke.device}; steps {smoke.steps}; "
        f"strategy {_smoke_strategy(smoke.strategy, plan.memory, smoke.run_mode)}",
        f"- Scaled model: {md_code(json.dumps(smoke.model_shape)) if smoke.model_shape else '-'}",
        f"- Loss: {', '.join(f'{x:.3f}' for x in smoke.losses)}",
        f"- Median step time: {smoke.step_time_s:.3f} s; {smoke.tokens_per_s:.0f} tokens/s"
        if smoke.step_time_s and smoke.tokens_per_s
        else "- Step time: -",
        f"- Peak memory per rank: {memory_comparison(smoke) or '-'}",
        f"- Run directory: {md_code(smoke.run_dir)}" if smoke.run_dir else "",
    ]


def _review_section(plan: TrainingPlan) -> list[str]:
    lines = ["", "## Review", "", "| severity | check | finding | fix |", "|---|---|---|---|"]
    lines += [
        f"| {f.severity} | {md_text(f.check)} | {md_text(f.message)} | {md_text(f.fix)} |"
        for f in plan.review.findings
    ]
    if plan.narrative:
        lines += ["", "## Agent notes", ""]
        for role, text in plan.narrative.items():
            lines += [f"**{md_text(role)}:** {md_text(text)}", ""]
    return lines


STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25rem .5rem}"
    "pre{background:#f6f8fa;padding:1rem;overflow:auto}"
    "figure{margin:1rem 0}figure img{max-width:100%;height:auto}figcaption{color:#555}"
)


def charts_html(charts: list[tuple[str, bytes]]) -> str:
    """Charts as ``<figure>`` elements with the PNG inline (base64 data URI), so the page needs no files."""
    figures = "".join(
        f"<figure><img alt='{html.escape(caption)}' "
        f"src='data:image/png;base64,{base64.b64encode(png).decode('ascii')}'>"
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        for caption, png in charts
    )
    return f"<section class='charts'><h2>Charts</h2>{figures}</section>" if figures else ""


# The report needs nothing from anywhere: its charts are data: URIs and its style is inline. The
# policy makes the browser refuse everything else (remote images, scripts, frames, fonts).
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
CSP_META = f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'


def render_html(markdown: str, title: str, charts: list[tuple[str, bytes]] | None = None) -> str:
    """A self-contained HTML page of the Markdown report, charts inline after the verdict."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    if charts:
        # After the title and verdict paragraph: the picture comes right after the decision.
        head, sep, rest = body.partition("</p>")
        body = head + sep + charts_html(charts) + rest if sep else body + charts_html(charts)
    style = STYLE
    return (
        f"<!doctype html><html><head><meta charset='utf-8'>{CSP_META}"
        f"<title>{html.escape(one_line(title))}</title>"
        f"<style>{style}</style></head><body>{_no_controls(body)}</body></html>\n"
    )


# What every plan writes, whatever its framework (the CLI checks them before any work).
REPORT_FILES = ("report.md", "report.html", "plan.json")


def write_report(plan: TrainingPlan, out_dir: Path) -> ReportPaths:
    """Write report.md, report.html (with its charts) and plan.json under ``out_dir``; return the paths."""
    from tools.artifacts.charts import plan_charts

    paths = ReportPaths(
        markdown=str(out_dir / "report.md"),
        html=str(out_dir / "report.html"),
        json=str(out_dir / "plan.json"),
    )
    plan = plan.model_copy(update={"report": paths})
    md = render_markdown(plan)
    texts = {
        "report.md": md,
        "report.html": render_html(md, plan_title(plan), plan_charts(plan)),
        "plan.json": plan_json(plan),
    }
    # All or nothing: a file of the user's under one of these names stops the report first.
    check_files(out_dir, texts)
    for name, text in texts.items():
        write_file(out_dir, name, text)
    return paths


def plan_json(plan: TrainingPlan) -> str:
    """The plan as contract JSON (hf_config left out: it is in model_config.json)."""
    data = plan.model_dump(mode="json")
    if data["model"]:
        data["model"].pop("hf_config", None)
    return json.dumps(data, indent=2) + "\n"


def _smoke_strategy(ran: str | None, memory: MemoryPlan | None, mode: RunMode | None) -> str:
    """What the smoke run ran, said so that it cannot be read as another choice."""
    if not ran:
        return "-"
    if mode is not None and mode.launcher == "layout" and memory is not None:
        return (
            f"{memory.chosen_label}, as the torch-native stand-in {mode.text()} "
            "(scaled to CPU ranks)"
        )
    if memory is not None and ran == memory.chosen and memory.chosen_label != ran:
        return f"{memory.chosen_label}, its ZeRO part only (the smoke run is data parallel)"
    return ran
