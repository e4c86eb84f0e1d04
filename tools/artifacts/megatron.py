"""Tensor/pipeline-parallel plans: Megatron-DeepSpeed's ``pretrain_gpt.py`` flags and MEGATRON.md.

A plan with tensor/pipeline parallelism (tools/planning/search.py, when no data-parallel setup
fits) cannot run on train.py or the plain DeepSpeed engine. It runs on Megatron-DeepSpeed
(github.com/microsoft/Megatron-DeepSpeed), whose flag names the arguments here follow (its
examples_deepspeed/ scripts); ds_config.json keeps the ZeRO part and batch sizes per
data-parallel rank.

Every path in the command is relative to the plan's folder, where launch.sh and train.sbatch
run: ds_config.json, the checkpoints the job saves under ``checkpoints/train`` and resumes
from, and a fine-tune's converted weights in ``checkpoints/converted``, which
convert_checkpoint.sh writes from a Hugging Face checkpoint with Megatron-DeepSpeed's own
converter. Only pretrain_gpt.py and the converter come from ``$MEGATRON_DIR``.
"""

from __future__ import annotations

import json
from typing import Any

from tools.artifacts import cluster
from tools.artifacts.megatron_env import deepspeed_check, deepspeed_note
from tools.artifacts.megatron_model import architecture_flags, architecture_note
from tools.artifacts.recipe_launch import megatron_eval_flags
from tools.artifacts.scripts import Shell, render, shell_join
from tools.core.schemas import GPUSpec, HardwareSpec, MemoryPlan, ModelSpec, TrainingBrief
from tools.planning.attention_kernels import megatron_attention
from tools.planning.batch_layout import BatchLayout
from tools.planning.parallel import pipeline_split
from tools.research.megatron_arch import convert_refusal

# Megatron-DeepSpeed's training entry point, in the user's checkout. launch.sh runs from the
# plan's directory (ds_config.json is there), so the script is named by the checkout's path:
# ``$MEGATRON_DIR/pretrain_gpt.py``, which puts the checkout on sys.path for ``import megatron``.
MEGATRON_SCRIPT = "pretrain_gpt.py"
MEGATRON_DIR = "MEGATRON_DIR"


def _in_checkout(path: str) -> Shell:
    """A file of the user's Megatron-DeepSpeed checkout; an unset MEGATRON_DIR stops the script."""
    return Shell(
        f'"${{{MEGATRON_DIR}:?set {MEGATRON_DIR} to your Megatron-DeepSpeed checkout, see '
        f'MEGATRON.md}}/{path}"'
    )


SCRIPT_ARG = _in_checkout(MEGATRON_SCRIPT)
# Megatron-DeepSpeed's Hugging Face -> Megatron-DeepSpeed converter, in the same checkout
# (microsoft/Megatron-DeepSpeed tools/hf2megads_weight_converter.py, run as
# examples_deepspeed/finetune_hf_llama/finetune_llama.sh convert_hf2mds runs it).
CONVERTER = "tools/hf2megads_weight_converter.py"
CONVERT_SCRIPT = "convert_checkpoint.sh"
# The converter's own DeepSpeed config: batch sizes only, ZeRO stage 0, no optimizer (as the
# example's ds_config_empty.json). ds_config.json would not do: its optimizer section makes
# DeepSpeed allocate optimizer states the converter never uses, and ZeRO-2/3 is refused for
# the pipeline model the converter builds.
CONVERT_CONFIG = "ds_config_convert.json"
# Where a fine-tune's converted checkpoint is read from, and where every job saves its own.
FINETUNE_CHECKPOINT = "checkpoints/converted"
TRAIN_CHECKPOINTS = "checkpoints/train"
# DeepSpeed's engine (which Megatron-DeepSpeed saves and loads through under --deepspeed)
# names the newest tag of a checkpoint folder in this file; present once a save completed.
LATEST = "latest"
# The --load arguments launch.sh picks for a fine-tune (``fine_tune_preamble``), and what it
# picks on the first run: the converted weights, model only (``--finetune`` implies the other
# two; they say it to a reader).
LOAD_ARGS = Shell('"${LOAD[@]}"')
FIRST_LOAD = ["--load", FINETUNE_CHECKPOINT, "--finetune", "--no-load-optim", "--no-load-rng"]
# Steps between saves: at most this many steps are lost to a crash or a preemption.
SAVE_INTERVAL = 500


