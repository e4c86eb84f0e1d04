"""The planner's view of a smoke run: full size or not, the predicted peak, the MFU.

A smoke run usually trains a scaled model, so its measurement is compared with the memory
model's prediction for that same shape (tools/planning/memory.py), like for like.
"""

from __future__ import annotations

from typing import Any

from tools.core.errors import InputError
from tools.core.schemas import ModelSpec, SmokeResult
from tools.core.smoke_types import RunMode
from tools.core.strategies import MIN_HEADROOM, STRATEGY_ORDER, base_strategy
from tools.planning.states import DEFAULT_LORA_RANK


def shape_spec(shape: dict[str, Any]) -> ModelSpec:
    """The ModelSpec of the model a smoke run builds (its ``model_shape``)."""
    return ModelSpec(
        name="smoke-scaled",
        params=int(shape["params"]),
        layers=int(shape["layers"]),
        hidden=int(shape["hidden"]),
        heads=int(shape["heads"]),
        kv_heads=shape.get("kv_heads"),
        intermediate=shape.get("intermediate"),
        vocab=int(shape["vocab"]),
        seq_len=int(shape.get("seq_len") or 64),
        largest_layer_params=int(
            shape.get("largest_layer_params", shape["vocab"] * shape["hidden"])
        ),
        # The family picks the activation model's per-layer coefficient (tools/planning/memory.py).
        hf_config={"model_type": shape["family"]} if shape.get("family") else None,
    )


# train.py's FSDP2 shardings (--fsdp-sharding) and the ZeRO stage each matches in the memory
# model: full shards parameters, gradients and optimizer states; grad-op keeps the parameters
# gathered from forward to backward (tools/planning/footprint.py fsdp_states).
FSDP_ZERO_STAGE = {"full": "zero3", "grad-op": "zero2", "hybrid": "zero3"}


