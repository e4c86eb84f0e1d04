"""Tensor/pipeline-parallel plans: Megatron-DeepSpeed's ``pretrain_gpt.py`` flags and MEGATRON.md.

A plan with tensor/pipeline parallelism (tools/planning/search.py, when no data-parallel setup
fits) cannot run on train.py or the plain DeepSpeed engine. It runs on Megatron-DeepSpeed
(github.com/microsoft/Megatron-DeepSpeed), whose flag names the arguments here follow (its
examples_deepspeed/ scripts); ds_config.json keeps the ZeRO part and batch sizes per
data-parallel rank.
"""

from __future__ import annotations

from typing import Any

from tools.artifacts.scripts import Shell, render, shell_join
from tools.core.schemas import HardwareSpec, MemoryPlan, ModelSpec, TrainingBrief

# Megatron-DeepSpeed's training entry point, in the user's checkout. launch.sh runs from the
# plan's directory (ds_config.json is there), so the script is named by the checkout's path:
# ``$MEGATRON_DIR/pretrain_gpt.py``, which puts the checkout on sys.path for ``import megatron``.
MEGATRON_SCRIPT = "pretrain_gpt.py"
MEGATRON_DIR = "MEGATRON_DIR"
SCRIPT_ARG = Shell(
    f'"${{{MEGATRON_DIR}:?set {MEGATRON_DIR} to your Megatron-DeepSpeed checkout, see MEGATRON.md}}'
    f'/{MEGATRON_SCRIPT}"'
)
# Where a fine-tune's converted checkpoint is read from (MEGATRON.md names the conversion).
FINETUNE_CHECKPOINT = "checkpoints/converted"


def model_parallel(memory: MemoryPlan | None) -> tuple[int, int] | None:
    """(tensor degree, pipeline degree) of a tensor/pipeline-parallel plan, else None."""
    if memory is None or memory.tensor_parallel * memory.pipeline_parallel == 1:
        return None
    return memory.tensor_parallel, memory.pipeline_parallel


def megatron_args(
    brief: TrainingBrief,
    model: ModelSpec,
    split: tuple[int, int],
    config: dict[str, Any],
    steps: int,
    precision: str,
) -> list[str]:
    """``pretrain_gpt.py`` and its arguments for the plan: degrees, model, batch, parallelism."""
    tp, pp = split
    return [
        SCRIPT_ARG,
        "--tensor-model-parallel-size",
        str(tp),
        "--pipeline-model-parallel-size",
        str(pp),
        *_architecture_flags(model),
        *_batch_and_optimizer_flags(brief, model, config, steps, precision),
        *_parallelism_flags(split, config),
        *_finetune_flags(brief),
    ]


def is_megatron_command(command: list[str]) -> bool:
    """Whether a launch command runs Megatron's pretrain_gpt.py."""
    return any(
        arg.rstrip('"').endswith("/" + MEGATRON_SCRIPT) or arg == MEGATRON_SCRIPT for arg in command
    )


def _finetune_flags(brief: TrainingBrief) -> list[str]:
    """A fine-tune starts from the converted weights: model only, a fresh optimizer and RNG.

    Megatron-DeepSpeed's checkpointing arguments (megatron/arguments.py ``_add_checkpointing_args``):
    ``--load`` a directory, ``--finetune`` resets the iteration count and skips optimizer and
    RNG state. Megatron-DeepSpeed saves and loads its own torch format (Megatron-LM's later
    ``--ckpt-format`` does not exist there).
    """
    if brief.task == "pretrain":
        return []
    return ["--load", FINETUNE_CHECKPOINT, "--finetune", "--no-load-optim", "--no-load-rng"]


def _architecture_flags(model: ModelSpec) -> list[str]:
    """The model's shape, and the Llama architecture switches for Llama-like families."""
    args = [
        "--num-layers",
        str(model.layers),
        "--hidden-size",
        str(model.hidden),
        "--num-attention-heads",
        str(model.heads),
    ]
    if model.intermediate:
        args += ["--ffn-hidden-size", str(model.intermediate)]
    if model.kv_heads and model.kv_heads != model.heads:
        args += ["--num-key-value-heads", str(model.kv_heads)]
    family = str((model.hf_config or {}).get("model_type") or model.family or "").lower()
    if family in ("llama", "mistral"):
        # As examples_deepspeed/pretrain_llama2_distributed.sh sets them.
        args += [
            "--swiglu",
            "--normalization",
            "rmsnorm",
            "--use-rotary-position-embeddings",
            "--untie-embeddings-and-output-weights",
            "--disable-bias-linear",
            "--no-query-key-layer-scaling",
            "--attention-dropout",
            "0",
            "--hidden-dropout",
            "0",
        ]
    return args


