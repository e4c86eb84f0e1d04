"""Starting the launchers on a cluster: launch scripts, hostfile, SLURM job, Accelerate config.

Shared by the rows of the launcher table (tools/artifacts/launch.py): the torchrun prefix, the
DeepSpeed launcher's per-node command for clusters without passwordless ssh, and the files
around a command (``launch.sh``, ``launch_node{R}.sh``, ``hostfile``, ``train.sbatch``,
``accelerate_config.yaml``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml

from tools.artifacts.scripts import Shell, comment_text, render, shell_join
from tools.core.schemas import HardwareSpec, ModelSpec, TrainingBrief

MASTER_PORT = 29500
# A script's own arguments, passed on to the command (launch.sh's and train.sbatch's last word).
ARGS = Shell('"$@"')


def hosts(hardware: HardwareSpec) -> list[str]:
    """The node names the files use: node0, node1, ... (the user renames them), or localhost."""
    return [f"node{i}" for i in range(hardware.nodes)] if hardware.nodes > 1 else ["localhost"]


def torchrun(hardware: HardwareSpec, gpus: int, master_addr: str) -> list[str]:
    """``torchrun`` up to the script; several nodes meet at a c10d rendezvous on the master."""
    command = ["torchrun", "--nnodes", str(hardware.nodes), "--nproc_per_node", str(gpus)]
    if hardware.nodes > 1:
        command += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"{master_addr}:{MASTER_PORT}"]
    return command


def port_from_env(command: list[str]) -> list[str]:
    """A one-node DeepSpeed launch that listens on ``$MASTER_PORT`` when it is set.

    DeepSpeed's launcher listens on 29500 unless told (it reads no environment variable), so
    with that port taken (a second job on the machine) every rank stopped with EADDRINUSE and
    launch.sh offered no way to pick another: its arguments go to train.py. torchrun on one
    node finds a free port itself; several nodes name their rendezvous in the command.
    """
    if not command or command[0] != "deepspeed" or "--hostfile" in command:
        return command
    port = [Shell("${MASTER_PORT:+--master_port}"), Shell('${MASTER_PORT:+"$MASTER_PORT"}')]
    return [command[0], *port, *command[1:]]


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


def launch_script(comments: list[str], command: list[str], preamble: Sequence[str] = ()) -> str:
    """A bash script that runs ``command`` from its own directory, after ``preamble`` lines."""
    return render(
        "launch.sh",
        comments="\n".join(comments),
        commands="\n".join([*preamble, shell_join(command)]),
    )


def hostfile(hardware: HardwareSpec, gpus: int) -> str:
    """The DeepSpeed launcher's hostfile: one ``host slots=N`` line per node."""
    return "".join(f"{host} slots={gpus}\n" for host in hosts(hardware))


def node_scripts(
    title: str,
    hardware: HardwareSpec,
    gpus: int,
    script_args: list[str],
    preamble: Sequence[str] = (),
) -> dict[str, str]:
    """``launch_node{R}.sh`` for every node R: the DeepSpeed launch without ssh, after ``preamble``."""
    names = hosts(hardware)
    scripts = {}
    for rank in range(hardware.nodes):
        how = (
            f"# Node rank {rank} of {hardware.nodes}, without ssh: run this on the host named "
            f"{names[rank]} in hostfile, and launch_node{{R}}.sh on every other node R."
        )
        command = deepspeed_no_ssh_command(
            hardware.nodes, gpus, rank, "node0", "hostfile", script_args
        )
        scripts[f"launch_node{rank}.sh"] = launch_script([title, how], command, preamble)
    return scripts


