"""Document similarity (rag_core.lookup.document_similarity): the query's cosine with a candidate
document's title plus its cosine with the centroid of the document's stored chunk vectors. Unit
tests on the in-memory store with small fakes; the store method itself is also tested on real
Milvus and pgvector (test_milvus_store, test_pgvector_store)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from rag_core.lookup.document_similarity import DocumentSimilarity, centroid, centroid_similarities
from rag_core.lookup.retriever import Candidate, RetrievalOutcome
from rag_core.models import Chunk, StoreHit
from rag_core.stores.base import StoreError
from rag_core.stores.memory import InMemoryStore


def _unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def _chunk(doc: str, i: int) -> Chunk:
    return Chunk(f"{doc}#{i}", doc, doc, f"{doc} > {i}", "k8s", f"text {i}", 0, 1, i, f"h-{doc}-{i}")


def _store(docs: dict[str, list[np.ndarray]]) -> InMemoryStore:
    store = InMemoryStore()
    store.ensure_schema(3)
    for doc, vectors in docs.items():
        store.upsert([_chunk(doc, i) for i in range(len(vectors))], np.stack(vectors))
    return store


class _Titles:
    """Passage side for titles: one fixed vector per known title."""

    fingerprint = "fake-model"

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def embed_passages(self, texts: list[str], ids: list[str] | None = None) -> np.ndarray:
        return np.stack([self.table[t] for t in texts])


class _BrokenStore(InMemoryStore):
    def document_vectors(self, doc_ids):
        raise StoreError("milvus unreachable")


def test_centroid_is_the_unit_mean_and_none_when_the_vectors_cancel_out():
    np.testing.assert_allclose(centroid(np.stack([_unit(1, 0, 0), _unit(0, 1, 0)])), _unit(1, 1, 0), atol=1e-6)
    assert centroid(np.stack([_unit(1, 0, 0), _unit(-1, 0, 0)])) is None
    assert centroid(np.zeros((0, 3), np.float32)) is None


def test_a_document_whose_sections_together_fit_the_query_beats_one_with_a_single_closer_section():
    # "spread" covers the query's two aspects in two sections; "single" has one section nearer
    # to the query than either of those, and one unrelated section.
    query = _unit(1, 1, 0)
    store = _store(
        {
            "spread.md": [_unit(1, 0, 0.2), _unit(0, 1, 0.2)],
            "single.md": [_unit(1, 0.6, 0), _unit(0, 0, 1)],
        }
    )
    best_chunk = {
        d: max(float(v @ query) for v in vs) for d, vs in store.document_vectors(["spread.md", "single.md"]).items()
    }
    assert best_chunk["single.md"] > best_chunk["spread.md"]
    got, error = centroid_similarities(store, query, ["spread.md", "single.md", "spread.md", "gone.md"])
    assert error is None
    assert set(got) == {"spread.md", "single.md"}
    assert got["spread.md"] > got["single.md"]


def test_title_and_centroid_cosines_are_summed_per_document():
    store = _store({"a.md": [_unit(1, 0, 0)], "b.md": [_unit(0, 1, 0)]})
    titles = _Titles({"A": _unit(1, 0, 0), "B": _unit(0, 0, 1)})
    got, _ = DocumentSimilarity(titles).similarities(store, _unit(1, 0, 0), {"a.md": "A", "b.md": "B"})  # type: ignore[arg-type]
    assert got == pytest.approx({"a.md": 2.0, "b.md": 0.0}, abs=1e-6)


def test_without_centroids_every_document_is_scored_by_its_title_alone(caplog):
    titles = _Titles({"A": _unit(1, 0, 0), "B": _unit(0, 1, 0)})
    similarity = DocumentSimilarity(titles)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        broken, error = similarity.similarities(_BrokenStore(), _unit(1, 0, 0), {"a.md": "A", "b.md": "B"})
    assert broken == pytest.approx({"a.md": 1.0, "b.md": 0.0}, abs=1e-6)
    assert error == "document centroids skipped: StoreError: milvus unreachable"  # the lookup says so
    assert "document centroids skipped: StoreError: milvus unreachable" in caplog.text
    # One document the store does not hold (a sidecar-only hit): titles alone, for all, so
    # the scores stay comparable.
    partial, error = similarity.similarities(
        _store({"a.md": [_unit(0, 1, 0)]}), _unit(1, 0, 0), {"a.md": "A", "b.md": "B"}
    )
    assert partial == pytest.approx({"a.md": 1.0, "b.md": 0.0}, abs=1e-6) and error is None
    # No store (it failed earlier in this lookup): not asked, titles alone.
    assert similarity.similarities(None, _unit(1, 0, 0), {"a.md": "A"}) == (pytest.approx({"a.md": 1.0}), None)


def test_the_document_stage_sets_each_candidates_document_similarity_when_the_query_has_a_vector():
    store = _store({"a.md": [_unit(1, 0, 0)], "b.md": [_unit(0, 1, 0)]})
    similarity = DocumentSimilarity(_Titles({"A": _unit(1, 0, 0), "B": _unit(0, 0, 1)}))  # type: ignore[arg-type]
    hits = [StoreHit(f"{d}#0", d, t, t, "k8s", "text", 0.5, "cosine", 0.5) for d, t in (("a.md", "A"), ("b.md", "B"))]
    candidates = [Candidate(hit=h, rrf=0.01, channels={"dense"}) for h in hits]
    got, error = similarity.annotate(RetrievalOutcome(candidates, [], None, query_vector=_unit(1, 0, 0)), store)
    assert error is None
    assert [c.document_similarity for c in got] == pytest.approx([2.0, 0.0], abs=1e-6)
    assert similarity.annotate(RetrievalOutcome(candidates, [], None), store) == (candidates, None)  # no query vector