def model_parallel(memory: MemoryPlan | None) -> tuple[int, int] | None:
    """(tensor degree, pipeline degree) of a model-parallel plan (context, expert too), else None."""
    experts = memory.setup.expert_parallel if memory is not None and memory.setup else 1
    if memory is None or (
        memory.tensor_parallel * memory.pipeline_parallel * memory.context_parallel * experts == 1
    ):
        return None
    return memory.tensor_parallel, memory.pipeline_parallel


def megatron_args(
    brief: TrainingBrief,
    model: ModelSpec,
    split: tuple[int, int],
    config: dict[str, Any],
    steps: int,
    precision: str,
    context_parallel: int = 1,
    expert_parallel: int = 1,
    fp8: bool = False,
    gpu: GPUSpec | None = None,
) -> list[str]:
    """``pretrain_gpt.py`` and its arguments for the plan: degrees, model, batch, parallelism.

    Attention runs the kernel the plan priced on ``gpu`` (tools/planning/attention_kernels.py:
    ``--use-flash-attn-v2`` where FlashAttention-2 runs; Megatron-DeepSpeed's default is unfused).

    Expert parallelism is DeepSpeed-MoE's ``--moe-expert-parallel-size`` (megatron_model.py).

    ``fp8``: fp8 linears through Transformer Engine, ``FP8_FLAGS`` (Megatron-DeepSpeed's
    megatron/arguments.py ``_add_transformer_engine_args``: ``--fp8-hybrid`` is E4M3 forward,
    E5M2 backward, and ``validate_args`` requires ``--transformer-impl transformer_engine``).

    Context parallelism is DeepSpeed-Ulysses here (``--ds-sequence-parallel-size``, Megatron-
    DeepSpeed's megatron/arguments.py; its data-parallel size is world / (t x p x c)).
    """
    tp, pp = split
    batch = _batch_and_optimizer_flags(brief, model, config, steps, precision)
    if fp8:
        batch += FP8_FLAGS
    batch += megatron_attention(gpu, fp8=fp8).flags
    iterations = int(batch[batch.index("--train-iters") + 1])
    ulysses = ["--ds-sequence-parallel-size", str(context_parallel)] if context_parallel > 1 else []
    return [
        SCRIPT_ARG,
        "--tensor-model-parallel-size",
        str(tp),
        "--pipeline-model-parallel-size",
        str(pp),
        *ulysses,
        *architecture_flags(model, tp, expert_parallel),
        *batch,
        *_parallelism_flags(split, config, pipeline_model=convertible(brief, config)),
        *_checkpoint_flags(brief, iterations),
        *run_setting_flags(brief),
        *megatron_eval_flags(brief),
    ]


def run_setting_flags(brief: TrainingBrief) -> list[str]:
    """The request's seed and W&B project as Megatron-DeepSpeed's ``--seed``, ``--wandb-project``.

    Both are in its megatron/arguments.py (``_add_initialization_args``, ``_add_logging_args``).
    """
    flags = ["--seed", str(brief.seed)] if brief.seed is not None else []
    return flags + (["--wandb-project", brief.wandb_project] if brief.wandb_project else [])


def is_fine_tune(brief: TrainingBrief) -> bool:
    """Whether the plan starts from a Hugging Face checkpoint (all but pretraining from scratch)."""
    return brief.loads_weights


