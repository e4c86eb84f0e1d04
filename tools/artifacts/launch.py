"""Write the launch artifacts: ds_config.json, the training script, launchers and guides.

One row of ``LAUNCHERS`` per way of starting training; a row returns its command, the files
only it writes and the line saying how to run it, and ``emit_launch`` adds the files every
plan gets (model_config.json, launch.sh, and train.sbatch and accelerate_config.yaml where
the row says so). Adding a framework adds a row.

The training script is ``trainer/train.py``: ``trainer/`` is a copy of the standalone scripts'
folder (tools/smoke/scripts/, whole: train.py and the modules it imports), and the launchers run
it from the plan's folder, where its relative paths (ds_config.json, checkpoints/) point. A plan
with a DeepSpeed config starts with the DeepSpeed launcher (``deepspeed``, a hostfile for
several nodes, plus one ``launch_node{R}.sh`` per node for clusters without passwordless ssh),
and also gets ``ds_config_hf.json``, the Hugging Face Trainer flavour of the same config
(tools/artifacts/deepspeed_config.py ``hf_trainer_config``). A plan without one (plain PyTorch
DDP) starts with ``torchrun``, which train.py then runs in its DDP mode. Both also get a SLURM
``train.sbatch`` and an Accelerate ``accelerate_config.yaml`` (tools/artifacts/cluster.py).

train.py runs the real job (``python trainer/train.py --help``): a fine-tune loads the model's
weights (``--init pretrained --model-path``, the hub id or local folder the plan names, or
``$MODEL_PATH``), a LoRA plan trains adapters of the plan's rank, ``$DATA`` names the dataset,
and the job checkpoints into ``checkpoints/`` and resumes from it. FSDP plans run train.py's
FSDP2 mode with the plan's sharding (FSDP.md also shows how to wrap the model in a script of
one's own). Horovod and TensorFlow plans get a launch command for the user's own script and a
guide (HOROVOD.md, TF_CONFIG.md; see tools/artifacts/guides.py) saying how to write it.

A plan with tensor/pipeline parallelism launches with the framework that implements it for the
model (tools/research/framework.py ``setup_framework``; the plan's ``framework`` says which):
tensor parallelism alone on a Hugging Face model runs train.py under the DeepSpeed launcher with
DeepSpeed AutoTP (``tensor_parallel.autotp_size`` in ds_config.json); a pipeline on a Llama model
torchtitan defines gets ``torchtitan.toml`` and a torchrun launch of ``torchtitan.train``
(tools/artifacts/torchtitan.py, TORCHTITAN.md); any other split gets ds_config.json (the ZeRO
part, batch sizes per data-parallel rank), a torchrun command for Megatron-DeepSpeed's
``$MEGATRON_DIR/pretrain_gpt.py`` with the plan's degrees, and MEGATRON.md
(tools/artifacts/megatron.py). None of them gets the Hugging Face flavour or the Accelerate
config, which size batches by the whole world; only the AutoTP plan gets trainer/.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from tools.artifacts import cluster, guides, megatron, torchtitan
from tools.artifacts.cluster import MASTER_PORT
from tools.artifacts.deepspeed_config import hf_trainer_config
from tools.artifacts.headline import FP8_NOT_APPLIED, NOT_AS_IS
from tools.artifacts.megatron_env import deepspeed_check
from tools.artifacts.megatron_fp8 import fp8_refusal
from tools.artifacts.recipe_launch import (
    eval_notes,
    recipe_args,
    recipe_not_applied,
    train_py_eval_args,
)
from tools.artifacts.run_shape import RunShape, shape_run
from tools.artifacts.scripts import Shell, comment_text, shell_quote
from tools.core.errors import ToolFailure
from tools.core.outputs import check_files, copy_file, listed, remove_file, write_file
from tools.core.schemas import (
    FrameworkChoice,
    HardwareSpec,
    LaunchSpec,
    MemoryPlan,
    ModelSpec,
    TrainingBrief,
)
from tools.core.strategies import train_py_fsdp
from tools.planning.batch import resolve_batch
from tools.planning.memory import resolve_precision
from tools.planning.optimizer_recipe import brief_recipe
from tools.planning.states import DEFAULT_LORA_RANK
from tools.research.architectures import trains_as_causal_lm
from tools.research.megatron_arch import megatron_differs
from tools.research.model_catalog import weights_location
from tools.research.variant_weights import variant_weights
from tools.smoke.standalone import script_files

# The plan's copy of the standalone scripts (tools/smoke/scripts/, copied whole): launch.sh runs
# the job script in it from the plan's folder.
JOB_DIR = "trainer"
JOB_SCRIPT = f"{JOB_DIR}/train.py"
_JOB_FILES = f"{JOB_DIR}/*"
# The scripts the user writes for frameworks train.py does not cover (we never generate them).
USER_SCRIPTS = {
    "horovod": "train_horovod.py",
    "tensorflow": "train_tensorflow.py",
}
# Frameworks whose plans run train.py in a mode of its own (the rest by config and split).
TRAIN_PY_MODES = {"pytorch_fsdp": "fsdp"}
# The environment variables launch.sh reads: the weights (a default from the plan) and the data.
MODEL_PATH_ENV = "MODEL_PATH"
DATA_ENV = "DATA"
# A model train.py cannot train runs the user's script, named by this variable.
TRAIN_SCRIPT_ENV = "TRAIN_SCRIPT"
# A pretraining plan's data: trainer/prepare_data.py tokenizes the corpus once into token shards
# here (relative to the plan's folder), and launch.sh gives them to the job when DATA is unset.
PREPARE_SCRIPT = f"{JOB_DIR}/prepare_data.py"
SHARDS_DIR = "data/tokens"
# A script that runs train.py exports its pid and host (tools/smoke/scripts/harness.py JOB_ENV): the
# ranks stop when it is gone, however it ended (SIGKILL of its process group included). The
# host from uname -n (gethostname, as train.py reads it): $HOSTNAME may be inherited from
# another machine (sbatch passes the submitting shell's environment on).
JOB_PID_LINE = 'export TRAINWRIGHT_JOB_PID="$$@$(uname -n)"'
_JOB_COMMENT = (
    f"# Set {DATA_ENV} to your dataset (a .jsonl or .txt file or folder, a datasets folder "
    f"saved with save_to_disk, or the token shards {JOB_DIR}/prepare_data.py writes); "
    f"{MODEL_PATH_ENV} overrides where the weights load from. "
    "Checkpoints go to checkpoints/: run this again to resume from the latest. Arguments to "
    "this script go to train.py (./launch.sh --steps 50)."
)
_PREPARE_COMMENT = (
    "# Pretraining data: tokenize your corpus once (.txt/.jsonl files or folders; in parallel, "
    "resumable: the same command again finishes an interrupted run) with: {0} ; then {1} "
    "(DATA unset: the shards in " + SHARDS_DIR + " when prepared). Each rank streams only its "
    "slice of the shards, and a resumed job continues at the sample where it stopped."
)
_SHARDS_DEFAULT = (
    f'[[ -n "${{{DATA_ENV}:-}}" || ! -f {SHARDS_DIR}/index.json ]] || {DATA_ENV}={SHARDS_DIR}'
)
_NO_QLORA_COMMENT = (
    "# QLoRA's 4-bit base needs bitsandbytes on a CUDA GPU and this plan's hardware has none: "
    "train.py refuses --qlora here (drop it to train the adapters on a 16-bit base)."
)
# Megatron-DeepSpeed's arguments have no keep-last option (megatron/arguments.py).
_MEGATRON_KEEPS_ALL = (
    "keep_checkpoints {} not applied: Megatron-DeepSpeed keeps every checkpoint it saves (its "
    "arguments have no keep-last option); delete old ones from the checkpoint folder"
)
# How often the job checkpoints: about ten times a run, at most every 500 steps (unless asked).
_SAVES_PER_RUN = 10
_MAX_SAVE_EVERY = 500
_NODE_SCRIPTS = "launch_node*.sh"
# Every name emit_launch may write, in the order LaunchSpec.files lists them (plan.json and
# the report show it); a name missing here is an error, so a new file cannot escape the
# cleanup: a re-emit removes the ones the new plan does not use.
_ARTIFACTS = (
    "model_config.json",
    _JOB_FILES,
    "train.py",  # where plans before trainer/ had the script: a re-emit removes it
    "ds_config.json",
    "ds_config_hf.json",
    "hostfile",
    _NODE_SCRIPTS,
    megatron.CONVERT_CONFIG,
    megatron.CONVERT_SCRIPT,
    "MEGATRON.md",
    torchtitan.TORCHTITAN_CONFIG,
    "TORCHTITAN.md",
    "train.sbatch",
    "accelerate_config.yaml",
    "HOROVOD.md",
    "TF_CONFIG.md",
    "FSDP.md",
    "launch.sh",
)


@dataclass(frozen=True)
class LaunchInputs:
    """What every launcher reads: the plan, plus what emit_launch derives from it once."""

    brief: TrainingBrief
    hardware: HardwareSpec
    model: ModelSpec
    deepspeed_config: dict[str, Any] | None
    split: tuple[int, int] | None  # (tensor, pipeline) degrees of a model-parallel plan
    steps: int
    gpus: int  # per node; a CPU-only machine counts as one
    precision: str
    title: str  # the first comment line of every launch script
    strategy: str | None = None  # the memory plan's chosen strategy, when there is one
    memory: MemoryPlan | None = None  # the plan the setup comes from
    run: RunShape | None = None  # steps, batch layout and schedule (tools/artifacts/run_shape.py)
    fp8: bool = False  # the recipe asks for fp8 linears (tools/planning/fp8.py)


@dataclass
class Launch:
    """One launcher's part: its command, the files only it writes, and how to run it."""

    command: list[str]
    how_to_run: str  # a comment line for launch.sh
    files: dict[str, str | Path] = field(default_factory=dict)  # text, or a file to copy
    sbatch: bool = True
    accelerate: bool = False
    preamble: list[str] = field(default_factory=list)  # launch.sh lines before the command
    fp8: bool = False  # the launch applies the plan's fp8 linears
    fp8_note: str | None = None  # why it does not, where its launcher has an fp8 path


