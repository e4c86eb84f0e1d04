"""The planning graph as a CrewAI tool, and a ready CrewAI agent that uses it."""

from __future__ import annotations

import json
from typing import Any

from crewai import Agent
from crewai.tools import BaseTool
from pydantic import ConfigDict, Field

from graphs.adapters.core import PlanTrainingInput, plan_training
from graphs.adapters.langchain_tool import TOOL_DESCRIPTION, TOOL_NAME
from prompts import load_prompts


class PlanTrainingTool(BaseTool):
    """CrewAI tool ``plan_training``: one run of the planning graph, a JSON summary back.

    ``chat_model``, ``settings`` and ``out_dir`` are the host's plumbing: fields of the tool,
    not arguments the crew's model can set.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = TOOL_NAME
    description: str = TOOL_DESCRIPTION
    args_schema: type[PlanTrainingInput] = PlanTrainingInput
    chat_model: Any = Field(default=None, exclude=True)
    settings: Any = Field(default=None, exclude=True)
    out_dir: str | None = Field(default=None, exclude=True)

    def _run(
        self,
        request: str | None = None,
        brief: dict[str, Any] | None = None,
        smoke: bool | None = None,
        **_: Any,
    ) -> str:
        summary = plan_training(
            request,
            brief,
            smoke,
            chat_model=self.chat_model,
            settings=self.settings,
            out_dir=self.out_dir,
        )
        return json.dumps(summary)


def make_crewai_agent(
    llm: Any = None,
    *,
    chat_model: Any = None,
    settings: Any = None,
    out_dir: str | None = None,
    **agent_kwargs: Any,
) -> Agent:
    """A CrewAI ``Agent`` with the engineer's role, goal and backstory and the planning tool.

    ``llm`` is the crew's model (a CrewAI ``LLM``, a ``BaseLLM`` subclass or a model name;
    None means CrewAI's default); ``chat_model`` and ``settings`` drive the graph inside the
    tool. ``agent_kwargs`` (role, goal, backstory, verbose, ...) override the defaults.
    """
    engineer = load_prompts()[0]["engineer"]
    tool = PlanTrainingTool(chat_model=chat_model, settings=settings, out_dir=out_dir)
    defaults: dict[str, Any] = {
        "role": engineer["role"],
        "goal": " ".join(engineer["goal"].split()),
        "backstory": " ".join(engineer["backstory"].split())
        + " You plan every setup with the plan_training tool and report what it returns.",
        "allow_delegation": False,
        "verbose": False,
    }
    if llm is not None:
        defaults["llm"] = llm
    return Agent(**{**defaults, **agent_kwargs, "tools": [tool, *agent_kwargs.get("tools", [])]})
