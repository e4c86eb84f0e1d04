"""Latency: CLI cold start, an offline plan, a batch of briefs, and what each heavy import costs.

Every figure is the wall time of a whole command in a fresh process (interpreter start-up
included), as a user pays it, unless it says otherwise. Pairs that are compared run
interleaved (a, b, a, b, ...) so that a busy spell on the machine hits both.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT, bench_env, median, run_cmd

# The heavy dependencies, each as the module our code imports from it (a bare top-level
# package such as langgraph or autogen_agentchat imports next to nothing).
HEAVY_MODULES = [
    "torch",
    "deepspeed",
    "transformers",
    "langgraph.graph",
    "langchain_core.language_models.chat_models",
    "crewai",
    "chromadb",
    "autogen_agentchat.agents",
    "sentence_transformers",
]
HEAVY_ROOTS = sorted({m.split(".")[0] for m in HEAVY_MODULES})
PLAN_BRIEF = "examples/briefs/llama3-8b-finetune-8xa100.yaml"
_BATCH_MODELS = [
    "gpt2", "gpt2-medium", "qwen2.5-0.5b", "phi-3-mini", "llama-2-7b",
    "mistral-7b", "llama-3-8b", "qwen2.5-7b", "llama-2-13b", "llama-3-70b",
]  # fmt: skip
_BATCH_HARDWARE = ["1x8xA100-80GB", "1x1xRTX4090", "2x8xH100-80GB", "1x4xA100-40GB"]
_BATCH_TASKS = ["finetune", "lora", "pretrain"]
_IMPORTTIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def cold_start(repeats: int) -> dict[str, Any]:
    """``python app.py --help`` vs ``python -c pass``, interleaved; medians and their ratio."""
    bare: list[float] = []
    app: list[float] = []
    env = bench_env()
    run_cmd([PY, "app.py", "--help"], timeout=60, env=env)  # page cache warm-up, not counted
    for _ in range(repeats):
        bare.append(run_cmd([PY, "-c", "pass"], timeout=60, env=env).wall_s)
        app.append(run_cmd([PY, "app.py", "--help"], timeout=60, env=env).wall_s)
    return {
        "what": "wall time, `python app.py --help` vs `python -c pass`, interleaved",
        "repeats": repeats,
        "python_pass_s": bare,
        "app_help_s": app,
        "python_pass_median_s": median(bare),
        "app_help_median_s": median(app),
        "ratio": median(app) / median(bare),
    }


def parse_importtime(text: str) -> list[dict[str, Any]]:
    """The top-level imports of ``python -X importtime`` output: name, self and cumulative µs."""
    rows = []
    for line in text.splitlines():
        match = _IMPORTTIME.match(line)
        if match and len(match.group(3)) == 1:  # one space: imported by the script itself
            rows.append(
                {"module": match.group(4), "self_us": int(match.group(1)),
                 "cumulative_us": int(match.group(2))}
            )  # fmt: skip
    return rows


def app_imports() -> dict[str, Any]:
    """What ``python -X importtime app.py --help`` imports: top level, and any heavy module."""
    done = run_cmd([PY, "-X", "importtime", "app.py", "--help"], timeout=60, env=bench_env())
    every = [m.group(4) for m in map(_IMPORTTIME.match, done.output.splitlines()) if m]
    top = parse_importtime(done.output)
    roots = {name.split(".")[0] for name in every}
    ours = sorted(r for r in roots if r in ("tools", "agents", "graphs", "knowledge", "prompts"))
    return {
        "what": "`python -X importtime app.py --help`: modules imported on the way to --help",
        "modules_imported": len(every),
        "top_level": sorted(top, key=lambda r: -r["cumulative_us"])[:12],
        "top_level_total_ms": sum(r["cumulative_us"] for r in top) / 1000,
        "heavy_imported": sorted(r for r in roots if r in HEAVY_ROOTS),
        "ours_imported": ours,
        "non_stdlib_roots": sorted(roots - _stdlib_roots()),
    }


def _stdlib_roots() -> set[str]:
    import sys

    return set(sys.stdlib_module_names) | set(sys.builtin_module_names) | {"_virtualenv"}


def heavy_imports(repeats: int, modules: list[str] | None = None) -> dict[str, Any]:
    """Seconds to import each heavy dependency in a fresh interpreter (import statement only)."""
    code = (
        "import sys, time; t = time.perf_counter(); import importlib; "
        "importlib.import_module(sys.argv[1]); print('IMPORT_S', time.perf_counter() - t)"
    )
    rows = []
    env = bench_env()
    for module in modules or HEAVY_MODULES:
        times: list[float] = []
        walls: list[float] = []
        error = None
        for _ in range(repeats):
            done = run_cmd([PY, "-c", code, module], timeout=180, env=env, check=False)
            found = re.findall(r"^IMPORT_S (\S+)$", done.output, flags=re.M)
            if done.returncode != 0 or not found:
                error = done.output.strip().splitlines()[-1:] or ["no output"]
                break
            times.append(float(found[-1]))
            walls.append(done.wall_s)
        rows.append(
            {
                "module": module,
                "import_s": times,
                "import_median_s": median(times) if times else None,
                "wall_median_s": median(walls) if walls else None,
                "error": error[0][:200] if error else None,
            }
        )
    return {
        "what": "import time of each heavy dependency, each in a fresh process",
        "repeats": repeats,
        "modules": rows,
    }


def plan_no_smoke(repeats: int, knowledge: Path) -> dict[str, Any]:
    """``python app.py plan --brief ... --no-smoke`` end to end (offline agents, no smoke run).

    The first run in a fresh knowledge folder builds the chromadb index of the knowledge cards
    (once per install); it is reported apart, and the repeats run with the index built.
    """
    walls = []
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        env = bench_env(
            TRAINWRIGHT_HOME=str(Path(tmp) / "home"), TRAINWRIGHT_KNOWLEDGE_DIR=str(knowledge)
        )
        first = None
        argv: list[str] = []
        for i in range(repeats + 1):
            out = Path(tmp) / f"out{i}"
            argv = [PY, "app.py", "plan", "--brief", PLAN_BRIEF, "--no-smoke", "--out", str(out),
                    "--json", str(out / "plan.json")]  # fmt: skip
            wall = run_cmd(argv, timeout=300, env=env).wall_s
            if i == 0:
                first = wall
            else:
                walls.append(wall)
            plan = json.loads((out / "plan.json").read_text())
    return {
        "what": f"wall time of `python app.py plan --brief {PLAN_BRIEF} --no-smoke --out DIR --json FILE`",
        "repeats": repeats,
        "first_run_with_index_build_s": first,
        "wall_s": walls,
        "median_s": median(walls),
        "chosen": plan["memory"]["chosen"],
        "verdict": plan["review"]["verdict"],
    }


def write_briefs(folder: Path, count: int) -> list[Path]:
    """``count`` distinct valid briefs (catalog models x described hardware x task)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        model = _BATCH_MODELS[i % len(_BATCH_MODELS)]
        hardware = _BATCH_HARDWARE[(i // len(_BATCH_MODELS)) % len(_BATCH_HARDWARE)]
        task = _BATCH_TASKS[i % len(_BATCH_TASKS)]
        seq = 512 * (1 + i % 2)
        brief = {
            "goal": f"bench brief {i}: {task} {model} on {hardware}",
            "model": model,
            "task": task,
            "seq_len": seq,
            "global_batch_size": 64,
            "hardware": hardware,
            "precision": "bf16",
            "smoke": False,
        }
        path = folder / f"brief-{i:03d}.json"
        path.write_text(json.dumps(brief, indent=1))
        paths.append(path)
    return paths


def batch_report(count: int, knowledge: Path, jobs: int = 2) -> dict[str, Any]:
    """``python app.py report DIR --out OUT --no-smoke`` over ``count`` briefs; per-brief time."""
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        briefs = Path(tmp) / "briefs"
        write_briefs(briefs, count)
        out = Path(tmp) / "reports"
        env = bench_env(
            TRAINWRIGHT_HOME=str(Path(tmp) / "home"), TRAINWRIGHT_KNOWLEDGE_DIR=str(knowledge)
        )
        argv = [PY, "app.py", "report", str(briefs), "--out", str(out), "--no-smoke",
                "--jobs", str(jobs)]  # fmt: skip
        done = run_cmd(argv, timeout=60 + 30 * count, env=env, check=False)
        plans = list(out.glob("*/plan.json")) + list(out.glob("*/*.json"))
        reports = len({p.parent for p in plans})
    return {
        "what": (
            f"wall time of `python app.py report BRIEFS --out OUT --no-smoke --jobs {jobs}` over "
            f"{count} generated briefs (catalog models x described GPU clusters x task), divided "
            "by the number of briefs; includes one interpreter start-up; knowledge index built"
        ),
        "briefs": count,
        "jobs": jobs,
        "exit_code": done.returncode,
        "report_folders": reports,
        "wall_s": done.wall_s,
        "per_brief_s": done.wall_s / count,
        "output_tail": done.output.strip().splitlines()[-3:],
    }


def measure(quick: bool) -> dict[str, Any]:
    """Every latency figure; quick mode runs fewer repeats and a 20-brief batch."""
    with tempfile.TemporaryDirectory(prefix="bench-knowledge-") as knowledge:
        return {
            "cold_start": cold_start(5 if quick else 15),
            "app_imports": app_imports(),
            "plan_no_smoke": plan_no_smoke(1 if quick else 3, Path(knowledge)),
            "batch": batch_report(20 if quick else 100, Path(knowledge)),
            "heavy_imports": heavy_imports(1 if quick else 3),
        }


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(ROOT))
    print(json.dumps(measure(quick="--full" not in sys.argv), indent=1))
