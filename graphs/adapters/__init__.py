"""Adapters that embed the planning graph in other agent frameworks.

Each wraps the same call, :func:`graphs.adapters.core.plan_training`, which runs the compiled
graph once and returns a compact JSON summary of the plan:

- ``graphs.adapters.langchain_tool.make_plan_training_tool`` — a LangChain ``StructuredTool``;
- ``graphs.adapters.crewai_tool.PlanTrainingTool`` and ``make_crewai_agent`` — a CrewAI tool
  and a ready CrewAI ``Agent`` that uses it;
- ``graphs.adapters.autogen_agent.TrainingPlannerAgent`` — an AutoGen AgentChat agent that can
  sit in a ``RoundRobinGroupChat``.

The framework modules are separate so that importing one does not import the others (crewai
alone takes seconds to import).
"""

from graphs.adapters.core import PlanTrainingInput, plan_training, summarize_plan

__all__ = ["PlanTrainingInput", "plan_training", "summarize_plan"]
