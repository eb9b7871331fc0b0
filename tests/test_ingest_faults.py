"""Faults leave the old index or the new one and say which (issue 44 item 3), on real Milvus
with the real model: a write fault mid-ingest into the served index is recorded before the
first write (``apply_pending.json``), named by the failed run, ``rag doctor`` and ``warm_up``, and
the next ingest rewrites that store whole, so it ranks exactly as a clean build of the same
corpus: same top-k chunks with the same dense and BM25 scores, and the same lookups.

The full-disk test fills a small tmpfs under the embedded Milvus server mid-ingest (it needs
root to mount; skipped otherwise). Without the rewrite (an incremental rerun over the rows the
fault left), 6 of its 12 top-10 lists differed from a clean build in BM25 scores and order."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess

import pytest
from conftest import make_settings
from fakes import DiskFullAfter

import rag_core.ingest.apply as apply_stage
from rag_core.health import check_health
from rag_core.ingest.index_state import pending_applies
from rag_core.ingest.pipeline import ingest
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.stores.base import StoreError
from rag_core.stores.milvus import MilvusStore
from rag_core.stores.milvus_server import stop_server
from rag_core.text import lexical_tokens

pytestmark = pytest.mark.integration  # the real model and the embedded Milvus server

QUERIES = (
    "redis memory usage is close to maxmemory",
    "consumer lag keeps growing on the orders topic",
    "RabbitMQ queue backlog",
    "evictions in the cache cluster",
    "page the cache owner",
    "dead letter queue filling up",
)


def change_corpus(kb) -> None:
    """Edit every document (a new section), add one and delete one: a run with many writes."""
    for i, path in enumerate(sorted(kb.rglob("*.md"))):
        if not path.name.startswith("_"):
            path.write_text(path.read_text() + f"\n\n## Escalation\n\nPage the cache owner, step {i}.\n")
    (kb / "cache" / "RedisClusterDown.md").write_text(
        "---\ntitle: Redis cluster down\n---\n# RedisClusterDown\n\nAll Redis nodes are down.\n\n"
        "## Diagnosis\n\nCheck the cache cluster nodes and their evictions.\n"
    )
    next(kb.rglob("RabbitMQQueueBacklog.md")).unlink()


def ranking(store, embedder) -> list:
    """Top 10 of each query on both channels: (chunk id, raw score to 4 decimals); BM25 included."""
    out = []
    for q in QUERIES:
        v = embedder.embed_query(q)
        for hits in (store.search(v, 10), store.search_lexical(sorted(set(lexical_tokens(q))), v, 10)):
            out.append([(h.chunk_id, round(h.raw_score, 4), round(h.lexical_score or 0.0, 4)) for h in hits])
    return out


def lookups(settings, store, embedder) -> list:
    tool = LookupKnowledgeTool(settings, embedder=embedder, store=store)
    try:
        return [
            [(b.doc_id, b.chunk_id, round(b.final_score, 4)) for b in tool.lookup(q).evidence_blocks] for q in QUERIES
        ]
    finally:
        tool.close()


def test_a_write_fault_mid_ingest_is_named_and_the_rerun_ranks_like_a_clean_build(
    tmp_path, kb_copy, embedder, monkeypatch
):
    settings = make_settings(tmp_path / "data", kb_copy)
    store = MilvusStore.from_settings(settings)
    ingest(settings, embedder, [store], progress=False)
    change_corpus(kb_copy)
    monkeypatch.setattr(apply_stage, "UPSERT_BATCH", 4)
    with pytest.raises(OSError) as info:
        ingest(settings, embedder, [DiskFullAfter(store, ok=1)], progress=False)
    assert info.value.errno == errno.ENOSPC
    # Said: the store is recorded as part-written by this process, and the health check names it.
    assert pending_applies(settings)["milvus"]["pid"] == os.getpid()
    health = check_health(settings, [store], embedder.identity())
    assert not health.ok and "stopped while writing it" in health.summary()

    monkeypatch.setattr(apply_stage, "UPSERT_BATCH", 512)
    recovered = ingest(settings, embedder, [store], progress=False)
    assert "rewritten whole" in recovered.rewritten["milvus"] and not pending_applies(settings)
    assert check_health(settings, [store], embedder.identity(), documents=True).ok

    assert_same_as_a_clean_build(tmp_path, kb_copy, settings, store, embedder)


def test_rag_ingest_write_fault_says_which_store_holds_part_of_the_run(tmp_path, kb_copy, embedder, monkeypatch):
    from typer.testing import CliRunner

    import rag_core.components as components
    from rag_core.cli import app

    settings = make_settings(tmp_path / "data", kb_copy)
    store = MilvusStore.from_settings(settings)
    ingest(settings, embedder, [store], progress=False)
    change_corpus(kb_copy)
    monkeypatch.setattr(apply_stage, "UPSERT_BATCH", 4)
    monkeypatch.setattr(components, "make_embedder", lambda settings: embedder)
    monkeypatch.setattr(components, "make_stores", lambda settings, sidecar=None: [DiskFullAfter(store, ok=1)])
    monkeypatch.setenv("RAG_DATA_DIR", str(settings.data_dir))
    res = CliRunner().invoke(app, ["ingest", "--knowledge-dir", str(kb_copy)])
    assert res.exit_code == 1, res.output
    [line] = [ln for ln in res.output.replace("\n", " ").split("ingest failed:")[1:]]
    assert "No space left on device" in line and "served index of milvus now holds part of this run's changes" in line


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs to fill (mounted here, unmounted after); skipped when mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: cannot make a small disk to fill")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {res.stderr.strip()}")
    yield disk
    stop_server(disk / "data")  # the embedded Milvus server keeps files open on it
    subprocess.run(["umount", "-l", str(disk)], check=False)


class FillsTheDisk:
    """A real store whose first upsert first fills the disk ``ballast`` is on (the Milvus server's
    own writes then fail, as on a disk filled by something else)."""

    def __init__(self, inner, ballast) -> None:
        self.inner, self.ballast, self.filled = inner, ballast, False
        self.name, self.score_label = inner.name, inner.score_label

    def upsert(self, chunks, vectors):
        if not self.filled:
            self.filled = True
            with open(self.ballast, "wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(bytes(1 << 16))
        self.inner.upsert(chunks, vectors)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def test_a_full_disk_mid_ingest_then_freed_reruns_to_a_clean_build(small_disk, tmp_path, kb_copy, embedder):
    settings = make_settings(small_disk / "data", kb_copy)
    store = MilvusStore.from_settings(settings)
    ingest(settings, embedder, [store], progress=False)
    change_corpus(kb_copy)
    with pytest.raises((OSError, StoreError)):
        ingest(settings, embedder, [FillsTheDisk(store, small_disk / "ballast")], progress=False)
    assert "milvus" in pending_applies(settings)
    (small_disk / "ballast").unlink()  # space freed

    recovered = ingest(settings, embedder, [store], progress=False)
    assert "rewritten whole" in recovered.rewritten["milvus"]
    assert_same_as_a_clean_build(tmp_path, kb_copy, settings, store, embedder)


def assert_same_as_a_clean_build(tmp_path, kb_copy, settings, store, embedder) -> None:
    """``store`` (recovered after a fault) holds the chunks, rankings and lookups a clean build of
    ``kb_copy`` gives; closes both stores."""
    clean_settings = make_settings(tmp_path / "clean", kb_copy)
    clean = MilvusStore.from_settings(clean_settings)
    ingest(clean_settings, embedder, [clean], progress=False)
    assert store.chunk_hashes() == clean.chunk_hashes()
    assert ranking(store, embedder) == ranking(clean, embedder)
    assert lookups(settings, store, embedder) == lookups(clean_settings, clean, embedder)
    store.close()
    clean.close()
