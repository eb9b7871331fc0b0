"""Document similarity (rag_core.lookup.document_similarity): the query's cosine with a candidate
document's title plus its cosine with the centroid of the document's chunk vectors, computed at
ingest (rag_core.ingest.centroids) and stored with the index, so a lookup reads one row per
candidate document whatever its size (issue 44). Unit tests on the in-memory store and the real
ingest pipeline with small fakes; the store methods themselves are also tested on real Milvus and
pgvector (test_milvus_store, test_pgvector_store)."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_settings
from fakes import HashEmbedder

from rag_core.health import check_health
from rag_core.ingest.apply import apply_plan
from rag_core.ingest.centroids import centroid
from rag_core.ingest.embed import embed_plan
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.pipeline import ingest
from rag_core.ingest.plan import chunk_scan, plan_ingest, read_store_state, scan_knowledge
from rag_core.lookup.document_similarity import DocumentSimilarity, centroid_similarities
from rag_core.lookup.retriever import Candidate, RetrievalOutcome
from rag_core.models import Chunk, StoreHit
from rag_core.stores.base import StoreError
from rag_core.stores.memory import InMemoryStore

DIM = 8


def _unit(*xs: float) -> np.ndarray:
    v = np.array(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def _chunk(doc: str, i: int) -> Chunk:
    return Chunk(f"{doc}#{i}", doc, doc, f"{doc} > {i}", "k8s", f"text {i}", 0, 1, i, f"h-{doc}-{i}")


def _store(docs: dict[str, list[np.ndarray]]) -> InMemoryStore:
    """An in-memory store holding ``docs``' chunks and their centroids, as ingest leaves it."""
    store = InMemoryStore()
    store.ensure_schema(3)
    for doc, vectors in docs.items():
        store.upsert([_chunk(doc, i) for i in range(len(vectors))], np.stack(vectors))
        store.put_centroids({doc: centroid(np.stack(vectors))})
    return store


class _Titles:
    """Passage side for titles: one fixed vector per known title."""

    fingerprint = "fake-model"

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def embed_passages(self, texts: list[str], ids: list[str] | None = None) -> np.ndarray:
        return np.stack([self.table[t] for t in texts])


class _BrokenStore(InMemoryStore):
    def document_centroids(self, doc_ids):
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
    hits = store.search(query, 4)
    assert hits[0].doc_id == "single.md"  # its best chunk is the nearest one
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


# --- centroids computed at ingest, one row read per document (issue 44) ------------------------


class _RowCounter:
    """Delegates to a store and counts, per doc id, the vector rows its reads return (a (dim,)
    vector is one row, an (n, dim) stack n): what a lookup pays per candidate document."""

    def __init__(self, inner: InMemoryStore) -> None:
        self.inner, self.rows = inner, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            for key, value in out.items() if isinstance(out, dict) else ():
                if isinstance(value, np.ndarray):
                    self.rows[key] += 1 if value.ndim == 1 else len(value)
            return out

        return call


def _write_kb(root: Path, long_sections: int) -> Path:
    sections = "\n\n".join(f"## Step {i}\n\nRun check number {i} on the node." for i in range(long_sections))
    docs = {
        "ops/changelog.md": f"---\ntitle: Changelog\n---\n# Changelog\n\n{sections}\n",
        "ops/alpha.md": "---\ntitle: Alpha\n---\n# Alpha\n\nAlpha intro.\n\n## Diagnosis\n\nCheck alpha.\n",
        "ops/gamma.md": "---\ntitle: Gamma\n---\n# Gamma\n\nGamma intro.\n\n## Diagnosis\n\nCheck gamma.\n",
    }
    for rel, text in docs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _centroids_from_chunks(store: InMemoryStore) -> dict[str, np.ndarray]:
    """Each document's centroid from every chunk vector the store holds (how lookups computed it
    before centroids were stored: the stored vectors in chunk-id order)."""
    by_doc: dict[str, list[str]] = {}
    for cid, (doc_id, _) in store.chunk_hashes().items():
        by_doc.setdefault(doc_id, []).append(cid)
    rows = store.fetch([cid for cids in by_doc.values() for cid in cids])
    found = {}
    for doc_id, cids in by_doc.items():
        center = centroid(np.asarray([rows[c].vector for c in sorted(cids)], dtype=np.float32))
        assert center is not None
        found[doc_id] = center
    return found


def _titles() -> dict[str, str]:
    return {"ops/changelog.md": "Changelog", "ops/alpha.md": "Alpha", "ops/gamma.md": "Gamma"}