Launcher = Callable[[LaunchInputs], Launch]


def emit_launch(
    out_dir: Path,
    brief: TrainingBrief,
    hardware: HardwareSpec,
    model: ModelSpec,
    framework: FrameworkChoice,
    deepspeed_config: dict[str, Any] | None,
    *,
    steps: int | None = None,
    memory: MemoryPlan | None = None,
) -> LaunchSpec:
    """Write the files needed to start training on the target hardware and return the command.

    The command is an argument list (never a shell string); ``launch.sh`` quotes it for people.
    ``memory`` is the plan the config came from: a tensor/pipeline-parallel plan gets the
    Megatron-DeepSpeed launch. (The config alone cannot tell: its batch arithmetic gives the
    product of the degrees at best, not the split.) ``steps`` is the run's length (None: the
    brief's dataset tokens over the tokens per step, else the default run); the schedule of
    every launcher, ds_config.json's included, spans it (tools/artifacts/run_shape.py).
    """
    brief = resolve_batch(brief, model, hardware)[0]  # the default the search planned with
    run, deepspeed_config = shape_run(brief, model, hardware, memory, deepspeed_config, steps)
    job = LaunchInputs(
        brief=brief,
        hardware=hardware,
        model=model,
        deepspeed_config=deepspeed_config,
        split=megatron.model_parallel(memory)
        or (
            # A plan that asks for Megatron runs it even when data parallelism alone fits.
            (memory.tensor_parallel, memory.pipeline_parallel)
            if memory is not None and framework.primary == "megatron"
            else None
        ),
        memory=memory,
        steps=run.steps,
        run=run,
        gpus=hardware.gpus_per_node if hardware.gpus_per_node > 0 else 1,
        precision=resolve_precision(brief.precision, hardware),
        title=f"# Launch for: {comment_text(brief.goal or model.name)} ({framework.primary})",
        strategy=memory.chosen if memory is not None else None,
        fp8=brief.recipe is not None and brief.recipe.precision == "fp8",
    )
    launcher = _launcher_for(framework, job)
    launch = LAUNCHERS[launcher](job)
    texts: dict[str, str | Path] = {"model_config.json": _json(model.hf_config or {})}
    texts |= launch.files
    job_script = JOB_SCRIPT in launch.files
    script_command = job_command(launch.command) if job_script else launch.command
    preamble = (
        [*own_script_guard(model), *job_preamble(launch.command), *launch.preamble]
        if job_script
        else launch.preamble
    )
    data_steps = pretraining_data(brief, model) if job_script else None
    preamble += data_preamble(brief, model) if job_script else []
    if job_script:
        # Arguments to launch.sh and train.sbatch go to train.py after the plan's (the last wins).
        script_command = [*script_command, cluster.ARGS]
    if launch.sbatch:
        texts["train.sbatch"] = cluster.sbatch(
            brief, hardware, model, job.gpus, script_command, preamble
        )
    if launch.accelerate:
        texts["accelerate_config.yaml"] = cluster.accelerate_config(
            hardware, job.gpus, job.precision, deepspeed_config
        )
    comments = [job.title, launch.how_to_run]
    if job_script:
        comments.append(_JOB_COMMENT)
        if "--qlora" in launch.command and hardware.gpu is None:
            comments.append(_NO_QLORA_COMMENT)
        if data_steps is not None:
            comments.append(comment_text(_PREPARE_COMMENT.format(*data_steps)))
    texts["launch.sh"] = cluster.launch_script(comments, script_command, preamble)
    # All or nothing: a file of the user's among them stops the launch before any is written.
    check_files(out_dir, texts)
    files = _write(out_dir, texts)
    _remove_stale(out_dir, files)
    notes = [*run.notes, *([_router_loss_note(model)] if job_script else [])]
    if launcher == "megatron" and (differs := megatron_differs(model, brief.loads_weights)):
        # Said whichever way Megatron was chosen: named, pinned, or the only fit.
        notes.insert(0, f"{differs}; {NOT_AS_IS} (MEGATRON.md)")
    if brief.keep_checkpoints is not None and launcher == "megatron":
        notes.append(_MEGATRON_KEEPS_ALL.format(brief.keep_checkpoints))
    notes += [] if job_script else _run_settings_not_applied(brief, launcher)
    notes += recipe_not_applied(brief, launcher) + eval_notes(brief, launcher, job.steps)
    if job.fp8 and not launch.fp8:
        notes.insert(0, launch.fp8_note or _FP8_NOT_APPLIED.format(launcher=launcher))
    return LaunchSpec(command=launch.command, files=files, notes=[n for n in notes if n])


