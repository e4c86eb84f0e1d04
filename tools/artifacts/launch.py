"""Write the launch artifacts: ds_config.json, the training script, launchers and guides.

DeepSpeed plans also get ``ds_config_hf.json``, the Hugging Face Trainer flavour of the same
config (tools/artifacts/deepspeed_config.py ``hf_trainer_config``).

A plan with a DeepSpeed config starts with the DeepSpeed launcher (``deepspeed``, a hostfile
for several nodes, plus one ``launch_node{R}.sh`` per node for clusters without passwordless
ssh); a plan without one (plain PyTorch DDP) starts with ``torchrun``, which train.py
(tools/smoke/train.py) then runs in its DDP mode. Both also get a SLURM ``train.sbatch`` and
an Accelerate ``accelerate_config.yaml``.

train.py covers DeepSpeed and DDP only. Horovod, TensorFlow and FSDP plans get a launch
command for the user's own script and a guide (HOROVOD.md, TF_CONFIG.md, FSDP.md) saying how
to write it; none of them gets train.py.

A plan with tensor/pipeline parallelism (tools/planning/search.py, when no data-parallel setup fits)
cannot run on train.py or the plain DeepSpeed engine: it gets ds_config.json (the ZeRO part,
batch sizes per data-parallel rank), a torchrun command for Megatron-DeepSpeed's
``pretrain_gpt.py`` with the plan's degrees, and MEGATRON.md; no train.py, no Hugging Face
flavour and no Accelerate config, which would all size batches by the whole world.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from tools.artifacts.deepspeed_config import hf_trainer_config
from tools.core.files import copy_atomic, write_atomic
from tools.core.schemas import (
    FrameworkChoice,
    HardwareSpec,
    LaunchSpec,
    MemoryPlan,
    ModelSpec,
    TrainingBrief,
)
from tools.planning.memory import resolve_precision

TRAIN_SCRIPT = Path(__file__).parents[1] / "smoke" / "train.py"
MASTER_PORT = 29500
TF_WORKER_PORT = 12345
# The scripts the user writes for frameworks train.py does not cover (we never generate them).
USER_SCRIPTS = {
    "horovod": "train_horovod.py",
    "tensorflow": "train_tensorflow.py",
    "pytorch_fsdp": "train_fsdp.py",
}
# Every fixed name emit_launch may write; a re-emit removes the ones the new plan does not use
# (launch_node{R}.sh are matched by pattern).
_ARTIFACTS = (
    "model_config.json",
    "train.py",
    "ds_config.json",
    "ds_config_hf.json",
    "hostfile",
    "launch.sh",
    "train.sbatch",
    "accelerate_config.yaml",
    "HOROVOD.md",
    "TF_CONFIG.md",
    "FSDP.md",
    "MEGATRON.md",
)
# Megatron-DeepSpeed's training entry point (github.com/microsoft/Megatron-DeepSpeed).
MEGATRON_SCRIPT = "pretrain_gpt.py"
_COVERAGE = (
    "trainwright's own train.py covers DeepSpeed and PyTorch DDP only, so this plan has no "
    "generated training script: `{script}` is yours to write, and this guide says how."
)
# Decoder-layer classes for FSDP's transformer_auto_wrap_policy, by HF model_type.
_LAYER_CLASSES = {
    "gpt2": ("transformers.models.gpt2.modeling_gpt2", "GPT2Block"),
    "llama": ("transformers.models.llama.modeling_llama", "LlamaDecoderLayer"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "MistralDecoderLayer"),
    "mixtral": ("transformers.models.mixtral.modeling_mixtral", "MixtralDecoderLayer"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2DecoderLayer"),
    "gemma": ("transformers.models.gemma.modeling_gemma", "GemmaDecoderLayer"),
    "phi3": ("transformers.models.phi3.modeling_phi3", "Phi3DecoderLayer"),
    "gpt_neox": ("transformers.models.gpt_neox.modeling_gpt_neox", "GPTNeoXLayer"),
}


class Shell(str):
    """An argument written into a script as shell text (``"$SLURM_NODEID"``), not quoted."""

    __slots__ = ()


def shell_join(argv: list[str]) -> str:
    """Quote an argument list for a script; ``Shell`` arguments go in verbatim."""
    return " ".join(arg if isinstance(arg, Shell) else shlex.quote(arg) for arg in argv)


def comment_text(text: str) -> str:
    """``text`` as one line for a ``#`` comment in a script.

    A newline (or any other control character) in a brief's goal or a model's name would end
    the comment, and the rest would run as a command.
    """
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def emit_launch(
    out_dir: Path,
    brief: TrainingBrief,
    hardware: HardwareSpec,
    model: ModelSpec,
    framework: FrameworkChoice,
    deepspeed_config: dict[str, Any] | None,
    *,
    steps: int = 1000,
    memory: MemoryPlan | None = None,
) -> LaunchSpec:
    """Write the files needed to start training on the target hardware and return the command.

    The command is an argument list (never a shell string); ``launch.sh`` quotes it for people.
    ``memory`` is the plan the config came from: a tensor/pipeline-parallel plan gets the
    Megatron-DeepSpeed launch. (The config alone cannot tell: its batch arithmetic gives the
    product of the degrees at best, not the split.)
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}

    def write(name: str, text: str, *, executable: bool = False) -> None:
        write_atomic(out_dir / name, text, executable=executable)
        files[name] = str(out_dir / name)

    write("model_config.json", json.dumps(model.hf_config or {}, indent=2) + "\n")
    gpus = hardware.gpus_per_node if hardware.gpus_per_node > 0 else 1
    precision = resolve_precision(brief.precision, hardware)
    title = f"# Launch for: {comment_text(brief.goal or model.name)} ({framework.primary})"
    user_script = USER_SCRIPTS.get(framework.primary)
    split = _model_parallel(memory)
    preamble: list[str] = []

    if split is not None and deepspeed_config is not None and user_script is None:
        write("ds_config.json", json.dumps(deepspeed_config, indent=2) + "\n")
        command = _torchrun(hardware, gpus, "node0") + _megatron_args(
            brief, model, split, deepspeed_config, steps, precision
        )
        how_to_run = (
            "# Tensor/pipeline parallel: run from a Megatron-DeepSpeed checkout (MEGATRON.md), "
            "adding your --data-path and tokenizer arguments"
            + (f", on each of the {hardware.nodes} nodes" if hardware.nodes > 1 else "")
            + "."
        )
        write("MEGATRON.md", _megatron_md(command, hardware, model, split, deepspeed_config))
        write("train.sbatch", _sbatch(brief, hardware, model, gpus, command))
    elif framework.primary == "horovod":
        hosts = ",".join(f"{host}:{gpus}" for host in _hosts(hardware))
        command = ["horovodrun", "-np", str(hardware.nodes * gpus), "-H", hosts]
        command += ["python", USER_SCRIPTS["horovod"]]
        how_to_run = (
            "# Run on the first node; horovodrun reaches the others over passwordless ssh. "
            "Write train_horovod.py first (HOROVOD.md)."
        )
        write("HOROVOD.md", _horovod_md(command, hardware, gpus))
    elif framework.primary == "tensorflow":
        command = ["python", USER_SCRIPTS["tensorflow"]]
        how_to_run = (
            "# Run once on every worker node with that worker's TF_CONFIG exported "
            "(TF_CONFIG.md). Write train_tensorflow.py first."
        )
        write("TF_CONFIG.md", _tf_config_md(command, hardware))
    else:
        if user_script is None:
            copy_atomic(TRAIN_SCRIPT, out_dir / "train.py")
            files["train.py"] = str(out_dir / "train.py")
            script_args = _train_py_args(brief, steps, deepspeed_config)
        else:  # pytorch_fsdp: torchrun starts the user's own FSDP script.
            script_args = [user_script]
        if deepspeed_config is not None and user_script is None:
            write("ds_config.json", json.dumps(deepspeed_config, indent=2) + "\n")
            # For users who train with the Hugging Face Trainer (TrainingArguments(deepspeed=...)):
            # the same config with the values the Trainer fills from its arguments as "auto".
            write(
                "ds_config_hf.json",
                json.dumps(hf_trainer_config(deepspeed_config), indent=2) + "\n",
            )
            command = ["deepspeed"]
            how_to_run = (
                "# Run from this directory on the first node; edit hostfile with your node names."
            )
            if hardware.nodes > 1:
                write("hostfile", "".join(f"{h} slots={gpus}\n" for h in _hosts(hardware)))
                command += ["--hostfile", "hostfile", "--num_nodes", str(hardware.nodes)]
                how_to_run += " Without passwordless ssh, run launch_node{R}.sh on node R instead."
                for rank in range(hardware.nodes):
                    node_command = deepspeed_no_ssh_command(
                        hardware.nodes, gpus, rank, "node0", "hostfile", script_args
                    )
                    write(
                        f"launch_node{rank}.sh",
                        _script(
                            [
                                title,
                                f"# Node rank {rank} of {hardware.nodes}, without ssh: run this "
                                f"on the host named {_hosts(hardware)[rank]} in hostfile, and "
                                "launch_node{R}.sh on every other node R.",
                            ],
                            node_command,
                        ),
                        executable=True,
                    )
            # The config's batch arithmetic is for hardware.world_size ranks; launch that many.
            command += ["--num_gpus", str(gpus), *script_args]
        else:
            command = _torchrun(hardware, gpus, "node0") + script_args
            if hardware.nodes > 1:
                how_to_run = (
                    f"# Run this same script from this directory on each of the {hardware.nodes} "
                    f"nodes; node0 must resolve to the first node (rendezvous at "
                    f"node0:{MASTER_PORT})."
                )
            else:
                how_to_run = "# Run it on the training machine."
            # Without a DeepSpeed config train.py trains with plain DDP; mixed precision is its
            # autocast flag (the DeepSpeed mode reads it from ds_config.json instead).
            if user_script is None and precision in ("bf16", "fp16"):
                command.append(f"--{precision}")
        write("train.sbatch", _sbatch(brief, hardware, model, gpus, command))
        if user_script is None:
            write(
                "accelerate_config.yaml",
                _accelerate_config(hardware, gpus, precision, deepspeed_config),
            )
        else:
            write("FSDP.md", _fsdp_md(command, hardware, model, precision))

    if framework.primary == "tensorflow":
        preamble = [': "${TF_CONFIG:?export TF_CONFIG for this worker first, see TF_CONFIG.md}"']
    write("launch.sh", _script([title, how_to_run], command, preamble), executable=True)
    # Re-emitting into the same directory: files this launch does not use must not linger and
    # suggest otherwise (a ds_config.json next to a torchrun launch, a stale hostfile).
    for stale in [*_ARTIFACTS, *(p.name for p in out_dir.glob("launch_node*.sh"))]:
        if stale not in files:
            (out_dir / stale).unlink(missing_ok=True)
    return LaunchSpec(command=command, files=files)


