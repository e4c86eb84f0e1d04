"""The smoke run of the workspace's plan: run or skipped, and how its PyTorch run runs.

The engineer's run_smoke_test tool (agents/toolkit.py) and the graph's own smoke step
(agents/roles.py) both call ``smoke_for``.
"""

from __future__ import annotations

from agents.workspace import Workspace, need
from tools.core.schemas import MemoryPlan, ModelSpec, SmokeResult
from tools.smoke.policy import (
    fsdp_smoke,
    runs_deepspeed,
    runs_tensorflow,
    skip_reason,
    smoke_layout,
    with_horovod_note,
)
from tools.smoke.spec import SmokeMode


def smoke_for(ws: Workspace, steps: int | None = None) -> SmokeResult:
    """Run (or skip) the smoke test for the workspace's plan and attach the predicted peak memory."""
    from tools.smoke import SmokeSpec, TensorFlowRun, run_smoke_test

    skipped = skip_reason(ws.brief, ws.framework)
    if skipped is not None:
        return SmokeResult(status="skipped", reason=skipped)
    model = need(ws.model, "the model", "lookup_model")
    tensorflow = runs_tensorflow(ws.framework)
    memory = None if tensorflow else need(ws.memory, "the memory plan", "plan_parallelism")
    # Testing aid (Settings.smoke_inject): a real fault in the plan's first run, or in every run.
    inject = ws.settings.smoke_fault(first_run=ws.first_round and ws.smoke_runs == 0)
    ws.smoke_runs += 1
    ws.progress(
        f"smoke run: {'TensorFlow workers' if memory is None else memory.chosen}, "
        f"{ws.settings.smoke_steps if steps is None else steps} steps"
        + (f", injecting {inject} (smoke_inject)" if inject else "")
    )
    if memory is None:
        spec = SmokeSpec(mode=TensorFlowRun(), steps=steps, inject=inject)
    else:
        spec = SmokeSpec(
            mode=_torch_smoke_mode(ws, model, memory),
            steps=steps,
            micro_batch_size=1,
            strategy=memory.chosen,
            task=ws.brief.task,
            inject=inject,
        )
    result = run_smoke_test(model, spec, ws.settings, on_progress=ws.progress)
    return with_horovod_note(result, ws.framework)


def _torch_smoke_mode(ws: Workspace, model: ModelSpec, memory: MemoryPlan) -> SmokeMode:
    """How the plan's PyTorch smoke run runs: the layout stand-in, FSDP2, DeepSpeed or DDP."""
    from tools.artifacts.deepspeed_config import emit_deepspeed_config as _emit
    from tools.smoke import DeepSpeedRun, TorchrunRun

    hardware = need(ws.hardware, "the hardware", "profile_hardware")
    # Tensor/pipeline parallelism: the torch-native stand-in runs the plan's layout, scaled.
    layout = smoke_layout(memory, model)
    if layout is not None:
        return layout
    fsdp, offload = fsdp_smoke(ws.framework, memory.chosen, hardware.nodes)
    config = ws.deepspeed_config
    if fsdp is None and config is None and runs_deepspeed(ws.framework):
        config = _emit(memory, model, hardware, ws.brief)
    if fsdp is None and config is not None:
        return DeepSpeedRun(config)
    # A plain PyTorch DDP or FSDP plan: torchrun, with the plan's recompute policy and its
    # launch command's learning-rate schedule.
    return TorchrunRun(
        fsdp=fsdp,  # type: ignore[arg-type]
        offload=offload,
        recompute=memory.activation_checkpointing,
        plan_command=tuple(ws.launch.command) if ws.launch is not None else None,
    )