def data_preamble(brief: TrainingBrief, model: ModelSpec) -> list[str]:
    """The lines that give ``DATA`` the plan's default when it is unset, then export it.

    The default is the request's data path, else the shards prepare_data.py wrote (a pretraining
    plan). Exported, as ``MODEL_PATH`` is: a multi-node SLURM job runs the launcher in a child
    ``bash -c``, which sees only the environment.
    """
    lines = [_data_default(brief.data_path)] if brief.data_path else []
    lines += [_SHARDS_DEFAULT] if pretraining_data(brief, model) is not None else []
    return [*lines, f"export {DATA_ENV}"] if lines else []


def _data_default(path: str) -> str:
    """launch.sh's line that makes the request's data path the default ``DATA`` ("~/" expands)."""
    where = f'"$HOME"/{shell_quote(path[2:])}' if path.startswith("~/") else shell_quote(path)
    return f'[[ -n "${{{DATA_ENV}:-}}" ]] || {DATA_ENV}={where}'


def _run_settings_not_applied(brief: TrainingBrief, launcher: str) -> list[str]:
    """One line per run setting the request named that this launch does not pass (train.py's do).

    Megatron-DeepSpeed takes ``--seed`` and ``--wandb-project`` (``megatron.run_setting_flags``);
    its data is the indexed dataset MEGATRON.md says to add. torchtitan's TOML sets the seed
    (``[debug] seed``) and reads its own dataset, and its W&B logger takes no project here.
    """
    lines = []
    if brief.seed is not None and launcher not in ("megatron", "torchtitan"):
        lines.append(f"seed {brief.seed} not applied: the {launcher} launch sets no seed")
    if brief.wandb_project and launcher != "megatron":
        lines.append(
            f"W&B project {brief.wandb_project!r} not applied: the {launcher} launch does not log "
            "to Weights & Biases (train.py's --wandb does)"
        )
    if brief.data_path:
        lines.append(
            f"data {brief.data_path!r} not applied: the {launcher} launch reads the dataset its "
            "guide says to name (train.py's --data reads the path as given)"
        )
    return lines


