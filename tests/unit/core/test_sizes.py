"""Sizes that keep the code readable (issue 27), checked like the import rule.

- At most ``MAX_BIG_MODULES`` modules of ours over ``MODULE_LINES`` lines. A data table may say
  so with ``# size: data table`` in its first 20 lines; it is then not counted.
- At most ``MAX_BIG_FUNCTIONS`` functions over ``FUNCTION_LINES`` lines (decorators, docstring
  and body counted).

The counts print the offenders, biggest first, so a split starts where it pays most.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("app.py", "graphs", "agents", "tools", "knowledge", "prompts")
MODULE_LINES, MAX_BIG_MODULES = 450, 8
FUNCTION_LINES, MAX_BIG_FUNCTIONS = 100, 3
DATA_TABLE = "# size: data table"


def _modules() -> list[Path]:
    files: list[Path] = []
    for top in PRODUCT:
        path = ROOT / top
        files.extend([path] if path.is_file() else sorted(path.rglob("*.py")))
    return [f for f in files if "__pycache__" not in f.parts]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _span(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return (node.end_lineno or node.lineno) - first + 1


def test_few_modules_are_long() -> None:
    big = []
    for path in _modules():
        lines = _lines(path)
        if len(lines) > MODULE_LINES and not any(DATA_TABLE in line for line in lines[:20]):
            big.append((len(lines), str(path.relative_to(ROOT))))
    big.sort(reverse=True)
    assert len(big) <= MAX_BIG_MODULES, f"{len(big)} modules over {MODULE_LINES} lines: {big}"


def test_few_functions_are_long() -> None:
    big = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _span(node) > FUNCTION_LINES:
                    big.append((_span(node), f"{path.relative_to(ROOT)}:{node.name}"))
    big.sort(reverse=True)
    assert len(big) <= MAX_BIG_FUNCTIONS, f"{len(big)} functions over {FUNCTION_LINES}: {big}"
