"""Full 3D plans on torchtitan: the TOML job config and TORCHTITAN.md.

A setup with pipeline parallelism on a Llama model whose shape torchtitan defines
(tools/research/framework.py ``setup_framework``) runs on torchtitan (github.com/pytorch/torchtitan),
PyTorch's FSDP2 x tensor x pipeline (x context) parallel trainer, release 0.2.2: the last on PyPI
whose ``ConfigManager`` reads a TOML (``--job.config_file``; 0.3.0 dropped it), so TORCHTITAN.md
says ``pip install torchtitan==0.2.2`` and launch.sh stops on any other version. The section and
key names below are torchtitan's ``JobConfig`` dataclasses (torchtitan/config/job_config.py at tag
v0.2.2, commit 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce; tests/data/torchtitan_job_config.py is
that file, and a test checks every generated key against it): ``[parallelism]`` data_parallel_replicate_degree,
data_parallel_shard_degree, tensor_parallel_degree, pipeline_parallel_degree,
pipeline_parallel_schedule, pipeline_parallel_microbatch_size, module_fqns_per_model_part (the
plan's split of the layers over the stages, uneven ones included), context_parallel_degree;
``[activation_checkpoint] mode`` none/selective/full; ``[training]`` local_batch_size,
global_batch_size, seq_len, steps, max_norm, enable_cpu_offload, mixed_precision_param. The
launch is torchtitan's own (run_train.sh): ``torchrun ... -m torchtitan.train --job.config_file``.

fp8 linears (a recipe with precision fp8): ``[model] converters = ["quantize.linear.float8"]``
(0.2.2's registry name, torchtitan/components/quantization/float8.py) and a
``[quantize.linear.float8]`` table: tensorwise dynamic scaling (no ``recipe_name``: the converter
refuses one together with the FSDP float8 all-gather), ``enable_fsdp_float8_all_gather`` and
``precompute_float8_dynamic_scale_for_fsdp`` when FSDP shards the weights (what the speed model
priced), ``filter_fqns = ["output"]`` (the output layer stays bf16); ``[compile] enable`` fuses
the casts (a compiling recipe has it too). The converter only warns and trains bf16 on a GPU
below compute capability 8.9, so launch.sh checks the GPU first.

Checkpoints (``[checkpoint]``, torchtitan/components/checkpoint.py ``CheckpointManager.load`` at
that commit): the job saves DCP checkpoints every ``interval`` steps into
``{dump_folder}/{folder}`` and, started again, resumes from the newest ``step-N`` there. A
fine-tune with none yet loads ``initial_load_path`` model-only; a folder holding
``*.safetensors`` is read as a Hugging Face checkpoint through the llama3 state-dict adapter
(``_load_checkpoint_in_hf_format``), so no conversion step. From pytorch/torchtitan a44dff1a4
(2025-07-28, "let user specify initial_load_path and initial_load_in_hf") the switch is
``initial_load_in_hf = true``, which the config also sets. The TOML loader refuses a key it
does not know (torchtitan/config/manager.py ``_dict_to_dataclass`` raises ValueError), so every
key here must be one of 0.2.2's. The tokenizer is read from the folder ``[model] hf_assets_path``
names (its ``tokenizer.json``; components/tokenizer.py ``build_hf_tokenizer``): the Hugging Face
folder for a fine-tune, ``assets/tokenizer`` for pretraining.
"""

from __future__ import annotations

import json
from typing import Any

from tools.artifacts.recipe_launch import titan_schedule_sections, titan_validation
from tools.artifacts.scripts import comment_text, render
from tools.core.errors import ToolFailure
from tools.core.schemas import HardwareSpec, MemoryPlan, ModelSpec, TrainingBrief
from tools.planning.batch_layout import BatchLayout
from tools.planning.optimizer_recipe import brief_recipe
from tools.research.titan_flavors import (
    TORCHTITAN_RELEASE,
    TORCHTITAN_RELEASE_COMMIT,
    flavor_refusal,
    torchtitan_flavor,
)