def deepspeed_no_ssh_command(
    nodes: int,
    gpus_per_node: int,
    node_rank: int | str,
    master_addr: str,
    hostfile: str,
    script_args: list[str],
) -> list[str]:
    """The DeepSpeed launcher's per-node command for clusters without passwordless ssh.

    ``--no_ssh`` still reads the hostfile (runner.py builds its resource pool from it and
    refuses ``--num_nodes`` > 1 without one); it only stops the launcher from ssh-ing out.
    """
    return [
        "deepspeed",
        "--hostfile",
        hostfile,
        "--no_ssh",
        "--node_rank",
        node_rank if isinstance(node_rank, str) else str(node_rank),
        "--master_addr",
        master_addr,
        "--master_port",
        str(MASTER_PORT),
        "--num_nodes",
        str(nodes),
        "--num_gpus",
        str(gpus_per_node),
        *script_args,
    ]


def _hosts(hardware: HardwareSpec) -> list[str]:
    return [f"node{i}" for i in range(hardware.nodes)] if hardware.nodes > 1 else ["localhost"]


def _train_py_args(
    brief: TrainingBrief, steps: int, deepspeed_config: dict[str, Any] | None
) -> list[str]:
    micro = (deepspeed_config or {}).get("train_micro_batch_size_per_gpu", 1)
    args = ["train.py", "--model-config", "model_config.json", "--steps", str(steps)]
    args += ["--seq-len", str(brief.seq_len), "--micro-batch", str(micro)]
    args += ["--metrics-dir", "metrics"]
    if deepspeed_config is not None:
        args += ["--deepspeed_config", "ds_config.json"]
    return args


