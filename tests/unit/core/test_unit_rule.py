"""The unit tier's guard fails a test that starts a process or runs over the limit, and names the rule.

Each case runs a one-test pytest session in process (pytester) whose conftest takes the guard
as tests/unit/conftest.py does; the time limit is lowered there so that no case sleeps 2 s.
(A marked test is shown exempt from the time limit only: the process check of this very test,
which is in the unit tier, refuses any process the inner session would start.)
"""

from __future__ import annotations

import pytest

CONFTEST = "from unit_rule import _no_process, pytest_runtest_call  # noqa: F401\n"
RULE = "unit-tier rule"


def _run(pytester: pytest.Pytester, body: str, limit: str = "0.5") -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_case="import os, subprocess, time, multiprocessing\n" + body)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINWRIGHT_UNIT_LIMIT_S", limit)
        mp.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the session's plugins cost seconds
        return pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")


@pytest.mark.parametrize(
    "start",
    [
        "subprocess.run(['true'])",
        "os.system('true')",
        "multiprocessing.Process(target=print).start()",
        "os.fork()",
    ],
)
def test_a_unit_test_that_starts_a_process_fails_naming_the_rule(
    pytester: pytest.Pytester, start: str
) -> None:
    result = _run(pytester, f"def test_it():\n    {start}\n")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{RULE}*started a process*"])


def test_a_caught_start_still_fails(pytester: pytest.Pytester) -> None:
    body = "def test_it():\n    try:\n        subprocess.run(['true'])\n    except BaseException:\n        pass\n"
    result = _run(pytester, body)
    assert result.ret != 0
    result.stdout.fnmatch_lines([f"*{RULE}*started a process*"])


def test_a_unit_test_over_the_limit_fails_naming_the_rule_and_the_time(
    pytester: pytest.Pytester,
) -> None:
    result = _run(
        pytester,
        "def test_it():\n    t = time.process_time()\n    while time.process_time() - t < 0.2:\n        pass\n",
        limit="0.05",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{RULE}*under 0.05 s*took 0.2 s of CPU*"])


def test_a_quick_pure_test_and_a_slow_marked_one_pass(pytester: pytest.Pytester) -> None:
    body = (
        "import pytest\n"
        "def test_pure():\n    assert sum(range(10)) == 45\n"
        "@pytest.mark.slow\n"
        "def test_marked():\n    t = time.process_time()\n    while time.process_time() - t < 0.1:\n        pass\n"
    )
    pytester.makeini("[pytest]\nmarkers =\n    slow: real runs\n")
    result = _run(pytester, body, limit="0.05")
    result.assert_outcomes(passed=2)
