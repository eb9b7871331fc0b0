"""tool_invocation trace table, the typed TraceRow and the spooling recorder, against a real
PostgreSQL."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from rag_core.stores.base import StoreError
from rag_core.traces import TRACE_COLUMNS, ToolInvocationRecorder, TraceStore
from rag_core.traces import rows as trace_rows
from rag_core.traces.recorder import JsonlSpool, trace_row
from rag_core.traces.rows import TraceRow

pytestmark = pytest.mark.timeout(120)
integration = pytest.mark.integration  # the session's embedded PostgreSQL

DOWN_DSN = "postgresql://rag:hunter2pw@127.0.0.1:1/rag?connect_timeout=1"


def row(i: int, **extra) -> TraceRow:
    values = {
        "session_id": f"s{i % 5}",
        "tool_name": "lookup_knowledge",
        "input": f"query {i}",
        "output_preview": "preview",
        "retrieval_layer": "L1",
        "status": "ok",
        "latency_ms": 12.5,
        "retrieval_details": {"attempts": [{"top_k": 10, "i": i}]},
        **extra,
    }
    return TraceRow(**values)


def spooled(spool: Path) -> int:
    return len(JsonlSpool(spool).rows())


def spool_empty(spool: Path) -> bool:
    return spooled(spool) == 0 and not list(spool.parent.glob(f"{spool.name}.*.replay"))


@pytest.fixture
def trace_store(pg_dsn, pg_table):
    store = TraceStore(pg_dsn, pg_table)
    store.ensure_schema()
    yield store
    store.close()


class Switch:
    """A store factory that is down (a real unreachable DSN) until ``up`` is set."""

    def __init__(self, dsn: str, table: str):
        self.dsn, self.table, self.up, self.calls = dsn, table, False, 0

    def __call__(self) -> TraceStore:
        self.calls += 1
        return TraceStore(self.dsn if self.up else DOWN_DSN, self.table, connect_timeout=1)


# --- TraceStore --------------------------------------------------------------------------------


@integration
def test_migration_adds_missing_columns_to_an_old_table(pg_dsn, pg_table):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {pg_table} (id text PRIMARY KEY, session_id text, tool_name text)")
        conn.execute(f"INSERT INTO {pg_table} VALUES ('old-1', 's', 'lookup_knowledge')")
    store = TraceStore(pg_dsn, pg_table)
    store.ensure_schema()
    store.ensure_schema()  # idempotent
    with psycopg.connect(pg_dsn) as conn:
        cols = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s", (pg_table,)
            ).fetchall()
        )
        indexes = [r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", (pg_table,))]
    assert set(cols) == set(TRACE_COLUMNS)
    assert cols["retrieval_details"] == "jsonb"
    assert cols["latency_ms"] == "double precision"
    assert cols["created_at"] == "timestamp with time zone"
    assert any("(created_at)" in d for d in indexes)
    old = store.recent(1)[0]
    assert store.count() == 1 and old.id == "old-1" and old.tool_name == "lookup_knowledge"
    assert old.created_at.tzinfo is not None and old.retrieval_details is None  # filled by the migration / NULL
    store.insert_many([row(1, id="new-1")])
    assert store.count() == 2
    store.close()


@integration
def test_insert_is_idempotent_and_rows_between_is_half_open(trace_store):
    day = datetime(2025, 3, 1, tzinfo=UTC)
    rows = [row(i, id=f"r{i}", created_at=day + timedelta(hours=6 * i)) for i in range(8)]
    trace_store.insert_many(rows)
    trace_store.insert_many(rows[2:5])  # a replay
    assert trace_store.count() == 8
    first_day = trace_store.rows_between(day, day + timedelta(days=1))
    assert [r.id for r in first_day] == ["r0", "r1", "r2", "r3"]
    naive = trace_store.rows_between(datetime(2025, 3, 2), datetime(2025, 3, 3))  # naive = UTC
    assert [r.id for r in naive] == ["r4", "r5", "r6", "r7"]
    assert first_day == rows[:4]  # every field read back as it was bound, created_at a datetime
    assert first_day[1].retrieval_details == {"attempts": [{"top_k": 10, "i": 1}]}
    assert first_day[1].created_at == day + timedelta(hours=6)
    assert [r.id for r in trace_store.recent(2)] == ["r7", "r6"]
    trace_store.insert_many([])


def test_trace_store_unreachable_is_store_error_without_password(pg_table):
    store = TraceStore(DOWN_DSN, pg_table, connect_timeout=1)
    with pytest.raises(StoreError) as err:
        store.ensure_schema()
    assert "hunter2pw" not in str(err.value)


# --- recorder ----------------------------------------------------------------------------------


@integration
def test_recorder_writes_rows(pg_dsn, trace_store, tmp_path):
    spool = tmp_path / "spool.jsonl"
    recorder = ToolInvocationRecorder(lambda: TraceStore(pg_dsn, trace_store.table), spool)
    for i in range(20):
        recorder.record(
            row(i, retrieval_details={"at": datetime(2025, 1, 1, tzinfo=UTC), "n": {1, 2}, "nan": float("nan")})
        )
    assert recorder.flush(10)
    recorder.close()
    assert trace_store.count() == 20
    assert spool_empty(spool)
    details = trace_store.recent(1)[0].retrieval_details
    assert details == {"at": "2025-01-01T00:00:00+00:00", "n": [1, 2], "nan": None}


@integration
def test_store_down_during_a_burst_spools_everything_then_replays_exactly_once(pg_dsn, trace_store, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="rag_core")
    spool = tmp_path / "spool.jsonl"
    factory = Switch(pg_dsn, trace_store.table)
    recorder = ToolInvocationRecorder(factory, spool, retry_interval=0.2)
    for i in range(1000):
        recorder.record(row(i))  # never raises, never blocks on the dead store: the rows spool
    assert recorder.flush(30)
    assert spooled(spool) == 1000
    assert trace_store.count() == 0

    factory.up = True
    assert recorder.flush(30)
    assert trace_store.count() == 1000
    assert spool_empty(spool)
    assert recorder.flush(10)
    recorder.close()
    assert trace_store.count() == 1000
    with psycopg.connect(pg_dsn) as conn:
        distinct = conn.execute(f"SELECT count(DISTINCT input) FROM {trace_store.table}").fetchone()[0]
    assert distinct == 1000
    assert "hunter2pw" not in caplog.text


@integration
def test_factory_that_raises_means_spool_and_a_partial_replay_never_duplicates(pg_dsn, trace_store, tmp_path):
    spool = tmp_path / "spool.jsonl"
    state = {"up": False}

    def factory() -> TraceStore:
        if not state["up"]:
            raise StoreError("embedded server cannot start")
        return TraceStore(pg_dsn, trace_store.table)

    recorder = ToolInvocationRecorder(factory, spool, retry_interval=0.2)
    for i in range(100):
        recorder.record(row(i))
    assert recorder.flush(10)
    assert spooled(spool) == 100
    # A replay that died after inserting 40 rows but before removing the spool:
    trace_store.insert_many(JsonlSpool(spool).rows()[:40])  # TraceRow read back from the spool
    state["up"] = True
    assert recorder.flush(10)
    recorder.close()
    assert trace_store.count() == 100
    assert spool_empty(spool)


@integration
def test_no_password_reaches_the_table_or_the_spool(pg_dsn, trace_store, tmp_path):
    spool = tmp_path / "spool.jsonl"
    bad = {
        "error": "OperationalError: connection to postgresql://admin:hunter2pw@db:5432/rag failed; "
        "dsn was host=db user=admin password=hunter2pw",
        "input": "connect to postgresql://u:hunter2pw@h/db please",
        "retrieval_details": {
            "attempts": [{"error": "password=hunter2pw"}],
            "password": "hunter2pw",
            "tokens": ["kept"],
        },
    }
    down = ToolInvocationRecorder(None, spool)  # no store: everything spools
    down.record(row(1, **bad))
    down.close()
    assert "hunter2pw" not in spool.read_text()

    recorder = ToolInvocationRecorder(lambda: TraceStore(pg_dsn, trace_store.table), spool)
    recorder.record(row(2, **bad))
    assert recorder.flush(10)
    recorder.close()
    rows = trace_store.recent(10)
    assert len(rows) == 2
    assert not any("hunter2pw" in r.model_dump_json() for r in rows)
    assert "admin:***@db" in rows[0].error
    assert rows[0].retrieval_details["password"] == "***"
    assert rows[0].retrieval_details["tokens"] == ["kept"]


@integration
def test_eight_threads_recording_at_once_with_a_small_queue(pg_dsn, trace_store, tmp_path):
    spool = tmp_path / "spool.jsonl"
    recorder = ToolInvocationRecorder(
        lambda: TraceStore(pg_dsn, trace_store.table), spool, queue_size=200, batch_size=50
    )
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(250):
                recorder.record(row(i, id=f"{t}-{i}"))
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert recorder.flush(30)
    recorder.close()
    assert not errors
    assert trace_store.count() == 2000  # queued rows and direct spills (queue full) alike
    assert spool_empty(spool)


@integration
def test_two_recorders_sharing_one_spool(pg_dsn, trace_store, tmp_path):
    spool = tmp_path / "spool.jsonl"
    a = ToolInvocationRecorder(None, spool)
    b = ToolInvocationRecorder(None, spool)
    for i in range(50):
        a.record(row(i, id=f"a{i}"))
        b.record(row(i, id=f"b{i}"))
    a.close()
    b.close()
    assert spooled(spool) == 100
    c = ToolInvocationRecorder(lambda: TraceStore(pg_dsn, trace_store.table), spool)
    assert c.flush(10)
    c.close()
    assert trace_store.count() == 100
    assert spool_empty(spool)


def test_a_row_is_cleaned_when_built_and_gets_id_and_time():
    class Odd:
        def __str__(self) -> str:
            return "odd"

    clean = TraceRow.coerce(
        {
            "input": Odd(),
            "session_id": 7,
            "latency_ms": float("inf"),
            "retrieval_details": {1: b"x\x00", "at": datetime(2025, 1, 1, tzinfo=UTC)},
            "error": "bad \ud800 surrogate",
            "created_at": datetime(2025, 1, 1),  # naive = UTC
            "unknown": "ignored",
        }
    )
    assert clean.input == "odd" and clean.session_id == "7" and clean.latency_ms is None
    assert clean.retrieval_details == {"1": "x", "at": "2025-01-01T00:00:00+00:00"}
    assert clean.error == "bad ? surrogate"
    assert clean.created_at == datetime(2025, 1, 1, tzinfo=UTC)
    assert TraceRow.coerce(clean) is clean
    fresh = TraceRow()
    assert fresh.id and fresh.id != TraceRow().id and fresh.created_at.tzinfo is not None
    assert trace_row(clean)["created_at"] == "2025-01-01T00:00:00Z"  # the spool's JSON shape


def test_record_never_raises():
    recorder = ToolInvocationRecorder(None, Path("/proc/definitely/not/writable.jsonl"))
    recorder.record({"input": "x"})  # spool unwritable: kept in memory, no exception
    recorder.record("not a dict")  # type: ignore[arg-type]
    assert not recorder.flush(2)  # one row is held only in memory
    recorder.close(timeout=1)


def test_table_columns_are_the_row_fields():
    assert list(TRACE_COLUMNS) == list(TraceRow.model_fields)


@integration
def test_rows_are_cleaned_once_at_construction_not_in_the_spool_or_store(trace_store, tmp_path, monkeypatch):
    calls: list[object] = []
    real = trace_rows._scrub
    monkeypatch.setattr(trace_rows, "_scrub", lambda v, *more: calls.append(v) or real(v, *more))
    built = row(1, error="postgresql://admin:hunter2pw@db/rag refused", retrieval_details={"token": "abc"})
    assert calls and built.error == "postgresql://admin:***@db/rag refused"
    assert built.retrieval_details == {"token": "***"}
    calls.clear()
    spool = JsonlSpool(tmp_path / "spool.jsonl")
    spool.append([built])
    [back] = spool.rows()
    trace_store.insert_many([back])
    assert trace_store.recent(1) == [built]  # the same row through the spool and the table
    assert calls == []  # read back from the spool and the table without cleaning again


@integration
def test_spool_lines_of_the_old_dict_format_load_and_replay(pg_dsn, trace_store, tmp_path):
    spool = tmp_path / "spool.jsonl"
    # What the recorder spooled before rows were typed: json.dumps of a cleaned dict, created_at
    # as datetime.isoformat() text; a torn last line from a writer that crashed mid-row.
    old = [
        {
            "session_id": "s1",
            "tool_name": "lookup_knowledge",
            "input": f"query {i}",
            "output_preview": "preview",
            "retrieval_layer": "L1",
            "retrieval_details": {"attempts": [{"top_k": 10, "i": i}]},
            "status": "ok",
            "error": None,
            "latency_ms": 12.5,
            "id": f"old-{i}",
            "created_at": f"2025-03-01T0{6 + i}:00:00+00:00",
        }
        for i in range(3)
    ]
    old[1]["created_at"] = "2025-03-01T07:00:00.123456"  # naive = UTC
    old[2]["latency_ms"] = None
    old[2]["input"] = 42  # json_safe kept numbers as numbers; the store stored their JSON text
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in old) + '{"id": "torn", "sess'
    spool.write_text(lines, encoding="utf-8")

    loaded = JsonlSpool(spool).rows()
    assert [r.id for r in loaded] == ["old-0", "old-1", "old-2"]  # the torn line skipped
    assert loaded[0].created_at == datetime(2025, 3, 1, 6, tzinfo=UTC)
    assert loaded[1].created_at == datetime(2025, 3, 1, 7, 0, 0, 123456, tzinfo=UTC)
    assert loaded[2].latency_ms is None and loaded[2].input == "42"

    recorder = ToolInvocationRecorder(lambda: TraceStore(pg_dsn, trace_store.table), spool)
    assert recorder.flush(10)
    recorder.close()
    assert spool_empty(spool)
    stored = {r.id: r for r in trace_store.recent(10)}
    assert set(stored) == {"old-0", "old-1", "old-2"}
    assert stored["old-0"] == loaded[0] and stored["old-1"].created_at == loaded[1].created_at
    assert stored["old-2"].retrieval_details == {"attempts": [{"top_k": 10, "i": 2}]}