def _torchrun(hardware: HardwareSpec, gpus: int, master_addr: str) -> list[str]:
    command = ["torchrun", "--nnodes", str(hardware.nodes), "--nproc_per_node", str(gpus)]
    if hardware.nodes > 1:
        command += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"{master_addr}:{MASTER_PORT}"]
    return command


def _script(comments: list[str], command: list[str], preamble: list[str] | None = None) -> str:
    lines = ["#!/usr/bin/env bash", *comments, "set -euo pipefail", 'cd "$(dirname "$0")"']
    return "\n".join([*lines, *(preamble or []), shell_join(command), ""])


def _sbatch(
    brief: TrainingBrief, hardware: HardwareSpec, model: ModelSpec, gpus: int, command: list[str]
) -> str:
    """A SLURM batch script: one task per node, each starting that node's launcher."""
    job = "trainwright-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", model.name).strip("-") or "train")
    # Data loading and the launcher want a few cores per GPU; 8 is a common per-GPU share.
    cpus = hardware.cpu_cores or 8 * gpus
    header = [
        "#!/usr/bin/env bash",
        f"# SLURM job for: {comment_text(brief.goal or model.name)}. Submit with: sbatch train.sbatch",
        f"#SBATCH --job-name={job}",
        f"#SBATCH --nodes={hardware.nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if hardware.gpus_per_node > 0:
        header.append(f"#SBATCH --gpus-per-node={hardware.gpus_per_node}")
    header += [
        f"#SBATCH --cpus-per-task={cpus}",
        "# A day of wall time; set it to your run's length and your partition's limit.",
        "#SBATCH --time=24:00:00",
        "#SBATCH --output=slurm-%j.out",
        "set -euo pipefail",
        # sbatch runs a copy of this script from the spool directory, so $0 is not here.
        'cd "${SLURM_SUBMIT_DIR:-.}"',
        # Not `| head -n 1`: under pipefail, scontrol's SIGPIPE would fail the job.
        'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'MASTER_ADDR="${NODES[0]}"',
        "export MASTER_ADDR",
    ]
    srun = ["srun", "--kill-on-bad-exit=1"]
    launcher, rest = command[0], command[1:]
    if launcher == "deepspeed" and hardware.nodes > 1:
        # The launcher still needs a hostfile under --no_ssh; build it from this allocation,
        # in SLURM_NODEID order, so node rank R is the R-th host.
        header.append(f'printf "%s slots={gpus}\\n" "${{NODES[@]}}" > "hostfile.$SLURM_JOB_ID"')
        script_args = rest[rest.index("--num_gpus") + 2 :]
        inner = deepspeed_no_ssh_command(
            hardware.nodes,
            gpus,
            Shell('"$SLURM_NODEID"'),
            Shell('"$MASTER_ADDR"'),
            Shell('"hostfile.$SLURM_JOB_ID"'),
            script_args,
        )
        # $SLURM_NODEID differs per task, so it must expand in the task's shell, not here.
        body = [*srun, "bash", "-c", "exec " + shell_join(inner)]
    elif launcher == "torchrun" and hardware.nodes > 1:
        end = rest.index("--rdzv_backend")
        body = [
            *srun,
            "torchrun",
            *rest[:end],
            "--rdzv_id",
            Shell('"$SLURM_JOB_ID"'),
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            Shell(f'"$MASTER_ADDR:{MASTER_PORT}"'),
            *rest[end + 4 :],
        ]
    else:
        body = [*srun, *command]
    return "\n".join([*header, shell_join(body), ""])


def _accelerate_config(
    hardware: HardwareSpec,
    gpus: int,
    precision: str,
    deepspeed_config: dict[str, Any] | None,
) -> str:
    """An ``accelerate launch --config_file`` config, for Hugging Face Accelerate/Trainer users."""
    mixed = {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no")
    config: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE"}
    if deepspeed_config is not None:
        # DeepSpeed reads precision from ds_config.json; keep Accelerate's setting in step.
        if (deepspeed_config.get("bf16") or {}).get("enabled"):
            mixed = "bf16"
        elif (deepspeed_config.get("fp16") or {}).get("enabled"):
            mixed = "fp16"
        elif "bf16" in deepspeed_config or "fp16" in deepspeed_config:
            mixed = "no"
        stage = (deepspeed_config.get("zero_optimization") or {}).get("stage", 0)
        ds: dict[str, Any] = {"deepspeed_config_file": "ds_config.json"}
        ds["zero3_init_flag"] = stage == 3
        if hardware.nodes > 1:
            # "standard": every node runs `accelerate launch` itself (no pdsh/ssh fan-out).
            ds["deepspeed_multinode_launcher"] = "standard"
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = ds
    elif hardware.world_size > 1:
        config["distributed_type"] = "MULTI_GPU"
    else:
        config["distributed_type"] = "NO"
    config |= {
        "machine_rank": 0,
        "main_process_ip": "node0" if hardware.nodes > 1 else None,
        "main_process_port": MASTER_PORT,
        "main_training_function": "main",
        "mixed_precision": mixed,
        "num_machines": hardware.nodes,
        "num_processes": hardware.nodes * gpus,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": hardware.gpus_per_node == 0,
    }
    header = (
        "# Accelerate config: accelerate launch --config_file accelerate_config.yaml "
        "your_script.py\n"
        "# num_processes counts every process on every machine. On machine R of several, set\n"
        "# machine_rank: R (or pass --machine_rank R); main_process_ip must reach machine 0.\n"
    )
    return header + yaml.safe_dump(config, sort_keys=False)


def _horovod_md(command: list[str], hardware: HardwareSpec, gpus: int) -> str:
    return f"""# Horovod launch

{_COVERAGE.format(script="train_horovod.py")}

## Start it

On the first node, with passwordless ssh to the others and the same environment everywhere:

```bash
{shlex.join(command)}
```

`-np` is the total number of processes ({hardware.nodes} node(s) x {gpus} per node); `-H` lists
each host with how many processes it takes. Replace the node names with your hosts.

## Turning a PyTorch training script into train_horovod.py

Start from an ordinary single-GPU PyTorch loop and make five changes:

1. **Initialise Horovod** first thing: `import horovod.torch as hvd` then `hvd.init()`.
   Every process now knows its global rank (`hvd.rank()`), its rank on this machine
   (`hvd.local_rank()`) and how many processes there are (`hvd.size()`).
2. **Give each process its own GPU**: `torch.cuda.set_device(hvd.local_rank())`, and move the
   model there. Shard the data too, e.g. a `DistributedSampler(dataset,
   num_replicas=hvd.size(), rank=hvd.rank())`, so processes see different batches.
3. **Wrap the optimizer**: `optimizer = hvd.DistributedOptimizer(optimizer,
   named_parameters=model.named_parameters())`. Its `step()` averages gradients across all
   processes (allreduce) before updating.
4. **Start everyone from the same weights**: after building the model and optimizer, call
   `hvd.broadcast_parameters(model.state_dict(), root_rank=0)` and
   `hvd.broadcast_optimizer_state(optimizer, root_rank=0)`, so rank 0's state (fresh or
   restored from a checkpoint) is what all ranks train from.
5. **Scale the learning rate** with the number of processes, `lr * hvd.size()`, because the
   effective batch is `hvd.size()` times larger; a warm-up over the first steps helps at large
   sizes. Save checkpoints and print logs from `hvd.rank() == 0` only.
"""


def _tf_config_md(command: list[str], hardware: HardwareSpec) -> str:
    workers = [f"node{i}:{TF_WORKER_PORT}" for i in range(hardware.nodes)]
    if hardware.nodes == 1:
        workers = [f"localhost:{TF_WORKER_PORT}"]
    blocks = []
    for index in range(len(workers)):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        blocks.append(
            f"Worker {index} (on `{workers[index].split(':')[0]}`):\n\n```json\n"
            f"{json.dumps(tf_config)}\n```\n"
        )
    example = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 0}}
    return f"""# TensorFlow multi-worker training (MultiWorkerMirroredStrategy)

{_COVERAGE.format(script="train_tensorflow.py")}

## One worker per node

Each node runs one worker process, which uses all of that node's GPUs. Every worker is told
the whole cluster and which member it is through the `TF_CONFIG` environment variable: the
`cluster.worker` list is the same everywhere, only `task.index` changes. Worker 0 is the chief
(it writes checkpoints and logs). Replace the node names and port with yours.

{chr(10).join(blocks)}
## Start it

On each worker, export that worker's TF_CONFIG and run the script:

```bash
export TF_CONFIG='{json.dumps(example)}'   # this worker's JSON from above
{shlex.join(command)}
```

`launch.sh` runs the same command and stops early when TF_CONFIG is not set.

## A minimal Keras script

```python
import tensorflow as tf

# Reads TF_CONFIG; create it before any other TensorFlow op.
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = 64 * strategy.num_replicas_in_sync

with strategy.scope():  # variables made here are mirrored on every replica
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(256, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

(x, y), _ = tf.keras.datasets.mnist.load_data()
dataset = (
    tf.data.Dataset.from_tensor_slices((x.reshape(-1, 784) / 255.0, y))
    .shuffle(10_000)
    .repeat()
    .batch(global_batch)  # Keras splits each global batch across the workers
)
model.fit(dataset, epochs=3, steps_per_epoch=200)
```
"""


