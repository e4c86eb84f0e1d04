"""The import rule (README.md, tools/README.md), checked statically over every module we ship.

Imports point one way: app.py -> graphs -> agents -> tools -> knowledge, prompts; inside tools/,
a stage imports only tools.core and earlier stages. Every import counts: module level, inside
functions, and ``importlib.import_module("...")`` with a literal name. No import cycle either,
however deep the import sits.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TOP = ("app", "graphs", "agents", "tools", "knowledge", "prompts")
# Higher imports lower; knowledge and prompts are both at the bottom.
LAYER = {"app": 4, "graphs": 3, "agents": 2, "tools": 1, "knowledge": 0, "prompts": 0}
# tools/ stages in data-flow order (tools/README.md says why research precedes intake and why
# artifacts come last).
STAGES = ("core", "research", "intake", "planning", "smoke", "review", "artifacts")
# The standalone scripts (tools/smoke/scripts/) are copied whole to GPU boxes and into plans:
# nothing of ours, few libraries. Each file names what it may import besides the standard library
# and its siblings (plain ``import job_data``, the script's folder being first on sys.path):
# torch and transformers (numpy with them), deepspeed, pynvml (the NVIDIA driver's bindings, only where it is
# installed), peft for LoRA, datasets, bitsandbytes and wandb only when a run asks for a saved
# dataset, QLoRA or W&B; the TensorFlow worker runs in .venv-tf with TensorFlow (Keras with it)
# only. A new file there must be added here.
SCRIPTS_DIR = ROOT / "tools" / "smoke" / "scripts"
TORCH_JOB = {
    "torch",
    "transformers",
    "numpy",  # the token shards' memmaps (token_shards.py); transformers requires it anyway
    "deepspeed",
    "pynvml",
    "peft",
    "datasets",
    "bitsandbytes",
    "wandb",
}
# train.py's modules (job_model.py, ...).
JOB_PARTS = (
    "checkpoints",
    "data",
    "deepspeed",
    "eval",
    "lock",
    "loop",
    "model",
    "probes",
    "ranks",
    "torch",
)
STANDALONE: dict[str, set[str]] = {
    "train.py": TORCH_JOB,
    **{f"job_{part}.py": TORCH_JOB for part in JOB_PARTS},
    "parallel_train.py": {"torch"},
    "parallel_layout.py": {"torch"},
    "tf_train.py": {"tensorflow"},
    "tf_models.py": {"tensorflow"},
    # What all three share: the standard library only (tf_train.py runs where torch is not).
    "harness.py": set(),
    # The pretraining data path: the tokenizing step runs without torch; the shard format and
    # the ranks' slices are numpy.
    "prepare_data.py": {"numpy", "transformers"},
    "token_shards.py": {"numpy"},
    # The held-out share and how ranks deal it: imported by train.py before torch (--help).
    "holdout.py": {"torch"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _our_modules() -> dict[str, Path]:
    found = {"app": ROOT / "app.py"}
    for top in TOP[1:]:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[_module_name(path)] = path
    return found


MODULES = _our_modules()


def _resolve(name: str) -> str | None:
    """The module of ours that ``name`` (a module or ``package.attribute``) refers to."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, imported name) for every import in ``path``, at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # "from pkg import sub" may name a submodule; "from mod import name" names the module.
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0] if node.args else None
            if (
                name == "import_module"
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                found.append((node.lineno, first.value))
    return found


def _edges() -> dict[str, list[tuple[int, str, str]]]:
    """Module -> (line, imported name, the module of ours it resolves to)."""
    edges: dict[str, list[tuple[int, str, str]]] = {}
    for module, path in MODULES.items():
        edges[module] = []
        for line, name in _imports(module, path):
            target = _resolve(name)
            if target is not None and target != module:
                edges[module].append((line, name, target))
    return edges


EDGES = _edges()


def _rank(module: str) -> tuple[int, int]:
    parts = module.split(".")
    stage = 0
    if parts[0] == "tools" and len(parts) > 1:
        stage = STAGES.index(parts[1]) if parts[1] in STAGES else -1
    return LAYER[parts[0]], stage


def test_every_tools_module_sits_in_a_stage() -> None:
    stray = [m for m in MODULES if m.startswith("tools.") and m.split(".")[1] not in STAGES]
    assert stray == [], f"modules outside the stages {STAGES}: {stray}"


def test_imports_point_one_way() -> None:
    upward = []
    for module, targets in EDGES.items():
        for line, name, target in targets:
            if _rank(target) > _rank(module):
                upward.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {name}")
    assert upward == [], "upward imports:\n" + "\n".join(upward)


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for _, _, w in EDGES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in EDGES:
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles() -> None:
    assert _cycles() == []


def test_every_standalone_script_is_classified_and_the_folder_is_no_package() -> None:
    found = {p.name for p in SCRIPTS_DIR.glob("*.py")}
    assert found == set(STANDALONE), "classify each file of tools/smoke/scripts/ in STANDALONE"
    # A plain folder: a package __init__ would make ``tools.smoke.scripts`` importable as ours
    # and let the import warm-up (tools/core/imports.py) run the scripts.
    assert not (SCRIPTS_DIR / "__init__.py").exists()


def _script_imports(name: str) -> set[str]:
    module = f"tools.smoke.scripts.{name.removesuffix('.py')}"
    return {n.split(".")[0] for _, n in _imports(module, SCRIPTS_DIR / name)} - {"__future__"}


@pytest.mark.parametrize("name", sorted(STANDALONE))
def test_standalone_script_imports_nothing_of_ours(name: str) -> None:
    siblings = {other.removesuffix(".py") for other in STANDALONE}
    names = _script_imports(name)
    ours = {n for n in names if n in TOP}
    others = names - set(sys.stdlib_module_names) - STANDALONE[name] - siblings
    assert ours == set() and others == set(), (ours, others)
    # A sibling brings no library this script may not use (the TensorFlow worker, in
    # .venv-tf, must not reach torch through one).
    for sibling in sorted(names & siblings):
        extra = STANDALONE[f"{sibling}.py"] - STANDALONE[name]
        assert extra == set(), f"{name} imports {sibling}, which may import {sorted(extra)}"


def test_the_checker_sees_function_level_and_string_imports(tmp_path: Path) -> None:
    """The walk finds what a lazy import hides, so the rule cannot be dodged that way."""
    source = (
        "def f():\n    from graphs.graph import build_graph\n"
        "def g():\n    import importlib\n    importlib.import_module('agents.roles')\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    names = [name for _, name in _imports("tools.core.probe", path)]
    assert "graphs.graph.build_graph" in names and "agents.roles" in names
    assert _resolve("graphs.graph.build_graph") == "graphs.graph"
    assert _rank("graphs.graph") > _rank("tools.core.schemas")
    assert _rank("tools.artifacts.report") > _rank("tools.planning.search")
