"""Streaming ingest (issue 23): documents are loaded, chunked, planned, embedded and written a
batch at a time, and the result is the one of a whole-corpus ingest.

Also: an interrupted ingest (Ctrl-C after batch k) resumes without embedding anything done;
a full disk (ENOSPC from a store write or the embedding cache) stops the run with one line and
the previous index stays searchable; bad files are reported one line each with a count.
Small fakes only (no model, no server).
"""

from __future__ import annotations

import errno
import os
import pathlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from conftest import make_settings
from fakes import HashEmbedder

from rag_core.ingest.documents import scan_documents
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.pipeline import IngestInterrupted, IngestRefusedError, ingest
from rag_core.l0 import L0Index
from rag_core.stores.memory import InMemoryStore

N_DOCS = 9
DIM = 8


class FakeEmbedder(HashEmbedder):
    """The shared hash embedder at this module's dimension."""

    def __init__(self, fingerprint: str = "f" * 16, checked: bool = True) -> None:
        super().__init__(DIM, fingerprint, checked)


def _doc(i: int, extra: str = "") -> str:
    return (
        f"---\ntitle: Service {i} latency\nkeywords: [svc{i}]\n---\n# Svc{i}HighLatency\n\n"
        f"Service {i} answers slowly.\n\n## Diagnosis\n\nCheck the p99 of service {i}.\n\n"
        f"## Mitigation\n\nScale service {i} out.{extra}\n"
    )


def _tree(root: Path, n: int = N_DOCS) -> Path:
    for i in range(n):
        path = root / f"team{i % 3}" / f"svc-{i:02d}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_doc(i))
    return root


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    return _tree(tmp_path / "kb")


class InterruptAfter(FakeEmbedder):
    """A FakeEmbedder whose chunk-passage call number ``calls_ok + 1`` raises KeyboardInterrupt
    (Ctrl-C in the middle of the embed stage)."""

    def __init__(self, calls_ok: int) -> None:
        super().__init__()
        self.calls_ok, self.passage_calls = calls_ok, 0

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> np.ndarray:
        if not any(label.startswith("title") for label in ids or ()):
            self.passage_calls += 1
            if self.passage_calls > self.calls_ok:
                raise KeyboardInterrupt
        return super().embed_passages(texts, ids)


class DiskFullStore(InMemoryStore):
    """An InMemoryStore whose upsert number ``ok + 1`` raises OSError(ENOSPC), as a full disk
    does (or KeyboardInterrupt with ``ctrl_c``); a rebuild's fresh store fails the same way."""

    def __init__(self, ok: int, ctrl_c: bool = False) -> None:
        super().__init__()
        self.ok, self.upserts, self.ctrl_c = ok, 0, ctrl_c

    def upsert(self, chunks, vectors) -> None:
        self.upserts += 1
        if self.upserts > self.ok:
            if self.ctrl_c:
                raise KeyboardInterrupt
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/milvus/segment")
        super().upsert(chunks, vectors)

    @contextmanager
    def rebuild(self) -> Iterator[InMemoryStore]:
        with super().rebuild() as fresh:
            fresh.upsert = self.upsert  # type: ignore[method-assign]
            yield fresh


def _docs_of(store: InMemoryStore) -> set[str]:
    return {doc for doc, _ in store.chunk_hashes().values()}


def test_batches_give_the_whole_corpus_result(tmp_path, kb):
    whole, batched = InMemoryStore(), InMemoryStore()
    s1, s2 = make_settings(tmp_path / "d1", kb), make_settings(tmp_path / "d2", kb)
    r1 = ingest(s1, FakeEmbedder(), [whole], progress=False, batch_docs=1000)
    r2 = ingest(s2, FakeEmbedder(), [batched], progress=False, batch_docs=2)
    assert batched.chunk_hashes() == whole.chunk_hashes()
    assert (r2.documents_seen, r2.documents_ingested, r2.chunks_total) == (
        r1.documents_seen,
        r1.documents_ingested,
        r1.chunks_total,
    )
    assert r2.main == r1.main
    # The L0 index streamed to disk is the one L0Index.build makes of every document.
    docs, _ = scan_documents(kb)
    counts: dict[str, int] = {}
    for _cid, (doc, _h) in whole.chunk_hashes().items():
        counts[doc] = counts.get(doc, 0) + 1
    expected = L0Index.build(docs, counts)
    assert L0Index.load(s2.l0_index_path).entries == expected.entries
    assert L0Index.load(s1.l0_index_path).entries == expected.entries


