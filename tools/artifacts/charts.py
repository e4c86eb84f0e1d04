"""Report charts as PNG bytes: memory per GPU by strategy, estimated throughput, the smoke run.

matplotlib is imported inside the functions (heavy imports stay lazy) and used through its object API
(``Figure`` + the Agg canvas), never ``pyplot``: pyplot keeps global state, and batch reports
render plans from several threads. A lock still serialises rendering, because matplotlib's
font cache and text layout are shared module state.
"""

from __future__ import annotations

import io
import threading
from typing import Any

from tools.core.schemas import SizingPlan, SizingRow, SmokeResult, StrategyEstimate, TrainingPlan
from tools.planning.memory import GB
from tools.smoke import step_times_s as run_step_times_s

_LOCK = threading.Lock()

# Memory terms in stacking order, with their colours (colour-blind safe, Okabe-Ito).
TERMS = (
    ("params", "#0072B2"),
    ("gradients", "#E69F00"),
    ("optimizer", "#009E73"),
    ("activations", "#CC79A7"),
    ("buffers", "#999999"),
)


def _png(fig: Any) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _setup_names(plan: TrainingPlan) -> list[str]:
    assert plan.memory is not None
    return [s.label + (" *" if plan.memory.is_chosen(s) else "") for s in plan.memory.strategies]


# A memory axis is cut (not log-scaled: stacked terms stay proportional) when the setups'
# totals span this factor or more and the longest bar would squeeze the chosen one and the
# capacity line into the left of the chart; it then ends this far past the larger of the two.
CUT_SPAN = 10.0
CUT_HEADROOM = 1.6


def memory_terms(row: StrategyEstimate) -> dict[str, float]:
    """A row's stacked segments in GB: they add up to its counted total.

    Gradients and activations are not live together (``MemoryBreakdown.not_concurrent``): the
    activations segment is the part above the gradients, so params + gradients + optimizer +
    activations + buffers = total, the number compared with the capacity.
    """
    t = row.per_gpu_bytes
    return {
        "params": t.params / GB,
        "gradients": t.gradients / GB,
        "optimizer": t.optimizer / GB,
        "activations": max(0, t.activations - t.not_concurrent) / GB,
        "buffers": t.buffers / GB,
    }


def memory_axis_limit(plan: TrainingPlan) -> float | None:
    """Where the memory axis is cut, in GB (None: it shows every bar whole)."""
    mem = plan.memory
    if mem is None or not mem.strategies:
        return None
    totals = [s.per_gpu_bytes.total / GB for s in mem.strategies]
    positive = [t for t in totals if t > 0]
    chosen = mem.chosen_row
    keep = max((mem.capacity_bytes or 0) / GB, chosen.per_gpu_bytes.total / GB if chosen else 0)
    if not positive or keep <= 0 or max(positive) < CUT_SPAN * min(positive):
        return None
    limit = CUT_HEADROOM * keep
    return limit if max(totals) > limit else None


def _capacity_label(plan: TrainingPlan) -> tuple[str, str]:
    """(capacity line's label, axis unit): GPU memory, or on a CPU machine a rank's RAM."""
    hw, cap = plan.hardware, (plan.memory.capacity_bytes or 0) / GB if plan.memory else 0
    if hw.gpu is None:
        return f"RAM per rank ({cap:.1f} GB of the node's RAM)", "GB of RAM per rank (CPU only)"
    return f"GPU memory ({hw.gpu.name}, {hw.gpu.memory_gb:g} GB)", "GB per GPU"


def _host_ram_binds(plan: TrainingPlan) -> bool:
    mem = plan.memory
    return bool(mem and mem.binding and "host RAM" in mem.binding)


def memory_caption(plan: TrainingPlan) -> str:
    """What the memory chart draws, in words."""
    assert plan.memory is not None
    line, unit = _capacity_label(plan)
    per = "CPU rank" if plan.hardware.gpu is None else "GPU"
    text = (
        f"Memory per {per} by strategy (* chosen): params, gradients, optimizer, activations "
        f"above the gradients (the two are not live together) and buffers, stacked to the "
        f"counted total written at each bar's end"
        + (f"; dashed line: {line}" if plan.memory.capacity_bytes else "")
    )
    limit = memory_axis_limit(plan)
    if limit is not None:
        text += f"; axis cut at {limit:.0f} GB, longer bars end in an arrow with their total"
    if _host_ram_binds(plan):
        text += "; right: host RAM per node each setup needs, against the node's RAM (it binds)"
    return text + "."


