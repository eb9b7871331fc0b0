"""Ingest while the agent serves (issue 14 item 4): 8-thread lookups in this process while
another process runs `rag ingest` of the runbook corpus on the same embedded Milvus server."""

import pytest
from conftest import RUNBOOKS, make_settings, need_shared
from rebuild_serving import run_rebuild

from bench import serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

QUERIES = [
    "pod keeps restarting with back-off",
    "node is not ready",
    "disk will fill up in 4 hours",
    "prometheus target down",
    "etcd has no leader",
    "KubeAPIErrorBudgetBurn",
    "alertmanager config reload failed",
    "CPU throttling high",
    "persistent volume filling up",
    "kubelet too many pods",
    "deployment replicas mismatch",
    "TargetDown job=node-exporter",
]


def test_lookups_never_fail_while_another_process_ingests(tmp_path, embedder):
    corpus = need_shared(RUNBOOKS)
    settings = make_settings(tmp_path / "data", corpus)
    run = serving.run(settings, embedder, QUERIES, corpus, tmp_path / "work", threads=8, timeout_s=600)
    summary = run.summary()
    assert run.ingest_returncode == 0, run.ingest_output
    assert run.lookups_during_ingest >= 8, summary  # the two really overlapped
    assert run.failures == [], summary
    assert run.foreign_hits == [], summary  # every hit is a chunk of the old or the new index
    assert run.traces == run.lookups, summary
    assert run.new_doc_found_after, summary


def _rebuild_under_lookups(settings, embedder, store, pg_dsn=None):
    """Fill the index, then loop lookups on ``store`` while another process runs
    `rag ingest --rebuild` of the same corpus; every lookup must be a whole answer."""
    from rag_core.components import make_stores
    from rag_core.ingest.pipeline import ingest

    stores = make_stores(settings, pg_dsn is not None)
    ingest(settings, embedder, stores, progress=False)
    for s in stores:
        s.close()
    run = run_rebuild(settings, embedder, QUERIES, [store], pg_dsn=pg_dsn)
    summary = run.summary()
    assert run.rebuild_returncode == 0, run.rebuild_output
    assert run.lookups_during_rebuild >= 8, summary  # the two really overlapped
    assert run.bad == [], summary  # none degraded, none without the document it found before
    assert run.rows_before > 0 and run.rows_after == run.rows_before and run.lost_chunk_ids == 0, summary


def test_rebuild_in_another_process_never_shows_a_half_built_milvus_index(tmp_path, embedder):
    from rag_core.stores.milvus import MilvusStore
    from rag_core.stores.milvus_server import stop_server

    settings = make_settings(tmp_path / "data", need_shared(RUNBOOKS))
    try:
        _rebuild_under_lookups(settings, embedder, MilvusStore.from_settings(settings))
    finally:
        stop_server(settings.data_dir)


def test_rebuild_in_another_process_never_shows_a_half_built_pgvector_table(tmp_path, embedder, pg_dsn, pg_table):
    from rag_core.stores.milvus_server import stop_server
    from rag_core.stores.pgvector import PgVectorStore

    settings = make_settings(
        tmp_path / "data", need_shared(RUNBOOKS), pg_dsn=pg_dsn, pg_table=pg_table, sidecar_enabled=True
    )
    try:
        _rebuild_under_lookups(settings, embedder, PgVectorStore(pg_dsn, pg_table), pg_dsn=pg_dsn)
    finally:
        pg = PgVectorStore(pg_dsn, pg_table)
        pg.drop()
        pg.close()
        stop_server(settings.data_dir)
