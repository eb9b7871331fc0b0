"""Faults under load against `rag serve` on the real stack (sample knowledge base in the embedded
Milvus, the default model, traces in the embedded PostgreSQL):

* the server SIGKILLed with lookups in flight, the trace store cut for part of the load: after a
  restart, every call that got an answer has its ``tool_invocation`` row (stored, or spooled and
  replayed by the restarted server);
* the embedded Milvus server SIGKILLed (and kept from restarting) under load: every call answers
  with the same honest degraded result the library gives in process, then, once Milvus may start
  again, with the evidence of before.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

pytest.importorskip("mcp", reason="the serve extra (mcp, fastapi) is not installed")

import uvicorn  # noqa: E402
from fakes import SwitchableProxy  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from rag_core.lookup.tool import LookupKnowledgeTool  # noqa: E402
from rag_core.serve.http_app import served_app  # noqa: E402
from rag_core.serve.service import LookupService  # noqa: E402
from rag_core.stores import milvus_server  # noqa: E402
from rag_core.stores.base import StoreError  # noqa: E402
from rag_core.traces.store import TraceStore  # noqa: E402

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
RAG = [sys.executable, "-c", "from rag_core.cli import main; main()"]
QUERIES = ["RedisMemoryHigh fired on redis-main", "kafka consumer lag keeps growing", "checkout pod OOMKilled"]
CLIENTS = 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.25)
    return bool(cond())


def _doc_ids(result_json: dict) -> list[str]:
    return [b["docId"] for b in result_json["evidenceBlocks"]]


class Load:
    """``CLIENTS`` threads posting ``/v1/lookup`` to ``base`` until stopped, each call with its own
    ``sessionId`` (``<tag>-<thread>-<n>``) so its trace row can be found. ``answered`` holds the
    session ids of the calls that got a 200 answer, ``failed`` the count of those that did not."""

    def __init__(self, base: str, tag: str) -> None:
        self.base, self.tag = base, tag
        self.answered: list[str] = []
        self.results: list[dict] = []
        self.failed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(CLIENTS)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def count(self) -> int:
        with self._lock:
            return len(self.answered)

    def _run(self, k: int) -> None:
        with httpx.Client(base_url=self.base, timeout=120) as http:
            n = 0
            while not self._stop.is_set():
                session = f"{self.tag}-{k}-{n}"
                n += 1
                try:
                    response = http.post("/v1/lookup", json={"query": QUERIES[n % len(QUERIES)], "sessionId": session})
                except httpx.HTTPError:
                    with self._lock:
                        self.failed += 1
                    if self._stop.wait(0.2):
                        return
                    continue
                with self._lock:
                    if response.status_code == 200:
                        self.answered.append(session)
                        self.results.append(response.json())
                    else:
                        self.failed += 1


# --- the server killed mid-load: no trace lost after the restart ------------------------------


def _serve(settings, port: int, dsn: str, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(
        RAG_DATA_DIR=str(settings.data_dir),
        RAG_KNOWLEDGE_DIR=str(settings.knowledge_dir),
        RAG_TRACE_ENABLED="true",
        RAG_PG_DSN=dsn,
        RAG_SERVE_PORT=str(port),
    )
    with open(log, "a") as err:
        return subprocess.Popen([*RAG, "serve"], cwd=REPO, env=env, stderr=err)


def _wait_ready(process: subprocess.Popen, base: str) -> None:
    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"rag serve exited with {process.returncode} before it was ready")
        try:
            return httpx.get(f"{base}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    assert _wait_until(ready, 240), "rag serve did not become ready"


def test_server_killed_mid_load_loses_no_trace_of_an_answered_call(sample_kb, pg_dsn, tmp_path):
    info = conninfo_to_dict(pg_dsn)
    # Traces go through a switchable TCP front of the embedded PostgreSQL: cut for part of the load.
    proxy = SwitchableProxy(f"{info['host']}/.s.PGSQL.{info.get('port', 5432)}")
    user, dbname = info.get("user", "postgres"), info.get("dbname", "postgres")
    dsn = f"host=127.0.0.1 port={proxy.port} user={user} dbname={dbname}"
    started = datetime.now(UTC)
    tag = f"kill-{uuid.uuid4().hex[:8]}"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = _serve(sample_kb, port, dsn, tmp_path / "serve.log")
    try:
        _wait_ready(server, base)
        with Load(base, tag) as load:
            assert _wait_until(lambda: load.count() >= 12, 300), "no answers under load"
            proxy.down()  # the trace store is cut: rows go to the spool
            stored_before = load.count()
            assert _wait_until(lambda: load.count() >= stored_before + 12, 300), "no answers while traces spool"
            os.kill(server.pid, signal.SIGKILL)  # with CLIENTS lookups in flight
            server.wait(30)
        answered = set(load.answered)
        proxy.up()
        server = _serve(sample_kb, port, dsn, tmp_path / "serve.log")
        _wait_ready(server, base)  # the restarted server replays the dead one's spool

        store = TraceStore(pg_dsn)
        try:
            end = datetime.now(UTC) + timedelta(minutes=5)

            def traced() -> set[str]:
                rows = store.rows_between(started, end)
                return {r.session_id for r in rows if r.session_id and r.session_id.startswith(tag + "-")}

            assert _wait_until(lambda: answered <= traced(), 120), sorted(answered - traced())[:10]
            rows = [r for r in store.rows_between(started, end) if r.session_id in answered]
        finally:
            store.close()
        assert len(answered) >= 24
        assert len(rows) == len({r.id for r in rows})  # replayed once, not duplicated
        assert {(r.retrieval_details or {}).get("transport") for r in rows} == {"http"}
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(60)
        proxy.down()


# --- Milvus killed under load: the library's degraded result, then recovery -------------------


@pytest.fixture
def served_tool(sample_kb, embedder):
    """The sample knowledge base's tool behind the served app (uvicorn on a free port, in this
    process so the Milvus server can be kept down): yields ``(tool, base_url)``."""
    port = _free_port()
    tool = LookupKnowledgeTool(sample_kb.model_copy(update={"serve_port": port}), embedder=embedder)
    service = LookupService(tool)
    service.start()
    server = uvicorn.Server(
        uvicorn.Config(served_app(service, start=False), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert _wait_until(lambda: server.started, 30)
    yield tool, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(60)


def test_milvus_killed_under_load_gives_the_degraded_result_then_recovers(served_tool, sample_kb, monkeypatch):
    tool, base = served_tool
    before = {q: _doc_ids(tool.lookup(q).to_json()) for q in QUERIES}
    pid = tool.store.server_pid
    assert pid is not None, "the sample knowledge base is not on an embedded Milvus server"

    def no_start() -> Path:  # how tests/test_milvus_server.py keeps a killed server down
        raise StoreError("the embedded Milvus server cannot start (fault test)")

    with Load(base, f"milvus-{uuid.uuid4().hex[:8]}") as load:
        assert _wait_until(lambda: load.count() >= 6, 300), "no answers under load"
        monkeypatch.setattr(milvus_server, "server_binary", no_start)
        os.kill(pid, signal.SIGKILL)
        assert _wait_until(lambda: milvus_server.server_status(sample_kb.data_dir) is None, 30)
        # In process during the outage: the library's own answer to compare the served ones with.
        library = tool.lookup(QUERIES[0]).to_json()
        assert library["status"] != "ok" and "cannot start" in library["message"] + str(library["retrievalTrace"])
        down_from = load.count()
        assert _wait_until(lambda: load.count() >= down_from + 12, 300), "no answers while Milvus is down"
        down_to = load.count()
        monkeypatch.undo()  # Milvus may start again: the next lookup restarts it

        def recovered() -> bool:
            last = load.results[-CLIENTS:]
            return load.count() >= down_to + CLIENTS and all(r["status"] == "ok" for r in last)

        assert _wait_until(recovered, 300), "lookups did not recover once Milvus could start again"
        # one more answer per client: lookups that began after recovery, not ones in flight across the restart
        settled = load.count()
        assert _wait_until(lambda: load.count() >= settled + CLIENTS, 300), "no answers after recovery"
        results = list(load.results)
    assert load.failed == 0
    # Answers that started after the outage began and ended before it ended are the degraded ones.
    degraded = results[down_from + CLIENTS : down_to]
    assert degraded and all(r["status"] == library["status"] for r in degraded)
    assert all(r["found"] == library["found"] for r in degraded if r["query"] == library["query"])
    changed = [
        (r["query"], _doc_ids(r), before[r["query"]]) for r in results[-CLIENTS:] if _doc_ids(r) != before[r["query"]]
    ]
    assert not changed, f"after recovery (query, doc ids, before): {changed}"
    assert tool.store.server_pid not in (None, pid)
