"""The interface both vector stores (Milvus main store, pgvector sidecar) implement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rag_core.embedding.base import ModelIdentity
from rag_core.models import Chunk, StoreHit
from rag_core.stores.errors import DimensionMismatchError, StoreError
from rag_core.stores.vectors import check_stored_vectors, cosine_to_similarity

__all__ = ["BulkLoad", "DimensionMismatchError", "StoreError", "check_vectors", "cosine_to_similarity"]


def check_vectors(chunk_ids: Sequence[str], vectors: np.ndarray, dim: int) -> None:
    """Reject NaN/inf, all-zero or non-unit vectors and wrong shapes before any write
    (``rag_core.stores.vectors.check_stored_vectors``; kept under this name for callers)."""
    check_stored_vectors(chunk_ids, vectors, dim)


@dataclass(frozen=True)
class StoredChunk:
    """One chunk as a store holds it (``fetch``): its fields, content hash and vector (float32)."""

    chunk_id: str
    doc_id: str
    title: str
    breadcrumb: str
    category: str
    text: str
    content_hash: str
    vector: np.ndarray


@dataclass(frozen=True)
class BulkLoad:
    """What ``bulk_load`` did: ``rows`` written, ``write_s`` seconds writing them (Milvus insert,
    PostgreSQL COPY) and ``index_s`` seconds making them searchable after (Milvus flush, the
    pgvector HNSW and full-text index builds; 0 for the in-memory store)."""

    rows: int
    write_s: float
    index_s: float


class VectorStore(Protocol):
    """A chunk store with dense (cosine) and lexical search.

    ``name`` is ``"milvus"`` or ``"pgvector"``; ``score_label`` describes ``raw_score`` of
    dense hits. All methods raise ``StoreError`` when the store is unreachable.
    """

    name: str
    score_label: str

    def ensure_schema(self, dim: int) -> None:
        """Create the collection/table if missing, load it; DimensionMismatchError if dims differ."""

    def check_chunk(self, chunk: Chunk) -> None:
        """ValueError naming the chunk and field when this store cannot hold ``chunk`` (e.g. a
        Milvus VARCHAR limit); needs no connection. Ingest skips such a chunk's document."""

    def upsert(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None:
        """Insert or replace chunks by chunk id; vectors are (n, dim) float32, L2-normalised."""

    def bulk_load(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> BulkLoad:
        """Fill an empty store (after ``ensure_schema``) with ``chunks`` (ids unique) and their
        (n, dim) float32 unit vectors, faster than ``upsert``: no replace by id, indexes built
        once after the write, rows searchable when it returns. ValueError names a bad vector and
        StoreError reports a store that is not empty, both before any write."""

    def flush(self) -> None:
        """Make every write so far durable and searchable without per-search rework (Milvus
        seals its growing segment; PostgreSQL commits per statement, so it does nothing)."""

    def delete_documents(self, doc_ids: Sequence[str]) -> None:
        """Remove every chunk of the given documents."""

    def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        """Remove chunks by id."""

    def chunk_hashes(self) -> dict[str, tuple[str, str]]:
        """``{chunk_id: (doc_id, content_hash)}`` of everything stored."""

    def count(self) -> int:
        """Number of stored chunks."""

    def fetch(self, chunk_ids: Sequence[str]) -> dict[str, StoredChunk]:
        """The stored rows of ``chunk_ids`` (ids not stored are absent), for health checks."""

    def document_centroids(self, doc_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Doc id -> the document's stored centroid ((dim,) float32 unit vector, written at
        ingest: ``rag_core.ingest.centroids``), one row read per document whatever its size;
        documents without one are absent. MissingCentroidsError when the store holds chunks but
        no centroid at all (an index built before centroids were stored)."""

    def centroid_doc_ids(self) -> set[str]:
        """The doc ids holding a stored centroid (empty when there are none)."""

    def put_centroids(self, centroids: Mapping[str, np.ndarray]) -> None:
        """Insert or replace the centroids of documents (doc id -> (dim,) float32 unit vector)."""

    def delete_centroids(self, doc_ids: Sequence[str]) -> None:
        """Remove the stored centroids of ``doc_ids`` (unknown ids are ignored)."""

    def search(self, vector: np.ndarray, top_k: int, category: str | None = None) -> list[StoreHit]:
        """Top-k chunks by cosine similarity, optionally only of one category; best first."""

    def search_lexical(
        self, terms: Sequence[str], vector: np.ndarray, top_k: int, category: str | None = None
    ) -> list[StoreHit]:
        """Top-k chunks by full-text score over pre-tokenised ``terms`` (see rag_core.text).

        Each hit also carries the cosine similarity to ``vector`` so the two channels can be
        fused and thresholded on one scale.
        """

    def drop(self) -> None:
        """Delete the collection/table and everything it holds."""

    def rebuild(self) -> AbstractContextManager[VectorStore]:
        """A new, empty store of the same kind (its own collection/table) to fill whole, for
        ``rag ingest --rebuild`` and model changes. On a normal exit it replaces this store's
        index atomically: a lookup through this store's name, in any process, sees the old
        index or the new one, never a part; the old one is then dropped. On an exception the
        partial build is removed and the old index stays served. StoreError when the switch fails."""

    def close(self) -> None:
        """Release connections."""

    def recorded_model(self) -> ModelIdentity | None:
        """The embedding model the store was built with; None when missing or unrecorded."""

    def record_model(self, identity: ModelIdentity) -> None:
        """Record the embedding model the store's vectors come from (after a write)."""


class MissingCentroidsError(StoreError):
    """The index holds chunks but no document centroid: it was built before centroids were
    stored with the index. ``rag ingest`` adds them (no re-embedding)."""

    def __init__(self, where: str):
        super().__init__(
            f"{where} holds no document centroids (built before they were stored with the index): "
            "run `rag ingest` to add them"
        )


class IndexModelMismatchError(StoreError):
    """The index was built with another embedding model (or other embedding settings)."""

    def __init__(self, where: str, recorded: ModelIdentity, active: ModelIdentity):
        if recorded.is_incomplete:
            message = (
                f"{where} is being written by an ingest for {recorded.model_id}, or its last ingest was "
                "interrupted: run `rag ingest` (it rewrites the index whole)"
            )
        else:
            message = (
                f"{where} was built with {recorded.describe()} but the active model is "
                f"{active.describe()}: run `rag ingest` to re-embed with it (RAG_EMBEDDING_BACKEND / "
                "RAG_EMBEDDING_MODEL select the model)"
            )
        super().__init__(message)
        self.recorded = recorded
        self.active = active