def _fsdp_md(command: list[str], hardware: HardwareSpec, model: ModelSpec, precision: str) -> str:
    model_type = str((model.hf_config or {}).get("model_type", ""))
    module, layer = _LAYER_CLASSES.get(
        model_type, ("transformers.models.llama.modeling_llama", "LlamaDecoderLayer")
    )
    layer_note = (
        f"`{layer}` is {model.name}'s decoder layer."
        if model_type in _LAYER_CLASSES
        else f"Replace `{layer}` with the decoder-layer class of {model.name}."
    )
    if hardware.nodes > 1:
        strategy = "HYBRID_SHARD"
        strategy_note = (
            "HYBRID_SHARD shards parameters, gradients and optimizer state across the GPUs of "
            "one node and replicates across nodes, so the frequent all-gathers stay on the fast "
            "intra-node links. Switch to FULL_SHARD (shard across every GPU) when a replica "
            "does not fit in one node."
        )
    else:
        strategy = "FULL_SHARD"
        strategy_note = (
            "FULL_SHARD shards parameters, gradients and optimizer state across all GPUs "
            "(ZeRO-3-like). On several nodes, HYBRID_SHARD keeps that sharding within a node "
            "and replicates across nodes."
        )
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(precision)
    if dtype is None:
        mp_lines = "mixed = None  # the plan trains in fp32"
    else:
        mp_lines = (
            f"mixed = MixedPrecision(param_dtype={dtype}, reduce_dtype={dtype}, "
            f"buffer_dtype={dtype})"
        )
    scaler_note = (
        "\nWith fp16, scale the loss with "
        "`torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler`.\n"
        if precision == "fp16"
        else ""
    )
    return f"""# PyTorch FSDP launch

{_COVERAGE.format(script="train_fsdp.py")}

## Start it

```bash
{shlex.join(command)}
```

Run it on each of the {hardware.nodes} node(s); `train.sbatch` does the same under SLURM.

## Wrapping the model

```python
import functools
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import AutoConfig, AutoModelForCausalLM
from {module} import {layer}

dist.init_process_group("nccl")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)

hf_config = json.loads(open("model_config.json").read())  # written next to this guide
config = AutoConfig.for_model(hf_config.pop("model_type"), **hf_config)
model = AutoModelForCausalLM.from_config(config)

# One FSDP unit per decoder layer: each layer's weights are gathered just before it runs.
wrap_policy = functools.partial(
    transformer_auto_wrap_policy, transformer_layer_cls={{{layer}}}
)
{mp_lines}
model = FSDP(
    model,
    auto_wrap_policy=wrap_policy,
    mixed_precision=mixed,
    sharding_strategy=ShardingStrategy.{strategy},
    device_id=local_rank,
)
# Build the optimizer after wrapping, so it holds the sharded parameters.
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
```

{layer_note} {strategy_note}
{scaler_note}"""


