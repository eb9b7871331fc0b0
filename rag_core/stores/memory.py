"""An in-process store: exact NumPy cosine search and in-memory BM25 (``bm25s``).

Not a product path: it is the floor the benchmarks compare the real stores with (query
embedding + exact NumPy search + BM25 in memory) and a fast, faithful stand-in for quality
experiments and unit tests. It indexes exactly the lexical tokens the real stores index
(``rag_core.text.lexical_string``) and scores BM25 with Milvus's defaults (k1 = 1.2,
b = 0.75; Robertson & Zaragoza 2009).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np

from rag_core.embedding.base import ModelIdentity
from rag_core.models import Chunk, StoreHit
from rag_core.stores.base import (
    BulkLoad,
    DimensionMismatchError,
    MissingCentroidsError,
    StoredChunk,
    StoreError,
    check_vectors,
    cosine_to_similarity,
)
from rag_core.stores.vectors import check_query_vector, finite_score
from rag_core.text import lexical_string

SCORE_LABEL = "memory_cosine_similarity[-1,1]"
BM25_K1 = 1.2
BM25_B = 0.75


class InMemoryStore:
    """Chunks held in process memory; implements ``VectorStore``. Thread-safe."""

    name = "memory"
    score_label = SCORE_LABEL

    def __init__(self) -> None:
        self._chunks: dict[str, Chunk] = {}
        self._vectors: dict[str, np.ndarray] = {}
        self._centroids: dict[str, np.ndarray] = {}  # doc id -> centroid
        self._lexical: dict[str, list[str]] = {}
        self._dim: int | None = None
        self._lock = threading.Lock()
        self._matrix: tuple[list[str], np.ndarray] | None = None
        self._bm25: object | None = None
        self._model: ModelIdentity | None = None

    def ensure_schema(self, dim: int) -> None:
        """Fix the dimension on first use; DimensionMismatchError when it differs."""
        if self._dim is not None and self._dim != dim:
            raise DimensionMismatchError("the in-memory store", self._dim, dim)
        self._dim = dim

    def check_chunk(self, chunk: Chunk) -> None:
        """Nothing to check: any chunk fits in memory."""

    def upsert(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None:
        """Insert or replace chunks by id (vectors (n, dim) float32, L2-normalised)."""
        if not chunks:
            return
        check_vectors([c.chunk_id for c in chunks], vectors, self._dim or vectors.shape[1])
        with self._lock:
            for chunk, vector in zip(chunks, vectors, strict=True):
                self._chunks[chunk.chunk_id] = chunk
                self._vectors[chunk.chunk_id] = np.asarray(vector, dtype=np.float32)
                self._lexical[chunk.chunk_id] = lexical_string(chunk.embed_text).split()
            self._invalidate()

    def bulk_load(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> BulkLoad:
        """``upsert`` into an empty store (``VectorStore.bulk_load``); StoreError when not empty."""
        if self._chunks:
            raise StoreError(f"bulk_load needs an empty store; the in-memory store holds {len(self._chunks)} chunks")
        t0 = time.perf_counter()
        self.upsert(chunks, vectors)
        return BulkLoad(len(chunks), time.perf_counter() - t0, 0.0)

    def delete_documents(self, doc_ids: Sequence[str]) -> None:
        """Remove every chunk of ``doc_ids``."""
        gone = set(doc_ids)
        self.delete_chunks([cid for cid, c in self._chunks.items() if c.doc_id in gone])

    def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        """Remove chunks by id (unknown ids are ignored)."""
        with self._lock:
            for cid in chunk_ids:
                self._chunks.pop(cid, None)
                self._vectors.pop(cid, None)
                self._lexical.pop(cid, None)
            self._invalidate()

    def chunk_hashes(self) -> dict[str, tuple[str, str]]:
        """``{chunk_id: (doc_id, content_hash)}``."""
        return {cid: (c.doc_id, c.content_hash) for cid, c in self._chunks.items()}

    def fetch(self, chunk_ids: Sequence[str]) -> dict[str, StoredChunk]:
        """The stored chunks of ``chunk_ids`` (absent ids are left out)."""
        with self._lock:
            found = [(self._chunks[c], self._vectors[c]) for c in chunk_ids if c in self._chunks]
        return {
            c.chunk_id: StoredChunk(c.chunk_id, c.doc_id, c.title, c.breadcrumb, c.category, c.text, c.content_hash, v)
            for c, v in found
        }

    def document_centroids(self, doc_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Doc id -> stored centroid (absent docs left out); MissingCentroidsError when chunks are
        held but no centroid."""
        with self._lock:
            if self._chunks and not self._centroids:
                raise MissingCentroidsError("the in-memory store")
            return {d: self._centroids[d] for d in doc_ids if d in self._centroids}

    def centroid_doc_ids(self) -> set[str]:
        """Doc ids with a stored centroid."""
        with self._lock:
            return set(self._centroids)

    def put_centroids(self, centroids: Mapping[str, np.ndarray]) -> None:
        """Insert or replace document centroids."""
        with self._lock:
            self._centroids.update({d: np.asarray(v, dtype=np.float32) for d, v in centroids.items()})

    def delete_centroids(self, doc_ids: Sequence[str]) -> None:
        """Remove the centroids of ``doc_ids``."""
        with self._lock:
            for d in doc_ids:
                self._centroids.pop(d, None)

    def count(self) -> int:
        """Number of chunks."""
        return len(self._chunks)

    def flush(self) -> None:
        """Nothing to persist (the protocol's durability point)."""

    def search(self, vector: np.ndarray, top_k: int, category: str | None = None) -> list[StoreHit]:
        """Exact top-k by cosine similarity, optionally within one category."""
        query = check_query_vector(vector)
        ids, matrix = self._dense()
        if not ids:
            return []
        scores = matrix @ query
        order = np.argsort(-scores, kind="stable")
        hits = []
        for i in order:
            chunk = self._chunks[ids[i]]
            if category is None or chunk.category == category:
                hits.append(_hit(chunk, float(scores[i]), "dense"))
                if len(hits) == top_k:
                    break
        return hits

    def search_lexical(
        self, terms: Sequence[str], vector: np.ndarray, top_k: int, category: str | None = None
    ) -> list[StoreHit]:
        """Top-k by BM25 over ``terms`` (only chunks containing a term), each with its cosine."""
        if not terms:
            return []
        ids, matrix = self._dense()
        bm25 = self._index(ids)
        if bm25 is None:
            return []
        scores = bm25.get_scores(list(terms))  # type: ignore[attr-defined]
        order = np.argsort(-scores, kind="stable")
        hits = []
        query = check_query_vector(vector)
        for i in order:
            if scores[i] <= 0:
                break
            chunk = self._chunks[ids[i]]
            if category is None or chunk.category == category:
                hits.append(_hit(chunk, float(matrix[i] @ query), "lexical", float(scores[i])))
                if len(hits) == top_k:
                    break
        return hits

    def drop(self) -> None:
        """Forget everything, the dimension included."""
        with self._lock:
            self._chunks.clear()
            self._vectors.clear()
            self._centroids.clear()
            self._lexical.clear()
            self._dim = None
            self._invalidate()

    @contextmanager
    def rebuild(self) -> Iterator[InMemoryStore]:
        """An empty store to fill; on a normal exit its contents replace this store's at once
        (under the lock), on an exception this store is left as it was."""
        fresh = InMemoryStore()
        yield fresh
        with fresh._lock, self._lock:
            self._chunks, self._vectors, self._lexical = fresh._chunks, fresh._vectors, fresh._lexical
            self._centroids = fresh._centroids
            self._dim, self._model = fresh._dim, fresh._model
            self._invalidate()

    def close(self) -> None:
        """Nothing to release."""

    def recorded_model(self) -> ModelIdentity | None:
        """The model recorded by ``record_model`` (None before)."""
        return self._model

    def record_model(self, identity: ModelIdentity) -> None:
        """Remember the model that filled the store."""
        self._model = identity

    def _invalidate(self) -> None:
        self._matrix = None
        self._bm25 = None

    def _dense(self) -> tuple[list[str], np.ndarray]:
        with self._lock:
            if self._matrix is None:
                ids = sorted(self._chunks)
                dim = self._dim or 1
                matrix = np.stack([self._vectors[i] for i in ids]) if ids else np.zeros((0, dim), np.float32)
                self._matrix = (ids, matrix)
            return self._matrix

    def _index(self, ids: list[str]) -> object | None:
        import bm25s

        with self._lock:
            if self._bm25 is None and ids:
                bm25 = bm25s.BM25(k1=BM25_K1, b=BM25_B)
                bm25.index([self._lexical[i] or [""] for i in ids], show_progress=False)
                self._bm25 = bm25
            return self._bm25


def _hit(chunk: Chunk, cosine: float, channel: str, lexical_score: float | None = None) -> StoreHit:
    return StoreHit(
        chunk_id=chunk.chunk_id,
        doc_id=chunk.doc_id,
        title=chunk.title,
        breadcrumb=chunk.breadcrumb,
        category=chunk.category,
        text=chunk.text,
        raw_score=finite_score(cosine),
        score_label=SCORE_LABEL,
        similarity=cosine_to_similarity(cosine),
        channel=channel,
        lexical_score=lexical_score,
    )