def test_changes_and_removals_across_batches_match_a_fresh_ingest(tmp_path, kb):
    settings = make_settings(tmp_path / "data", kb)
    store = InMemoryStore()
    ingest(settings, FakeEmbedder(), [store], progress=False, batch_docs=2)
    (kb / "team0" / "svc-03.md").unlink()  # removed
    (kb / "team1" / "svc-04.md").write_text(_doc(4).split("## Mitigation")[0])  # a section fewer
    (kb / "team2" / "svc-05.md").write_text(_doc(5, " Then page the owner."))  # changed text
    (kb / "team0" / "svc-99.md").write_text(_doc(99))  # added
    report = ingest(settings, FakeEmbedder(), [store], progress=False, batch_docs=2)
    fresh = InMemoryStore()
    ingest(make_settings(tmp_path / "fresh", kb), FakeEmbedder(), [fresh], progress=False)
    assert store.chunk_hashes() == fresh.chunk_hashes()
    assert report.main.removed == 4  # svc-03's three chunks and svc-04's Mitigation
    assert report.main.added == 3 and report.main.updated == 1
    assert "team0/svc-03.md" not in L0Index.load(settings.l0_index_path).entries


def test_wipe_refusal_keeps_working_and_writes_nothing(tmp_path, kb):
    settings = make_settings(tmp_path / "data", kb)
    store = InMemoryStore()
    ingest(settings, FakeEmbedder(), [store], progress=False, batch_docs=2)
    held, l0 = store.chunk_hashes(), settings.l0_index_path.read_bytes()
    for i in range(6):
        next(kb.rglob(f"svc-{i:02d}.md")).unlink()
    with pytest.raises(IngestRefusedError, match="RAG_INGEST_MAX_REMOVE_SHARE"):
        ingest(settings, FakeEmbedder(), [store], progress=False, batch_docs=2)
    assert store.chunk_hashes() == held and settings.l0_index_path.read_bytes() == l0
    for path in kb.rglob("*.md"):
        path.unlink()
    with pytest.raises(IngestRefusedError, match="no Markdown document found"):
        ingest(settings, FakeEmbedder(), [store], progress=False)
    assert store.chunk_hashes() == held


@pytest.mark.parametrize("existing", [False, True], ids=["new-index", "existing-index"])
def test_interrupted_ingest_resumes_without_re_embedding(tmp_path, kb, existing):
    """Ctrl-C after batch k; the re-run embeds only what was not done, and ends where a clean
    run ends. Counted with the fake embedder's passage counter."""
    settings, clean_settings = make_settings(tmp_path / "data", kb), make_settings(tmp_path / "clean", kb)
    store, clean = InMemoryStore(), InMemoryStore()
    if existing:  # an index of the old texts (twice: the clean run's too), then every document changes
        ingest(settings, FakeEmbedder(), [store], progress=False)
        ingest(clean_settings, FakeEmbedder(), [clean], progress=False)
        for i in range(N_DOCS):
            next(kb.rglob(f"svc-{i:02d}.md")).write_text(_doc(i, " Edited."))
    clean_emb = FakeEmbedder()
    ingest(clean_settings, clean_emb, [clean], progress=False)

    first = InterruptAfter(calls_ok=2)  # one call per batch of 3 documents: batch 3 is cut
    with pytest.raises(IngestInterrupted, match="interrupted after 6 of 9 documents"):
        ingest(settings, first, [store], progress=False, batch_docs=3)
    assert first.texts > 0
    second = FakeEmbedder()
    report = ingest(settings, second, [store], progress=False, batch_docs=3)
    assert first.texts + second.texts == clean_emb.texts  # nothing embedded twice
    assert second.titles + first.titles <= clean_emb.titles
    assert store.chunk_hashes() == clean.chunk_hashes()
    assert store.recorded_model() == second.identity()
    assert report.embedding_cache_hits + report.passages_embedded == report.chunks_embedded
    assert L0Index.load(settings.l0_index_path).entries == L0Index.load(clean_settings.l0_index_path).entries


