"""Issue 12 row 7: stores are verified against the last ingest (rows, model, sampled content
hashes, vectors, self-search) by ``warm_up`` and ``rag doctor``; a damaged or emptied index is an
error in the lookup trace, never "found nothing"."""

from __future__ import annotations

import json
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


# --- issue 44 item 2 / issue 46 item 4: document sets, and every store the last ingest wrote -------


def _drop_from_l0(settings) -> str:
    """Remove one document from the saved L0 index by hand; returns its doc id."""
    entries = json.loads(settings.l0_index_path.read_text())
    gone = entries.pop()["doc_id"]
    settings.l0_index_path.write_text(json.dumps(entries))
    return gone


def test_stores_l0_index_and_index_state_must_hold_the_same_documents(ingested, embedder):
    settings, store = ingested
    report = check_health(settings, [store], embedder.identity(), documents=True)
    assert report.ok and not report.document_problems, report.summary()

    gone = _drop_from_l0(settings)
    report = check_health(settings, [store], embedder.identity(), documents=True)
    assert not report.ok
    assert f"memory and the L0 index hold different documents: 1 ('{gone}') only in memory" in report.summary()

    # A document written since the last ingest (another writer): the store no longer matches the state.
    chunk = next(iter(store._chunks.values()))
    store.upsert([replace(chunk, chunk_id="extra", doc_id="extra/Other.md")], store._vectors[chunk.chunk_id][None, :])
    text = check_health(settings, [store], embedder.identity(), documents=True).summary()
    assert "memory holds" in text and "documents, not the" in text and "'extra/Other.md'" in text


def test_rag_doctor_exits_1_naming_the_document_the_l0_index_lacks(tmp_path, kb, embedder, monkeypatch):
    from typer.testing import CliRunner

    from rag_core.cli import app
    from rag_core.stores.milvus import MilvusStore

    settings = make_settings(tmp_path / "data", kb, milvus_mode="file")
    store = MilvusStore.from_settings(settings)
    ingest(settings, embedder, [store], progress=False)
    store.close()
    monkeypatch.setenv("RAG_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("RAG_MILVUS_MODE", "file")
    monkeypatch.setenv("RAG_SIDECAR_ENABLED", "false")
    gone = _drop_from_l0(settings)
    bad = CliRunner().invoke(app, ["doctor"])
    assert bad.exit_code == 1, bad.output
    assert f"milvus and the L0 index hold different documents: 1 ('{gone}') only in milvus" in bad.output.replace(
        "\n", " "
    )


def test_doctor_and_readiness_check_the_sidecar_the_last_ingest_wrote(
    tmp_path, kb, embedder, pg_dsn, pg_table, monkeypatch
):
    """The sidecar disabled for lookups (RAG_SIDECAR_ENABLED=false) but written by the last ingest,
    as after `make run`: `rag doctor` and the serve readiness check it all the same."""
    from typer.testing import CliRunner

    from rag_core.cli import app
    from rag_core.components import make_sidecar_store
    from rag_core.serve.service import LookupService
    from rag_core.stores.milvus import MilvusStore

    settings = make_settings(tmp_path / "data", kb, milvus_mode="file", pg_dsn=pg_dsn, pg_table=pg_table)
    milvus, sidecar = MilvusStore.from_settings(settings), make_sidecar_store(settings)
    ingest(settings, embedder, [milvus, sidecar], progress=False)
    milvus.close()
    for name, value in (("DATA_DIR", settings.data_dir), ("MILVUS_MODE", "file"), ("PG_DSN", pg_dsn)):
        monkeypatch.setenv(f"RAG_{name}", str(value))
    monkeypatch.setenv("RAG_PG_TABLE", pg_table)
    monkeypatch.setenv("RAG_SIDECAR_ENABLED", "false")
    ok = CliRunner().invoke(app, ["doctor"])
    assert ok.exit_code == 0, ok.output
    assert "milvus: ok" in ok.output and "pgvector: ok" in ok.output

    service = LookupService(LookupKnowledgeTool(settings, embedder=embedder))
    try:
        service.start()
        assert service.readiness()["sidecar"] == "not queried (RAG_SIDECAR_ENABLED=false); up"
        sidecar.delete_chunks(sorted(sidecar.chunk_hashes())[:1])
        service.tool.check_health()
        assert "problem: holds" in service.readiness()["sidecar"]
    finally:
        service.close()
        sidecar.close()
    bad = CliRunner().invoke(app, ["doctor"])
    assert bad.exit_code == 1 and "pgvector: holds" in bad.output, bad.output
