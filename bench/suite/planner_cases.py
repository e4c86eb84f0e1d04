"""Six reference planning cases: our per-GPU estimate beside DeepSpeed's own model-state figure.

Run ``python bench/suite/planner_cases.py`` from the repository root; it prints a Markdown table
and writes bench/results/<date>-planner-cases.json. For each case the strategy search (tools/planning/search.py) picks a
setup; the table gives our per-GPU total for it (model states, activations, buffers, CUDA
context, 10% margin), the model-state part alone, and DeepSpeed's
``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs`` for the
same strategy (ZeRO-1 and DDP have no DeepSpeed estimator; ZeRO-2's is shown for ZeRO-1 with
that caveat), and the search's reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.common import dated  # noqa: E402  (after the path set-up above)

OUT = dated("planner-cases.json")

CASES = [
    # label, model, hardware, task, seq_len, global batch
    ("gpt2 on 1xT4", "gpt2", "1x1xT4", "finetune", 1024, 32),
    ("llama-3-8b full fine-tune on 8xA100-80GB", "llama-3-8b", "1x8xA100-80GB", "finetune", 4096, 64),
    ("llama-3-8b LoRA on 1xRTX 4090", "llama-3-8b", "1x1xRTX4090", "lora", 2048, 16),
    ("llama-2-13b on 1xA100-40GB", "llama-2-13b", "1x1xA100-40GB", "finetune", 2048, 16),
    ("llama-3-70b on 2x8xH100", "llama-3-70b", "2x8xH100-80GB", "finetune", 4096, 256),
    ("llama-3.1-405b on 8x8xH100", "llama-3.1-405b", "8x8xH100-80GB", "pretrain", 8192, 1024),
]  # fmt: skip


def deepspeed_model_states(model: Any, hardware: Any, strategy: str, task: str) -> float | None:
    """DeepSpeed's own per-GPU model-state estimate (bytes) for ``strategy``, if it has one."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    if task == "lora" or strategy == "ddp":
        return None  # its estimators assume every parameter is trained by Adam
    kw = {"num_gpus_per_node": hardware.gpus_per_node, "num_nodes": hardware.nodes}
    with contextlib.redirect_stdout(io.StringIO()):
        if strategy.startswith("zero3"):
            out = estimate_zero3_model_states_mem_needs(
                model.params,
                model.largest_layer_params,
                cpu_offload="offload" in strategy,
                cpu_offload_params=strategy == "zero3_offload_all",
                zero_init=True,
                **kw,
            )
        else:
            out = estimate_zero2_model_states_mem_needs(
                model.params, cpu_offload="offload" in strategy, **kw
            )
    return float(out[1])


def plan_cases() -> list[dict[str, Any]]:
    """Plan each case; one record per case (our figures, DeepSpeed's, the choice and why)."""
    from tools.intake.brief import brief_from_dict
    from tools.planning import search_strategy
    from tools.research.hardware import parse_hardware
    from tools.research.model_catalog import lookup_model

    rows = []
    for label, model_id, hw_spec, task, seq, batch in CASES:
        brief = brief_from_dict(
            {"model": model_id, "hardware": hw_spec, "task": task, "seq_len": seq,
             "global_batch_size": batch}
        )  # fmt: skip
        hardware = parse_hardware(hw_spec)
        model = lookup_model(model_id, seq)
        plan = search_strategy(model, hardware, brief)
        row = next(s for s in plan.strategies if s.name == plan.chosen)
        b = row.per_gpu_bytes
        states = b.params + b.gradients + b.optimizer
        ds = deepspeed_model_states(model, hardware, plan.chosen, task)
        fits = row.fits
        why = (
            f"fits with {1 - b.total / (plan.capacity_bytes or 1):.0%} free; "
            + "; ".join(f"{k}: {v}" for k, v in list(plan.why_not.items())[:2])
            if fits
            else f"nothing fits; smallest that would: {plan.smallest_fitting_hardware}"
        )
        rows.append(
            {
                "case": label,
                "chosen": plan.chosen
                + (f"+tp{plan.tensor_parallel}" if plan.tensor_parallel > 1 else "")
                + (f"+pp{plan.pipeline_parallel}" if plan.pipeline_parallel > 1 else ""),
                "micro_batch": plan.micro_batch_size,
                "accumulation": plan.gradient_accumulation_steps,
                "checkpointing": plan.activation_checkpointing,
                "per_gpu_total_gb": round(b.total / 1e9, 2),
                "model_states_gb": round(states / 1e9, 2),
                "deepspeed_model_states_gb": round(ds / 1e9, 2) if ds is not None else None,
                "fits": fits,
                "why": why,
            }
        )
    return rows


def main() -> int:
    """Plan each case, write the JSON and print the table."""
    rows = plan_cases()
    OUT.write_text(json.dumps(rows, indent=2) + "\n")
    print(
        "| case | chosen | mb x acc, ckpt | our total GB/GPU | our model states | DeepSpeed model states | why |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ds = r["deepspeed_model_states_gb"]
        print(
            f"| {r['case']} | {r['chosen']} | {r['micro_batch']} x {r['accumulation']}, "
            f"{'on' if r['checkpointing'] else 'off'} | {r['per_gpu_total_gb']} | "
            f"{r['model_states_gb']} | {ds if ds is not None else '-'} | {r['why'][:160]} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