def _model_parallel(memory: MemoryPlan | None) -> tuple[int, int] | None:
    """(tensor degree, pipeline degree) of a tensor/pipeline-parallel plan, else None."""
    if memory is None or memory.tensor_parallel * memory.pipeline_parallel == 1:
        return None
    return memory.tensor_parallel, memory.pipeline_parallel


def _megatron_args(
    brief: TrainingBrief,
    model: ModelSpec,
    split: tuple[int, int],
    config: dict[str, Any],
    steps: int,
    precision: str,
) -> list[str]:
    """Megatron-DeepSpeed ``pretrain_gpt.py`` arguments for the plan (its examples' flag names).

    Megatron-DeepSpeed hands DeepSpeed its own optimizer and LR schedule, which take precedence
    over the config's (DeepSpeed uses a client optimizer when given one), so the recipe in
    ds_config.json is repeated here as Megatron flags.
    """
    tp, pp = split
    zero = config.get("zero_optimization") or {}
    optimizer = (config.get("optimizer") or {}).get("params") or {}
    scheduler = (config.get("scheduler") or {}).get("params") or {}
    total = scheduler.get("total_num_steps")
    args: list[str] = [
        MEGATRON_SCRIPT,
        "--tensor-model-parallel-size",
        str(tp),
        "--pipeline-model-parallel-size",
        str(pp),
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
        # The Llama architecture in Megatron-DeepSpeed (examples_deepspeed/
        # pretrain_llama2_distributed.sh).
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
    args += [
        "--seq-length",
        str(brief.seq_len),
        "--max-position-embeddings",
        str(max(brief.seq_len, model.seq_len)),
        "--micro-batch-size",
        str(config.get("train_micro_batch_size_per_gpu", 1)),
        "--global-batch-size",
        str(config.get("train_batch_size", brief.global_batch_size)),
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
    args += [
        "--deepspeed",
        "--deepspeed_config",
        "ds_config.json",
        "--zero-stage",
        str(zero.get("stage", 0)),
    ]
    return args


def _megatron_md(
    command: list[str],
    hardware: HardwareSpec,
    model: ModelSpec,
    split: tuple[int, int],
    config: dict[str, Any],
) -> str:
    tp, pp = split
    world = hardware.world_size
    dp = world // (tp * pp)
    degrees = f"tensor parallel {tp} x pipeline parallel {pp} x data parallel {dp} = {world} GPUs"
    stage = (config.get("zero_optimization") or {}).get("stage", 0)
    return f"""# Tensor/pipeline-parallel launch (Megatron-DeepSpeed)

{model.name} does not fit on these GPUs with data parallelism alone, not even ZeRO-3, so the
plan splits each model replica: {degrees}. DeepSpeed's engine on its own has no tensor- or
pipeline-parallel layers, and trainwright's train.py parallelises data only, so this plan runs
on Megatron-DeepSpeed (github.com/microsoft/Megatron-DeepSpeed), which builds the parallel
model and hands DeepSpeed its process groups (Megatron-LM or NeMo work too, with their own
configuration instead of ds_config.json).

## Start it

From a Megatron-DeepSpeed checkout with this directory's ds_config.json copied next to
`{MEGATRON_SCRIPT}`, on each of the {hardware.nodes} node(s):

```bash
{shell_join(command)} \\
    --data-path YOUR_DATA_PREFIX --tokenizer-type YOUR_TOKENIZER_TYPE --tokenizer-model YOUR_TOKENIZER
```

`launch.sh` and `train.sbatch` run the same command; append the data and tokenizer arguments
there.

## What the config says and why

- ZeRO stage {stage} over the {dp} data-parallel rank(s). DeepSpeed's pipeline engine accepts
  stage 0 or 1 only; with tensor parallelism alone stages 2 and 3 also work.
- `train_batch_size` {config.get("train_batch_size")} = micro-batch
  {config.get("train_micro_batch_size_per_gpu")} x gradient accumulation
  {config.get("gradient_accumulation_steps")} x {dp} data-parallel ranks, not x {world} GPUs:
  DeepSpeed counts the data-parallel group Megatron gives it. trainwright validated the config
  with DeepSpeed's own DeepSpeedConfig at that size. With a pipeline, the accumulation steps
  are the micro-batches each pipeline runs per step (the bubble is (p-1)/(m+p-1) of it).
- Megatron passes its own optimizer and LR schedule to DeepSpeed, which then ignores the
  config's `optimizer` and `scheduler`; the command repeats them as Megatron flags.
- `--sequence-parallel` and full recomputation are what the memory estimate assumed.
"""