def test_a_lookup_reads_one_row_per_candidate_document_however_many_chunks_it_has(tmp_path):
    settings = make_settings(tmp_path / "data", _write_kb(tmp_path / "kb", long_sections=1000))
    store, emb = InMemoryStore(), HashEmbedder(DIM)
    ingest(settings, emb, [store], progress=False)
    assert store.count() > 1000
    reads = _RowCounter(store)
    query = emb.embed_query("node check failed")
    got, error = DocumentSimilarity(emb).similarities(reads, query, _titles())  # type: ignore[arg-type]
    assert error is None and reads.rows == {doc_id: 1 for doc_id in _titles()}
    # The same numbers as the centroids of every chunk vector, computed at lookup time.
    title_cosines, _ = DocumentSimilarity(emb).similarities(None, query, _titles())  # type: ignore[arg-type]
    expected = {d: title_cosines[d] + float(c @ query) for d, c in _centroids_from_chunks(store).items()}
    assert got == expected


def test_centroids_follow_incremental_ingests_and_a_deleted_embedding_cache(tmp_path):
    kb = _write_kb(tmp_path / "kb", long_sections=30)
    settings = make_settings(tmp_path / "data", kb)
    store, emb = InMemoryStore(), HashEmbedder(DIM)
    ingest(settings, emb, [store], progress=False)
    # One document changed (sections dropped and one edited), one deleted.
    _write_kb(kb, long_sections=12)
    (kb / "ops/alpha.md").write_text("---\ntitle: Alpha\n---\n# Alpha\n\nAlpha intro, edited.\n")
    (kb / "ops/gamma.md").unlink()
    ingest(settings, emb, [store], progress=False, prune=True)
    expected = _centroids_from_chunks(store)
    assert set(expected) == store.centroid_doc_ids() == {"ops/changelog.md", "ops/alpha.md"}
    stored = store.document_centroids(list(expected))
    assert all(np.array_equal(stored[d], expected[d]) for d in expected)
    # A changed document whose unchanged chunks are no longer cached: their stored vectors serve.
    EmbeddingCache.under(settings.data_dir).path.unlink()
    _write_kb(kb, long_sections=13)
    ingest(settings, emb, [store], progress=False)
    expected = _centroids_from_chunks(store)
    stored = store.document_centroids(list(expected))
    assert all(np.array_equal(stored[d], expected[d]) for d in expected)


def test_an_index_without_centroids_says_so_and_the_next_ingest_adds_them_without_embedding(tmp_path, caplog):
    settings = make_settings(tmp_path / "data", _write_kb(tmp_path / "kb", long_sections=5))
    store, emb = InMemoryStore(), HashEmbedder(DIM)
    ingest(settings, emb, [store], progress=False)
    before = _centroids_from_chunks(store)
    store.delete_centroids(list(before))  # an index the previous version built
    query = emb.embed_query("node check failed")
    with caplog.at_level(logging.WARNING):
        got, error = DocumentSimilarity(emb).similarities(store, query, _titles())  # type: ignore[arg-type]
    assert got == DocumentSimilarity(emb).similarities(None, query, _titles())[0]  # type: ignore[arg-type]  # titles alone
    assert error is not None and "holds no document centroids" in error and "run `rag ingest`" in error
    assert error in caplog.text
    health = check_health(settings, [store], emb.identity())
    assert not health.ok and "run `rag ingest` to add them" in health.summary()
    embedded = emb.texts
    ingest(settings, emb, [store], progress=False)  # nothing changed on disk
    assert emb.texts == embedded  # nothing re-embedded
    stored = store.document_centroids(list(before))
    assert all(np.array_equal(stored[d], before[d]) for d in before)
    assert check_health(settings, [store], emb.identity()).ok


def test_the_apply_stage_of_the_dagster_assets_stores_centroids_too(tmp_path):
    settings = make_settings(tmp_path / "data", _write_kb(tmp_path / "kb", long_sections=5))
    store, emb = InMemoryStore(), HashEmbedder(DIM)
    scan = scan_knowledge(settings.knowledge_dir, settings.max_document_bytes)
    chunked = chunk_scan(scan.documents, emb.count_tokens, 256)
    plan = plan_ingest(scan, chunked, [read_store_state(store)], emb.identity())
    apply_plan(store, plan, embed_plan(plan, emb, EmbeddingCache.under(settings.data_dir)))
    expected = _centroids_from_chunks(store)
    stored = store.document_centroids(list(expected))
    assert set(stored) == set(_titles()) and all(np.array_equal(stored[d], expected[d]) for d in expected)
