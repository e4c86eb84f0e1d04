"""The smoke run's memory cap holds for the sum of its processes (issue: a run with micro-batch
6000 once took the machine to 22.6 of 23 GB under the default cap of half the RAM).

The per-rank address limit is the cap split across the ranks plus a fixed allowance (it was
the whole cap plus 8 GiB per rank, so two ranks could hold twice the cap); the watchdog samples
the run's own processes at a fixed period; a cgroup v2 with ``memory.max`` is used where this
process's cgroup delegates the memory controller (not on this machine: the fallback is what
runs here, the cgroup protocol is checked on a folder laid out like cgroupfs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.smoke import memory_cap
from tools.smoke.groups import group_alive
from tools.smoke.memory_cap import (
    ADDRESS_SPACE_ALLOWANCE,
    ARENA_BYTES,
    RunMemory,
    close_cgroup,
    default_memory_cap,
    memory_cgroup,
    rank_address_space,
)
from tools.smoke.outcome import Outcome
from tools.smoke.supervise import _RLIMIT_SHIM

ROOT = Path(__file__).resolve().parents[2]
GiB = 2**30


def test_the_address_limit_is_split_across_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    cap = 4 * GiB
    allowance = ADDRESS_SPACE_ALLOWANCE
    assert rank_address_space(cap, 2) == 2 * GiB + allowance + 8 * ARENA_BYTES
    assert rank_address_space(cap, 8) == GiB // 2 + allowance + 2 * ARENA_BYTES
    assert rank_address_space(cap, 1) == cap + allowance + 16 * ARENA_BYTES
    assert rank_address_space(0, 2) == 0
    # Before: cap + 8 GiB per rank, so 2 ranks could map 2 * (cap + 8 GiB) between samples.
    assert 2 * rank_address_space(cap, 2) < 2 * (cap + 8 * GiB) - cap


def test_the_default_cap_leaves_headroom_for_the_rest_of_the_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory_cap, "_usable_memory", lambda: 32 * GiB)
    monkeypatch.setattr(memory_cap, "_available_memory", lambda: 30 * GiB)
    assert default_memory_cap() == 16 * GiB  # half the RAM
    # Other programs hold most of it: what is available, less a tenth of the RAM.
    monkeypatch.setattr(memory_cap, "_available_memory", lambda: 10 * GiB)
    assert default_memory_cap() == 10 * GiB - int(3.2 * GiB)
    monkeypatch.setattr(memory_cap, "_available_memory", lambda: GiB)
    assert default_memory_cap() == 64 * 2**20  # the least a run may get: it ends as oom
    assert default_memory_cap.__module__ == "tools.smoke.memory_cap"


def _fake_cgroupfs(tmp_path: Path, controllers: str) -> Path:
    own = tmp_path / "user.slice" / "session"
    own.mkdir(parents=True)
    (own / "cgroup.subtree_control").write_text(controllers)
    return tmp_path


def test_a_run_cgroup_gets_the_cap_as_memory_max(tmp_path: Path) -> None:
    root = _fake_cgroupfs(tmp_path, "cpu memory pids\n")
    group, how = memory_cgroup("run-1", 3 * GiB, root=root, own="/user.slice/session")
    assert group is not None and group.parent == root / "user.slice" / "session"
    assert how == str(group)
    assert (group / "memory.max").read_text() == str(3 * GiB)
    assert (group / "memory.swap.max").read_text() == "0"
    # An OOM kill inside the group is the run going over the cap; the group is then removed
    # (cgroupfs removes its own files; here the test does).
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    (group / "memory.peak").write_text(str(3 * GiB + 4096))
    outcome = Outcome()
    for f in group.iterdir():
        if f.name not in ("memory.events", "memory.peak"):
            f.unlink()
    close_cgroup(group, outcome, 3 * GiB)
    assert outcome.over_cap == (3 * GiB, 3 * GiB + 4096)


def test_without_a_delegated_memory_controller_there_is_no_cgroup(tmp_path: Path) -> None:
    root = _fake_cgroupfs(tmp_path, "cpu pids\n")
    group, how = memory_cgroup("run-1", GiB, root=root, own="/user.slice/session")
    assert group is None
    assert how.startswith("none: the memory controller is not enabled"), how
    assert memory_cgroup("run-1", GiB, root=tmp_path / "absent", own="/")[0] is None


def test_the_launch_shim_joins_the_cgroup_and_sets_the_address_limit(tmp_path: Path) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    limit = 3 * GiB
    out = subprocess.run(
        [sys.executable, "-S", "-c", _RLIMIT_SHIM, str(limit), str(procs),
         "/bin/sh", "-c", "echo $$; ulimit -v"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    pid, kib = out.stdout.split()
    assert procs.read_text() == pid  # the shim wrote its own pid, then exec'd the launcher
    assert int(kib) * 1024 == limit


def test_the_watchdog_reads_only_the_runs_processes(tmp_path: Path) -> None:
    # A group of three processes, one holding ~200 MiB: the sample counts them all and needs
    # no scan of every process on the machine.
    code = "import time; b = bytearray(200 * 2**20); time.sleep(60)"
    leader = subprocess.Popen(
        ["/bin/sh", "-c", f"{sys.executable} -c '{code}' & sleep 60 & wait"],
        start_new_session=True,
    )
    try:
        watch = RunMemory([leader.pid])
        outcome = Outcome()
        held = 0
        for _ in range(100):  # until the bytearray is resident (a few tenths of a second)
            held = watch.sample(outcome)
            if held > 200 * 2**20:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert held > 200 * 2**20, held
        assert len(watch.known) == 3, watch.known
        assert outcome.peak_rss == held and outcome.samples >= 1
        assert outcome.max_sample_s < 0.5
    finally:
        os.killpg(leader.pid, 9)
        leader.wait(timeout=10)


@pytest.mark.slow
def test_a_huge_micro_batch_under_a_small_cap_ends_as_oom_with_the_sum_under_the_cap(
    tmp_path: Path,
) -> None:
    cap = 2 * GiB  # a run's footprint is ~1.5 GiB; micro-batch 6000 would need tens of GiB
    run_dir = tmp_path / "run"
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "smoke", "--model", "gpt2",
         "--micro-batch", "6000", "--steps", "2", "--memory-cap", "2GiB", "--timeout", "240",
         "--run-dir", str(run_dir), "--json", str(out)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["reason"].startswith("oom: "), result["reason"]
    memory = json.loads((run_dir / "memory.json").read_text())
    print(json.dumps(memory))
    assert memory["memory_cap_bytes"] == cap
    assert memory["address_space_limit_bytes"] == rank_address_space(cap, 2)
    # The largest sum of resident memory the watchdog saw: under the cap plus what one sample
    # period of allocation can add.
    assert memory["peak_rss_bytes"] < cap + 512 * 2**20, memory
    # Sampled at a fixed period: no gap grows past a few periods on a busy machine.
    assert memory["samples"] >= 1 and memory["max_gap_s"] < 1.0, memory
    launch = json.loads((run_dir / "launch.json").read_text())
    assert launch["cgroup"], launch
    assert all(group_alive(pgid) == [] for pgid in launch["pgids"])
