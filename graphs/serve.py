"""The graph as the LangGraph CLI / server loads it (``langgraph.json``: ``graphs.serve:graph``).

Offline model and settings from the environment (``TRAINWRIGHT_*``); no checkpointer, because
the LangGraph server supplies its own persistence. Served settings (``Settings.served``) keep
the server's files under its own home, never its working folder; clients choose ``out_dir``
only inside the host's root; a smoke run starts only when the input asks for it (``smoke:
true``); inputs are bounded in size (agents/intake.py). Each node stops when its run is
cancelled, and at most ``serve_max_active`` nodes work at once (graphs/cancel.py).
"""

from tools.core.settings import Settings, disable_telemetry

disable_telemetry()

from graphs.cancel import Slots, cancellable  # noqa: E402
from graphs.graph import build_graph  # noqa: E402

settings = Settings.load().served()
slots = Slots(settings.serve_max_active)
graph = build_graph(settings=settings, wrap=lambda name, node: cancellable(name, node, slots))
