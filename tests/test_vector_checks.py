"""Issue 12 row 5: one vector check for both stores (stored and query vectors: finite, unit
length), non-finite scores become 0 and every lookup result is strict JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.models import Chunk, StoreHit
from rag_core.settings import RagSettings
from rag_core.stores.memory import InMemoryStore
from rag_core.stores.vectors import (
    VectorCheckError,
    check_query_vector,
    check_stored_vectors,
    cosine_to_similarity,
)

DIM = 16


def chunk(i: int) -> Chunk:
    return Chunk(
        chunk_id=f"c{i}",
        doc_id=f"d{i}.md",
        title="T",
        breadcrumb=f"T > S{i}",
        category="cat",
        text=f"text number {i} about redis memory",
        start=0,
        end=1,
        ordinal=i,
        content_hash=f"h{i}",
    )


def unit(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


BAD_QUERIES = {
    "nan": np.full(DIM, np.nan, np.float32),
    "inf": np.r_[np.inf, np.zeros(DIM - 1)].astype(np.float32),
    "tiny": unit(1, 7)[0] * np.float32(1e-29),
    "zero": np.zeros(DIM, np.float32),
    "long": unit(1, 8)[0] * 3,
}


@pytest.mark.parametrize("kind", sorted(BAD_QUERIES))
def test_bad_query_vectors_are_rejected(kind):
    with pytest.raises(VectorCheckError, match="query vector rejected"):
        check_query_vector(BAD_QUERIES[kind])


def test_unit_query_passes_and_slightly_off_unit_is_tolerated():
    v = unit(1)[0] * np.float32(1.005)
    assert check_query_vector(v).dtype == np.float32


def test_stored_vector_of_wrong_norm_is_rejected_naming_the_chunk():
    vectors = unit(3)
    vectors[1] *= 1e-29
    with pytest.raises(VectorCheckError, match="chunk c1: not unit length"):
        check_stored_vectors(["c0", "c1", "c2"], vectors, DIM)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_scores_become_zero(value):
    assert cosine_to_similarity(value) == 0.0


def test_memory_store_uses_the_shared_check():
    store = InMemoryStore()
    store.ensure_schema(DIM)
    with pytest.raises(VectorCheckError):
        store.upsert([chunk(0)], unit(1) * 5)
    store.upsert([chunk(i) for i in range(3)], unit(3))
    for bad in BAD_QUERIES.values():
        with pytest.raises(VectorCheckError):
            store.search(bad, 3)


class _NanScoreStore(InMemoryStore):
    """A store whose engine hands back NaN/inf scores (a corrupted index)."""

    def search(self, vector, top_k, category=None):
        hits = super().search(vector, top_k, category)
        return [
            StoreHit(**{**h.__dict__, "raw_score": float("inf"), "similarity": float("nan")}) if i == 0 else h
            for i, h in enumerate(hits)
        ]


class _FixedEmbedder:
    """An embedder that returns a fixed (possibly broken) query vector."""

    def __init__(self, vector: np.ndarray):
        self.vector = vector

    def embed_query(self, text: str) -> np.ndarray:
        return self.vector

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vector for _ in texts])

    def identity(self):
        return None


@pytest.mark.parametrize("kind", ["inf", "tiny", "nan"])
def test_lookup_with_a_broken_query_vector_claims_nothing_and_is_strict_json(tmp_path, kind):
    store = InMemoryStore()
    store.ensure_schema(DIM)
    store.upsert([chunk(i) for i in range(5)], unit(5))
    settings = RagSettings(data_dir=tmp_path, trace_enabled=False)
    tool = LookupKnowledgeTool(settings, embedder=_FixedEmbedder(BAD_QUERIES[kind]), store=store)
    result = tool.lookup("redis memory")
    json.dumps(result.to_json(), allow_nan=False)
    assert not result.found and result.status == "error"
    assert "query vector rejected" in (result.retrieval_trace.error or "")


def test_non_finite_store_scores_never_reach_the_result(tmp_path):
    store = _NanScoreStore()
    store.ensure_schema(DIM)
    store.upsert([chunk(i) for i in range(5)], unit(5))
    settings = RagSettings(data_dir=tmp_path, trace_enabled=False, min_block_similarity=0.0)
    tool = LookupKnowledgeTool(settings, embedder=_FixedEmbedder(unit(1, 3)[0]), store=store)
    result = tool.lookup("redis memory")
    text = json.dumps(result.to_json(), allow_nan=False)
    assert "NaN" not in text and "Infinity" not in text


@pytest.mark.integration
def test_milvus_rejects_bad_query_and_stored_vectors(tmp_path):
    from rag_core.stores.milvus import MilvusStore

    store = MilvusStore(str(tmp_path / "milvus.db"), "chunks")
    try:
        store.ensure_schema(DIM)
        with pytest.raises(VectorCheckError, match="chunk c0"):
            store.upsert([chunk(0)], unit(1) * np.float32(1e-29))
        store.upsert([chunk(i) for i in range(3)], unit(3))
        for bad in BAD_QUERIES.values():
            with pytest.raises(VectorCheckError):
                store.search(bad, 3)
            with pytest.raises(VectorCheckError):
                store.search_lexical(["redis"], bad, 3)
    finally:
        store.close()


@pytest.mark.integration
def test_pgvector_rejects_bad_query_and_stored_vectors(pg_dsn, pg_table):
    from rag_core.stores.pgvector import PgVectorStore

    store = PgVectorStore(pg_dsn, pg_table)
    try:
        store.ensure_schema(DIM)
        with pytest.raises(VectorCheckError, match="chunk c0"):
            store.upsert([chunk(0)], unit(1) * np.float32(1e-29))
        store.upsert([chunk(i) for i in range(3)], unit(3))
        for bad in BAD_QUERIES.values():
            with pytest.raises(VectorCheckError):
                store.search(bad, 3)
    finally:
        store.drop()
        store.close()
