"""Semantic search over the knowledge cards, for the researcher's citations.

The index lives at ``settings.knowledge_index_dir`` and is built on first use (see
``knowledge.index``); one ``KnowledgeIndex`` per path is kept for the life of the process so
the embedding model and the chromadb client load once, whichever threads ask first.
"""

from __future__ import annotations

import threading
from pathlib import Path

from knowledge.index import KnowledgeIndex, Passage
from tools.core.settings import Settings

__all__ = ["Passage", "cite", "search_knowledge"]


_INDEXES: dict[Path, KnowledgeIndex] = {}
_INDEXES_LOCK = threading.Lock()
_MAX_INDEXES = 4


def _index(path: Path) -> KnowledgeIndex:
    # A lock, not functools.lru_cache: lru_cache may run the constructor twice for threads
    # that miss at once, and the planning graph runs plans in parallel threads.
    with _INDEXES_LOCK:
        index = _INDEXES.get(path)
        if index is None:
            index = _INDEXES[path] = KnowledgeIndex(path)
            if len(_INDEXES) > _MAX_INDEXES:  # bounded, as lru_cache(maxsize=4) was
                del _INDEXES[next(iter(_INDEXES))]
        return index


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
