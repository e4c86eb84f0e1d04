"""Public seams, checked statically like the import rule (tests/test_layers.py).

- No module of ours uses another module's ``_private`` name (an import, ``module._name``, or
  ``getattr``/``setattr`` with the name): a sibling that needs one asks for a public function.
  Tests may reach a private name only where a test must stand inside the module (fault
  injection, a probe the module keeps to itself); those are listed below with why.
- A setup is spelled by ``Setup.label()`` only (tools/core/setup.py).
- One tuple of smoke fault kinds (tools/core/settings.py ``SMOKE_FAULTS``); the standalone
  scripts, which import nothing of ours, keep a copy that must equal it.
- One GB formatter (tools/core/units.py ``gb_text``).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from tools.core.settings import SMOKE_FAULTS

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("graphs", "agents", "tools", "knowledge", "prompts")
OURS = ("app", *PRODUCT, "tests")
# Scripts that import nothing of ours (they are copied alone): their own vocabulary. They live
# in tools/smoke/ or, split by job, in tools/smoke/scripts/.
STANDALONE = ("train.py", "parallel_train.py", "tf_train.py")


def _standalone(path: Path) -> bool:
    rel = path.relative_to(ROOT).parts
    return rel[:2] == ("tools", "smoke") and (path.name in STANDALONE or "scripts" in rel)


# (test file, module.name): why the test stands inside the module.
TEST_PRIVATES = {
    ("test_memory_cap.py", "tools.smoke.supervise._RLIMIT_SHIM"): "runs the launch shim alone",
    ("test_memory_cap.py", "tools.smoke.memory_cap._usable_memory"): "the machine's RAM, faked",
    ("test_memory_cap.py", "tools.smoke.memory_cap._available_memory"): "free RAM, faked",
    ("test_models.py", "tools.research.model_catalog._count"): "counts a model is built for",
    ("test_models.py", "tools.research.model_catalog._catalog_config"): "the catalog's config",
    ("test_models.py", "tools.research.model_catalog._shipped_counts"): "the shipped counts",
    ("test_models.py", "tools.research.model_catalog._transformers_version"): "version, faked",
    ("test_models.py", "tools.research.model_catalog._models_dir"): "the configs folder, faked",
    ("test_input_bounds.py", "tools.research.model_catalog._catalog_config"): "a huge config",
    ("test_strategy.py", "tools.research.hardware._torch_cuda"): "a CPU-only machine, faked",
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files(tops: tuple[str, ...]) -> list[Path]:
    found = [ROOT / "app.py"] if "app" in tops else []
    for top in tops:
        if top != "app":
            found += sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)
    return found


MODULES = {_module_name(p) for p in _files(OURS)}


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@pytest.fixture(scope="module", autouse=True)
def _parsed() -> None:
    """Parse every product file once, in set-up: the tests time their checks, not the parser
    (parsing them all takes most of a second of CPU, and a loaded machine doubles that)."""
    for path in _files(("app", *PRODUCT)):
        _tree(path)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _aliases(tree: ast.AST, package: str) -> dict[str, str]:
    """Local names bound to modules of ours (``import a.b as c``, ``from a import b``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS:
                    names[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, package)
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def _base(node: ast.ImportFrom, package: str) -> str:
    base = node.module or ""
    if node.level:
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def _dotted(node: ast.expr, names: dict[str, str]) -> str | None:
    """The module of ours an expression like ``a.b`` names, if any."""
    chain: list[str] = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in names:
        full = ".".join([names[node.id], *reversed(chain)])
        return full if full in MODULES else None
    return None


def _named_by_call(node: ast.Call, names: dict[str, str], module: str) -> list[str]:
    """Private names a call reaches by string: ``getattr(m, "_x")``, ``monkeypatch.setattr``
    with a module and a name or with one dotted string (``"tools.a._x"``)."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in ("getattr", "setattr", "delattr", "hasattr") or not node.args:
        return []
    first, rest = node.args[0], node.args[1:]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        target, _, name = first.value.rpartition(".")  # monkeypatch.setattr("a.b._x", value)
    elif rest and isinstance(rest[0], ast.Constant) and isinstance(rest[0].value, str):
        target, name = _dotted(first, names) or "", rest[0].value
    else:
        return []
    if target in MODULES and target != module and _private(name):
        return [f"{target}.{name}"]
    return []


def _private_uses(path: Path) -> list[tuple[int, str]]:
    """(line, module.name) for every private name of another module of ours that ``path`` uses."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = _tree(path)
    names = _aliases(tree, package)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _base(node, package)
            if base.split(".")[0] in OURS and base != module:
                found += [(node.lineno, f"{base}.{a.name}") for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            target = _dotted(node.value, names)
            if target is not None and target != module:
                found.append((node.lineno, f"{target}.{node.attr}"))
        elif isinstance(node, ast.Call):
            found += [(node.lineno, name) for name in _named_by_call(node, names, module)]
    return found


def test_no_module_uses_a_siblings_private_name() -> None:
    used = [
        f"{path.relative_to(ROOT)}:{line} uses {name}"
        for path in _files(("app", *PRODUCT))
        for line, name in _private_uses(path)
    ]
    assert used == [], "private names across modules:\n" + "\n".join(used)


# A degree written after its axis name (``+tp8``, ``tp2xpp2``, ``:cp4``): a setup being spelled.
_AXIS_BEFORE_DEGREE = re.compile(r"(?:^|[^A-Za-z])(?:tp|pp|vpp|cp|ep|dp)$")
# Not setups, or not Setup.label's to spell: the inference plan's serving degrees (``tp2+pp2``,
# the why_not keys of its own contract), and the smoke result's ``mode`` string, which keeps
# the spelling earlier plans carry (``native-3d:tp2xpp2xdp1``; readers use ``run_mode``).
SPELLING_ALLOWED = {
    "tools/core/setup.py": "Setup.label itself",
    "tools/planning/inference.py": "serving degrees, the inference contract's keys",
    "tools/core/smoke_types.py": "RunMode.text: the contract's legacy mode string",
}


def _spellings(tree: ast.Module) -> list[int]:
    """Lines of f-strings that write an axis name followed by a degree."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr):
            continue
        for piece, after in zip(node.values, node.values[1:], strict=False):
            text = str(piece.value) if isinstance(piece, ast.Constant) else ""
            if isinstance(after, ast.FormattedValue) and _AXIS_BEFORE_DEGREE.search(text):
                lines.append(node.lineno)
    return lines


def test_a_setup_is_spelled_by_setup_label_only() -> None:
    """No other module writes ``tp``/``pp``/``vpp``/``cp``/``ep``/``dp`` followed by a degree."""
    spelled = []
    for path in _files(("app", *PRODUCT)):
        rel = str(path.relative_to(ROOT))
        if rel in SPELLING_ALLOWED or _standalone(path):
            continue
        spelled += [f"{rel}:{line}" for line in _spellings(_tree(path))]
    assert spelled == [], "setups spelled outside Setup.label():\n" + "\n".join(spelled)


def test_the_spelling_check_sees_the_ways_a_setup_was_spelled() -> None:
    """The check fires on the spellings that drifted before (a label without ``+cp``, a tuple)."""
    for source in (
        'f"{name}+tp{tp}"',
        'f"{s}+tp{t}+pp{p}" + (f"+cp{c}" if c > 1 else "")',
        'f"native-3d:tp{tp}xpp{pp}xdp{dp}"',
        'f"tp{t}"',
    ):
        assert _spellings(ast.parse(source)), source
    for prose in ('f"step {n}"', 'f"tensor parallel {tp} x pipeline {pp}"', 'f"setup {x}"'):
        assert not _spellings(ast.parse(prose)), prose


def _tuple_of_strings(node: ast.AST) -> set[str] | None:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
        if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            return {str(e.value) for e in node.elts}  # type: ignore[attr-defined]
    return None


def test_one_tuple_of_fault_kinds() -> None:
    faults = set(SMOKE_FAULTS)
    copies, scripts = [], []
    for path in _files(("app", *PRODUCT)):
        for node in ast.walk(_tree(path)):
            kinds = _tuple_of_strings(node)
            if kinds is None or not {"oom", "nan", "hang", "crash"} <= kinds:
                continue
            rel = str(path.relative_to(ROOT))
            if _standalone(path):
                scripts.append(path.name)
                assert kinds == faults, f"{rel} injects {sorted(kinds)}, not {sorted(faults)}"
            elif rel != "tools/core/settings.py":
                copies.append(f"{rel}:{getattr(node, 'lineno', '?')}")
    assert copies == [], "fault kinds copied outside tools/core/settings.py: " + ", ".join(copies)
    assert scripts, "the standalone scripts' fault kinds were not found"


def _formats_gb_itself(node: ast.FunctionDef) -> bool:
    """A function named for GB that writes the figure itself rather than through gb_text."""
    if "gb" not in node.name.lower() or node.name == "gb_text":
        return False
    calls = {getattr(n.func, "id", None) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return "gb_text" not in calls


def test_one_gb_formatter() -> None:
    helpers = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
        for path in _files(("app", *PRODUCT))
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.FunctionDef) and _formats_gb_itself(node)
    ]
    assert helpers == [], "GB formatters besides tools/core/units.py gb_text: " + ", ".join(helpers)
