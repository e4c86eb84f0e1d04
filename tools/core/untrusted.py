"""Bounds for text that comes from a chat model: capped where it enters the plan's state.

A reply or a tool argument can be any size. What the graph keeps of it (the agents' notes in
the state, and so in every checkpoint and report) is cut to ``MAX_LLM_TEXT`` characters with a
marker that says how long it was.
"""

from __future__ import annotations

# 16 Ki characters: several pages of notes, a few tens of KB in a checkpoint at most.
MAX_LLM_TEXT = 16_384


def cap_text(text: str, limit: int = MAX_LLM_TEXT) -> str:
    """``text``, cut to ``limit`` characters with a ``[cut: N chars]`` marker when longer."""
    if len(text) <= limit:
        return text
    return text[:limit] + f" ... [cut: {len(text):,} chars in all]"