TORCHTITAN_CONFIG = "torchtitan.toml"
TORCHTITAN_MODULE = "torchtitan.train"
# The job-config keys' source, named in the TOML and the guide: the release the files are for.
TORCHTITAN_COMMIT = TORCHTITAN_RELEASE_COMMIT
# Pretraining's tokenizer folder (a fine-tune reads the Hugging Face folder's own).
TOKENIZER_DIR = "assets/tokenizer"
# A fine-tune's Hugging Face weights: the user links (or copies) the model's folder here.
HF_CHECKPOINT = "hf_checkpoint"
DUMP_FOLDER = "outputs"
CHECKPOINT_FOLDER = "checkpoint"
# Steps between saves: at most this many steps are lost to a crash or a preemption.
SAVE_INTERVAL = 500
# fp8 linears: torchao Float8Linear through torchtitan's model converter (module docstring).
FLOAT8_CONVERTER = FLOAT8_SECTION = "quantize.linear.float8"  # the registry name and the table
ZERO_12 = ("zero1", "zero2", "zero2_offload_optimizer")  # one weight gather a step: no reshard


def setup_of(memory: MemoryPlan) -> dict[str, Any]:
    """The chosen setup's degrees and recompute policy, from the memory plan.

    ``setup`` (checkpointing none/selective/full, virtual_stages, context_parallel) is read
    when the plan has it, else the plan's own fields: full recomputation iff checkpointing.
    """
    setup = getattr(memory, "setup", None)

    def field(name: str, default: Any) -> Any:
        if setup is None:
            return default
        value = setup.get(name) if isinstance(setup, dict) else getattr(setup, name, None)
        return default if value is None else value

    checkpointing = field("checkpointing", "full" if memory.activation_checkpointing else "none")
    return {
        "tensor_parallel": int(field("tensor_parallel", memory.tensor_parallel)),
        "pipeline_parallel": int(field("pipeline_parallel", memory.pipeline_parallel)),
        "context_parallel": int(field("context_parallel", 1)),
        "virtual_stages": int(field("virtual_stages", 1)),
        "micro_batch_size": int(field("micro_batch_size", memory.micro_batch_size)),
        "gradient_accumulation_steps": int(
            field("gradient_accumulation_steps", memory.gradient_accumulation_steps)
        ),
        "checkpointing": str(checkpointing),
        "stage_layers": [int(n) for n in field("stage_layers", [])],
    }


def _toml_value(value: Any) -> str:
    """A TOML value: booleans lower-case, strings as JSON strings, lists of those (a subset)."""
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value) if isinstance(value, float) else str(value)


