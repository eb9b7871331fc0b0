"""Incremental ingestion on real Milvus Lite with the real model over the sample knowledge base."""

import dataclasses
from contextlib import contextmanager

import pytest
from conftest import RUNBOOKS, make_settings, need_shared
from fakes import CountingEmbedder

import rag_core.ingest.apply as apply_stage
from rag_core.health import check_health
from rag_core.ingest.index_state import state_path
from rag_core.ingest.pipeline import chunk_documents, ingest
from rag_core.ingest.plan import scan_knowledge
from rag_core.stores.milvus import MilvusStore

pytestmark = pytest.mark.integration  # the real model, and Milvus Lite (file or embedded server)


class FailingAfter:
    """A real store whose upsert is interrupted after ``n`` successful calls (a run stopped mid-write)."""

    def __init__(self, inner, n):
        self.inner, self.n, self.written = inner, n, 0
        self.name, self.score_label = inner.name, inner.score_label

    def upsert(self, chunks, vectors):
        if self.n == 0:
            raise KeyboardInterrupt("simulated interruption")
        self.n -= 1
        self.inner.upsert(chunks, vectors)
        self.written += len(chunks)

    @contextmanager
    def rebuild(self):
        """The new collection of a rebuild / model change, interrupted alike."""
        with self.inner.rebuild() as fresh:
            self.inner = fresh
            yield self

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


@pytest.fixture
def env(tmp_path, kb_copy, embedder):
    settings = make_settings(tmp_path / "data", kb_copy, embedding_batch_size=32)
    store = MilvusStore.from_settings(settings)
    yield settings, store, CountingEmbedder(embedder), kb_copy
    store.close()


def test_unchanged_reingest_embeds_nothing(env):
    settings, store, emb, kb = env
    first = ingest(settings, emb, [store], progress=False)
    assert first.documents_ingested >= 5 and first.main.added == first.chunks_total == store.count()
    assert emb.count == first.chunks_total
    second = ingest(settings, emb, [store], progress=False)
    assert emb.count == first.chunks_total  # nothing re-embedded
    assert second.main.unchanged == first.chunks_total
    assert (second.main.added, second.main.updated, second.main.removed) == (0, 0, 0)
    assert settings.l0_index_path.exists()


def test_changed_and_deleted_documents(env):
    settings, store, emb, kb = env
    first = ingest(settings, emb, [store], progress=False)
    target = next(kb.rglob("RedisMemoryHigh.md"))
    doc_id = target.relative_to(kb).as_posix()
    text = target.read_text()
    target.write_text(text.replace("## Mitigation", "## Mitigation\n\nNew first step: page the cache owner.\n", 1))
    gone = next(kb.rglob("RabbitMQQueueBacklog.md"))
    gone_id = gone.relative_to(kb).as_posix()
    gone_chunks = sum(1 for _, (d, _) in store.chunk_hashes().items() if d == gone_id)
    gone.unlink()
    before = emb.count
    report = ingest(settings, emb, [store], progress=False)
    assert report.main.updated >= 1 and report.main.removed >= gone_chunks > 0
    assert emb.count - before == report.main.added + report.main.updated  # only changed chunks
    docs = {d for d, _ in store.chunk_hashes().values()}
    assert gone_id not in docs and doc_id in docs
    assert store.count() == first.chunks_total - gone_chunks + report.main.added