def test_interrupted_rebuild_keeps_the_previous_index(tmp_path, kb):
    settings = make_settings(tmp_path / "data", kb)
    store = DiskFullStore(ok=10**6, ctrl_c=True)
    ingest(settings, FakeEmbedder(), [store], progress=False)
    held, l0 = store.chunk_hashes(), settings.l0_index_path.read_bytes()
    store.ok, store.upserts = 1, 0  # Ctrl-C in the second batch's write into the new index
    with pytest.raises(IngestInterrupted, match="after 3 of 9 documents"):
        ingest(settings, FakeEmbedder(), [store], progress=False, rebuild=True, batch_docs=3)
    assert store.chunk_hashes() == held and store.recorded_model() == FakeEmbedder().identity()
    assert settings.l0_index_path.read_bytes() == l0


def test_disk_full_in_a_store_write_stops_and_leaves_the_previous_index(tmp_path, kb):
    settings = make_settings(tmp_path / "data", kb)
    store = DiskFullStore(ok=10**6)
    emb = FakeEmbedder()
    ingest(settings, emb, [store], progress=False)
    before_docs, l0 = _docs_of(store), settings.l0_index_path.read_bytes()
    for i in range(N_DOCS):
        next(kb.rglob(f"svc-{i:02d}.md")).write_text(_doc(i, " Edited."))
    (kb / "team0" / "svc-00.md").unlink()
    store.ok, store.upserts = 1, 0  # the second batch's write hits a full disk
    with pytest.raises(OSError) as info:
        ingest(settings, emb, [store], progress=False, batch_docs=3)
    assert info.value.errno == errno.ENOSPC
    # Still searchable: every document of the previous ingest (removals wait for the end), the
    # model recorded, the old L0 index in place.
    assert _docs_of(store) == before_docs
    assert store.recorded_model() == emb.identity()
    assert settings.l0_index_path.read_bytes() == l0
    assert store.search(emb.embed_query("service 4 latency"), 3)
    assert not list(settings.l0_index_path.parent.glob(".*.tmp"))


def _cli(tmp_path, kb, monkeypatch, embedder, store, *extra: str):
    from typer.testing import CliRunner

    import rag_core.components as components
    from rag_core.cli import app

    monkeypatch.setattr(components, "make_embedder", lambda settings: embedder)
    monkeypatch.setattr(components, "make_stores", lambda settings, sidecar=None: [store])
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_INGEST_BATCH_DOCS", "3")
    return CliRunner().invoke(app, ["ingest", "--knowledge-dir", str(kb), *extra])


def test_rag_ingest_disk_full_is_one_line(tmp_path, kb, monkeypatch):
    res = _cli(tmp_path, kb, monkeypatch, FakeEmbedder(), DiskFullStore(ok=1))
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    # The first batch was written into the served index before the disk filled: the line says so.
    assert lines == [
        f"ingest failed: cannot write /data/milvus/segment: No space left on device (RAG_DATA_DIR={tmp_path / 'data'})"
        "; the served index of memory now holds part of this run's changes until the next `rag ingest`, "
        "which rewrites it whole from the embedding cache"
    ]


