"""The unit tier: pure functions, no process, no network, each test under 2 s (see unit_rule.py)."""

from unit_rule import _no_process, pytest_runtest_call  # noqa: F401 - the rule, for this folder
