"""A one-node SLURM cluster on this machine, for tests/smoke/test_slurm.py.

Debian's slurm-wlm and munge (``make slurm`` installs them, as root): munged with a key made
here, slurmctld and slurmd in the foreground as children of the test, and a slurm.conf,
gres.conf, state, spool and logs under the test's temp folder. The node is ``localhost`` with
this machine's CPUs and memory and two stand-in GPUs (character devices like /dev/null, so that
a plan's ``--gpus-per-node=2`` can be granted on a machine without any). proctrack/linuxproc
and task/none: no cgroups needed. munged's socket lies in a short folder of its own under /tmp:
munged wants every folder above it searchable by all (pytest's base folder is 0700), and a
socket's path has at most 107 bytes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tools.smoke.commands import free_port

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scancel", "scontrol")
GPUS = 2
_FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY")
_START_GUARD_S = 60.0  # hang guards, not timings
_STOP_GUARD_S = 30.0


def unavailable() -> str | None:
    """Why this machine cannot run the cluster (slurmd needs root), or None."""
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed (make slurm installs slurm-wlm and munge as root)"
        )
    if os.geteuid() != 0:
        return "slurmd and munged run as root here, and this test is not root"
    return None


def _conf(folder: Path, socket: Path) -> str:
    mem_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    return "\n".join(
        [
            "ClusterName=trainwright-test",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={folder / 'state'}",
            f"SlurmdSpoolDir={folder / 'spool'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={folder / 'slurmd.pid'}",
            f"SlurmctldLogFile={folder / 'slurmctld.log'}",
            f"SlurmdLogFile={folder / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "GresTypes=gpu",
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} "
            f"RealMemory={max(1, mem_mib - 1)} Gres=gpu:{GPUS} State=UNKNOWN",
            "PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


class Cluster:
    """munged, slurmctld and slurmd under ``folder``; ``env`` points SLURM's commands at them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.sock_dir = Path(tempfile.mkdtemp(prefix="tw-munge-", dir="/tmp"))
        self.env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
        self.daemons: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self) -> None:
        """Write the configuration, start the daemons, wait until the node is idle."""
        folder, socket = self.folder, self.sock_dir / "munge.sock"
        self.sock_dir.chmod(0o755)
        for sub in ("state", "spool", "dev"):
            (folder / sub).mkdir()
        key = os.open(folder / "munge.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(key, os.urandom(1024))
        os.close(key)
        for gpu in range(GPUS):
            os.mknod(folder / "dev" / f"gpu{gpu}", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        (folder / "slurm.conf").write_text(_conf(folder, socket))
        (folder / "gres.conf").write_text(
            f"NodeName=localhost Name=gpu File={folder / 'dev'}/gpu[0-{GPUS - 1}]\n"
        )
        self._daemon(
            "munged",
            ["munged", "-F", f"--socket={socket}", f"--key-file={folder / 'munge.key'}"]
            + [f"--pid-file={folder / 'munged.pid'}", f"--seed-file={folder / 'munged.seed'}"]
            + [f"--log-file={folder / 'munged.log'}"],
        )
        self._until(socket.exists, "munged's socket")
        conf = str(folder / "slurm.conf")
        self._daemon("slurmctld", ["slurmctld", "-D", "-f", conf])
        self._daemon("slurmd", ["slurmd", "-D", "-N", "localhost", "-f", conf])
        self._until(lambda: self.node_state() == "idle", "the node idle in sinfo")

    def _daemon(self, name: str, argv: list[str]) -> None:
        log = open(self.folder / f"{name}.out", "wb")  # noqa: SIM115 - the daemon's own
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.daemons.append((name, proc))
        log.close()

    def _until(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + _START_GUARD_S
        while not ready():
            gone = [name for name, proc in self.daemons if proc.poll() is not None]
            if gone or time.monotonic() > deadline:
                raise RuntimeError(f"no {what} ({', '.join(gone) or 'none'} exited): {self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        """The daemons' output, last lines of each."""
        parts = []
        for out in sorted(self.folder.glob("*.out")):
            parts.append(f"--- {out.name}\n" + "\n".join(out.read_text().splitlines()[-15:]))
        return "\n".join(parts)

    def node_state(self) -> str:
        """The node's state in sinfo (idle, mixed, allocated, drained, inval, ...)."""
        res = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
        return res.stdout.strip()

    def run(self, *argv: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
        """A SLURM command against this cluster."""
        kw.setdefault("env", self.env)
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=check, **kw)  # type: ignore[call-overload,no-any-return]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, ExitCode, ...)."""
        line = self.run("scontrol", "-o", "show", "job", job_id).stdout
        return dict(item.split("=", 1) for item in line.split() if "=" in item)

    def wait_job(self, job_id: str, guard_s: float) -> dict[str, str]:
        """The job's fields once it has ended (``guard_s``: a hang guard)."""
        deadline = time.monotonic() + guard_s
        while (fields := self.job(job_id))["JobState"] not in _FINAL:
            if time.monotonic() > deadline:
                self.run("scancel", "--signal=KILL", "--full", job_id, check=False)
                raise AssertionError(f"job {job_id} still {fields['JobState']}: {self.logs()}")
            time.sleep(0.2)
        return fields

    def stop(self) -> None:
        """Cancel every job, stop the daemons (SIGTERM, then SIGKILL), remove munged's folder."""
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "--signal=KILL", "--partition=test", check=False)
            deadline = time.monotonic() + _STOP_GUARD_S
            while self.run("squeue", "-h", check=False).stdout.strip():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        for _, daemon in reversed(self.daemons):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(timeout=_STOP_GUARD_S)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait(timeout=_STOP_GUARD_S)
        shutil.rmtree(self.sock_dir, ignore_errors=True)
