"""The ingest stages on small fakes (no model, no server): plan -> embed once -> apply per store.

A bad vector skips its whole document (reported with path and heading), the rest is ingested;
a stale plan is refused; the embedding cache serves a second run and misses after a model change;
``rag ingest`` exits 3 on a partial ingest without a traceback.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import make_settings
from fakes import POISON, HashEmbedder

from rag_core.ingest.apply import StalePlanError, apply_plan
from rag_core.ingest.embed import embed_plan
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.pipeline import ingest
from rag_core.ingest.plan import chunk_scan, plan_ingest, read_store_state, scan_knowledge
from rag_core.stores.memory import InMemoryStore

DIM = 8


def _kb(root: Path) -> Path:
    docs = {
        "ops/alpha.md": "---\ntitle: Alpha\n---\n# Alpha\n\nAlpha intro.\n\n## Diagnosis\n\nCheck alpha.\n",
        "ops/beta.md": f"---\ntitle: Beta\n---\n# Beta\n\nBeta intro.\n\n## Mitigation\n\nRestart beta {POISON}.\n",
        "ops/gamma.md": "---\ntitle: Gamma\n---\n# Gamma\n\nGamma intro.\n\n## Diagnosis\n\nCheck gamma.\n",
        "ops/delta.md": "---\ntitle: Delta\n---\n# Delta\n\nDelta body.\n",
    }
    for rel, text in docs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    return _kb(tmp_path / "kb")


def _plan(settings, embedder, stores):
    scan = scan_knowledge(settings.knowledge_dir, settings.max_document_bytes)
    chunked = chunk_scan(scan.documents, embedder.count_tokens, 256)
    return plan_ingest(scan, chunked, [read_store_state(s) for s in stores], embedder.identity())


@pytest.mark.parametrize("checked", [True, False], ids=["backend-rejects", "raw-nan"])
def test_nan_vector_skips_its_document_with_path_and_heading(tmp_path, kb, checked):
    settings = make_settings(tmp_path / "data", kb)
    store, emb = InMemoryStore(), HashEmbedder(DIM, checked=checked)
    report = ingest(settings, emb, [store], progress=False)
    [issue] = report.skipped
    assert issue.path == "ops/beta.md" and issue.heading == "Beta > Mitigation"
    assert "non-finite" in issue.reason
    assert report.partial and report.documents_ingested == 3
    docs = {doc for doc, _ in store.chunk_hashes().values()}
    assert docs == {"ops/alpha.md", "ops/gamma.md", "ops/delta.md"}  # beta's good chunk not written
    assert store.count() == report.chunks_total


def test_skipped_document_keeps_its_previous_chunks(tmp_path, kb):
    settings = make_settings(tmp_path / "data", kb)
    beta = kb / "ops" / "beta.md"
    poisoned = beta.read_text()
    beta.write_text(poisoned.replace(POISON, "now"))
    store, emb = InMemoryStore(), HashEmbedder(DIM)
    ingest(settings, emb, [store], progress=False)
    before = {cid: v for cid, v in store.chunk_hashes().items() if v[0] == "ops/beta.md"}
    beta.write_text(poisoned)  # an edit whose embedding fails: the old version stays searchable
    report = ingest(settings, emb, [store], progress=False)
    assert [i.path for i in report.skipped] == ["ops/beta.md"]
    assert {cid: v for cid, v in store.chunk_hashes().items() if v[0] == "ops/beta.md"} == before


def test_stale_plan_is_refused_and_writes_nothing(tmp_path, kb):
    settings = make_settings(tmp_path / "data", kb)
    store, emb = InMemoryStore(), HashEmbedder(DIM)
    plan = _plan(settings, emb, [store])
    embeddings = embed_plan(plan, emb, EmbeddingCache.under(settings.data_dir))
    ingest(settings, emb, [store], progress=False)  # another writer gets there first
    held = store.chunk_hashes()
    with pytest.raises(StalePlanError, match="memory changed since this ingest was planned"):
        apply_plan(store, plan, embeddings)
    assert store.chunk_hashes() == held


def test_embedded_once_for_every_store(tmp_path, kb):
    settings = make_settings(tmp_path / "data", kb)
    (kb / "ops" / "beta.md").unlink()
    first, second, emb = InMemoryStore(), InMemoryStore(), HashEmbedder(DIM)
    second.name = "memory2"
    report = ingest(settings, emb, [first, second], progress=False)
    assert emb.texts == report.chunks_total == first.count() == second.count()
    assert emb.titles == 3  # alpha, gamma, delta: once for both stores
    assert report.passages_embedded == report.chunks_total and report.embedding_cache_hits == 0


def test_cache_hit_on_second_run_and_miss_after_a_model_change(tmp_path, kb):
    settings = make_settings(tmp_path / "data", kb)
    (kb / "ops" / "beta.md").unlink()
    emb = HashEmbedder(DIM)
    first = ingest(settings, emb, [InMemoryStore()], progress=False)
    assert emb.texts == first.chunks_total > 0 and emb.titles == 3
    # A fresh store (e.g. --rebuild, or a new sidecar) needs every vector: all from the cache.
    again = ingest(settings, emb, [InMemoryStore()], progress=False)
    assert emb.texts == first.chunks_total and emb.titles == 3  # titles too
    assert again.embedding_cache_hits == again.chunks_embedded == first.chunks_total
    assert again.passages_embedded == 0
    other = HashEmbedder(DIM, fingerprint="0" * 16)  # same backend and dimension, other settings
    changed = ingest(settings, other, [InMemoryStore()], progress=False)
    assert other.texts == changed.passages_embedded == first.chunks_total
    assert changed.embedding_cache_hits == 0
    assert other.titles == 3
    assert EmbeddingCache.under(settings.data_dir).count() == 2 * (first.chunks_total + 3)


def test_cached_bad_vector_is_not_reused(tmp_path, kb):
    settings = make_settings(tmp_path / "data", kb)
    (kb / "ops" / "beta.md").unlink()
    emb = HashEmbedder(DIM)
    plan = _plan(settings, emb, [InMemoryStore()])
    cache = EmbeddingCache.under(settings.data_dir)
    cache.put_many(emb.identity(), {c.content_hash: np.zeros(DIM, np.float32) for c in plan.to_embed()})
    embeddings = embed_plan(plan, emb, cache)
    assert embeddings.cache_hits == 0 and embeddings.embedded == len(plan.to_embed())


def test_plan_makes_no_write_and_refuses_a_wipe(tmp_path, kb):
    from rag_core.ingest.plan import IngestRefusedError

    settings = make_settings(tmp_path / "data", kb)
    store, emb = InMemoryStore(), HashEmbedder(DIM)
    ingest(settings, emb, [store], progress=False)
    for doc in ("alpha", "gamma", "delta"):
        (kb / "ops" / f"{doc}.md").unlink()
    held = store.chunk_hashes()
    with pytest.raises(IngestRefusedError, match="RAG_INGEST_MAX_REMOVE_SHARE"):
        _plan(settings, emb, [store])
    assert store.chunk_hashes() == held


def test_rag_ingest_partial_exits_3_and_lists_the_document(tmp_path, kb, monkeypatch):
    from typer.testing import CliRunner

    import rag_core.components as components
    from rag_core.cli import app

    store = InMemoryStore()
    monkeypatch.setattr(components, "make_embedder", lambda settings: HashEmbedder(DIM))
    monkeypatch.setattr(components, "make_stores", lambda settings, sidecar=None: [store])
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    res = CliRunner().invoke(app, ["ingest", "--knowledge-dir", str(kb)])
    assert res.exit_code == 3, res.output
    assert "partial ingest: 1 document(s) skipped: ops/beta.md" in res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert {doc for doc, _ in store.chunk_hashes().values()} == {"ops/alpha.md", "ops/gamma.md", "ops/delta.md"}
    (kb / "ops" / "beta.md").unlink()
    monkeypatch.setenv("RAG_INGEST_MAX_REMOVE_SHARE", "1.0")
    assert CliRunner().invoke(app, ["ingest", "--knowledge-dir", str(kb)]).exit_code == 0


class NanForOneSection:
    """The real embedder, except that passages of one section come back NaN (a model fault)."""

    def __init__(self, inner, marker: str) -> None:
        self.inner, self.marker = inner, marker

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def embed_passages(self, texts, ids=None):
        out = np.array(self.inner.embed_passages(texts, ids), copy=True)
        for i, text in enumerate(texts):
            if text.startswith(self.marker):
                out[i] = np.nan
        return out


@pytest.mark.integration
def test_nan_vector_on_milvus_with_the_real_model_skips_only_its_document(tmp_path, kb_copy, embedder):
    from rag_core.stores.milvus import MilvusStore

    settings = make_settings(tmp_path / "data", kb_copy)
    store = MilvusStore.from_settings(settings)
    try:
        report = ingest(settings, NanForOneSection(embedder, "RedisMemoryHigh > Mitigation"), [store], progress=False)
        [issue] = report.skipped
        assert issue.path == "cache/RedisMemoryHigh.md" and issue.heading == "RedisMemoryHigh > Mitigation"
        assert "non-finite" in issue.reason and report.partial
        docs = {doc for doc, _ in store.chunk_hashes().values()}
        assert "cache/RedisMemoryHigh.md" not in docs
        assert len(docs) == report.documents_ingested >= 5 and store.count() == report.chunks_total
        healed = ingest(settings, embedder, [store], progress=False)  # the model is fixed: it comes in
        assert not healed.partial and healed.main.added > 0 and healed.passages_embedded < healed.chunks_total
        assert "cache/RedisMemoryHigh.md" in {doc for doc, _ in store.chunk_hashes().values()}
    finally:
        store.close()


def test_a_chunk_a_store_cannot_hold_skips_its_document_at_chunking(tmp_path, kb):
    from rag_core.components import chunk_checks

    long_title = "告" * 400  # 1,200 UTF-8 bytes: over Milvus's 1,024-byte VARCHAR title
    (kb / "ops" / "long.md").write_text(f"---\ntitle: {long_title}\n---\n# Long\n\n## Steps\n\nRestart it.\n")
    settings = make_settings(tmp_path / "data", kb)
    scan = scan_knowledge(settings.knowledge_dir, settings.max_document_bytes)
    unchecked = chunk_scan(scan.documents, HashEmbedder(DIM).count_tokens, 256)
    checked = chunk_scan(scan.documents, HashEmbedder(DIM).count_tokens, 256, chunk_checks(settings))
    assert "ops/long.md" in {d.doc_id for d in unchecked.documents}  # chunking alone knows no store limits
    issue = next(i for i in checked.issues if i.path == "ops/long.md")
    assert "title" in issue.reason and "1200" in issue.reason and "VARCHAR" in issue.reason
    assert {d.doc_id for d in checked.documents} == {d.doc_id for d in unchecked.documents} - {"ops/long.md"}
