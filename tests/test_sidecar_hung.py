"""Issue 12 row 6: a hung sidecar PostgreSQL (accepts TCP, never answers) is dialled once, then
skipped by the circuit breaker; sidecar work is bounded; traces are spooled, not lost, and
``close()`` does not dial the hung server again."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from fakes import HashEmbedder, five_doc_store

from rag_core.breaker import CircuitBreaker
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.settings import RagSettings
from rag_core.stores.memory import InMemoryStore
from rag_core.traces.recorder import JsonlSpool, ToolInvocationRecorder
from rag_core.traces.store import TraceStore

DIM = 16


class HungServer:
    """Accepts TCP connections and never sends a byte (a hung PostgreSQL)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.accepted:
            c.close()


@pytest.fixture
def hung() -> Iterator[HungServer]:
    server = HungServer()
    yield server
    server.close()


def main_store() -> InMemoryStore:
    return five_doc_store(DIM)


def test_breaker_opens_on_failure_and_lets_one_probe_through():
    now = [0.0]
    breaker = CircuitBreaker(retry_after=2.0, max_retry_after=8.0, clock=lambda: now[0])
    assert breaker.allow() and not breaker.is_open
    assert breaker.failure("down") is True
    assert not breaker.allow()
    now[0] = 2.5
    assert breaker.allow() and not breaker.allow()  # one probe at a time
    assert breaker.failure("still down") is False
    now[0] = 5.0
    assert not breaker.allow()  # back-off doubled to 4 s
    now[0] = 6.6
    assert breaker.allow()
    assert breaker.success() is True and not breaker.is_open and breaker.allow()


def test_hung_sidecar_is_dialled_once_then_skipped_and_traces_are_spooled(tmp_path, hung):
    dsn = f"postgresql://rag:secret@127.0.0.1:{hung.port}/rag"
    # No second model beside the fake one: loading it would outlast the breaker's retry window.
    settings = RagSettings(
        data_dir=tmp_path,
        pg_dsn=dsn,
        sidecar_enabled=True,
        pg_connect_timeout_s=2,
        ensemble_backend="none",
        _env_file=None,
    )
    recorder = ToolInvocationRecorder(lambda: TraceStore(dsn, connect_timeout=2), settings.trace_spool_path)
    tool = LookupKnowledgeTool(settings, embedder=HashEmbedder(DIM), store=main_store(), recorder=recorder)
    first = tool.lookup("redis memory text 1")
    assert first.found and first.status == "ok"
    assert first.retrieval_trace.sidecar.status in ("unavailable", "error")
    dialled = len(hung.accepted)
    assert dialled >= 1
    later = [tool.lookup(f"redis memory text {i % 5}") for i in range(6)]
    for r in later:
        assert r.found and r.status == "ok"
        assert r.retrieval_trace.sidecar.status == "unavailable"
        assert r.retrieval_trace.sidecar.reason.startswith("skipped: sidecar failed")
        assert "secret" not in r.model_dump_json()
    assert tool.sidecar_breaker.is_open
    recorder.flush(5, reconnect=False)
    assert recorder.breaker.is_open
    failures_before_close = recorder.breaker.failures
    tool.close()
    spooled = JsonlSpool(settings.trace_spool_path).rows()
    assert len(spooled) == 7  # every lookup's trace, none lost
    # The trace store was found down once; close() spooled without dialling it again.
    assert recorder.breaker.failures == failures_before_close


def test_sidecar_work_in_flight_is_bounded(tmp_path):
    release = threading.Event()

    class Blocking:
        name = "pgvector"
        score_label = "pgvector_cosine_distance[0,2]"

        def recorded_model(self):
            release.wait(30)
            return None

        def close(self):
            pass

    settings = RagSettings(
        data_dir=tmp_path,
        sidecar_enabled=True,
        sidecar_queue_max=2,
        trace_enabled=False,
        ensemble_backend="none",
        _env_file=None,
    )
    tool = LookupKnowledgeTool(settings, embedder=HashEmbedder(DIM), store=main_store(), sidecar=Blocking())
    vec = HashEmbedder(DIM).embed_query("q")
    from rag_core.lookup.query_transformer import KnowledgeQueryTransformer

    tq = KnowledgeQueryTransformer(None, 2000).transform("q")
    started = [tool.sidecar_search.start(tq, vec) for _ in range(4)]
    skipped = [s for s in started if not hasattr(s, "result")]
    assert len(skipped) == 2
    assert all("RAG_SIDECAR_QUEUE_MAX" in s.reason for s in skipped)
    release.set()
    for s in started[:2]:
        s.result(timeout=30)
    tool.close()
