"""What a supervised launch ended with: exit code, timeout, memory, the log (supervise.py)."""

from __future__ import annotations


class Outcome:
    """What happened to the launched process group."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.timed_out = False
        self.start_error = ""
        self.last_progress = ""
        self.log_text = ""
        self.timeout_s = 0.0
        # The stall limit the run had (0: none), and the seconds without a new step after which
        # it was stopped as stalled (None: it was not).
        self.stall_s = 0.0
        self.stalled_after_s: float | None = None
        # Set when the run's processes held more than the memory cap: (cap, held) in bytes.
        self.over_cap: tuple[int, int] | None = None
        self.address_space = 0
        # What the watchdog saw: the largest sum of resident memory (bytes), how many samples,
        # the longest time between two samples and the longest sample (seconds).
        self.peak_rss = 0
        self.samples = 0
        self.max_gap_s = 0.0
        self.max_sample_s = 0.0
        # The cgroup v2 the run's processes were in (its memory.max is the cap), or why none.
        self.cgroup = ""
        # The process groups of the run's processes other than the launchers' own: torchrun
        # starts each rank in a session of its own, which no kill of its group reaches.
        self.groups: set[int] = set()
