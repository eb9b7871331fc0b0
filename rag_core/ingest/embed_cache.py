"""Passage embeddings kept by model and chunk content hash, in SQLite (``<data_dir>/embedding_cache.sqlite3``).

A vector depends only on the model (its ``ModelIdentity``: backend, model, dimension and the
fingerprint of every setting that changes vectors) and on the embedded text, which the chunk's
content hash covers. So a chunk embedded once is never embedded again for that model: not by a
second store, a re-run after a failed write, a ``--rebuild``, nor the Dagster assets of another
process. A model change is a different key: nothing is reused across models.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterable, Mapping
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np

from rag_core.embedding.base import ModelIdentity

CACHE_FILE = "embedding_cache.sqlite3"
# SQLite limits host parameters per statement (32766 on current builds; stay well below).
_IN_CHUNK = 500
_SCHEMA = """
CREATE TABLE IF NOT EXISTS embedding (
    model TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (model, content_hash)
) WITHOUT ROWID
"""


def model_key(identity: ModelIdentity) -> str:
    """The cache key of a model: ``backend:model_id:dimension:fingerprint``."""
    return f"{identity.backend}:{identity.model_id}:{identity.dimension}:{identity.fingerprint}"


class EmbeddingCache:
    """Float32 vectors by (model, content hash) in one SQLite file; safe across processes.

    Each call opens its own connection (WAL journal, 30 s busy timeout), so an instance can be
    pickled and used from any thread or process. Raises sqlite3.Error when the file cannot be
    created or read (e.g. a read-only data dir).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """In pydantic JSON (the Dagster IO manager's files) a cache is its file path."""
        from pydantic_core import core_schema

        from_path = core_schema.no_info_after_validator_function(cls, core_schema.str_schema())
        return core_schema.json_or_python_schema(
            json_schema=from_path,
            python_schema=core_schema.union_schema([core_schema.is_instance_schema(cls), from_path]),
            serialization=core_schema.plain_serializer_function_ser_schema(lambda cache: str(cache.path)),
        )

    @classmethod
    def under(cls, data_dir: Path) -> EmbeddingCache:
        """The cache of a RAG data dir."""
        return cls(Path(data_dir) / CACHE_FILE)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30.0)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_SCHEMA)
        return conn

    def get_many(self, identity: ModelIdentity, content_hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """``{content_hash: (dimension,) float32}`` of the hashes cached for ``identity``
        (missing hashes, and rows of another length, are absent)."""
        wanted = list(dict.fromkeys(content_hashes))
        key, out = model_key(identity), {}
        with closing(self._connect()) as conn:
            for i in range(0, len(wanted), _IN_CHUNK):
                part = wanted[i : i + _IN_CHUNK]
                marks = ",".join("?" * len(part))
                rows = conn.execute(
                    f"SELECT content_hash, vector FROM embedding WHERE model = ? AND content_hash IN ({marks})",
                    [key, *part],
                ).fetchall()
                for content_hash, blob in rows:
                    vector = np.frombuffer(blob, dtype=np.float32)
                    if vector.shape == (identity.dimension,):
                        out[content_hash] = vector
        return out

    def put_many(self, identity: ModelIdentity, vectors: Mapping[str, np.ndarray]) -> None:
        """Store ``{content_hash: vector}`` for ``identity`` (replacing what was there), in one
        transaction. OSError(ENOSPC) naming the cache file when the disk is full."""
        key = model_key(identity)
        rows = [(key, h, np.asarray(v, dtype=np.float32).tobytes()) for h, v in vectors.items()]
        try:
            with closing(self._connect()) as conn, conn:
                conn.executemany(
                    "INSERT OR REPLACE INTO embedding (model, content_hash, vector) VALUES (?, ?, ?)", rows
                )
        except sqlite3.OperationalError as exc:
            # SQLite reports a full disk as its own error: raise it as the OSError every writer
            # of the data dir raises, so the CLI names the file in one line.
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path)) from exc
            raise

    def count(self, identity: ModelIdentity | None = None) -> int:
        """Cached vectors (of ``identity`` only, when given)."""
        with closing(self._connect()) as conn:
            if identity is None:
                row = conn.execute("SELECT COUNT(*) FROM embedding").fetchone()
            else:
                row = conn.execute("SELECT COUNT(*) FROM embedding WHERE model = ?", [model_key(identity)]).fetchone()
        return int(row[0])
