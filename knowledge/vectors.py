"""The search table: the knowledge index's passages and vectors in one ``vectors.npz`` file.

``knowledge.index`` writes it whenever the chromadb collection is built or found current, and
a search ranks its vectors without opening chromadb (see that module's docstring). This module
imports nothing from tools, agents or graphs.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

TABLE_FILE = "vectors.npz"


class SearchTable(BaseModel):
    """The index's passages and vectors as a search reads them (``<path>/vectors.npz``)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    digest: str = Field(description="cards_digest of the cards the collection was built from.")
    ids: list[str] = Field(description="Passage ids, card#section, in the vectors' row order.")
    documents: list[str] = Field(description="The passage texts, as embedded.")
    metadatas: list[dict[str, Any]] = Field(description="card, section, title and heading.")
    vectors: Any = Field(description="float32 array (passages, 384) of unit-length embeddings.")


def read_table(path: Path, digest: str) -> SearchTable | None:
    """The search table under ``path`` if it was written for ``digest``; None if absent or stale.

    A table that cannot be read (cut short, not a table) counts as absent: the next search opens
    the chromadb collection, which is the index of record, and writes it again.
    """
    import zipfile

    import numpy as np

    try:
        with np.load(path / TABLE_FILE, allow_pickle=False) as data:
            meta = json.loads(data["meta"].tobytes())
            if meta.get("digest") != digest:
                return None
            vectors = data["vectors"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None
    return SearchTable(
        digest=digest,
        ids=meta["ids"],
        documents=meta["documents"],
        metadatas=meta["metadatas"],
        vectors=vectors,
    )


def write_table(path: Path, collection: Any, digest: str) -> SearchTable:
    """Write the collection's passages and vectors to ``path``'s search table (atomic replace)."""
    import numpy as np

    found = collection.get(include=["embeddings", "documents", "metadatas"])
    ids = list(found["ids"])
    vectors = np.asarray(found["embeddings"], dtype=np.float32).reshape(len(ids), -1)
    table = SearchTable(
        digest=digest,
        ids=ids,
        documents=list(found["documents"]),
        metadatas=[dict(m) for m in found["metadatas"]],
        vectors=vectors,
    )
    meta = table.model_dump(exclude={"vectors"})
    tmp = path / f".{TABLE_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    with tmp.open("wb") as handle:
        np.savez(
            handle, vectors=vectors, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        )
    os.replace(tmp, path / TABLE_FILE)
    return table
