"""The graph as the LangGraph CLI / server loads it (``langgraph.json``: ``graphs.serve:graph``).

Offline model and settings from the environment (``TRAINWRIGHT_*``); no checkpointer, because
the LangGraph server supplies its own persistence.
"""

from tools.core.settings import Settings, disable_telemetry

disable_telemetry()

from graphs.graph import build_graph  # noqa: E402

graph = build_graph(settings=Settings.load())
