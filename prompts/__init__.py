"""CrewAI-style role and task definitions, loaded as data: agents.yaml and tasks.yaml."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml


@lru_cache(maxsize=1)
def load_prompts() -> tuple[dict[str, Any], dict[str, Any]]:
    """The roles (role, goal, backstory, tools) and tasks (description, expected_output, agent)."""
    base = resources.files("prompts")
    agents = yaml.safe_load(base.joinpath("agents.yaml").read_text(encoding="utf-8"))
    tasks = yaml.safe_load(base.joinpath("tasks.yaml").read_text(encoding="utf-8"))
    return agents, tasks


def task_of(role: str) -> str:
    """The task a role performs (the task whose ``agent`` is ``role`` in tasks.yaml)."""
    _, tasks = load_prompts()
    names = [name for name, task in tasks.items() if task.get("agent") == role]
    if len(names) != 1:
        raise KeyError(f"tasks.yaml: expected one task for {role!r}, found {names}")
    return names[0]