def test_rag_ingest_cache_full_is_one_line(tmp_path, kb, monkeypatch):
    def full(self, identity, vectors):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    monkeypatch.setattr(EmbeddingCache, "put_many", full)
    store = InMemoryStore()
    res = _cli(tmp_path, kb, monkeypatch, FakeEmbedder(), store)
    assert res.exit_code == 1, res.output
    [line] = [ln for ln in res.output.splitlines() if ln.strip()]
    assert "embedding_cache.sqlite3: No space left on device" in line
    assert store.count() == 0  # nothing written without its vectors cached first


def test_sqlite_full_disk_is_raised_as_enospc(tmp_path):
    cache = EmbeddingCache(tmp_path / "c.sqlite3")
    ident = FakeEmbedder().identity()
    cache.put_many(ident, {"a": np.ones(8, np.float32)})
    import sqlite3

    conn = sqlite3.connect(cache.path)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    real_connect = EmbeddingCache._connect

    def capped(self):
        conn = real_connect(self)
        conn.execute(f"PRAGMA max_page_count = {pages}")  # the file cannot grow: SQLITE_FULL
        return conn

    cache._connect = capped.__get__(cache)  # type: ignore[method-assign]
    with pytest.raises(OSError) as info:
        cache.put_many(ident, {f"h{i}": np.ones(8, np.float32) for i in range(5000)})
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(cache.path)


def test_rag_ingest_ctrl_c_is_one_line_and_the_next_run_resumes(tmp_path, kb, monkeypatch):
    store = InMemoryStore()
    res = _cli(tmp_path, kb, monkeypatch, InterruptAfter(calls_ok=1), store)
    assert res.exit_code == 130, res.output
    [line] = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line.startswith("ingest interrupted after 3 of 9 documents") and "run it again to resume" in line
    again = FakeEmbedder()
    res = _cli(tmp_path, kb, monkeypatch, again, store)
    assert res.exit_code == 0, res.output
    assert 0 < again.texts < FakeEmbedder().texts + 3 * 9  # only the undone part
    assert len(_docs_of(store)) == N_DOCS


def test_bad_files_are_one_line_each_with_a_count(tmp_path, kb, monkeypatch):
    bad = kb / "bad"
    bad.mkdir()
    (bad / "yaml.md").write_text("---\ntitle: [unclosed\n---\n# X\n\nBody.\n")
    (bad / "utf8.md").write_bytes(b"# Title\n\nline two\n\xff\xfe bad bytes\n")
    (bad / "binary.md").write_bytes(b"# T\n\x00\x01")
    os.symlink("loop.md", bad / "loop.md")
    (bad / "secret.md").write_text("# Secret\n\nBody.\n")
    real_read = pathlib.Path.read_bytes

    def read_bytes(self):  # the tests run as root, who can read a chmod 000 file
        if self.name == "secret.md":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_read(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    store = InMemoryStore()
    res = _cli(tmp_path, kb, monkeypatch, FakeEmbedder(), store)
    assert res.exit_code == 3, res.output
    lines = res.output.splitlines()
    skipped = [ln for ln in lines if ln.startswith("skipped: ")]
    assert sorted(skipped) == [
        "skipped: bad/binary.md:2: binary file (NUL byte at byte offset 4)",
        "skipped: bad/loop.md: symlink loop (-> loop.md)",
        "skipped: bad/secret.md: cannot read file: Permission denied",
        "skipped: bad/utf8.md:4: not valid UTF-8: byte 0xff at byte offset 18",
        "skipped: bad/yaml.md:2: invalid YAML frontmatter: expected ',' or ']', but got '<stream end>'",
    ]
    assert "5 file(s) skipped" in lines
    assert _docs_of(store) == {f"team{i % 3}/svc-{i:02d}.md" for i in range(N_DOCS)}


def test_progress_counts_chunks_to_the_total(tmp_path, kb, capsys):
    settings = make_settings(tmp_path / "data", kb)
    report = ingest(settings, FakeEmbedder(), [InMemoryStore()], progress=True, batch_docs=2)
    err = capsys.readouterr().err
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("ingest: 100%") and f"{report.chunks_total}/{report.chunks_total}" in last
    assert "chunk/s" in last
