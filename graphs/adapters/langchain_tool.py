"""The planning graph as a LangChain tool, for any LangChain/LangGraph agent."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.tools import StructuredTool

from graphs.adapters.core import PlanTrainingInput, plan_training
from tools.core.settings import Settings

TOOL_NAME = "plan_training"
TOOL_DESCRIPTION = (
    "Plan a distributed training setup: framework, parallelism strategy (DDP, ZeRO-1/2/3, "
    "offload), micro-batch, per-GPU memory, a DeepSpeed config, launch files, an optional real "
    "smoke-test run, and a review verdict. Returns a JSON summary with the report's path."
)


def make_plan_training_tool(
    chat_model: BaseChatModel | None = None,
    settings: Settings | None = None,
    out_dir: str | None = None,
) -> StructuredTool:
    """A ``plan_training`` tool bound to a chat model and settings the calling model never sees.

    ``chat_model`` drives the graph's own agents (default: ``settings.llm``, offline unless
    configured); ``out_dir`` is where reports go (default: a folder per model under
    ``settings.out_dir``).
    """

    def _plan(
        request: str | None = None,
        brief: dict[str, Any] | None = None,
        smoke: bool | None = None,
    ) -> str:
        summary = plan_training(
            request, brief, smoke, chat_model=chat_model, settings=settings, out_dir=out_dir
        )
        return json.dumps(summary)

    return StructuredTool.from_function(
        func=_plan,
        name=TOOL_NAME,
        description=TOOL_DESCRIPTION,
        args_schema=PlanTrainingInput,
    )
