"""Every tool the model sees describes itself and each of its arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.toolkit import engineer_tools, researcher_tools, reviewer_tools
from agents.workspace import Workspace
from tools.core.schemas import TrainingBrief
from tools.core.settings import Settings


@pytest.mark.parametrize("factory", [researcher_tools, engineer_tools, reviewer_tools])
def test_every_tool_and_argument_is_described(factory, tmp_path: Path) -> None:
    ws = Workspace(
        settings=Settings(home=tmp_path), out_dir=tmp_path, brief=TrainingBrief(model="gpt2")
    )
    for tool in factory(ws):
        assert tool.description and len(tool.description) > 20, tool.name
        schema = tool.args_schema.model_json_schema()
        for name, prop in schema.get("properties", {}).items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"


def test_plumbing_never_appears_in_tool_arguments(tmp_path: Path) -> None:
    ws = Workspace(
        settings=Settings(home=tmp_path), out_dir=tmp_path, brief=TrainingBrief(model="gpt2")
    )
    forbidden = {"settings", "out_dir", "path", "run_dir", "workspace", "brief"}
    for tool in researcher_tools(ws) + engineer_tools(ws) + reviewer_tools(ws):
        props = set(tool.args_schema.model_json_schema().get("properties", {}))
        assert not props & forbidden, (tool.name, props & forbidden)