# A launcher without an fp8 path: said in one line, never an fp8 label on a bf16 run.
_FP8_NOT_APPLIED = (
    FP8_NOT_APPLIED + ": the {launcher} launch has no fp8 path here, so it trains "
    "bf16 mixed precision and runs slower than the fp8 estimate (torchtitan and Megatron "
    "launches apply fp8)"
)


def _router_loss_note(model: ModelSpec) -> str:
    """What train.py changes in a mixture of experts' config to train it (job_model.py)."""
    cfg = model.hf_config or {}
    coef = cfg.get("router_aux_loss_coef")
    moe = model.active_params is not None and model.active_params < model.params
    if moe and "output_router_logits" not in cfg:
        return (
            f"mixture of experts: transformers' {cfg.get('model_type', 'model')} computes no "
            "load-balancing loss (nor DeepSeek-V3's bias balancing), so train.py trains its router "
            "on the language-model loss alone: watch how evenly the experts are loaded"
        )
    if "output_router_logits" not in cfg or not isinstance(coef, int | float) or coef <= 0:
        return ""
    return (
        f"mixture of experts: train.py trains with the router's load-balancing loss on "
        f"(output_router_logits, weight router_aux_loss_coef {coef:g} from the model's config; "
        "transformers leaves it out of the loss while that switch is off, as released configs "
        "have it). train.py does not split the experts across ranks (the plan's expert parallelism runs "
        "on Megatron-DeepSpeed)"
    )


def _launcher_for(framework: FrameworkChoice, job: LaunchInputs) -> str:
    """The ``LAUNCHERS`` row for a plan: the framework's own, else by config and split.

    The row follows the plan's framework, which follows the setup (tools/research/framework.py
    ``setup_framework``, or an fp8 recipe's launcher): torchtitan runs its own trainer; megatron runs pretrain_gpt.py; a
    deepspeed plan, tensor-parallel or not, runs train.py under the DeepSpeed launcher (AutoTP
    reads the degree from ds_config.json). A tensor/pipeline split under any other framework
    is refused: its files would not run the plan.
    """
    if framework.primary in USER_SCRIPTS and job.split is None:
        return framework.primary
    if framework.primary in TRAIN_PY_MODES and job.split is None:
        return TRAIN_PY_MODES[framework.primary]
    if framework.primary == "torchtitan":
        # A split, or an fp8 plan's data parallelism (FSDP2 or DDP, tools/artifacts/fp8_launch.py).
        if job.memory is None:
            raise ToolFailure("a torchtitan launch needs the plan's setup")
        return "torchtitan"
    if job.deepspeed_config is None:
        if job.split is None:
            return "torchrun"
        raise ToolFailure(
            f"the setup {job.split[0]} x {job.split[1]} (tensor x pipeline) under "
            f"{framework.primary} has no DeepSpeed config; emit the config first"
        )
    if framework.primary == "megatron":
        return "megatron"
    autotp = (job.deepspeed_config.get("tensor_parallel") or {}).get("autotp_size", 0)
    if job.split is not None and (job.split[1] > 1 or autotp != job.split[0]):
        raise ToolFailure(
            f"the plan's framework {framework.primary} runs no tensor {job.split[0]} x "
            f"pipeline {job.split[1]} split with this config (AutoTP size {autotp or 'unset'}); "
            "the framework must follow the setup (DeepSpeed AutoTP, torchtitan or megatron)"
        )
    return "deepspeed"


