"""The unit tier's rule, enforced: a test in tests/unit/ starts no process and runs under 2 s.

tests/unit/conftest.py takes the fixture and the hook from here. A test marked ``slow`` is
exempt (it says it is not a unit test; better, it moves to tests/smoke/). Starting a process
(subprocess, os.fork/posix_spawn/system, multiprocessing) fails the test at once, even where
the code under test catches exceptions; a test whose call phase takes longer than the limit
fails after it ran. The time is this process's CPU time (all its threads), not the wall
clock, so that other work on a shared machine does not fail a quick test; a unit test has
nothing to wait for. TRAINWRIGHT_UNIT_LIMIT_S sets another limit (0 turns the time check
off), and the failure names the limit it applied.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

LIMIT_S = 2.0
RULE = "unit-tier rule (tests/unit: no process, no network, each test under {limit:g} s)"
SPAWNERS = (
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (os, "popen"),
    (subprocess.Popen, "_execute_child"),
    (multiprocessing.process.BaseProcess, "start"),
)


def limit_s() -> float:
    """The time limit for one test's call phase (TRAINWRIGHT_UNIT_LIMIT_S overrides 2 s)."""
    return float(os.environ.get("TRAINWRIGHT_UNIT_LIMIT_S", LIMIT_S))


def _exempt(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


STARTED = pytest.StashKey[list[str]]()


@pytest.fixture(autouse=True)
def _no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting a process fails an unmarked unit test, naming the rule and what was called."""
    if _exempt(request.node):
        return
    started = request.node.stash.setdefault(STARTED, [])

    def refusing(owner: Any, name: str) -> Any:
        what = f"{getattr(owner, '__name__', owner)}.{name}"

        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            started.append(what)
            pytest.fail(
                f"{RULE.format(limit=limit_s())}: this test started a process ({what}); "
                "move it to tests/e2e or tests/smoke, or test the function in process",
                pytrace=False,
            )

        return refuse

    for owner, name in SPAWNERS:
        if hasattr(owner, name):
            monkeypatch.setattr(owner, name, refusing(owner, name))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A call phase over the limit fails an unmarked unit test, naming the rule and the time."""
    started = time.process_time()
    result = yield
    took = time.process_time() - started
    limit = limit_s()
    started_here = item.stash.get(STARTED, [])
    if started_here:  # the code under test caught the failure: fail anyway
        pytest.fail(
            f"{RULE.format(limit=limit)}: this test started a process ({', '.join(started_here)})",
            pytrace=False,
        )
    if limit > 0 and took > limit and not _exempt(item):
        pytest.fail(
            f"{RULE.format(limit=limit)}: this test took {took:.1f} s of CPU; make it "
            "cheaper, or move it to tests/graph, tests/e2e or tests/smoke",
            pytrace=False,
        )
    return result
