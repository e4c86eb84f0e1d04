"""Semantic search over the knowledge cards, for the researcher's citations.

The index lives at ``settings.knowledge_index_dir`` and is built on first use (see
``knowledge.index``); one ``KnowledgeIndex`` per path is kept for the life of the process so
the embedding model and the chromadb client load once.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from knowledge.index import KnowledgeIndex, Passage
from tools.settings import Settings

__all__ = ["Passage", "cite", "search_knowledge"]


@lru_cache(maxsize=4)
def _index(path: Path) -> KnowledgeIndex:
    return KnowledgeIndex(path)


def search_knowledge(query: str, settings: Settings, k: int = 3) -> list[Passage]:
    """Find the knowledge-card sections that best answer a question about training frameworks.

    Args:
        query: The question or topic in plain words, e.g. "shard optimizer states across GPUs".
        settings: Run settings; the index is kept at ``settings.knowledge_index_dir``.
        k: How many passages to return, best first.

    Returns:
        Up to ``k`` passages, each naming its card and section, with a cosine-similarity score.
    """
    return _index(settings.knowledge_index_dir.resolve()).search(query, k=k)


def cite(passage: Passage) -> str:
    """A citation for ``passage``: ``knowledge/cards/<card>.md#<section>: <title>``."""
    return f"knowledge/cards/{passage.card}.md#{passage.section}: {passage.title}"