def test_interrupted_run_completes_without_duplicates(env, monkeypatch):
    settings, store, emb, kb = env
    scan = scan_knowledge(kb, settings.max_document_bytes)
    _, chunks = chunk_documents(scan.documents, settings, _NoReport(), emb)
    expected = {c.chunk_id: (c.doc_id, c.content_hash) for c in chunks}
    batch = 8
    assert len(expected) > 2 * batch  # several upsert batches, so the run can stop between them
    monkeypatch.setattr(apply_stage, "UPSERT_BATCH", batch)
    interrupted = FailingAfter(store, 2)
    with pytest.raises(KeyboardInterrupt):
        ingest(settings, emb, [interrupted], progress=False)
    # The two batches written before the interruption are in the store, exactly as planned.
    assert interrupted.written == 2 * batch
    store.flush()
    partial = store.chunk_hashes()
    assert len(partial) == store.count() == 2 * batch
    assert all(expected[cid] == held for cid, held in partial.items())
    assert not state_path(settings).exists()  # no index state claims the half-written store is complete
    # marked half-written: the next run must not take these rows for a complete index
    assert store.recorded_model() == emb.identity().incomplete()

    embedded = emb.count
    report = ingest(settings, emb, [store], progress=False)
    assert emb.count == embedded  # the interrupted run's vectors come from the embedding cache
    # rewritten whole (vectors from the cache): rows of an interrupted run are never trusted
    assert report.main.updated == len(partial) and report.main.added == len(expected) - len(partial)
    assert store.count() == report.chunks_total == len(expected)
    assert store.chunk_hashes() == expected  # every chunk once, none duplicated, none left over
    assert store.recorded_model() == emb.identity()
    health = check_health(settings, [store], emb.identity())
    assert health.ok, health.summary()


class OtherModel(CountingEmbedder):
    """The same model under another identity with other vectors (a same-dimension model change)."""

    def identity(self):
        return dataclasses.replace(self.inner.identity(), model_id="other-model", fingerprint="other")

    @property
    def fingerprint(self):
        return "other"

    def embed_passages(self, texts, ids=None):
        return self.inner.embed_passages(texts, ids)[:, ::-1].copy()


def test_interrupted_model_change_keeps_the_old_index_served_whole(env, monkeypatch):
    settings, store, emb, kb = env
    first = ingest(settings, emb, [store], progress=False)
    held = store.chunk_hashes()
    other = OtherModel(emb.inner)
    monkeypatch.setattr(apply_stage, "UPSERT_BATCH", 8)
    interrupted = FailingAfter(store, 2)
    with pytest.raises(KeyboardInterrupt):  # re-embedding for the other model stops after 2 batches
        ingest(settings, other, [interrupted], progress=False)
    assert interrupted.written == 16  # the new collection was being filled
    # The re-embedding went to a new collection: the old one still serves, whole, and the
    # partial build is gone (no collection but the index's own and its records).
    assert store.recorded_model() == emb.identity() and store.chunk_hashes() == held
    assert check_health(settings, [store], emb.identity()).ok
    names = set(store._call("list", lambda c: c.list_collections()))
    assert not [n for n in names if "__build_" in n], names
    # The model change, run again to the end, re-embeds everything and switches.
    monkeypatch.setattr(apply_stage, "UPSERT_BATCH", 512)
    again = ingest(settings, other, [store], progress=False)
    assert again.main.unchanged == 0 and again.main.updated == first.chunks_total
    assert store.recorded_model() == other.identity() and store.count() == first.chunks_total
    fresh = MilvusStore.from_settings(settings)  # another client follows the switch
    assert fresh.recorded_model() == other.identity() and fresh.chunk_hashes() == store.chunk_hashes()
    fresh.close()


class _NoReport:
    """Collects the chunking issues ``chunk_documents`` reports (none for the sample folders)."""

    def __init__(self):
        self.skipped = []


def test_bad_documents_are_reported_and_the_rest_ingested(env):
    settings, store, emb, kb = env
    (kb / "broken.md").write_bytes(b"---\ntitle: [unclosed\n---\n# Broken\nbody\n")
    (kb / "binary.md").write_bytes(b"\x00\x01\x02binary")
    (kb / "latin1.md").write_bytes("# Caf\xe9\n".encode("latin-1"))
    report = ingest(settings, emb, [store], progress=False)
    skipped = {i.path: i for i in report.skipped}
    assert {"broken.md", "binary.md", "latin1.md"} <= set(skipped)
    assert skipped["broken.md"].line is not None
    assert report.documents_ingested >= 5 and store.count() == report.chunks_total


def test_rebuild_starts_over(env):
    settings, store, emb, kb = env
    first = ingest(settings, emb, [store], progress=False)
    again = ingest(settings, emb, [store], rebuild=True, progress=False)
    assert again.main.added == first.chunks_total and store.count() == first.chunks_total


