"""A smoke run's memory cap: its default, the per-rank address limit, the cgroup, the sampler.

The watchdog in supervise.py samples the run with ``RunMemory`` and stops it over the cap.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from tools.smoke.groups import descendants, group_pids, group_rss_bytes
from tools.smoke.outcome import Outcome

# The memory cap a run gets by default (Settings.smoke_memory_cap unset): half of the machine's
# RAM (or of its cgroup's limit when that is lower), and never more than the memory available
# now less a margin for the rest of the machine. The cap bounds the resident memory of every
# process of the run together (launchers and ranks; shared library pages count in each
# process that maps them).
DEFAULT_MEMORY_CAP_FRACTION = 0.5
# What the default leaves to everything else: this share of the RAM, at least 1 GiB.
MEMORY_MARGIN_FRACTION = 0.1
MIN_MEMORY_MARGIN = 2**30
# The watchdog samples the run's memory this often, whatever else the machine runs: it reads
# /proc/PID/statm of the run's own processes only (found through /proc/PID/task/*/children,
# with a scan of /proc for the run's process groups every GROUP_SCAN_S), never the whole of
# /proc at every sample.
MEMORY_POLL_S = 0.05
GROUP_SCAN_S = 1.0
# On CPU every rank also runs under an address-space limit (RLIMIT_AS): its share of the cap
# (cap / ranks) plus an allowance for address space that is reserved but never touched: torch
# and OpenMP map ~1 GiB more than they hold (a CPU rank maps ~1.5 GiB for ~0.5 GiB resident),
# and glibc reserves a 64 MiB arena per thread that allocates, up to one per OpenMP thread.
# The limit stops one allocation larger than a rank's share before the watchdog's next sample.
# Never on CUDA, which reserves huge ranges.
ADDRESS_SPACE_ALLOWANCE = 2 * 2**30
ARENA_BYTES = 64 * 2**20


class RunMemory:
    """The resident memory of one run's processes, sampled cheaply and at a fixed rate.

    The processes are the launchers and their descendants (``/proc/PID/task/*/children``),
    plus, every GROUP_SCAN_S, whatever else is in the launchers' process groups (a scan of
    /proc's stat files, for a process that was re-parented). Each sample reads one
    ``/proc/PID/statm`` per process: its resident pages.
    """

    def __init__(self, pgids: list[int]) -> None:
        self.pgids = pgids
        self.known: set[int] = set(pgids)
        self.next_scan = 0.0
        self.last = 0.0
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def sample(self, outcome: Outcome) -> int:
        """The run's resident memory now (bytes); records the sample's timing in ``outcome``."""
        started = time.monotonic()
        if not os.path.exists("/proc/self/statm"):
            held = group_rss_bytes(self.pgids)
        else:
            if started >= self.next_scan:
                self.known |= set(group_pids(self.pgids))
                self.next_scan = started + GROUP_SCAN_S
            self.known = descendants(self.known)
            held = 0
            for pid in list(self.known):
                try:
                    with open(f"/proc/{pid}/statm", "rb") as fh:
                        held += int(fh.read().split()[1]) * self.page
                except (OSError, IndexError, ValueError):
                    self.known.discard(pid)  # gone
        done = time.monotonic()
        if self.last:
            outcome.max_gap_s = max(outcome.max_gap_s, done - self.last)
        self.last = done
        outcome.samples += 1
        outcome.max_sample_s = max(outcome.max_sample_s, done - started)
        outcome.peak_rss = max(outcome.peak_rss, held)
        return held


# ---- cgroup v2 ---------------------------------------------------------------------------------


def _cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` on most systems), or None."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            return Path(left.split()[4])
    return None


def _own_cgroup() -> str | None:
    """This process's cgroup v2 path (``0::/path`` in /proc/self/cgroup), or None."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip() or "/"
    except OSError:
        pass
    return None


def memory_cgroup(
    name: str, cap: int, root: Path | None = None, own: str | None = None
) -> tuple[Path | None, str]:
    """A new cgroup v2 for one run with ``memory.max`` = ``cap``, or None and the reason why not.

    It is made under this process's own cgroup, which must have the memory controller enabled
    for its children (``cgroup.subtree_control``) and be writable (a delegated subtree, or
    root). Swap is turned off in it where the kernel has swap accounting. ``root`` and
    ``own`` stand in for the mount point and this process's cgroup path (tests).
    """
    root = root if root is not None else _cgroup2_mount()
    own = own if own is not None else _own_cgroup()
    if root is None or own is None:
        return None, "none: no cgroup v2 hierarchy"
    parent = root / own.lstrip("/")
    try:
        controllers = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None, f"none: cannot read {parent / 'cgroup.subtree_control'}"
    if "memory" not in controllers:
        return None, f"none: the memory controller is not enabled for children of {parent}"
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64] or "run"
    group = parent / f"trainwright-{safe}-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        return None, f"none: cannot create a cgroup in {parent}: {exc.strerror}"
    try:
        (group / "memory.max").write_text(str(cap))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None, f"none: cannot set memory.max in {parent}: {exc.strerror}"
    with contextlib.suppress(OSError):
        (group / "memory.swap.max").write_text("0")
    return group, str(group)


def close_cgroup(group: Path, outcome: Outcome, memory_cap: int) -> None:
    """Count an OOM kill inside the run's cgroup as over the cap, then remove the cgroup."""
    try:
        events = dict(
            line.split() for line in (group / "memory.events").read_text().splitlines() if line
        )
        if int(events.get("oom_kill", 0)) > 0 and outcome.over_cap is None:
            peak = memory_cap
            with contextlib.suppress(OSError, ValueError):
                peak = int((group / "memory.peak").read_text())
            outcome.over_cap = (memory_cap, max(peak, outcome.peak_rss))
    except (OSError, ValueError):
        pass
    with contextlib.suppress(OSError):
        group.rmdir()


def rank_address_space(memory_cap: int, ranks: int) -> int:
    """The RLIMIT_AS of each CPU rank (and launcher) under ``memory_cap``; 0 with no cap.

    The cap split across the ranks, plus ADDRESS_SPACE_ALLOWANCE and one glibc arena per
    OpenMP thread of a rank, for address space that is reserved but never touched: one rank
    alone cannot take the whole cap in one allocation.
    """
    if memory_cap <= 0:
        return 0
    threads = max(1, (os.cpu_count() or 1) // max(1, ranks))  # each rank's OMP_NUM_THREADS
    return memory_cap // max(1, ranks) + ADDRESS_SPACE_ALLOWANCE + threads * ARENA_BYTES


def default_memory_cap() -> int:
    """The default memory cap of a smoke run, leaving headroom for the rest of the machine.

    Half of this machine's RAM (or of its cgroup's limit), but no more than the memory
    available now (MemAvailable) less a margin of a tenth of the RAM (at least 1 GiB); never
    below 64 MiB, the least a run may be given (a run then ends as ``oom`` at once).
    """
    usable = _usable_memory()
    cap = int(DEFAULT_MEMORY_CAP_FRACTION * usable)
    available = _available_memory()
    if available is not None:
        margin = max(MIN_MEMORY_MARGIN, int(MEMORY_MARGIN_FRACTION * usable))
        cap = min(cap, available - margin)
    return max(cap, 64 * 2**20)


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, or None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _usable_memory() -> int:
    total = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    # A container's memory limit (cgroup v2, then v1) is what the run can really use.
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(path).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and 0 < int(limit) < total:
            total = int(limit)
        break
    return total


def format_bytes(n: int) -> str:
    """``n`` bytes as MiB below 1 GiB (``512 MiB``), else GiB with one decimal (``8.0 GiB``)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