def memory_figure(plan: TrainingPlan) -> Any:
    """The memory chart as a matplotlib ``Figure`` (None: no memory plan); see ``memory_caption``."""
    if plan.memory is None or not plan.memory.strategies:
        return None
    from matplotlib.figure import Figure

    mem = plan.memory
    names = _setup_names(plan)
    limit = memory_axis_limit(plan)
    line_label, unit = _capacity_label(plan)
    host = _host_ram_binds(plan)
    fig = Figure(figsize=(12 if host else 8, 0.45 * len(names) + 1.6))
    ax = fig.add_subplot(1, 2 if host else 1, 1)
    left = [0.0] * len(names)
    rows = [memory_terms(s) for s in mem.strategies]
    for term, colour in TERMS:
        values = [r[term] for r in rows]
        label = "activations above gradients" if term == "activations" else term
        ax.barh(names, values, left=left, color=colour, label=label, gid=f"term:{term}")
        left = [a + b for a, b in zip(left, values, strict=True)]
    totals = [s.per_gpu_bytes.total / GB for s in mem.strategies]
    if mem.capacity_bytes:
        ax.axvline(
            mem.capacity_bytes / GB, color="#D55E00", linestyle="--", label=line_label,
            gid="capacity",
        )  # fmt: skip
    right = limit or max([*totals, (mem.capacity_bytes or 0) / GB]) * 1.12
    ax.set_xlim(0, right)
    for y, total in enumerate(totals):
        if limit is not None and total > limit:
            ax.annotate(
                f"{total:,.0f} GB \u25b6", (limit, y), xytext=(-4, 0), textcoords="offset points",
                ha="right", va="center", fontsize="small", color="white", fontweight="bold",
                gid="cut",
            )  # fmt: skip
        else:
            ax.annotate(
                f"{total:.1f}", (total, y), xytext=(3, 0), textcoords="offset points",
                va="center", fontsize="small", gid="total",
            )  # fmt: skip
    ax.invert_yaxis()
    ax.set_xlabel(unit + (f" (axis cut at {limit:.0f} GB)" if limit else ""))
    per = "CPU rank" if plan.hardware.gpu is None else "GPU"
    ax.set_title(f"Memory per {per} by strategy (* chosen)")
    # Below the axes, so that it covers no bar.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    if host:
        _host_ram_axis(fig.add_subplot(1, 2, 2), plan)
        fig.tight_layout()
    return fig