def _deepspeed(job: LaunchInputs) -> Launch:
    """train.py under the DeepSpeed launcher; several nodes add a hostfile and per-node scripts."""
    assert job.deepspeed_config is not None  # _launcher_for picks this row only then
    hardware, gpus = job.hardware, job.gpus
    script_args = _train_py_args(job)
    files: dict[str, str | Path] = {
        **_job_files(),
        "ds_config.json": _json(job.deepspeed_config),
        # For users who train with the Hugging Face Trainer (TrainingArguments(deepspeed=...)):
        # the same config with the values the Trainer fills from its arguments as "auto".
        "ds_config_hf.json": _json(hf_trainer_config(job.deepspeed_config)),
    }
    autotp = job.split is not None  # _launcher_for checked ds_config's autotp_size matches
    if autotp:
        # The HF Trainer flavour and the Accelerate config size batches by the whole world;
        # under AutoTP DeepSpeed counts world / tensor degree data-parallel ranks.
        del files["ds_config_hf.json"]
    command = ["deepspeed"]
    how_to_run = "# Run from this directory on the first node; edit hostfile with your node names."
    if hardware.nodes > 1:
        files["hostfile"] = cluster.hostfile(hardware, gpus)
        # Each node's script sets the same data default as launch.sh.
        preamble = [
            *own_script_guard(job.model),
            *job_preamble(script_args),
            *data_preamble(job.brief, job.model),
        ]
        # Arguments to launch_node{R}.sh go to the script after the plan's, as for launch.sh.
        node_args = [*job_command(script_args), cluster.ARGS]
        files |= cluster.node_scripts(job.title, hardware, gpus, node_args, preamble)
        command += ["--hostfile", "hostfile", "--num_nodes", str(hardware.nodes)]
        how_to_run += " Without passwordless ssh, run launch_node{R}.sh on node R instead."
    # The config's batch arithmetic is for hardware.world_size ranks; launch that many.
    command += ["--num_gpus", str(gpus), *script_args]
    return Launch(command, how_to_run, files, accelerate=not autotp)


def _ddp(job: LaunchInputs) -> Launch:
    """train.py under torchrun, in its plain DDP mode."""
    command = cluster.torchrun(job.hardware, job.gpus, "node0") + _train_py_args(job)
    # Mixed precision is train.py's autocast flag here (the DeepSpeed mode reads it from
    # ds_config.json instead).
    if job.precision in ("bf16", "fp16"):
        command.append(f"--{job.precision}")
    files: dict[str, str | Path] = _job_files()
    return Launch(command, _torchrun_how_to_run(job.hardware), files, accelerate=True)


def _fsdp(job: LaunchInputs) -> Launch:
    """train.py's FSDP2 mode under torchrun with the plan's sharding; FSDP.md on wrapping."""
    sharding, offload = train_py_fsdp(job.strategy, job.hardware.nodes)
    command = cluster.torchrun(job.hardware, job.gpus, "node0") + _train_py_args(job)
    if sharding is not None:  # None (NO_SHARD) is DDP: train.py's plain mode
        command += ["--fsdp", "--fsdp-sharding", sharding]
        command += ["--fsdp-offload"] if offload else []
    command += [f"--{job.precision}"] if job.precision in ("bf16", "fp16") else []
    guide = guides.fsdp_md(
        command, job.hardware, job.model, job.precision, JOB_SCRIPT, strategy_name=job.strategy
    )
    files: dict[str, str | Path] = {**_job_files(), "FSDP.md": guide}
    return Launch(command, _torchrun_how_to_run(job.hardware), files)


def _horovod(job: LaunchInputs) -> Launch:
    """Horovod's horovodrun on the first node, which reaches the others over ssh; HOROVOD.md."""
    script = USER_SCRIPTS["horovod"]
    hosts = ",".join(f"{host}:{job.gpus}" for host in cluster.hosts(job.hardware))
    command = ["horovodrun", "-np", str(job.hardware.nodes * job.gpus), "-H", hosts]
    command += ["python", script]
    how_to_run = (
        "# Run on the first node; horovodrun reaches the others over passwordless ssh. "
        f"Write {script} first (HOROVOD.md)."
    )
    keras = job.brief.team.existing_stack == "tensorflow"
    guide = guides.horovod_md(command, job.hardware, job.gpus, script, keras=keras)
    return Launch(command, how_to_run, {"HOROVOD.md": guide}, sbatch=False)


