"""Model and hardware specs shared by the planner tests (exact published shapes)."""

from __future__ import annotations

from tools.core.schemas import (
    GPUSpec,
    HardwareSpec,
    MemoryBreakdown,
    MemoryPlan,
    ModelSpec,
    StrategyEstimate,
)

A100 = GPUSpec(name="A100-80GB", memory_gb=80, bf16_tflops=312, fp16_tflops=312)
V100 = GPUSpec(name="V100-32GB", memory_gb=32, fp16_tflops=125)
LLAMA3_8B = ModelSpec(
    name="llama-3-8b",
    params=8_030_261_248,
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    vocab=128_256,
    intermediate=14_336,
    largest_layer_params=525_336_576,
    seq_len=4096,
)
GPT2 = ModelSpec(
    name="gpt2",
    params=124_439_808,
    layers=12,
    hidden=768,
    heads=12,
    vocab=50_257,
    largest_layer_params=38_597_376,
    seq_len=1024,
)
CPU_BOX = HardwareSpec(source="local", nodes=1, gpus_per_node=0, gpu=None, cpu_cores=2, ram_gb=24)
LLAMA3_70B = ModelSpec(
    name="llama-3-70b",
    params=70_553_706_496,
    layers=80,
    hidden=8192,
    heads=64,
    kv_heads=8,
    vocab=128_256,
    intermediate=28_672,
    largest_layer_params=1_050_673_152,
    seq_len=4096,
)
MIXTRAL = ModelSpec(
    name="mixtral-8x7b",
    params=46_702_792_704,
    active_params=12_879_925_248,
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    vocab=32_000,
    intermediate=14_336,
    largest_layer_params=1_409_286_144,
    seq_len=4096,
)

# A two-layer GPT-2 the smoke and launch tests build and run in seconds on CPU.
GPT2_TINY = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 2,
    "vocab_size": 256,
    "n_positions": 128,
}


def tiny_spec(hf_config: dict | None, name: str = "tiny") -> ModelSpec:
    """A ModelSpec whose real shape lives in ``hf_config`` (the smoke run scales from that)."""
    return ModelSpec(
        name=name,
        params=0,
        layers=2,
        hidden=64,
        heads=2,
        vocab=256,
        seq_len=64,
        largest_layer_params=0,
        hf_config=hf_config,
    )


# A brief for llama-3-8b fine-tuning on one 8xA100-80GB node (the review-loop and hostile-input
# tests start from it; each sets "smoke" as it needs).
LLAMA_8B_BRIEF = {
    "goal": "Fine-tune Llama-3-8B on support tickets",
    "model": "llama-3-8b",
    "task": "finetune",
    "seq_len": 4096,
    "global_batch_size": 64,
    "hardware": "1x8xA100-80GB",
    "precision": "bf16",
    "smoke": False,
}

# A brief that plans a tiny gpt2 on this machine with a smoke run (the crash, resume and
# Ctrl-C tests kill or interrupt it mid-run).
TINY_GPT2_BRIEF_YAML = """\
model: gpt2
task: pretrain
seq_len: 128
global_batch_size: 8
hardware: local
smoke: true
team: {experience: beginner, existing_stack: none}
"""


def model_parallel_plan(
    strategy: str, tp: int, pp: int, micro: int = 1, accumulation: int = 1
) -> MemoryPlan:
    """A memory plan whose chosen setup is ``strategy`` at tensor ``tp`` x pipeline ``pp``."""
    row = StrategyEstimate(
        name=strategy,  # type: ignore[arg-type]
        per_gpu_bytes=MemoryBreakdown(
            params=1, gradients=1, optimizer=1, activations=1, buffers=1, total=5
        ),
        fits=True,
        tensor_parallel=tp,
        pipeline_parallel=pp,
    )
    return MemoryPlan(
        strategies=[row],
        chosen=strategy,  # type: ignore[arg-type]
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        activation_checkpointing=True,
        tensor_parallel=tp,
        pipeline_parallel=pp,
    )