def _host_ram_axis(ax: Any, plan: TrainingPlan) -> None:
    """Host RAM per node of every setup, with the node's RAM: drawn when host RAM binds."""
    from tools.planning.overheads import node_ram_bytes

    assert plan.memory is not None
    ram, assumed = node_ram_bytes(plan.hardware)
    ax.barh(
        _setup_names(plan),
        [s.cpu_bytes_per_node / GB for s in plan.memory.strategies],
        color="#56B4E9",
        gid="host_ram",
    )
    ax.axvline(
        ram / GB, color="#D55E00", linestyle="--", gid="node_ram",
        label=f"node RAM {ram / GB:g} GB" + (" (assumed)" if assumed else ""),
    )  # fmt: skip
    ax.invert_yaxis()
    ax.set_xlabel("GB of host RAM per node")
    ax.set_title("Host RAM per node (offload)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize="small")
    ax.grid(axis="x", alpha=0.3)


def memory_chart(plan: TrainingPlan) -> bytes | None:
    """Per-GPU memory by strategy as PNG bytes (None: no memory plan)."""
    with _LOCK:
        fig = memory_figure(plan)
        return None if fig is None else _png(fig)


def throughput_chart(plan: TrainingPlan) -> bytes | None:
    """Estimated tokens/s of every strategy that has an estimate (None: no estimate at all)."""
    if plan.memory is None:
        return None
    rows = [
        (name, s.tokens_per_s or 0.0, s.fits)
        for name, s in zip(_setup_names(plan), plan.memory.strategies, strict=True)
    ]
    if not any(v for _, v, _ in rows):
        return None
    from matplotlib.figure import Figure

    with _LOCK:
        fig = Figure(figsize=(8, 0.45 * len(rows) + 1.6))
        ax = fig.add_subplot()
        colours = ["#0072B2" if fits else "#BBBBBB" for _, _, fits in rows]
        ax.barh([n for n, _, _ in rows], [v for _, v, _ in rows], color=colours)
        ax.invert_yaxis()
        ax.set_xlabel("estimated tokens/s (whole job; grey: does not fit)")
        ax.set_title("Estimated throughput by strategy (* chosen)")
        ax.grid(axis="x", alpha=0.3)
        return _png(fig)


def scaling_caption(plan: TrainingPlan) -> str:
    """What the scaling chart draws, in words."""
    sc = plan.scaling
    cost = "total cost to train" if sc.dataset_tokens else "cost per billion tokens"
    missing = [r.gpus for r in sc.rows if not r.fits]
    return (
        f"Scaling with the number of {plan.hardware.gpu.name if plan.hardware.gpu else 'GPU'}s "
        f"(speed model, not measured): estimated tokens/s of the whole job (left) and {cost} "
        f"(right) of the setup the strategy search picks at each size; star: the plan's size"
        + (f"; does not fit at {', '.join(map(str, missing))} GPUs" if missing else "")
        + "."
    )


def scaling_figure(plan: TrainingPlan) -> Any:
    """The scaling chart as a matplotlib ``Figure`` (None: no size fits or no table)."""
    rows = [r for r in plan.scaling.rows if r.fits and r.tokens_per_s]
    if not rows:
        return None
    from matplotlib.figure import Figure

    total = plan.scaling.dataset_tokens is not None
    costs = [(r.gpus, r.cost if total else r.cost_per_billion_tokens) for r in rows]
    costs = [(g, c) for g, c in costs if c is not None]
    fig = Figure(figsize=(10 if costs else 5.5, 3.6))
    axes = [fig.add_subplot(1, 2 if costs else 1, 1)]
    gpus = [r.gpus for r in rows]
    speeds = [r.tokens_per_s or 0.0 for r in rows]
    axes[0].plot(gpus, speeds, marker="o", color="#0072B2", gid="tokens")
    axes[0].set_ylabel("estimated tokens/s (whole job)")
    axes[0].set_title("Throughput vs GPUs")
    axes[0].set_ylim(bottom=0)
    if costs:
        currency = f" ({plan.scaling.currency})" if plan.scaling.currency else ""
        axes.append(fig.add_subplot(1, 2, 2))
        axes[1].plot(*zip(*costs, strict=True), marker="o", color="#E69F00", gid="cost")
        axes[1].set_ylabel(("cost to train" if total else "cost per billion tokens") + currency)
        axes[1].set_title("Cost vs GPUs")
        axes[1].set_ylim(bottom=0)
    chosen = next((r for r in rows if r.chosen), None)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.set_xlabel("GPUs")
        ax.grid(alpha=0.3)
    if chosen is not None:
        axes[0].plot(chosen.gpus, chosen.tokens_per_s or 0.0, marker="*", markersize=16,
                     color="#D55E00", linestyle="none", gid="chosen")  # fmt: skip
        value = chosen.cost if total else chosen.cost_per_billion_tokens
        if len(axes) > 1 and value is not None:
            axes[1].plot(chosen.gpus, value, marker="*", markersize=16, color="#D55E00",
                         linestyle="none")  # fmt: skip
    fig.tight_layout()
    return fig


def scaling_chart(plan: TrainingPlan) -> bytes | None:
    """Tokens/s and cost against the number of GPUs as PNG bytes (None: nothing to draw)."""
    with _LOCK:
        fig = scaling_figure(plan)
        return None if fig is None else _png(fig)


# One colour per GPU type in the sizing chart (Okabe-Ito, then greys).
SIZING_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
                  "#000000", "#999999", "#666666")  # fmt: skip
DAY_S = 86_400.0


def _sizing_point(row: SizingRow, per_token: bool) -> tuple[float, float] | None:
    """(days, USD) of a row: for the token budget, or per billion tokens without one."""
    if not row.tokens_per_s or row.fit == "does not fit":
        return None
    if per_token:
        cost = row.usd_per_billion_tokens
        return (1e9 / row.tokens_per_s / DAY_S, cost) if cost is not None else None
    if row.time_s is None or row.cost_usd is None:
        return None
    return row.time_s / DAY_S, row.cost_usd


def sizing_caption(sizing: SizingPlan) -> str:
    """What the sizing chart draws, in words."""
    per = "" if sizing.tokens else " per billion tokens"
    return (
        f"Time against cost{per} of every fitting row the sizing considered (speed model, not "
        "measured; one colour per GPU type, labels: GPUs x type on the Pareto set and each "
        "type's cost-optimal count; star: the pick; dashed: the deadline and the budget)."
    )