def sbatch(
    brief: TrainingBrief,
    hardware: HardwareSpec,
    model: ModelSpec,
    gpus: int,
    command: list[str],
    preamble: Sequence[str] = (),
) -> str:
    """A SLURM batch script: one task per node, each starting that node's launcher.

    ``preamble``: the launch.sh lines before the command, run here once before srun.

    In the template: sbatch runs a copy of the script from the spool directory, so it changes
    to ``$SLURM_SUBMIT_DIR``, not to ``$0``'s directory; it takes the first host from
    ``mapfile``, not ``| head -n 1``, whose SIGPIPE to scontrol would fail the job under
    pipefail; and srun runs in the background while the script waits for it, passing SIGTERM
    on (scancel and preemption signal the script too: one that died at once would let the
    ranks' watch on it end them mid-save; tests/smoke/test_slurm.py runs it under slurmd).
    """
    job = "trainwright-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", model.name).strip("-") or "train")
    # Data loading and the launcher want a few cores per GPU; 8 is a common per-GPU share.
    cpus = hardware.cpu_cores or 8 * gpus
    resources = [f"#SBATCH --cpus-per-task={cpus}"]
    if hardware.gpus_per_node > 0:
        resources.insert(0, f"#SBATCH --gpus-per-node={hardware.gpus_per_node}")
    *setup, srun = _srun_lines(hardware, gpus, command)
    return render(
        "train.sbatch",
        goal=comment_text(brief.goal or model.name),
        job=job,
        nodes=hardware.nodes,
        resources="\n".join(resources),
        launch="\n".join([*preamble, *setup]),
        srun=srun,
    )


def _srun_lines(hardware: HardwareSpec, gpus: int, command: list[str]) -> list[str]:
    """The job's last lines: ``command`` under srun, once per node, told its place in the job."""
    srun = ["srun", "--kill-on-bad-exit=1"]
    launcher, rest = command[0], command[1:]
    if launcher == "deepspeed" and hardware.nodes > 1:
        # The launcher still needs a hostfile under --no_ssh; build it from this allocation,
        # in SLURM_NODEID order, so node rank R is the R-th host.
        make_hostfile = f'printf "%s slots={gpus}\\n" "${{NODES[@]}}" > "hostfile.$SLURM_JOB_ID"'
        script_args = rest[rest.index("--num_gpus") + 2 :]
        inner = deepspeed_no_ssh_command(
            hardware.nodes,
            gpus,
            Shell('"$SLURM_NODEID"'),
            Shell('"$MASTER_ADDR"'),
            Shell('"hostfile.$SLURM_JOB_ID"'),
            script_args,
        )
        # $SLURM_NODEID differs per task, so it must expand in the task's shell, not here; the
        # script's own arguments, when it passes them on, reach that shell as its "$@".
        forward = ["bash", ARGS] if any(arg is ARGS for arg in script_args) else []
        task = [*srun, "bash", "-c", "exec " + shell_join(inner), *forward]
        return [make_hostfile, shell_join(task)]
    if launcher == "torchrun" and hardware.nodes > 1:
        # torchrun(): the four --rdzv_backend/--rdzv_endpoint items; the job's own go instead.
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
        return [shell_join(body)]
    return [shell_join([*srun, *command])]


def accelerate_config(
    hardware: HardwareSpec,
    gpus: int,
    precision: str,
    deepspeed_config: dict[str, Any] | None,
) -> str:
    """An ``accelerate launch --config_file`` config, for Hugging Face Accelerate/Trainer users."""
    mixed = {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no")
    config: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE"}
    if deepspeed_config is not None:
        mixed = _deepspeed_precision(deepspeed_config, mixed)
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
    body = yaml.safe_dump(config, sort_keys=False).removesuffix("\n")
    return render("accelerate_config.yaml", config=body)


def _deepspeed_precision(deepspeed_config: dict[str, Any], mixed: str) -> str:
    """DeepSpeed reads precision from ds_config.json; keep Accelerate's setting in step."""
    if (deepspeed_config.get("bf16") or {}).get("enabled"):
        return "bf16"
    if (deepspeed_config.get("fp16") or {}).get("enabled"):
        return "fp16"
    if "bf16" in deepspeed_config or "fp16" in deepspeed_config:
        return "no"
    return mixed
