"""Smoke-run overhead: bench/suite/smoke_overhead.py run as it is, its figures read back.

bench/suite/smoke_overhead.py (its own owner; not changed here) times, interleaved, ``app.py smoke``
(gpt2 scaled to the CPU budget, ZeRO-2, 2 CPU ranks, 30 steps) against bench/suite/minimal_ds_train.py
launched by DeepSpeed on the same model config, DeepSpeed config, steps, batch and sequence
length, after one uncounted warm-up pair. It runs in a child process with a hard timeout; its
JSON goes to a temporary file, so the committed bench/results/*-smoke-overhead.json stays as its
owner wrote it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT, bench_env, run_cmd

_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, {bench!r})
import smoke_overhead
smoke_overhead.OUT = Path(sys.argv[1])
sys.argv = ["smoke_overhead.py", "--repeats", sys.argv[2]]
sys.exit(smoke_overhead.main())
"""


def measure(repeats: int, *, timeout: float | None = None) -> dict[str, Any]:
    """Run bench/suite/smoke_overhead.py with ``repeats`` and return its report plus the wall time."""
    timeout = timeout or 120 + 200 * (repeats + 1)
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        out = Path(tmp) / "smoke_overhead.json"
        code = _CHILD.format(bench=str(ROOT / "bench" / "suite"))
        done = run_cmd([PY, "-c", code, str(out), str(repeats)], timeout=timeout, env=bench_env())
        report = json.loads(out.read_text())
    report["command"] = f"python bench/suite/smoke_overhead.py --repeats {repeats}"
    report["wall_s"] = done.wall_s
    report["warmup_pairs"] = 1
    return report