def test_missing_knowledge_dir_is_a_clear_error(tmp_path, embedder):
    settings = make_settings(tmp_path / "d", tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="nope"):
        ingest(settings, embedder, [MilvusStore.from_settings(settings)], progress=False)


def test_runbooks_corpus_crashloop_query_in_top3(tmp_path, embedder):
    root = need_shared(RUNBOOKS)
    from rag_core.lookup.tool import LookupKnowledgeTool

    settings = make_settings(tmp_path / "d", root)
    store = MilvusStore.from_settings(settings)
    report = ingest(settings, embedder, [store], progress=False)
    assert report.documents_ingested == 108 and all(i.path.endswith("_index.md") for i in report.skipped)
    tool = LookupKnowledgeTool(settings, embedder=embedder, store=store)
    result = tool.lookup("pod keeps restarting with back-off")
    assert "kubernetes/KubePodCrashLooping.md" in [b.doc_id for b in result.evidence_blocks[:3]]
    tool.close()


class RecordingStore:
    """A real store that records the order of its write calls."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.name, self.score_label = inner.name, inner.score_label

    def __getattr__(self, attr):
        value = getattr(self.inner, attr)
        if attr in ("upsert", "delete_chunks", "delete_documents", "flush"):

            def record(*args, **kwargs):
                self.calls.append(attr)
                return value(*args, **kwargs)

            return record
        return value


def test_every_ingest_write_stage_ends_with_a_flush(env):
    """Searches in the writing process then run on sealed segments, as in a fresh process."""
    settings, store, emb, kb = env
    rec = RecordingStore(store)
    ingest(settings, emb, [rec], progress=False)
    assert "upsert" in rec.calls and rec.calls[-1] == "flush"
    assert store.pending_rows == 0
    next(kb.rglob("RabbitMQQueueBacklog.md")).unlink()  # a run that only deletes
    rec.calls.clear()
    ingest(settings, emb, [rec], progress=False)
    assert rec.calls == ["delete_chunks", "flush"] and store.pending_rows == 0
    fresh = MilvusStore.from_settings(settings)  # another client sees exactly the same rows
    assert fresh.count() == store.count() and fresh.chunk_hashes() == store.chunk_hashes()
    fresh.close()


def _kb(root, names):
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / f"{name}.md").write_text(f"---\ntitle: {name}\n---\n# {name}\n\n{name} runbook body text.\n")
    return root


def test_ingest_refuses_to_wipe_the_index_unless_pruning_is_asked_for(tmp_path, embedder):
    from rag_core.ingest.pipeline import IngestRefusedError
    from rag_core.stores.memory import InMemoryStore

    full = _kb(tmp_path / "full", ["alpha", "beta", "gamma", "delta"])
    settings = make_settings(tmp_path / "data", full)
    store = InMemoryStore()
    ingest(settings, embedder, [store], progress=False)
    before, l0_before = store.chunk_hashes(), settings.l0_index_path.read_bytes()

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(IngestRefusedError, match=f"no Markdown document found under {empty}"):
        ingest(settings, embedder, [store], knowledge_dir=empty, progress=False)
    shrunk = _kb(tmp_path / "shrunk", ["alpha"])
    with pytest.raises(IngestRefusedError, match=r"holds 4: this ingest would remove 3 \(75%"):
        ingest(settings, embedder, [store], knowledge_dir=shrunk, progress=False)
    assert store.chunk_hashes() == before and settings.l0_index_path.read_bytes() == l0_before

    report = ingest(settings, embedder, [store], knowledge_dir=shrunk, progress=False, prune=True)
    assert report.stores["memory"].removed == 3
    assert {doc for doc, _ in store.chunk_hashes().values()} == {"alpha.md"}


def test_rag_ingest_on_an_empty_dir_exits_1_and_names_prune(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rag_core.cli import app

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    res = CliRunner().invoke(app, ["ingest", "--knowledge-dir", str(empty)])
    assert res.exit_code == 1 and "--prune" in res.output and str(empty) in res.output.replace("\n", "")