def _tensorflow(job: LaunchInputs) -> Launch:
    """One worker per node, each told its place by TF_CONFIG; TF_CONFIG.md."""
    script = USER_SCRIPTS["tensorflow"]
    command = ["python", script]
    how_to_run = (
        "# Run once on every worker node with that worker's TF_CONFIG exported "
        f"(TF_CONFIG.md). Write {script} first."
    )
    guide = guides.tf_config_md(command, job.hardware, script)
    preamble = [': "${TF_CONFIG:?export TF_CONFIG for this worker first, see TF_CONFIG.md}"']
    return Launch(command, how_to_run, {"TF_CONFIG.md": guide}, sbatch=False, preamble=preamble)


def _megatron(job: LaunchInputs) -> Launch:
    """Megatron-DeepSpeed's pretrain_gpt.py under torchrun, with ds_config.json; MEGATRON.md."""
    config, split = job.deepspeed_config, job.split
    assert config is not None and split is not None  # _launcher_for picks this row only then
    cp = job.memory.context_parallel if job.memory is not None else 1
    ep = job.memory.chosen_setup.ep if job.memory is not None else 1
    # fp8 runs only where Megatron-DeepSpeed's Transformer Engine layers build the model.
    pipeline_model = split[1] > 1 or megatron.convertible(job.brief, config)
    fp8_refused = (
        fp8_refusal(
            job.model,
            split[0],
            pipeline_model=pipeline_model,
            context_parallel=cp,
            expert_parallel=ep,
        )
        if job.fp8
        else None
    )
    fp8 = job.fp8 and fp8_refused is None
    args = megatron.megatron_args(
        job.brief,
        job.model,
        split,
        config,
        job.steps,
        job.precision,
        context_parallel=cp,
        expert_parallel=ep,
        fp8=fp8,
        gpu=job.hardware.gpu,
    )
    command = cluster.torchrun(job.hardware, job.gpus, "node0") + args
    nodes = job.hardware.nodes
    how_to_run = (
        "# Tensor/pipeline parallel on Megatron-DeepSpeed (MEGATRON.md): export MEGATRON_DIR "
        "(your checkout) and run from this directory, adding your --data-path and tokenizer "
        "arguments" + (f", on each of the {nodes} nodes" if nodes > 1 else "") + "."
    )
    files: dict[str, str | Path] = {
        "ds_config.json": _json(config),
        "MEGATRON.md": megatron.megatron_md(
            command, job.hardware, job.model, split, config, context_parallel=cp, expert_parallel=ep
        ),
    }
    preamble = megatron.folder_check("ds_config.json") + deepspeed_check()
    if megatron.is_fine_tune(job.brief):
        # The Hugging Face weights in Megatron-DeepSpeed's layout first; launch.sh refuses to
        # start without them (or the job's own checkpoint, to resume from).
        files |= megatron.convert_files(
            job.title, job.brief, job.hardware, job.gpus, job.model, split, config, job.precision
        )
        preamble += megatron.fine_tune_preamble()
        how_to_run += (
            f" The job starts from the weights: run ./{megatron.CONVERT_SCRIPT} HF_MODEL_DIR first."
        )
    return Launch(command, how_to_run, files, preamble=preamble, fp8=fp8, fp8_note=fp8_refused)


def _torchtitan(job: LaunchInputs) -> Launch:
    """The torchtitan trainer under torchrun with the plan's TOML job config; TORCHTITAN.md."""
    assert job.memory is not None  # _launcher_for picks this row only then
    config = torchtitan.job_config(
        job.brief, job.model, job.hardware, job.memory, job.steps, job.precision, fp8=job.fp8
    )
    if job.brief.seed is not None:  # the request's seed: torchtitan 0.2.2's [debug] seed
        config["debug"] = {"seed": job.brief.seed}
    # As torchtitan's run_train.sh starts it: torchrun ... -m torchtitan.train.
    command = cluster.torchrun(job.hardware, job.gpus, "node0") + [
        "-m",
        torchtitan.TORCHTITAN_MODULE,
        "--job.config_file",
        torchtitan.TORCHTITAN_CONFIG,
    ]
    how_to_run = (
        "# Full 3D parallel on torchtitan (TORCHTITAN.md): pip install "
        f"torchtitan=={torchtitan.TORCHTITAN_RELEASE} first (the release this TOML is for)"
        + (
            f"; run this same script on each of the {job.hardware.nodes} nodes"
            if job.hardware.nodes > 1
            else ""
        )
        + "."
    )
    files: dict[str, str | Path] = {
        torchtitan.TORCHTITAN_CONFIG: torchtitan.job_toml(config),
        "TORCHTITAN.md": torchtitan.torchtitan_md(command, job.hardware, job.model, config),
    }
    return Launch(
        command, how_to_run, files, preamble=torchtitan.launch_preamble(config), fp8=job.fp8
    )


