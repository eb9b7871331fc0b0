"""The embedded Milvus server of a data dir: sharing, faults, idle stop, `rag server` (real engine)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import make_settings
from typer.testing import CliRunner

from rag_core.models import Chunk
from rag_core.stores import milvus_server
from rag_core.stores.base import StoreError
from rag_core.stores.milvus import MilvusStore

pytestmark = pytest.mark.integration
DIM = 8


def chunk(i: int) -> Chunk:
    return Chunk(
        chunk_id=f"c{i}",
        doc_id=f"d{i % 3}.md",
        title="T",
        breadcrumb=f"T > S{i}",
        category="cat",
        text=f"text {i} about redis memory",
        start=0,
        end=1,
        ordinal=i,
        content_hash=f"h{i}",
    )


def unit(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def wait_until(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return bool(cond())


@pytest.fixture
def data_dir(tmp_path):
    yield tmp_path
    milvus_server.stop_server(tmp_path)


@pytest.fixture
def filled(data_dir):
    """A store on the embedded server of ``data_dir`` holding 20 flushed rows."""
    store = MilvusStore("", "chunks", embedded_dir=data_dir)
    store.ensure_schema(DIM)
    vecs = unit(20)
    store.upsert([chunk(i) for i in range(20)], vecs)
    store.flush()
    yield store, vecs
    store.close()


def test_state_file_names_the_live_server(filled, data_dir):
    store, _ = filled
    state = milvus_server.server_status(data_dir)
    assert state is not None and state.pid == store.server_pid
    assert store.uri == state.uri and state.uri.startswith("http://127.0.0.1:")
    raw = json.loads((data_dir / milvus_server.STATE_NAME).read_text())
    assert raw["engine"] == "milvus-lite" and raw["engine_version"] == milvus_server.engine_version()
    assert raw["db_path"] == str((data_dir / "milvus.db").resolve())


def test_two_processes_starting_at_once_share_one_server(data_dir):
    code = (
        "import sys; from pathlib import Path; from rag_core.stores import milvus_server as m; "
        "print(m.ensure_server(Path(sys.argv[1])).pid)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(data_dir)], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    pids = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(pids) == 1
    engines = [
        p
        for p in psutil.process_iter(["cmdline"])
        if (p.info["cmdline"] or [""])[1:2] == [str((data_dir / "milvus.db").resolve())]
    ]
    assert len(engines) == 1


def test_stale_state_from_a_killed_server_is_replaced(filled, data_dir):
    store, vecs = filled
    old = milvus_server.server_status(data_dir)
    os.kill(old.pid, signal.SIGKILL)
    assert wait_until(lambda: milvus_server.server_status(data_dir) is None, 10)
    assert (data_dir / milvus_server.STATE_NAME).exists()  # stale file left behind
    new = milvus_server.ensure_server(data_dir)
    assert new.pid != old.pid
    fresh = MilvusStore("", "chunks", embedded_dir=data_dir)
    assert fresh.count() == 20 and fresh.search(vecs[4], 1)[0].chunk_id == "c4"  # nothing lost
    fresh.close()


def test_stale_pid_reused_by_another_program_is_not_taken_for_the_server(data_dir):
    db = str((data_dir / "milvus.db").resolve())
    fake = milvus_server.ServerState(
        pid=os.getpid(),
        host="127.0.0.1",
        port=9,
        engine="milvus-lite",
        engine_version="x",
        db_path=db,
        started_at=0.0,
        idle_stop_seconds=0,
    )
    milvus_server._write_state(data_dir / milvus_server.STATE_NAME, fake)
    (data_dir / milvus_server.LOCK_NAME).write_text("left over")  # a lock file of a dead process
    state = milvus_server.ensure_server(data_dir)
    assert state.pid != os.getpid() and state.port != 9


def test_port_in_use_is_skipped(data_dir, monkeypatch):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    ports = iter([busy_port])
    monkeypatch.setattr(milvus_server, "_pick_port", lambda host: next(ports, None) or milvus_server._free_port(host))
    try:
        state = milvus_server.ensure_server(data_dir)
    finally:
        busy.close()
    assert state.port != busy_port
    assert milvus_server.server_status(data_dir).pid == state.pid


def test_server_dying_between_lookups_is_restarted_once(filled, data_dir):
    store, vecs = filled
    first = store.server_pid
    os.kill(first, signal.SIGKILL)
    assert wait_until(
        lambda: not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE, 10
    )
    hits = store.search(vecs[7], 1)
    assert hits[0].chunk_id == "c7" and store.server_pid != first
    assert store.count() == 20


def test_threads_failing_together_share_one_restart(filled, data_dir):
    from concurrent.futures import ThreadPoolExecutor

    store, vecs = filled
    first = store.server_pid
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: milvus_server.server_status(data_dir) is None, 10)
    with ThreadPoolExecutor(8) as pool:
        top = list(pool.map(lambda i: store.search(vecs[i], 1)[0].chunk_id, range(16)))
    assert top == [f"c{i}" for i in range(16)]
    engines = [
        p
        for p in psutil.process_iter(["cmdline"])
        if (p.info["cmdline"] or [""])[1:2] == [str((data_dir / "milvus.db").resolve())]
    ]
    assert len(engines) == 1 and store.server_pid != first


def test_server_that_cannot_restart_gives_a_store_error_and_a_structured_result(filled, data_dir, monkeypatch):
    store, vecs = filled
    os.kill(store.server_pid, signal.SIGKILL)

    def no_binary() -> Path:
        raise StoreError("the embedded Milvus server binary is missing (test)")

    monkeypatch.setattr(milvus_server, "server_binary", no_binary)
    with pytest.raises(StoreError, match="binary is missing"):
        store.search(vecs[0], 1)

    from rag_core.lookup.tool import LookupKnowledgeTool

    class Emb:
        dimension = DIM

        def embed_query(self, text: str) -> np.ndarray:
            return vecs[0]

        def embed_queries(self, texts: list[str]) -> np.ndarray:
            return np.stack([vecs[0] for _ in texts])

    settings = make_settings(data_dir)
    tool = LookupKnowledgeTool(settings, embedder=Emb(), store=store)
    result = tool.lookup("redis memory")
    tool.close()
    payload = result.to_json()
    assert payload["found"] is False and "binary is missing" in json.dumps(payload)


def test_data_of_another_engine_names_rebuild_and_rebuild_keeps_it(data_dir):
    lite3 = data_dir / "milvus.db"
    (lite3 / "collections" / "knowledge_chunks").mkdir(parents=True)  # Milvus Lite 3's layout
    (lite3 / "collections" / "knowledge_chunks" / "manifest.json").write_text("{}")
    store = MilvusStore("", "knowledge_chunks", embedded_dir=data_dir)
    with pytest.raises(milvus_server.ForeignFormatError, match=r"rag ingest --rebuild"):
        store.count()
    store.drop()  # what `rag ingest --rebuild` does first
    store.ensure_schema(DIM)
    store.upsert([chunk(0)], unit(1))
    assert store.count() == 1
    kept = list(data_dir.glob("milvus.db.foreign-*"))
    assert len(kept) == 1 and (kept[0] / "collections" / "knowledge_chunks" / "manifest.json").exists()
    store.close()


def test_file_mode_refuses_foreign_data_too(tmp_path):
    (tmp_path / "milvus.db").write_text("not sqlite")
    store = MilvusStore(str(tmp_path / "milvus.db"), "chunks")
    with pytest.raises(milvus_server.ForeignFormatError, match=r"rag ingest --rebuild"):
        store.count()


def test_idle_server_stops_after_the_set_time_but_not_while_connected(data_dir):
    store = MilvusStore("", "chunks", embedded_dir=data_dir, idle_stop_seconds=1.0)
    store.ensure_schema(DIM)
    pid = store.server_pid
    time.sleep(3)
    assert milvus_server.server_status(data_dir).pid == pid  # a client is connected
    store.close()
    assert wait_until(lambda: milvus_server.server_status(data_dir) is None, 20)
    assert wait_until(lambda: not (data_dir / milvus_server.STATE_NAME).exists(), 10)


def test_idle_embedded_postgres_stops(pg_scratch_dir):
    import psycopg

    from rag_core.stores.pgserver import embedded_dsn, running_pid

    pgdata = pg_scratch_dir / "pgdata"
    dsn = embedded_dsn(pgdata, idle_stop_seconds=1.0)
    pid = running_pid(pgdata)
    with psycopg.connect(dsn) as conn:  # a connected client (an agent's pool) keeps it running
        time.sleep(3)
        assert conn.execute("SELECT 1").fetchone()[0] == 1
        assert running_pid(pgdata) == pid
    assert wait_until(lambda: running_pid(pgdata) is None, 30)


def test_rag_server_status_and_stop(filled, data_dir, monkeypatch):
    from rag_core.cli import app

    store, _ = filled
    monkeypatch.setenv("RAG_DATA_DIR", str(data_dir))
    runner = CliRunner()
    out = runner.invoke(app, ["server", "status", "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["server"]: r for r in json.loads(out.stdout)}
    assert rows["milvus"]["running"] and rows["milvus"]["pid"] == store.server_pid
    assert rows["milvus"]["uri"] == store.uri and rows["milvus"]["uptime_s"] >= 0
    assert rows["postgres"]["running"] is False
    store.close()
    out = runner.invoke(app, ["server", "stop", "--json"])
    assert out.exit_code == 0, out.output
    assert {r["server"]: r["stopped"] for r in json.loads(out.stdout)} == {"milvus": True, "postgres": False}
    assert milvus_server.server_status(data_dir) is None
    out = runner.invoke(app, ["server", "status"])
    assert out.exit_code == 0 and "not running" in out.stdout


def test_pool_starts_a_stopped_embedded_postgres_again(pg_scratch_dir):
    from rag_core.stores.pgserver import PgPool, embedded_dsn, running_pid, stop_embedded

    pgdata = pg_scratch_dir / "pgdata"
    pool = PgPool(embedded_dsn(pgdata))
    assert pool.run("select", lambda c: c.execute("SELECT 1").fetchone()[0]) == 1
    stop_embedded(pgdata, mode="immediate")  # as the idle watchdog or `rag server stop` does
    assert running_pid(pgdata) is None
    # The pooled connection is dead and the server gone: the pool starts it again and reconnects.
    assert pool.run("select", lambda c: c.execute("SELECT 2").fetchone()[0]) == 2
    assert running_pid(pgdata) is not None
    pool.close()


def test_pool_opens_lazily_with_autocommit_statement_timeout_and_configure(pg_dsn):
    from rag_core.stores.pgserver import PgPool

    configured = []
    pool = PgPool(
        pg_dsn, max_size=2, statement_timeout_ms=300, configure=lambda c: configured.append(c.info.backend_pid)
    )
    assert pool.get_stats()["pool_size"] == 0 and configured == []  # nothing connects before the first run
    pid, autocommit, timeout = pool.run(
        "settings", lambda c: (c.info.backend_pid, c.autocommit, c.execute("SHOW statement_timeout").fetchone()[0])
    )
    assert autocommit is True and timeout == "300ms"
    assert pool.run("pid", lambda c: c.info.backend_pid) == pid and configured == [pid]  # reused, configured once
    with pytest.raises(StoreError, match="slow query failed on .*statement timeout"):
        pool.run("slow query", lambda c: c.execute("SELECT pg_sleep(2)"))
    assert pool.run("after", lambda c: c.execute("SELECT 3").fetchone()[0]) == 3  # the pool is still usable
    with pytest.raises(StoreError, match="missing: run ensure_schema"):
        pool.run("select", lambda c: c.execute("SELECT * FROM no_such_table"), "missing: run ensure_schema")
    pool.close()
    with pytest.raises(StoreError, match="pool is closed"):
        pool.run("select", lambda c: c.execute("SELECT 1"))


def test_pool_with_every_connection_busy_waits_a_bounded_time(pg_dsn):
    import threading

    from rag_core.stores.pgserver import PgPool

    pool = PgPool(pg_dsn, max_size=1, acquire_timeout=0.5)
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=pool.run, args=("hold", lambda c: (held.set(), release.wait(10))))
    holder.start()
    try:
        assert held.wait(10)
        start = time.monotonic()
        with pytest.raises(StoreError, match=r"no free PostgreSQL connection .* after 0.5s \(all 1 in use\)"):
            pool.run("select", lambda c: c.execute("SELECT 1"))
        assert 0.4 < time.monotonic() - start < 5
    finally:
        release.set()
        holder.join(10)
    assert pool.run("select", lambda c: c.execute("SELECT 1").fetchone()[0]) == 1  # free again
    pool.close()


def test_pool_fails_fast_with_the_cause_when_connecting_fails(pg_dsn):
    from rag_core.stores.pgserver import PgPool

    down = PgPool("postgresql://rag:hunter2pw@127.0.0.1:1/rag", connect_timeout=1, acquire_timeout=30)
    start = time.monotonic()
    with pytest.raises(StoreError) as err:
        down.run("count", lambda c: c.execute("SELECT 1"))
    assert time.monotonic() - start < 10  # the failed connect, not the 30 s wait
    assert "connect failed on postgresql://rag:***@127.0.0.1:1/rag: OperationalError" in str(err.value)
    assert "hunter2pw" not in str(err.value)
    down.close()

    def no_extension(conn):
        raise StoreError("the pgvector extension is not available")

    unconfigurable = PgPool(pg_dsn, configure=no_extension, acquire_timeout=30)
    start = time.monotonic()
    with pytest.raises(StoreError, match="^the pgvector extension is not available$"):
        unconfigurable.run("count", lambda c: c.execute("SELECT 1"))
    assert time.monotonic() - start < 10
    unconfigurable.close()


def test_watchdog_stops_a_server_whose_data_dir_was_deleted(tmp_path):
    import shutil

    from rag_core.stores.idle_stop import watch
    from rag_core.stores.idle_stop_main import stopper

    data = tmp_path / "gone"
    state = milvus_server.ensure_server(data)
    shutil.rmtree(data)
    assert watch("milvus", state.pid, 0.5, stopper("milvus", data, state.pid), poll=0.2) == "stopped"
    assert wait_until(lambda: not milvus_server._serves(state.pid, state.db_path), 10)


def test_server_writes_nothing_outside_its_data_dir(tmp_path, monkeypatch):
    """The engine's log (glog), temp files and cache stay under the data dir: nothing in the
    system temp dir (TMPDIR) or the home directory of the process that started it."""
    tmp, home, data = tmp_path / "tmp", tmp_path / "home", tmp_path / "data"
    for d in (tmp, home, data):
        d.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RAG_MILVUS_LOG_LEVEL", "INFO")  # glog writes files at every level
    store = MilvusStore("", "chunks", embedded_dir=data)
    try:
        store.ensure_schema(DIM)
        store.upsert([chunk(i) for i in range(5)], unit(5))
        store.flush()
        assert store.search(unit(1)[0], 3)
    finally:
        store.close()
        milvus_server.stop_server(data)
    assert not list(tmp.iterdir()) and not list(home.iterdir())
    assert "Start milvus-local success" in (data / milvus_server.LOG_NAME).read_text()
