"""The launcher commands and environment of a smoke run: one launcher per "node", all local.

The commands are the ones a cluster without ssh runs (DeepSpeed's runner or torchrun), every
"node" being this machine, so the multi-node path is exercised for real.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from tools.core.outputs import write_file
from tools.core.settings import TELEMETRY_OFF

# The hostfile a one-node DeepSpeed run names: it must not exist, so that the launcher stays on
# this machine even where a cluster image ships /job/hostfile (the runner's default).
NO_HOSTFILE = "no-hostfile"


def launch_commands(
    *,
    run_dir: Path,
    script: Path,
    device: str,
    ranks: int,
    nodes: int,
    deepspeed: bool,
    train_args: list[str],
    lr: float,
) -> list[list[str]]:
    """One launcher command per node, as argument lists (no shell), for the local smoke world.

    One node: ``deepspeed`` (its runner) or ``torchrun`` on this machine. Several nodes: the
    commands the planner emits for a cluster without ssh (tools/artifacts/cluster.py launch_node{R}.sh),
    every "node" being this machine: DeepSpeed's runner with a hostfile of ``nodes`` hosts,
    ``--no_ssh --node_rank R``; torchrun with ``--nnodes N --node_rank R`` and a static
    rendezvous at 127.0.0.1.
    """
    port = free_port()
    script_args = [str(script), "--model-config", str(run_dir / "model_config.json")]
    if deepspeed:
        script_args += ["--deepspeed_config", str(run_dir / "ds_config.json")]
    script_args += [*train_args, "--lr", f"{lr:g}"]
    if deepspeed:
        return _deepspeed_commands(run_dir, device, ranks, nodes, port, script_args)
    return _torchrun_commands(device, ranks, nodes, port, script_args)


def _deepspeed_commands(
    run_dir: Path, device: str, ranks: int, nodes: int, port: int, script_args: list[str]
) -> list[list[str]]:
    if nodes > 1:
        text = "".join(f"node{i} slots={ranks // nodes}\n" for i in range(nodes))
        write_file(run_dir, "hostfile", text, field="--run-dir")
    commands: list[list[str]] = []
    for node in range(nodes):
        if nodes > 1:
            where = ["--hostfile", str(run_dir / "hostfile"), "--no_ssh"]
            where += ["--node_rank", str(node)]
        else:
            # A missing hostfile keeps the launcher on this machine (NO_HOSTFILE).
            where = [
                "--hostfile",
                str(run_dir / NO_HOSTFILE),
                *_rank_selection(device, ranks),
            ]
        commands.append(
            [
                sys.executable,
                "-m",
                "deepspeed.launcher.runner",
                *where,
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                *script_args,
            ]
        )
    return commands


def _torchrun_commands(
    device: str, ranks: int, nodes: int, port: int, script_args: list[str]
) -> list[list[str]]:
    # torchrun's ranks index the GPUs that CUDA_VISIBLE_DEVICES leaves visible, so a user's
    # selection holds without an --include equivalent.
    return [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(nodes),
            "--node_rank",
            str(node),
            "--nproc_per_node",
            str(ranks // nodes),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            *script_args,
            *(["--bf16"] if device == "cuda" else []),
        ]
        for node in range(nodes)
    ]


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_selection(device: str, ranks: int) -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if device == "cuda" and visible:
        # The runner ignores CUDA_VISIBLE_DEVICES when --num_gpus is given and renumbers from
        # 0, which would use GPUs the user hid; --include keeps their selection.
        ids = [part for part in visible.split(",") if part.strip()][:ranks]
        return ["--include", "localhost:" + ",".join(ids)]
    return ["--num_gpus", str(ranks)]


def child_env(tmp_dir: Path, device: str, ranks: int) -> dict[str, str]:
    """The environment of a run's launchers and ranks: telemetry off, ``tmp_dir``, CPU threads."""
    env = dict(os.environ)
    env.update(TELEMETRY_OFF)
    env["TMPDIR"] = str(tmp_dir)
    env["PYTHONUNBUFFERED"] = "1"
    # The supervisor adds its own pid (groups.py SUPERVISOR_ENV), which every rank watches.
    if device != "cuda":
        env["DS_ACCELERATOR"] = "cpu"
        # One OpenMP pool per rank over all cores oversubscribes the CPU and makes steps slow
        # and noisy; split the cores between the ranks instead.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
        # glibc keeps freed blocks in its arenas and adapts its mmap threshold upwards, so a
        # rank's RSS would hold every size it ever freed. A fixed threshold gives each block of
        # 64 KiB or more (nearly every tensor) its own mapping, returned to the system when
        # freed: the RSS peak then follows live tensors, as a GPU's allocated peak does.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    return env