# Keyed by launch (train.py's two modes, Megatron, torchtitan) or, for a script the user
# writes, by framework.
LAUNCHERS: dict[str, Launcher] = {
    "deepspeed": _deepspeed,
    "torchrun": _ddp,
    "megatron": _megatron,
    "torchtitan": _torchtitan,
    "fsdp": _fsdp,
    "horovod": _horovod,
    "tensorflow": _tensorflow,
}


def _torchrun_how_to_run(hardware: HardwareSpec) -> str:
    if hardware.nodes == 1:
        return "# Run it on the training machine."
    return (
        f"# Run this same script from this directory on each of the {hardware.nodes} nodes; "
        f"node0 must resolve to the first node (rendezvous at node0:{MASTER_PORT})."
    )


def _train_py_args(job: LaunchInputs) -> list[str]:
    """train.py's arguments for the plan's job: model, weights, data, batch, schedule, checkpoints."""
    assert job.run is not None  # emit_launch shapes the run first
    layout, schedule = job.run.layout, job.run.schedule
    args = [_job_script(job.model), *_model_args(job), "--steps", str(job.steps)]
    args += ["--seq-len", str(job.brief.seq_len), "--micro-batch", str(layout.micro)]
    save_every = job.brief.save_every or max(1, min(_MAX_SAVE_EVERY, job.steps // _SAVES_PER_RUN))
    args += ["--checkpoint-dir", "checkpoints", "--save-every", str(min(save_every, job.steps))]
    if job.brief.keep_checkpoints is not None:
        args += ["--keep-checkpoints", str(job.brief.keep_checkpoints)]
    args += ["--log-every", "10", "--metrics-dir", "metrics"]
    if job.brief.seed is not None:
        args += ["--seed", str(job.brief.seed)]
    if job.brief.wandb_project:
        args += ["--wandb", job.brief.wandb_project]
    args += _lora_args(job.brief) + train_py_eval_args(job.brief)
    if job.deepspeed_config is not None:
        # Optimizer, schedule, clipping and accumulation are the config's.
        return [*args, "--deepspeed_config", "ds_config.json"]
    # The run's schedule (tools/planning/lr_schedule.py), its floor included, and its recipe.
    args += ["--lr", f"{schedule.peak_lr:g}", *recipe_args(brief_recipe(job.brief))]
    args += ["--lr-schedule", schedule.decay, "--warmup-steps", str(schedule.warmup_steps)]
    if schedule.min_lr_ratio:
        args += ["--min-lr-ratio", f"{schedule.min_lr_ratio:g}"]
    args += ["--grad-accum", str(layout.accumulation)]
    if job.memory is not None and job.memory.activation_checkpointing:
        args.append("--gradient-checkpointing")
    return args


def _model_args(job: LaunchInputs) -> list[str]:
    """Pretraining from scratch builds from model_config.json; other jobs load the weights.

    A fine-tune, LoRA or continued pretraining loads the plan's weights.

    The weights default to the ones the brief names (a variant such as
    ``meta-llama/Meta-Llama-3-8B-Instruct``: tools/research/variant_weights.py), else the
    model's hub id (a catalog model) or its local folder, and ``$MODEL_PATH`` overrides them (a
    local copy on the cluster).
    """
    if not job.brief.loads_weights:
        return ["--model-config", "model_config.json"]
    where = variant_weights(job.brief.model) or weights_location(job.model) or job.model.name
    return ["--init", "pretrained", "--model-path", where]


def _job_script(model: ModelSpec) -> str:
    """train.py, or ``"$TRAIN_SCRIPT"`` for a model it cannot train (it builds a causal LM).

    An image model or an encoder-decoder would stop in transformers' AutoModelForCausalLM on
    every rank; its scripts run the model's own training loop, with the same arguments, and
    refuse to start until ``$TRAIN_SCRIPT`` names it (``own_script_guard``).
    """
    if trains_as_causal_lm(model.hf_config or {}):
        return JOB_SCRIPT
    return Shell(f'"${TRAIN_SCRIPT_ENV}"')


def own_script_guard(model: ModelSpec) -> list[str]:
    """The line that stops a launch of ``$TRAIN_SCRIPT`` while it is unset (none for train.py)."""
    if trains_as_causal_lm(model.hf_config or {}):
        return []
    why = comment_text(
        f"{model.name} ({model.family}) is not a causal language model, so {JOB_SCRIPT} (token "
        "batches, next-token loss) cannot train it: set TRAIN_SCRIPT to its own training "
        "script, which gets the arguments below"
    )
    return [
        f'if [[ -z "${{{TRAIN_SCRIPT_ENV}:-}}" ]]; then',
        f"    echo {shell_quote(why)} >&2",
        "    exit 2",
        "fi",
    ]


def pretraining_data(brief: TrainingBrief, model: ModelSpec) -> tuple[str, str] | None:
    """A pretraining plan's data steps: tokenize the corpus into shards, then run on them.

    None for other tasks (a fine-tune's dataset is tokenized by the job itself). The tokenizer
    is the model's (its hub id or folder); a model given by size names none, so the command
    says to give one.
    """
    if brief.task != "pretrain":
        return None
    tokenizer = weights_location(model)
    named = shell_quote(tokenizer) if tokenizer else "YOUR_TOKENIZER_FOLDER"
    prepare = f"python {PREPARE_SCRIPT} YOUR_CORPUS --out {SHARDS_DIR} --tokenizer {named}"
    return prepare, f"{DATA_ENV}={SHARDS_DIR} ./launch.sh"


def job_command(command: list[str]) -> list[str]:
    """The plan's train.py command as the scripts run it: ``$MODEL_PATH`` and ``$DATA`` read.

    The plan's command names the weights it was planned with and no dataset; the scripts pass
    ``--model-path "$MODEL_PATH"`` (``job_preamble`` sets it to the plan's weights when unset)
    and ``--data "$DATA"`` when it is set (unset, train.py says so and trains on synthetic
    patterns); a one-node DeepSpeed launch takes its port from ``$MASTER_PORT`` when set.
    """
    shell: list[str] = []
    command = cluster.port_from_env(command)
    for i, arg in enumerate(command):
        after_flag = i > 0 and command[i - 1] == "--model-path"
        shell.append(Shell(f'"${MODEL_PATH_ENV}"') if after_flag else arg)
    return [*shell, Shell(f"${{{DATA_ENV}:+--data}}"), Shell(f'${{{DATA_ENV}:+"${DATA_ENV}"}}')]


def job_preamble(command: list[str]) -> list[str]:
    """The lines before a train.py command: the pid the ranks watch, and the weights.

    ``$MODEL_PATH`` keeps a value from the environment, else gets the plan's weights, quoted
    on a line of its own (``shell_quote``: any character survives, a newline included), and is
    exported for the ``bash -c`` that a multi-node SLURM job runs on each node.
    """
    lines = [JOB_PID_LINE]
    if "--model-path" in command:
        weights = command[command.index("--model-path") + 1]
        name = MODEL_PATH_ENV
        lines += [f'[[ -n "${{{name}:-}}" ]] || {name}={shell_quote(weights)}', f"export {name}"]
    return lines


def _lora_args(brief: TrainingBrief) -> list[str]:
    """The adapters the memory plan priced: its LoRA rank (or the default), and QLoRA's 4-bit base."""
    recipe = brief.recipe
    rank = recipe.lora_rank if recipe is not None else None
    if brief.task != "lora" and rank is None:
        return []
    args = ["--lora-rank", str(rank or DEFAULT_LORA_RANK)]
    if brief.lora_alpha is not None:
        args += ["--lora-alpha", f"{brief.lora_alpha:g}"]
    if recipe is not None and recipe.qlora:
        args.append("--qlora")
    return args


def _job_files() -> dict[str, str | Path]:
    """The plan's ``trainer/`` folder: every file of the standalone scripts' folder."""
    return {f"{JOB_DIR}/{source.name}": source for source in script_files()}


def _json(value: Any) -> str:
    return json.dumps(value, indent=2) + "\n"


def _listed(name: str) -> int:
    for pattern in (_NODE_SCRIPTS, _JOB_FILES):
        if fnmatch(name, pattern):
            return _ARTIFACTS.index(pattern)
    return _ARTIFACTS.index(name)


def _write(out_dir: Path, texts: dict[str, str | Path]) -> dict[str, str]:
    """Write (or copy) every file, in ``_ARTIFACTS`` order; returns name -> path.

    The shell scripts (``*.sh``) are executable; ``train.sbatch`` is read by sbatch, not run.
    """
    files: dict[str, str] = {}
    # sorted() is stable: launch_node{R}.sh keep their rank order.
    for name in sorted(texts, key=_listed):
        content = texts[name]
        if isinstance(content, Path):
            copy_file(out_dir, name, content)
        else:
            write_file(out_dir, name, content, executable=name.endswith(".sh"))
        files[name] = str(out_dir / name)
    return files


def _remove_stale(out_dir: Path, files: dict[str, str]) -> None:
    """Re-emitting into the same directory: files this launch does not use must not linger.

    They would suggest otherwise (a ds_config.json next to a torchrun launch, a stale hostfile).
    Only files an earlier launch wrote here and nobody changed since are removed
    (tools/core/outputs.py): the user's own train.py, hostfile or MEGATRON.md stay; so does
    ``trainer/`` while anything is left in it.
    """
    for stale in listed(out_dir):
        ours = stale in _ARTIFACTS or any(fnmatch(stale, p) for p in (_NODE_SCRIPTS, _JOB_FILES))
        if ours and stale not in files:
            remove_file(out_dir, stale)
    job_dir = out_dir / JOB_DIR
    if not any(name.startswith(f"{JOB_DIR}/") for name in files) and _real_dir(job_dir):
        with contextlib.suppress(OSError):  # not empty: something of the user's is in it
            job_dir.rmdir()


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()
