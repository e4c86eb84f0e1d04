"""Cold time of a full sizing for a 70B model over the priced GPU catalog: ``app.py size``.

``python bench/suite/sizing_cold.py [--runs 5] [--json FILE]``; run.py's section
``sizing_cold``. Each run is a fresh process, as a user pays it:
``python app.py size --model llama-2-70b --task pretrain --tokens 2T [--deadline-days 30]
--json DIR/size.json``: every GPU type with a list price (knowledge/gpu_prices.yaml), counts 1
to 1,024 until each type is past its cost optimum (with a deadline, until a row meets it).
Figures per case: CPU time (user + sys, from ``os.wait4``) and wall time, median and min over
``runs``, and the rows (strategy searches) the sizing made. Target (issue 31): under 5 s cold.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import PY, BenchError, bench_env, median  # noqa: E402
from bench.suite.plan_cold import cpu_run  # noqa: E402

TARGET_S = 5.0
MODEL = "llama-2-70b"
CASES = {
    "pretrain 2T tokens": ["--task", "pretrain", "--tokens", "2T"],
    "pretrain 2T tokens within 30 days": ["--task", "pretrain", "--tokens", "2T",
                                          "--deadline-days", "30"],
}  # fmt: skip


def _case(args: list[str], runs: int, home: Path) -> dict[str, Any]:
    env = bench_env(TRAINWRIGHT_HOME=str(home))
    out = home / "size.json"
    argv = [PY, "app.py", "size", "--model", MODEL, *args, "--json", str(out)]
    done = []
    for _ in range(runs):
        run = cpu_run(argv, env=env, timeout=300)
        if run.returncode != 0:
            raise BenchError(f"size exited {run.returncode}: {run.output[-500:]}")
        done.append(run)
    sizing = json.loads(out.read_text(encoding="utf-8"))
    cpu = [r.cpu_s for r in done]
    wall = [r.wall_s for r in done]
    return {
        "command": " ".join(["python app.py size --model", MODEL, *args]),
        "runs": runs,
        "cpu_median_s": median(cpu),
        "cpu_min_s": min(cpu),
        "wall_median_s": median(wall),
        "wall_min_s": min(wall),
        "rows": len(sizing["rows"]),
        "gpu_types": len({r["gpu"] for r in sizing["rows"]}),
        "pick": None
        if sizing["pick"] is None
        else f"{sizing['pick']['count']} x {sizing['pick']['gpu']} ({sizing['pick']['setup']})",
        "target_s": TARGET_S,
    }


def measure(quick: bool, runs: int | None = None) -> dict[str, Any]:
    """Every case, ``runs`` cold processes each (quick: 3, else 5)."""
    runs = runs or (3 if quick else 5)
    with tempfile.TemporaryDirectory(prefix="bench-sizing-cold-") as tmp:
        return {name: _case(args, runs, Path(tmp)) for name, args in CASES.items()}


def render(result: dict[str, Any]) -> list[str]:
    """The figures as Markdown lines."""
    lines = [
        "| case | CPU median (min) | wall median (min) | rows searched | GPU types | pick |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in result.items():
        lines.append(
            f"| {name} | {c['cpu_median_s']:.2f} s ({c['cpu_min_s']:.2f}) | "
            f"{c['wall_median_s']:.2f} s ({c['wall_min_s']:.2f}) | {c['rows']} | "
            f"{c['gpu_types']} | {c['pick'] or 'none'} |"
        )
    lines.append(f"\nTarget: under {TARGET_S:g} s cold; {MODEL}, `app.py size` in fresh processes.")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, optionally write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="cold processes per case")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs is at least 1")
    result = measure(False, args.runs)
    print("\n".join(render(result)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
