"""Issue 12 row 7: stores are verified against the last ingest (rows, model, sampled content
hashes, vectors, self-search) by ``warm_up`` and ``rag doctor``; a damaged or emptied index is an
error in the lookup trace, never "found nothing"."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
from conftest import SAMPLE_KNOWLEDGE_DIR, make_settings

from rag_core.health import check_health
from rag_core.ingest.index_state import state_path
from rag_core.ingest.pipeline import ingest
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.stores.memory import InMemoryStore

pytestmark = pytest.mark.integration  # the real embedding model


@pytest.fixture
def kb(tmp_path):
    dst = tmp_path / "kb"
    for folder in ("cache", "queues"):
        shutil.copytree(SAMPLE_KNOWLEDGE_DIR / folder, dst / folder)
    return dst


@pytest.fixture
def ingested(tmp_path, kb, embedder):
    settings = make_settings(tmp_path / "data", kb)
    store = InMemoryStore()
    ingest(settings, embedder, [store], progress=False)
    return settings, store


def test_a_fresh_ingest_is_healthy(ingested, embedder):
    settings, store = ingested
    assert state_path(settings).exists()
    report = check_health(settings, [store], embedder.identity())
    assert report.ok, report.summary()
    assert report.stores[0].rows == store.count() and report.stores[0].checked_chunks > 0


def test_lost_rows_are_named(ingested, embedder):
    settings, store = ingested
    victim = sorted(store.chunk_hashes())[0]
    store.delete_chunks([victim])
    report = check_health(settings, [store], embedder.identity())
    assert not report.ok
    text = report.summary()
    assert f"holds {store.count()} rows but the last ingest left {store.count() + 1}" in text
    assert "sampled chunks are missing" in text


def test_damaged_rows_and_a_damaged_vector_index_are_found(ingested, embedder):
    settings, store = ingested
    cid = sorted(store.chunk_hashes())[0]
    chunk = store._chunks[cid]
    store.upsert([replace(chunk, text=chunk.text + " garbage")], store._vectors[cid][None, :])
    report = check_health(settings, [store], embedder.identity())
    assert "content that does not match their hash" in report.summary()

    class WrongIndex(InMemoryStore):
        def search(self, vector, top_k, category=None):  # answers with unrelated chunks
            return list(reversed(super().search(-vector, top_k, category)))

    settings2 = settings.model_copy(update={"data_dir": settings.data_dir.parent / "data2"})
    broken = WrongIndex()
    ingest(settings2, embedder, [broken], progress=False)
    assert "does not find" in check_health(settings2, [broken], embedder.identity()).summary()


def test_text_warm_up_loads_the_chinese_dictionary(monkeypatch):
    import jieba

    from rag_core import text

    monkeypatch.setattr(jieba.dt, "initialized", False)  # as in a fresh process
    text.warm_up()
    assert jieba.dt.initialized


def test_warm_up_reports_and_lookups_carry_the_problem(ingested, embedder, monkeypatch):
    from rag_core import text

    settings, store = ingested
    tool = LookupKnowledgeTool(settings, embedder=embedder, store=store)
    loads = []
    monkeypatch.setattr(text, "warm_up", lambda: loads.append(1))
    assert tool.warm_up().ok
    assert loads  # the first Chinese query does not load the dictionary
    assert tool.lookup("redis memory is high").status == "ok"
    store.delete_chunks(sorted(store.chunk_hashes())[:3])
    report = tool.warm_up()
    assert not report.ok
    r = tool.lookup("redis memory is high")
    assert r.status == "degraded" and "index check failed" in (r.retrieval_trace.error or "")


def test_an_emptied_index_is_an_error_not_found_nothing(ingested, embedder):
    settings, store = ingested
    tool = LookupKnowledgeTool(settings, embedder=embedder, store=store)
    store.delete_chunks(list(store.chunk_hashes()))
    r = tool.lookup("why is the sky blue")
    assert r.status == "error" and not r.found
    assert "the last ingest left" in (r.retrieval_trace.error or "")


def test_a_deleted_data_dir_under_a_live_tool_is_an_error(ingested, embedder):
    settings, store = ingested
    tool = LookupKnowledgeTool(settings, embedder=embedder, store=store)
    assert tool.lookup("redis memory is high").status == "ok"
    shutil.rmtree(settings.data_dir)
    r = tool.lookup("redis memory is high")
    assert r.status == "degraded" and "is gone" in (r.retrieval_trace.error or "")


def test_rag_doctor_on_milvus(tmp_path, kb, embedder, monkeypatch):
    from typer.testing import CliRunner

    from rag_core.cli import app
    from rag_core.stores.milvus import MilvusStore

    settings = make_settings(tmp_path / "data", kb, milvus_mode="file")
    store = MilvusStore.from_settings(settings)
    ingest(settings, embedder, [store], progress=False)
    monkeypatch.setenv("RAG_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("RAG_MILVUS_MODE", "file")
    monkeypatch.setenv("RAG_SIDECAR_ENABLED", "false")
    runner = CliRunner()
    store.close()
    ok = runner.invoke(app, ["doctor"])
    assert ok.exit_code == 0, ok.output
    assert "milvus: ok" in ok.output

    store = MilvusStore.from_settings(settings)
    hashes = store.chunk_hashes()
    store.delete_chunks(sorted(hashes)[:2])
    store.flush()
    store.close()
    bad = runner.invoke(app, ["doctor"])
    assert bad.exit_code == 1
    assert f"holds {len(hashes) - 2} rows but the last ingest left {len(hashes)}" in bad.output.replace("\n", " ")