def convertible(brief: TrainingBrief, config: dict[str, Any]) -> bool:
    """Whether the fine-tune can start from weights Megatron-DeepSpeed's converter writes.

    The converter writes the pipeline model's layout (GPTModelPipe) only, and DeepSpeed's
    pipeline engine trains with ZeRO stage 0 or 1 only; a plan at stage 2 or 3 trains the
    plain model (``--no-pipeline-parallel``), which cannot load that checkpoint.
    """
    return is_fine_tune(brief) and convertible_config(config)


def convertible_config(config: dict[str, Any]) -> bool:
    """Whether the config's ZeRO stage trains the pipeline model the converter writes."""
    return int((config.get("zero_optimization") or {}).get("stage", 0)) <= 1


def is_megatron_command(command: list[str]) -> bool:
    """Whether a launch command runs Megatron's pretrain_gpt.py."""
    return any(
        arg.rstrip('"').endswith("/" + MEGATRON_SCRIPT) or arg == MEGATRON_SCRIPT for arg in command
    )


def _checkpoint_flags(brief: TrainingBrief, iterations: int) -> list[str]:
    """Save every ``SAVE_INTERVAL`` steps into the folder, and load from it: the job resumes.

    Megatron-DeepSpeed's checkpointing arguments (megatron/arguments.py
    ``_add_checkpointing_args``): ``--save``/``--save-interval``; ``--load`` a directory, from
    whose newest checkpoint (DeepSpeed's ``latest`` tag file) the job continues with weights,
    optimizer, RNG and iteration; a missing one starts from random weights (pretraining). A
    fine-tune's first run loads the converted weights instead, with ``--finetune`` (iteration
    0, model only: the converter saved no optimizer); launch.sh picks which (``LOAD_ARGS``).
    Megatron-DeepSpeed saves its own torch format (Megatron-LM's later ``--ckpt-format`` does
    not exist there).
    """
    every = min(brief.save_every or SAVE_INTERVAL, iterations)  # the request's, else 500
    save = ["--save", TRAIN_CHECKPOINTS, "--save-interval", str(every)]
    if not is_fine_tune(brief):
        return ["--load", TRAIN_CHECKPOINTS, *save]
    return [LOAD_ARGS, *save]


def fine_tune_preamble() -> list[str]:
    """launch.sh and train.sbatch lines before a fine-tune's command: which checkpoint to load.

    The job's own checkpoint when it has one (a restart resumes), else the converted weights;
    neither: one line naming convert_checkpoint.sh, and exit 2 before anything starts.
    """
    train, converted = TRAIN_CHECKPOINTS, FINETUNE_CHECKPOINT
    return [
        f"if [[ -f {train}/{LATEST} ]]; then",
        f"    LOAD=(--load {train})",
        f"elif [[ -f {converted}/{LATEST} ]]; then",
        f"    LOAD=({shell_join(FIRST_LOAD)})",
        "else",
        f'    echo "no converted checkpoint in {converted}: run ./{CONVERT_SCRIPT} '
        'HF_MODEL_DIR first (MEGATRON.md)" >&2',
        "    exit 2",
        "fi",
    ]


def _batch_and_optimizer_flags(
    brief: TrainingBrief, model: ModelSpec, config: dict[str, Any], steps: int, precision: str
) -> list[str]:
    """Sequence, batch sizes and steps from the config, then its optimizer, schedule and dtype.

    The batch is the config's layout (tools/planning/batch_layout.py: global = micro x
    accumulation x data parallel; Megatron derives its micro-batches per step from the two
    flags). Megatron-DeepSpeed hands DeepSpeed its own optimizer and LR schedule, which take
    precedence over the config's (DeepSpeed uses a client optimizer when given one), so the
    recipe in ds_config.json is repeated here as Megatron flags (``_schedule_flags``).
    """
    scheduler = (config.get("scheduler") or {}).get("params") or {}
    total = scheduler.get("total_num_steps")
    args = [
        "--seq-length",
        str(brief.seq_len),
        "--max-position-embeddings",
        str(max(brief.seq_len, model.seq_len)),
        *BatchLayout.of_deepspeed(config).megatron_flags(),
        "--train-iters",
        str(total or steps),
    ]
    args += _schedule_flags(config)
    if precision in ("bf16", "fp16"):
        args.append(f"--{precision}")
    return args