def job_config(
    brief: TrainingBrief,
    model: ModelSpec,
    hardware: HardwareSpec,
    memory: MemoryPlan,
    steps: int,
    precision: str,
    *,
    fp8: bool = False,
) -> dict[str, dict[str, Any]]:
    """The torchtitan job config for the plan, section -> key -> value.

    Only for a model one of torchtitan's flavors builds exactly: any other would train
    another model (tools/research/titan_flavors.py), so it is refused. ``fp8``: fp8 linears
    (the module docstring); a dotted section name is a nested TOML table.
    """
    flavor = torchtitan_flavor(model)
    if flavor is None:
        why = flavor_refusal(model) or (
            f"torchtitan {TORCHTITAN_RELEASE} has no llama3 flavor of its shape"
        )
        raise ToolFailure(
            f"torchtitan cannot build {model.name}: {why}; plan it on Megatron "
            "(framework megatron), which builds it from its config"
        )
    setup = setup_of(memory)
    tp, pp, cp = setup["tensor_parallel"], setup["pipeline_parallel"], setup["context_parallel"]
    world = hardware.world_size
    dp = world // (tp * pp * cp)
    layout = BatchLayout(
        setup["micro_batch_size"], setup["gradient_accumulation_steps"], dp, pipeline=pp
    )
    batch_keys, microbatch_key = layout.torchtitan_fields()
    virtual = setup["virtual_stages"]
    # DDP replicates; every ZeRO row shards (FSDP2 shards parameters, gradients and optimizer
    # states, at most the per-GPU bytes of the plan's ZeRO-1/2/3 rows).
    replicate, shard = (dp, 1) if memory.chosen == "ddp" else (1, dp)
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "tensor_parallel_degree": tp,
        "pipeline_parallel_degree": pp,
        # Interleaved 1F1B with v stages per rank (Narayanan et al. 2021 sec. 2.2); 1F1B else.
        "pipeline_parallel_schedule": "Interleaved1F1B" if virtual > 1 else "1F1B",
        **microbatch_key,
        "context_parallel_degree": cp,
    }
    if memory.chosen in ZERO_12:
        parallelism["fsdp_reshard_after_forward"] = "never"
    if pp > 1:
        parallelism["module_fqns_per_model_part"] = stage_modules(
            model.layers, pp, virtual, setup["stage_layers"]
        )
    config: dict[str, dict[str, Any]] = {
        "job": {
            "dump_folder": f"./{DUMP_FOLDER}",
            "description": comment_text(brief.goal or model.name),
        },
        "model": {
            "name": "llama3",
            "flavor": flavor,
            "hf_assets_path": f"./{HF_CHECKPOINT if brief.loads_weights else TOKENIZER_DIR}",
        },
        **titan_schedule_sections(brief, model.params, layout, steps),
        "training": {
            "dataset": "c4",
            # One data-parallel rank's batch per forward-backward, and the step's batch:
            # torchtitan accumulates global / (local x dp) times; with a pipeline the local
            # batch is the plan's micro-batches (tools/planning/batch_layout.py).
            **batch_keys,
            "seq_len": brief.seq_len,
            "max_norm": brief_recipe(brief).max_grad_norm or 1.0,  # 0 would zero the gradients
            "steps": steps,
            "enable_cpu_offload": "offload" in memory.chosen,
            "mixed_precision_param": "bfloat16" if precision == "bf16" else "float32",
        },
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": setup["checkpointing"]},
        "checkpoint": {
            "enable": True,
            "folder": CHECKPOINT_FOLDER,
            "interval": min(brief.save_every or SAVE_INTERVAL, steps),
            **({"keep_latest_k": brief.keep_checkpoints} if brief.keep_checkpoints else {}),
        },
    }
    if fp8:
        config["model"]["converters"] = [FLOAT8_CONVERTER]
        config[FLOAT8_SECTION] = {
            "enable_fsdp_float8_all_gather": shard > 1,
            "precompute_float8_dynamic_scale_for_fsdp": shard > 1,
            "filter_fqns": ["output"],
        }
    if fp8 or (brief.recipe is not None and brief.recipe.compile):  # intake/recipe_fields.py
        config["compile"] = {"enable": True, "components": ["model", "loss"]}
    config |= titan_validation(brief, steps)  # the request's evaluation (recipe_launch.py)
    if brief.loads_weights:
        # The Hugging Face safetensors themselves, model only (the module docstring: how
        # torchtitan reads them); ignored once the job has a checkpoint of its own.
        config["checkpoint"] |= {
            "initial_load_path": f"./{HF_CHECKPOINT}",
            "initial_load_model_only": True,
            "initial_load_in_hf": True,
        }
    return config