def predict_peak_bytes(
    shape: dict[str, Any],
    strategy: str,
    device: str,
    ranks: int,
    *,
    task: str = "pretrain",
    mode: RunMode | None = None,
    nodes: int = 1,
) -> int:
    """The planner's prediction of what a smoke run of ``shape`` measures, per rank.

    Like for like: the measurement is ``max_memory_allocated`` on a GPU (tensors only) and the
    peak RSS above the pre-model baseline on CPU, so the prediction is the memory model's total
    for the same shape, ranks, strategy and micro-batch without the two terms neither reading
    contains: the CUDA context and the 10% fragmentation margin (tools/planning/memory.py).
    ``mode`` (how the run ran) prices an FSDP2 run as FSDP and a layout run as its split.
    """
    from tools.core.schemas import GPUSpec, HardwareSpec
    from tools.planning.memory import estimate_strategy
    from tools.planning.recipe import Recipe

    name: str = strategy if strategy in STRATEGY_ORDER else "ddp"
    recipe = None
    sharded_over = max(1, ranks)
    sharding = mode.fsdp_sharding if mode is not None and mode.launcher == "fsdp" else None
    if sharding is not None:
        # FSDP2: its own master-weight and gather terms; hybrid shards within a node only.
        offload = mode is not None and mode.offload
        name = FSDP_ZERO_STAGE[sharding] + ("_offload_optimizer" if offload else "")
        recipe = Recipe(
            framework="fsdp",
            precision="bf16" if device == "cuda" else "fp32",
            checkpointing="full" if shape.get("activation_checkpointing") else "none",
            lora_rank=DEFAULT_LORA_RANK if task == "lora" else None,
        )
        if sharding == "hybrid":
            sharded_over = max(1, ranks // max(1, nodes))
    tp = pp = 1
    layout = mode is not None and mode.launcher == "layout"
    if mode is not None and layout:
        # parallel_train.py: Megatron's split over tp x pp, ZeRO-1 over dp > 1.
        tp, pp, name = mode.tensor_parallel, mode.pipeline_parallel, mode.setup.strategy
    # The memory model prices tensor/pipeline splits on GPUs only; a roomy one stands in for
    # the CPU ranks (fp32 tensors either way).
    gpu = GPUSpec(name="local", memory_gb=1e6) if device == "cuda" or layout else None
    if gpu is None and "offload" in name:
        # On CPU ranks "offload" moves states from RAM to RAM: the footprint is the base stage's.
        name = base_strategy(name)
    hardware = HardwareSpec(source="local", nodes=1, gpus_per_node=sharded_over, gpu=gpu)
    est = estimate_strategy(
        shape_spec(shape),
        hardware,
        name,  # type: ignore[arg-type]
        task="lora" if task == "lora" else "pretrain",
        precision="bf16" if device == "cuda" else "fp32",
        micro_batch_size=int(shape.get("micro_batch_size", 1)),
        seq_len=int(shape.get("seq_len") or 64),
        attention="eager" if shape.get("attn_implementation") == "eager" else "sdpa",
        activation_checkpointing=bool(shape.get("activation_checkpointing")),
        recipe=recipe,
        tensor_parallel=tp,
        pipeline_parallel=pp,
    )
    return int(est.per_gpu_bytes.peak_allocated)


def with_prediction(result: SmokeResult, *, task: str = "pretrain") -> SmokeResult:
    """Attach the predicted peak for the shape that ran, the gap to the measurement, and MFU."""
    shape = result.model_shape
    if not shape or result.status == "skipped" or not result.strategy:
        return result
    update: dict[str, Any] = {
        "predicted_peak_memory_bytes": predict_peak_bytes(
            shape,
            result.strategy,
            result.device,
            result.world_size,
            task=task,
            mode=result.run_mode,
            nodes=result.nodes,
        )
    }
    measured = result.measured_memory_bytes
    if measured and update["predicted_peak_memory_bytes"] > 0:
        update["memory_gap"] = measured / update["predicted_peak_memory_bytes"] - 1
    if result.device == "cuda" and result.tokens_per_s and result.device_name:
        update["mfu"] = smoke_mfu(shape, result.tokens_per_s, result.device_name, result.world_size)
    return result.model_copy(update=update)


def smoke_mfu(
    shape: dict[str, Any], tokens_per_s: float, device_name: str, ranks: int
) -> float | None:
    """Model FLOPs utilisation of a GPU smoke run: 6N + 12·L·h·s per token over the bf16 peak.

    The FLOPs are tools/planning/speed.py's ``training_flops_per_token`` (PaLM appendix B, without
    recompute: the smoke configs do not checkpoint activations); the peak is the GPU catalog's
    dense bf16 figure for the device torch reports. None when the catalog lacks the device.
    """
    from tools.core.errors import InputError as _InputError
    from tools.planning.speed import training_flops_per_token
    from tools.research.hardware import find_gpu

    try:
        gpu = find_gpu(device_name)
    except _InputError:
        return None
    if not gpu.bf16_tflops:
        return None
    flops = training_flops_per_token(
        shape_spec(shape), int(shape.get("seq_len") or 64), activation_checkpointing=False
    )
    return float(tokens_per_s * flops / (gpu.bf16_tflops * 1e12 * max(1, ranks)))


def fits_local_gpu(
    model: ModelSpec,
    strategy: str,
    ranks: int,
    micro_batch: int,
    seq_len: int,
    task: str,
    *,
    activation_checkpointing: bool = False,
) -> bool:
    """Whether the full-size model fits the local GPU under ``strategy`` with 10% free."""
    import torch

    from tools.core.schemas import GPUSpec, HardwareSpec
    from tools.planning.memory import estimate_strategy

    if strategy not in STRATEGY_ORDER:
        return False
    props = torch.cuda.get_device_properties(0)
    capacity = int(props.total_memory)
    gpu = GPUSpec(name=str(props.name), memory_gb=capacity / 1e9)
    hardware = HardwareSpec(source="local", nodes=1, gpus_per_node=ranks, gpu=gpu)
    try:
        est = estimate_strategy(
            model,
            hardware,
            strategy,  # type: ignore[arg-type]
            task="lora" if task == "lora" else "pretrain",
            precision="bf16",
            micro_batch_size=micro_batch,
            seq_len=seq_len,
            activation_checkpointing=activation_checkpointing,
        )
    except InputError:
        return False
    return est.per_gpu_bytes.total <= (1 - MIN_HEADROOM) * capacity