def sizing_figure(sizing: SizingPlan) -> Any:
    """Time vs cost of the sizing's rows as a ``Figure`` (None: nothing priced fits)."""
    per_token = not sizing.tokens
    points = [(r, _sizing_point(r, per_token)) for r in sizing.rows]
    drawn = [(r, p) for r, p in points if p is not None]
    if not drawn:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot(1, 1, 1)
    kinds = list(dict.fromkeys(r.gpu for r, _ in drawn))
    for i, kind in enumerate(kinds):
        xs, ys = zip(*(p for r, p in drawn if r.gpu == kind), strict=True)
        colour = SIZING_COLOURS[i % len(SIZING_COLOURS)]
        ax.plot(xs, ys, marker="o", linestyle="-", alpha=0.8, color=colour, label=kind, gid=kind)
    best = {(a.gpu, a.cost_optimal_count) for a in sizing.answers}
    labelled = {(r.gpu, r.count) for r in sizing.pareto} | best
    for r, (x, y) in drawn:
        if (r.gpu, r.count) in labelled:
            ax.annotate(f"{r.count}x{r.gpu}", (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)  # fmt: skip
    pick = sizing.pick and _sizing_point(sizing.pick, per_token)
    if pick:
        ax.plot(*pick, marker="*", markersize=18, color="#D55E00", linestyle="none",
                label="pick", gid="pick")  # fmt: skip
    if sizing.deadline_s is not None and not per_token:
        ax.axvline(sizing.deadline_s / DAY_S, linestyle="--", color="#444444", label="deadline")
    if sizing.budget_usd is not None and not per_token:
        ax.axhline(sizing.budget_usd, linestyle=":", color="#444444", label="budget")
    days = [p[0] for _, p in drawn]
    costs = [p[1] for _, p in drawn]
    # Log axes where the points span more than a decade, so that small rows stay readable.
    if max(days) > 10 * min(days):
        ax.set_xscale("log")
    if max(costs) > 10 * min(costs):
        ax.set_yscale("log")
    ax.set_xlabel("days to train" + (" a billion tokens" if per_token else ""))
    ax.set_ylabel("cost (USD)" + (" per billion tokens" if per_token else ""))
    ax.set_title(f"Which GPUs: time vs cost, {sizing.model} {sizing.task}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def sizing_chart(plan: TrainingPlan) -> bytes | None:
    """The sizing's time-vs-cost chart as PNG bytes (None: no sizing, or nothing to draw)."""
    if plan.sizing is None:
        return None
    with _LOCK:
        fig = sizing_figure(plan.sizing)
        return None if fig is None else _png(fig)


def step_times_s(smoke: SmokeResult) -> list[float]:
    """Per-step wall times of a smoke run, the slowest rank per step (tools/smoke/verdict.py)."""
    return run_step_times_s(smoke.run_dir) if smoke.run_dir else []


def smoke_chart(plan: TrainingPlan) -> bytes | None:
    """Loss curve and step times of the smoke run (None when there was no run with losses)."""
    smoke = plan.smoke_test
    if smoke.status == "skipped" or not smoke.losses:
        return None
    from matplotlib.figure import Figure

    times = step_times_s(smoke)
    with _LOCK:
        fig = Figure(figsize=(8, 3.2))
        ax = fig.add_subplot(1, 2 if times else 1, 1)
        ax.plot(range(1, len(smoke.losses) + 1), smoke.losses, marker=".", color="#0072B2")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(f"Smoke run loss ({smoke.status})")
        ax.grid(alpha=0.3)
        if times:
            ax2 = fig.add_subplot(1, 2, 2)
            ax2.bar(range(1, len(times) + 1), times, color="#E69F00")
            ax2.set_xlabel("step")
            ax2.set_ylabel("seconds")
            ax2.set_title("Step time (slowest rank)")
            ax2.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        return _png(fig)


def plan_charts(plan: TrainingPlan) -> list[tuple[str, bytes]]:
    """Every chart that applies to a plan, as (caption, PNG bytes)."""
    charts = [
        (sizing_caption(plan.sizing) if plan.sizing else "", sizing_chart(plan)),
        (memory_caption(plan) if plan.memory else "", memory_chart(plan)),
        (
            "Estimated tokens/s of the whole job by strategy (speed model, not measured; "
            "grey: does not fit, * chosen).",
            throughput_chart(plan),
        ),
        (scaling_caption(plan), scaling_chart(plan)),
        (
            f"Smoke run ({plan.smoke_test.status}): loss per step and, where recorded, the "
            "slowest rank's step time.",
            smoke_chart(plan),
        ),
    ]
    return [(caption, png) for caption, png in charts if png]