def _schedule_flags(config: dict[str, Any]) -> list[str]:
    """The config's AdamW and its schedule as Megatron's flags (none without an optimizer).

    WarmupCosineLR is ``--lr-decay-style cosine``, WarmupDecayLR ``linear`` (to its
    ``warmup_min_lr``), WarmupLR ``constant``.

    Megatron's cosine (megatron/optimizer_param_scheduler.py) warms up linearly over
    ``--lr-warmup-iters``, then decays from ``--lr`` to ``--min-lr`` at ``--lr-decay-iters``:
    the same curve as DeepSpeed's WarmupCosineLR with ``cos_min_ratio`` = min / peak.
    """
    optimizer = (config.get("optimizer") or {}).get("params") or {}
    if not optimizer:
        return []
    scheduler = (config.get("scheduler") or {}).get("params") or {}
    peak = float(optimizer.get("lr", 1e-4))
    total = scheduler.get("total_num_steps")
    betas = optimizer.get("betas") or [0.9, 0.999]
    args = [
        "--optimizer",
        "adam",
        "--lr",
        f"{peak:g}",
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
    ]
    kind = (config.get("scheduler") or {}).get("type")
    if kind == "WarmupDecayLR":  # linear down to warmup_min_lr (deepspeed_config.py)
        floor = float(scheduler.get("warmup_min_lr", 0.0))
        args += ["--lr-decay-iters", str(total), "--lr-decay-style", "linear"]
    elif total and kind != "WarmupLR":
        floor = peak * float(scheduler.get("cos_min_ratio", 0.0))
        args += ["--lr-decay-iters", str(total), "--lr-decay-style", "cosine"]
    else:
        floor = 0.0
        args += ["--lr-decay-style", "constant"]
    return [*args, "--min-lr", f"{floor:g}"]


def _parallelism_flags(
    split: tuple[int, int], config: dict[str, Any], *, pipeline_model: bool = False
) -> list[str]:
    """Sequence parallelism, recomputation, the pipeline switch and DeepSpeed's ZeRO stage.

    ``pipeline_model`` keeps Megatron-DeepSpeed's pipeline model (GPTModelPipe) at one stage:
    the Hugging Face converter builds only that model (tools/hf2megads_weight_converter.py
    ``convert_ckpt`` raises NotImplementedError under --no-pipeline-parallel), and its
    checkpoint's layer files load only into the same model.
    """
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
    if pp == 1 and not pipeline_model:
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


# fp8 linears on Megatron-DeepSpeed: Transformer Engine's layers with its hybrid format.
FP8_FLAGS = ["--transformer-impl", "transformer_engine", "--fp8-hybrid"]
FP8_NOTE = (
    "fp8 linears: `--transformer-impl transformer_engine --fp8-hybrid` runs the transformer "
    "layers' linears on FP8 tensor cores (E4M3 forward, E5M2 gradients, delayed scaling over "
    "`--fp8-amax-history-len` steps) with bf16 everywhere else; it needs NVIDIA Transformer "
    "Engine installed and a GPU of compute capability 8.9 or later (Ada, Hopper, Blackwell)."
)


