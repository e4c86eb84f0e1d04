"""Stage 4, proof: the short real training run of a planned setup on this machine.

It shows the setup starts, fits and learns; train.py is the standalone script it launches.
"""

from tools.smoke.runner import (
    INJECT_KINDS,
    default_memory_cap,
    free_port,
    run_smoke_test,
    stop_all_runs,
    stop_on_sigterm,
    stop_runs_on_interrupt,
)

__all__ = [
    "INJECT_KINDS",
    "default_memory_cap",
    "free_port",
    "run_smoke_test",
    "stop_all_runs",
    "stop_on_sigterm",
    "stop_runs_on_interrupt",
]
