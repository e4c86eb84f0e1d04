"""The locked dependency set imports together in one process (the protobuf trap, DEVELOPERS.md)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_dependency_imports_in_one_process(tmp_path: Path) -> None:
    code = (
        "import langgraph, langchain, langchain_core, langgraph.checkpoint.sqlite, crewai, "
        "autogen_agentchat, autogen_core, chromadb, pydantic, torch, deepspeed, transformers, pytest, "
        "langgraph_cli.cli, langgraph_api.cli, langgraph_runtime_inmem; "
        "from autogen_agentchat.agents import AssistantAgent; from crewai import Agent; print('ok')"
    )
    # In tmp_path: importing langgraph_runtime_inmem creates .langgraph_api/ in the cwd.
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().endswith("ok")


def test_autogen_is_the_agentchat_07_line() -> None:
    assert md.version("autogen-agentchat").startswith("0.7.")
    assert md.version("autogen-core").startswith("0.7.")


def test_pip_check_is_clean() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout


def test_cli_help_does_not_import_heavy_libraries() -> None:
    code = (
        "import sys, app; app.build_parser(); "
        "print(sorted(m for m in ('torch', 'deepspeed', 'chromadb', 'crewai', 'transformers') if m in sys.modules))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert res.stdout.strip() == "[]", res.stdout + res.stderr
    assert importlib.util.find_spec("app") is not None


def test_cli_help_imports_only_what_the_parser_needs() -> None:
    """``app.py --help`` stays near Python's own start (bench/suite/plan_cold.py measures it).

    typing, dataclasses (and inspect under it), json and tools.core.settings load after the
    arguments are parsed, so ``--help`` and a usage error never pay for them.
    """
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "app.py", "--help"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert res.returncode == 0 and "plan" in res.stdout
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if "|" in line}
    assert "argparse" in imported and "tools.core.errors" in imported  # the output is read right
    late = {"typing", "dataclasses", "inspect", "json", "tools.core.settings", "tools.core.schemas"}
    assert imported & late == set()


HEAVY = ("torch", "transformers", "deepspeed", "chromadb", "crewai")


def test_the_planner_path_imports_no_heavy_library() -> None:
    """Importing the planning tools and planning a catalog model stays free of torch & co.

    The catalog's parameter counts are shipped (knowledge/models/counts.json), so a one-shot
    plan need not import torch/transformers; only DeepSpeed's own validation imports DeepSpeed.
    """
    code = (
        "import sys\n"
        "import tools.research.model_catalog, tools.planning.memory, tools.planning.search, tools.planning.speed, tools.artifacts.deepspeed_config\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "from tools.artifacts.deepspeed_config import emit_deepspeed_config\n"
        "from tools.research.hardware import parse_hardware\n"
        "from tools.research.model_catalog import lookup_model\n"
        "from tools.core.schemas import TrainingBrief\n"
        "from tools.planning.search import search_strategy\n"
        "hw = parse_hardware('8x8xH100-80GB')\n"
        "brief = TrainingBrief(model='llama-3-70b', seq_len=4096, global_batch_size=1024,\n"
        "                      hardware='8x8xH100-80GB', task='pretrain')\n"
        "model = lookup_model('llama-3-70b', 4096)\n"
        "plan = search_strategy(model, hw, brief)\n"
        "config = emit_deepspeed_config(plan, model, hw, brief)\n"
        "assert model.params == 70_553_706_496 and config['train_batch_size'] == 1024\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["[]", "[]"], res.stdout + res.stderr


def test_validating_a_scheduler_imports_no_torch_dynamo() -> None:
    """torch._dynamo costs about 2 s of CPU to import; a planning process never needs it.

    (A process of its own: the test process may have imported torch._dynamo already.)
    """
    code = (
        "import sys; from tools.artifacts.ds_validate import validate_deepspeed_config\n"
        "validate_deepspeed_config({'train_batch_size': 8, 'train_micro_batch_size_per_gpu': 1,"
        " 'gradient_accumulation_steps': 1, 'scheduler': {'type': 'WarmupDecayLR', 'params':"
        " {'total_num_steps': 100, 'warmup_num_steps': 10}}}, 8)\n"
        "print('deepspeed' in sys.modules, 'torch._dynamo' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["True", "False"]