def megatron_md(
    command: list[str],
    hardware: HardwareSpec,
    model: ModelSpec,
    split: tuple[int, int],
    config: dict[str, Any],
    context_parallel: int = 1,
    expert_parallel: int = 1,
) -> str:
    """MEGATRON.md: why the plan needs Megatron-DeepSpeed, how to start it, what the config says."""
    tp, pp = split
    world = hardware.world_size
    dp = world // (tp * pp * context_parallel)
    ulysses = (
        f" x sequence (context) parallel {context_parallel}, DeepSpeed-Ulysses "
        "(`--ds-sequence-parallel-size`: each rank holds 1/"
        f"{context_parallel} of every sequence, and an all-to-all gives attention whole "
        "sequences of a share of the heads)"
        if context_parallel > 1
        else ""
    )
    if expert_parallel > 1:
        ulysses += (
            f", the routed experts split over {expert_parallel} of the data-parallel ranks "
            f"(expert parallel {expert_parallel}, DeepSpeed-MoE's `--moe-expert-parallel-size`: "
            "each holds 1/" + f"{expert_parallel} of the experts and all-to-alls route tokens)"
        )
    return render(
        "MEGATRON.md",
        model=model.name,
        degrees=f"tensor parallel {tp} x pipeline parallel {pp}{ulysses} x data parallel {dp} "
        f"= {world} GPUs",
        script=MEGATRON_SCRIPT,
        megatron_dir=MEGATRON_DIR,
        deepspeed_note=deepspeed_note(),
        nodes=hardware.nodes,
        finetune=_finetune_note(command, config, model),
        architecture=architecture_note(model)
        + ("\n\n" + FP8_NOTE if "--fp8-hybrid" in command else "")
        + "\n\n"
        + _attention_note(megatron_attention(hardware.gpu, fp8="--fp8-hybrid" in command).note),
        command=shell_join(first_run(command)),
        stage=(config.get("zero_optimization") or {}).get("stage", 0),
        dp=dp,
        world=world,
        train_batch_size=config.get("train_batch_size"),
        micro_batch=config.get("train_micro_batch_size_per_gpu"),
        accumulation=config.get("gradient_accumulation_steps"),
        stages=stages_note(model, pp),
    )


def _attention_note(note: str) -> str:
    """The plan's attention line as a MEGATRON.md sentence."""
    what = note.removeprefix("attention: ")
    return f"Attention: {what}."


def stages_note(model: ModelSpec, pp: int) -> str:
    """MEGATRON.md's line on how the pipeline splits the layers (uneven where p does not divide).

    Megatron-DeepSpeed builds the pipeline model (GPTModelPipe) as DeepSpeed's
    ``PipelineModule`` with ``partition_method='type:transformer'``: ``partition_balanced``
    over one unit per transformer layer, so the first L mod p stages take one layer more
    (tools/planning/parallel.py ``pipeline_split``, the split the plan priced). No flag sets
    it: Megatron-DeepSpeed has no ``--decoder-first-pipeline-num-layers`` (megatron-core's).
    """
    if pp <= 1:
        return "No pipeline: every rank of a tensor group holds all the layers."
    split = pipeline_split(model.layers, pp)
    if not split:
        return f"The pipeline's {pp} stages hold {model.layers // pp} layers each."
    return (
        f"The pipeline's {pp} stages hold {', '.join(str(n) for n in split)} layers: "
        f"{model.layers} layers do not divide by {pp}, and DeepSpeed's PipelineModule "
        "(`partition_method='type:transformer'` in Megatron-DeepSpeed's GPTModelPipe) gives "
        "the first stages one more, the first also holding the embedding. No flag sets the "
        f"split; the memory and speed estimates priced the {max(split)}-layer stages."
    )


def first_run(command: list[str]) -> list[str]:
    """The command as a fine-tune's first run has it: the converted weights for launch.sh's choice.

    The guide's copy is run by hand, where launch.sh's ``LOAD`` array does not exist.
    """
    if LOAD_ARGS not in command:
        return command
    at = command.index(LOAD_ARGS)
    return [*command[:at], *FIRST_LOAD, *command[at + 1 :]]


