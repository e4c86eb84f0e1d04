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

from tools.core.schemas import SmokeResult, TrainingPlan
from tools.core.strategies import setup_label
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
    return [
        setup_label(s.name, s.tensor_parallel, s.pipeline_parallel)
        + (" *" if plan.memory.is_chosen(s) else "")
        for s in plan.memory.strategies
    ]


def memory_chart(plan: TrainingPlan) -> bytes | None:
    """Per-GPU memory by strategy, stacked by term, with the GPU's capacity line (None: no memory plan)."""
    if plan.memory is None or not plan.memory.strategies:
        return None
    from matplotlib.figure import Figure

    mem = plan.memory
    names = _setup_names(plan)
    with _LOCK:
        fig = Figure(figsize=(8, 0.45 * len(names) + 1.6))
        ax = fig.add_subplot()
        left = [0.0] * len(names)
        for term, colour in TERMS:
            values = [getattr(s.per_gpu_bytes, term) / GB for s in mem.strategies]
            ax.barh(names, values, left=left, color=colour, label=term)
            left = [a + b for a, b in zip(left, values, strict=True)]
        # Gradients and activations are not live together (MemoryBreakdown.not_concurrent):
        # mark the counted total, which is what is compared with the capacity.
        totals = [s.per_gpu_bytes.total / GB for s in mem.strategies]
        ax.scatter(totals, names, marker="|", s=200, color="black", label="counted total", zorder=3)
        if mem.capacity_bytes:
            ax.axvline(
                mem.capacity_bytes / GB, color="#D55E00", linestyle="--", label="GPU capacity"
            )
        ax.invert_yaxis()
        ax.set_xlabel("GB per GPU")
        ax.set_title("Memory per GPU by strategy (* chosen)")
        ax.legend(loc="lower right", fontsize="small")
        ax.grid(axis="x", alpha=0.3)
        return _png(fig)


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
        ("Memory per GPU by strategy, stacked by term", memory_chart(plan)),
        ("Estimated throughput by strategy", throughput_chart(plan)),
        ("Smoke run: loss and step times", smoke_chart(plan)),
    ]
    return [(caption, png) for caption, png in charts if png]