def stage_modules(layers: int, pp: int, virtual: int, stage_layers: list[int]) -> list[list[str]]:
    """The module names of each pipeline stage, first to last: the plan's split, written out.

    torchtitan 0.2.2 builds one stage per list (``pipeline_module_split``), stage ``s`` on
    pipeline rank ``s mod p`` (the looped schedules' order), so p x v lists for v virtual
    stages. Without them it splits by its own rule (``generate_llm_fqn_per_model_part``, which
    counts the embedding and the output layer as a layer each: 20, 21, 20, 19 for 80 layers
    over 4), not the plan's, and its ``pipeline_parallel_layers_per_stage`` adds those two
    weights to the layers before dividing, which no interleaved split of L/(p x v) survives.
    The plan's split: equal stages, or ``stage_layers`` (the first stages a layer longer,
    tools/planning/parallel.py ``pipeline_split``).
    """
    stages = pp * virtual
    counts = (
        list(stage_layers)
        if len(stage_layers) == stages
        else [layers // stages + (1 if s < layers % stages else 0) for s in range(stages)]
    )
    parts: list[list[str]] = []
    first = 0
    for count in counts:
        parts.append([f"layers.{i}" for i in range(first, first + count)])
        first += count
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def launch_preamble(config: dict[str, dict[str, Any]]) -> list[str]:
    """launch.sh and train.sbatch lines before the command: the files the job reads are here.

    A fine-tune without a complete checkpoint of its own (a ``step-N`` with DCP's
    ``.metadata``) needs the Hugging Face weights; a checkpoint folder without one would make
    torchtitan skip ``initial_load_path`` and start from random weights, so it stops too.
    """
    lines = [
        f"if [[ ! -f {TORCHTITAN_CONFIG} ]]; then",
        f'    echo "no {TORCHTITAN_CONFIG} in $PWD: start this from the plan\'s folder" >&2',
        "    exit 2",
        "fi",
        *version_check(),
        *(fp8_check() if FLOAT8_SECTION in config else []),
    ]
    if "initial_load_path" not in config["checkpoint"]:
        return [
            *lines,
            f"if [[ ! -f {TOKENIZER_DIR}/tokenizer.json ]]; then",
            f"    echo \"no tokenizer in {TOKENIZER_DIR}: put the model's tokenizer.json "
            '(and tokenizer_config.json) there, see TORCHTITAN.md" >&2',
            "    exit 2",
            "fi",
        ]
    saved = f"{DUMP_FOLDER}/{config['checkpoint']['folder']}"
    return [
        *lines,
        f'if ! compgen -G "{saved}/step-*/.metadata" > /dev/null; then',
        f'    if ! compgen -G "{HF_CHECKPOINT}/*.safetensors" > /dev/null; then',
        f'        echo "no Hugging Face weights (*.safetensors) in {HF_CHECKPOINT}: link the '
        f"model's folder there first (ln -s /path/to/hf-model {HF_CHECKPOINT}), see "
        'TORCHTITAN.md" >&2',
        "        exit 2",
        "    fi",
        f"    if [[ -d {saved} ]]; then",
        f'        echo "{saved} holds no complete checkpoint and torchtitan would start from '
        f'random weights, not {HF_CHECKPOINT}: move it away first" >&2',
        "        exit 2",
        "    fi",
        "fi",
    ]


def fp8_check() -> list[str]:
    """launch.sh lines that stop (exit 2) unless the GPU has FP8 tensor cores (sm_89 or later).

    torchtitan's float8 converter only logs a warning below 8.9 and trains bf16.
    """
    probe = (
        "import torch; import sys; "
        "sys.exit(0 if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9) "
        "else 1)"
    )
    return [
        f'if ! "${{PYTHON:-python3}}" -c "{probe}"; then',
        '    echo "fp8 linears need FP8 tensor cores (compute capability 8.9 or later: Ada, '
        'Hopper, Blackwell); this GPU has none and torchtitan would train bf16" >&2',
        "    exit 2",
        "fi",
    ]


def version_check() -> list[str]:
    """launch.sh lines that stop with one line (exit 2) unless torchtitan is the TOML's release.

    torchtitan 0.3.0 and later no longer read ``--job.config_file``.
    """
    probe = "import importlib.metadata as m; print(m.version('torchtitan'))"
    return [
        f'titan_version=$("${{PYTHON:-python3}}" -c "{probe}" 2>/dev/null || echo none)',
        f'if [[ "$titan_version" != "{TORCHTITAN_RELEASE}" ]]; then',
        f'    echo "{TORCHTITAN_CONFIG} is for torchtitan {TORCHTITAN_RELEASE} (the last release '
        f"that reads a TOML job config), found torchtitan $titan_version in "
        f'${{PYTHON:-python3}}: pip install torchtitan=={TORCHTITAN_RELEASE}" >&2',
        "    exit 2",
        "fi",
    ]


def job_toml(config: dict[str, dict[str, Any]]) -> str:
    """The job config as TOML text, headed by the source of its keys."""
    lines = [
        "# torchtitan job config written by trainwright; keys as in torchtitan/config/"
        f"job_config.py (pytorch/torchtitan {TORCHTITAN_COMMIT}).",
    ]
    for section, values in config.items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def torchtitan_md(
    command: list[str], hardware: HardwareSpec, model: ModelSpec, config: dict[str, Any]
) -> str:
    """TORCHTITAN.md: why the plan runs on torchtitan, how to start it, what the config says."""
    par = config["parallelism"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    degrees = (
        f"data parallel {dp} x tensor parallel {par['tensor_parallel_degree']} x pipeline "
        f"parallel {par['pipeline_parallel_degree']} x context parallel "
        f"{par['context_parallel_degree']} = {hardware.world_size} GPUs"
    )
    checkpoint = config["checkpoint"]
    saved = f"{DUMP_FOLDER}/{checkpoint['folder']}"
    resume = (
        f"The job saves a checkpoint every {checkpoint['interval']} steps into `{saved}` and, "
        "started again (the same launch.sh or train.sbatch), resumes from the newest one there."
    )
    convert = (
        "This job starts from the Hugging Face weights, read as they are (no conversion): "
        f"link the model's folder (its `*.safetensors` and `config.json`) to `{HF_CHECKPOINT}` "
        f"here, `ln -s /path/to/hf-model {HF_CHECKPOINT}`; `[checkpoint] initial_load_path` "
        "loads it, model weights only, through torchtitan's llama3 state-dict adapter "
        "(`initial_load_in_hf`). launch.sh refuses to start without it until the job has a "
        "checkpoint of its own. " + resume
        if "initial_load_path" in checkpoint
        else "This is pretraining from random weights: no checkpoint to load. " + resume
    )
    return render(
        "TORCHTITAN.md",
        model=model.name,
        flavor=config["model"]["flavor"],
        degrees=degrees,
        nodes=hardware.nodes,
        config_file=TORCHTITAN_CONFIG,
        command=" ".join(command),
        commit=TORCHTITAN_COMMIT,
        release=TORCHTITAN_RELEASE,
        schedule=par["pipeline_parallel_schedule"],
        stages=_stages_note(par),
        mode=config["activation_checkpoint"]["mode"],
        fp8=_fp8_note(config),
        local_batch=config["training"]["local_batch_size"],
        global_batch=config["training"]["global_batch_size"],
        convert=convert,
    )


def _fp8_note(config: dict[str, Any]) -> str:
    """TORCHTITAN.md's line on fp8 linears (after the recompute line), or nothing for bf16."""
    table = config.get(FLOAT8_SECTION)
    if table is None:
        return ""
    gather = (
        "FSDP all-gathers the weights in fp8 (`enable_fsdp_float8_all_gather`, with "
        "`precompute_float8_dynamic_scale_for_fsdp`)"
        if table["enable_fsdp_float8_all_gather"]
        else "no FSDP sharding, so no float8 all-gather"
    )
    return (
        f'\n- `[model] converters = ["{FLOAT8_CONVERTER}"]` and `[{FLOAT8_SECTION}]`: fp8 linears '
        "(torchao `Float8Linear`, tensorwise dynamic scaling; install torchao) on every linear "
        f"but the output layer (`filter_fqns`); {gather}; `[compile] enable` fuses the casts. "
        "launch.sh stops on a GPU without FP8 tensor cores (torchtitan would train bf16)."
    )


def _stages_note(parallelism: dict[str, Any]) -> str:
    """TORCHTITAN.md's line on ``module_fqns_per_model_part``: how the layers are split."""
    parts = parallelism.get("module_fqns_per_model_part")
    if not parts:
        return "No pipeline: every rank holds all the layers."
    counts = [sum(name.startswith("layers.") for name in part) for part in parts]
    split = (
        f"{len(parts)} stages of {counts[0]} layers"
        if len(set(counts)) == 1
        else f"{len(parts)} stages of {min(counts)} to {max(counts)} layers ("
        + ", ".join(str(c) for c in counts)
        + "; the layers do not divide evenly, the first stages take one more)"
    )
    return (
        f"`module_fqns_per_model_part` names each stage's modules: {split}, the embedding on "
        "the first and the norm and output layer on the last, the split the memory and speed "
        "estimates priced (torchtitan's own split would differ)."
    )