def _finetune_note(command: list[str], config: dict[str, Any], model: ModelSpec) -> str:
    """MEGATRON.md's paragraph on the checkpoints: the conversion for a fine-tune, resuming."""
    resume = (
        f"The job saves every `--save-interval` steps into `{TRAIN_CHECKPOINTS}` and, started "
        "again (the same launch.sh or train.sbatch), resumes from the newest checkpoint there: "
        "weights, optimizer, RNG and step."
    )
    if LOAD_ARGS not in command:
        return "This is pretraining from random weights: no checkpoint to convert. " + resume
    steps = (
        f"This is a fine-tune. First convert the Hugging Face checkpoint (a local folder) "
        f"with the plan's tensor and pipeline degrees: `./{CONVERT_SCRIPT} /path/to/hf-model` "
        f"(or `HF_MODEL=/path/to/hf-model`), with `{MEGATRON_DIR}` set, runs Megatron-DeepSpeed's "
        f"`{CONVERTER}` (as examples_deepspeed/finetune_hf_llama/finetune_llama.sh does, Llama "
        f"family) into `{FINETUNE_CHECKPOINT}`; its DeepSpeed config is `{CONVERT_CONFIG}`. "
        f"Every converter rank loads the whole model into CPU memory. Then launch: the first "
        f"run loads `{FINETUNE_CHECKPOINT}` with `--finetune` (weights only, step 0; the "
        f"command above), and launch.sh refuses to start while it is missing. "
        + resume
        + " launch.sh and train.sbatch choose between the two (their `LOAD` array). Give "
        "training the same folder as tokenizer (`--tokenizer-type HFTokenizer "
        "--tokenizer-model /path/to/hf-model`): the converted embedding is padded to its "
        "vocabulary."
    )
    refusal = convert_refusal(model)
    if refusal is not None:
        steps += (
            f" Not for this model: {refusal}; {CONVERT_SCRIPT} says so and exits. Start such "
            f"a fine-tune from a Megatron-DeepSpeed checkpoint of the model saved with these "
            f"degrees, placed in `{FINETUNE_CHECKPOINT}`."
        )
    elif not convertible_config(config):
        stage = (config.get("zero_optimization") or {}).get("stage", 0)
        steps += (
            f" Not for this plan: the converter writes the pipeline model (GPTModelPipe), which "
            f"DeepSpeed trains with ZeRO stage 0 or 1 only, and this plan needs stage {stage} "
            f"(the plain model, `--no-pipeline-parallel`); {CONVERT_SCRIPT} says so and exits. "
            "Start such a fine-tune from a Megatron-DeepSpeed checkpoint of the plain model "
            f"saved with these degrees, placed in `{FINETUNE_CHECKPOINT}`."
        )
    return steps


