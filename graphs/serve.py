"""The graph as the LangGraph CLI / server loads it (``langgraph.json``: ``graphs.serve:graph``).

Offline model and settings from the environment (``TRAINWRIGHT_*``); no checkpointer, because
the LangGraph server supplies its own persistence. Clients choose ``out_dir`` only inside the
host's root (``Settings.served``).
"""

from tools.core.settings import Settings, disable_telemetry

disable_telemetry()

from graphs.graph import build_graph  # noqa: E402

# A client's out_dir is a folder name inside TRAINWRIGHT_SERVE_ROOT (default TRAINWRIGHT_OUT);
# anything that resolves outside it is refused (agents/intake.py, tools/core/outputs.py).
graph = build_graph(settings=Settings.load().served())
