"""State schema and LangGraph wiring; ``build_graph`` is the embedding entry point."""

from graphs.graph import build_graph

__all__ = ["build_graph"]