def convert_files(
    title: str,
    brief: TrainingBrief,
    hardware: HardwareSpec,
    gpus: int,
    model: ModelSpec,
    split: tuple[int, int],
    config: dict[str, Any],
    precision: str,
) -> dict[str, str]:
    """convert_checkpoint.sh and its DeepSpeed config, for a fine-tune.

    The script converts a local Hugging Face model folder (its argument, or ``HF_MODEL``) into
    ``FINETUNE_CHECKPOINT`` with the plan's tensor and pipeline degrees, running
    Megatron-DeepSpeed's ``tools/hf2megads_weight_converter.py`` with the flags
    examples_deepspeed/finetune_hf_llama/finetune_llama.sh gives it (``--hf-ckpt-dir``,
    ``--load-mode auto``: Transformers' from_pretrained, so any shard layout; ``--save``; the
    model's shape and degrees as in training; ``--tokenizer-type HFTokenizer`` on the same
    folder, which sets the padded vocabulary the checkpoint is cut to). A plan the converter
    cannot serve (``convertible``) gets a script that says why and exits 2.
    """
    tp, pp = split
    nodes, procs = _converter_layout(hardware, gpus, tp * pp)
    dp = nodes * procs // (tp * pp)
    layout = hardware.model_copy(update={"nodes": nodes})
    hf = Shell('"$HF_MODEL"')
    command = [
        *cluster.torchrun(layout, procs, "node0"),
        _in_checkout(CONVERTER),
        "--hf-ckpt-dir",
        hf,
        "--load-mode",
        "auto",
        "--save",
        FINETUNE_CHECKPOINT,
        # validate_args asserts an interval wherever --save is given; the converter saves once.
        "--save-interval",
        "1",
        "--tensor-model-parallel-size",
        str(tp),
        "--pipeline-model-parallel-size",
        str(pp),
        *architecture_flags(model, tp),
        "--seq-length",
        str(brief.seq_len),
        "--max-position-embeddings",
        str(max(brief.seq_len, model.seq_len)),
        # One sample per data-parallel rank: the converter builds, loads and saves, no step.
        "--micro-batch-size",
        "1",
        "--global-batch-size",
        str(dp),
        "--train-iters",
        "1",
        "--tokenizer-type",
        "HFTokenizer",
        "--tokenizer-model",
        hf,
        *([f"--{precision}"] if precision in ("bf16", "fp16") else []),
        "--deepspeed",
        "--deepspeed_config",
        CONVERT_CONFIG,
        "--zero-stage",
        "0",
    ]
    where = f"on each of the {nodes} nodes" if nodes > 1 else "on one node"
    comments = [
        title.replace("# Launch for:", "# Hugging Face -> Megatron-DeepSpeed checkpoint for:", 1),
        f"# Usage: ./{CONVERT_SCRIPT} HF_MODEL_DIR (or HF_MODEL=HF_MODEL_DIR), {where}, with "
        f"MEGATRON_DIR set; writes {FINETUNE_CHECKPOINT} (tensor {tp} x pipeline {pp}), which "
        "launch.sh loads.",
    ]
    body = [
        *deepspeed_check(),
        shell_join(command),
        f'echo "converted into {FINETUNE_CHECKPOINT}; now run ./launch.sh"',
    ]
    files = {
        CONVERT_CONFIG: json.dumps(
            {"train_batch_size": dp, "train_micro_batch_size_per_gpu": 1}, indent=2
        )
        + "\n"
    }
    if not convertible(brief, config):
        stage = (config.get("zero_optimization") or {}).get("stage", 0)
        body = [
            f"echo \"{CONVERT_SCRIPT}: Megatron-DeepSpeed's converter writes the pipeline "
            f"model, which DeepSpeed trains with ZeRO stage 0 or 1 only; this plan uses stage "
            f'{stage} (MEGATRON.md)" >&2',
            "exit 2",
        ]
        files = {}
    refusal = convert_refusal(model)
    if refusal is not None:
        body = [f'echo "{CONVERT_SCRIPT}: {refusal} (MEGATRON.md)" >&2', "exit 2"]
        files = {}
    script = render(CONVERT_SCRIPT, comments="\n".join(comments), commands="\n".join(body))
    return {CONVERT_SCRIPT: script, **files}


def folder_check(generated: str) -> list[str]:
    """A script's first lines after its cd: stop unless it stands in the plan's folder.

    launch.sh changes to its own directory; train.sbatch to ``$SLURM_SUBMIT_DIR`` (sbatch runs
    a spooled copy), so ``sbatch train.sbatch`` from elsewhere would find no relative path.
    """
    return [
        f"if [[ ! -f {generated} ]]; then",
        f'    echo "no {generated} in $PWD: start this from the plan\'s folder" >&2',
        "    exit 2",
        "fi",
    ]


def _converter_layout(hardware: HardwareSpec, gpus: int, ranks: int) -> tuple[int, int]:
    """(nodes, processes per node) for the converter: one rank per tensor x pipeline slot.

    Every rank loads the whole Hugging Face model into CPU memory (from_pretrained), so the
    fewest ranks the degrees allow; the plan's own layout when they do not fill whole nodes.
    """
    if ranks <= gpus:
        return 1, ranks
    if ranks % gpus == 0:
        return ranks // gpus, gpus
    return hardware.nodes, gpus