def _batch_and_optimizer_flags(
    brief: TrainingBrief, model: ModelSpec, config: dict[str, Any], steps: int, precision: str
) -> list[str]:
    """Sequence, batch sizes and steps from the config, then its optimizer, schedule and dtype.

    Megatron-DeepSpeed hands DeepSpeed its own optimizer and LR schedule, which take precedence
    over the config's (DeepSpeed uses a client optimizer when given one), so the recipe in
    ds_config.json is repeated here as Megatron flags.
    """
    optimizer = (config.get("optimizer") or {}).get("params") or {}
    scheduler = (config.get("scheduler") or {}).get("params") or {}
    total = scheduler.get("total_num_steps")
    args = [
        "--seq-length",
        str(brief.seq_len),
        "--max-position-embeddings",
        str(max(brief.seq_len, model.seq_len)),
        "--micro-batch-size",
        str(config.get("train_micro_batch_size_per_gpu", 1)),
        "--global-batch-size",
        str(config.get("train_batch_size") or brief.batch),
        "--train-iters",
        str(total or steps),
    ]
    if optimizer:
        betas = optimizer.get("betas") or [0.9, 0.999]
        args += [
            "--optimizer",
            "adam",
            "--lr",
            f"{optimizer.get('lr', 1e-4):g}",
            "--adam-beta1",
            f"{betas[0]:g}",
            "--adam-beta2",
            f"{betas[1]:g}",
            "--adam-eps",
            f"{optimizer.get('eps', 1e-8):g}",
            "--weight-decay",
            f"{optimizer.get('weight_decay', 0.0):g}",
            "--clip-grad",
            f"{config.get('gradient_clipping', 1.0):g}",
            "--lr-warmup-iters",
            str(scheduler.get("warmup_num_steps", 0)),
            "--lr-decay-style",
            "linear" if total else "constant",
            "--min-lr",
            "0",
        ]
    if precision in ("bf16", "fp16"):
        args.append(f"--{precision}")
    return args


def _parallelism_flags(split: tuple[int, int], config: dict[str, Any]) -> list[str]:
    """Sequence parallelism, recomputation, the pipeline switch and DeepSpeed's ZeRO stage."""
    tp, pp = split
    args: list[str] = []
    if tp > 1:
        # Korthikanti et al. 2022 sec. 4.2.2: what the memory estimate assumes under t > 1.
        args.append("--sequence-parallel")
    if "activation_checkpointing" in config:
        args += [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--deepspeed-activation-checkpointing",
        ]
    if pp == 1:
        # Megatron-DeepSpeed builds a DeepSpeed PipelineModule unless told not to.
        args.append("--no-pipeline-parallel")
    zero = config.get("zero_optimization") or {}
    return [
        *args,
        "--deepspeed",
        "--deepspeed_config",
        "ds_config.json",
        "--zero-stage",
        str(zero.get("stage", 0)),
    ]


def megatron_md(
    command: list[str],
    hardware: HardwareSpec,
    model: ModelSpec,
    split: tuple[int, int],
    config: dict[str, Any],
) -> str:
    """MEGATRON.md: why the plan needs Megatron-DeepSpeed, how to start it, what the config says."""
    tp, pp = split
    world = hardware.world_size
    dp = world // (tp * pp)
    return render(
        "MEGATRON.md",
        model=model.name,
        degrees=f"tensor parallel {tp} x pipeline parallel {pp} x data parallel {dp} = {world} GPUs",
        script=MEGATRON_SCRIPT,
        megatron_dir=MEGATRON_DIR,
        nodes=hardware.nodes,
        finetune=_finetune_note(command),
        command=shell_join(command),
        stage=(config.get("zero_optimization") or {}).get("stage", 0),
        dp=dp,
        world=world,
        train_batch_size=config.get("train_batch_size"),
        micro_batch=config.get("train_micro_batch_size_per_gpu"),
        accumulation=config.get("gradient_accumulation_steps"),
    )


def _finetune_note(command: list[str]) -> str:
    """MEGATRON.md's paragraph on the checkpoint a fine-tune loads."""
    if "--finetune" not in command:
        return "This is pretraining from random weights: no checkpoint to load."
    return (
        "This is a fine-tune: `--load " + FINETUNE_CHECKPOINT + " --finetune` reads the model's "
        "weights in Megatron-DeepSpeed's format. Convert the Hugging Face checkpoint first, with "
        "the same tensor and pipeline degrees, using Megatron-DeepSpeed's "
        "`tools/hf2megads_weight_converter.py` (Llama; examples_deepspeed/finetune_hf_llama) "
        "into `" + FINETUNE_CHECKPOINT + "` under this directory."
    )
