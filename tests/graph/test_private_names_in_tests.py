"""Tests reach private names of the product only where TEST_PRIVATES lists them.

The check of tests/unit/core/test_seams.py, over every test file: it parses all of them, which
outgrew the unit tier's 2 s CPU per test as the suite grew, so it runs here with that module's
helpers and list.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "unit" / "core" / "test_seams.py"
_SPEC = importlib.util.spec_from_file_location("seams_checks", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
seams = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(seams)


def test_tests_use_private_names_only_where_listed() -> None:
    used = {
        (path.name, name)
        for path in seams._files(("tests",))
        for _line, name in seams._private_uses(path)
    }
    listed = set(seams.TEST_PRIVATES)
    assert used - listed == set(), "a test reaches a private name: make it public"
    assert listed - used == set(), "listed but no longer used: drop it from the list"
