"""The trace row's ``origin`` (where a lookup came from), against a real PostgreSQL."""

from __future__ import annotations

import json

import psycopg
import pytest

from rag_core.traces import TraceStore
from rag_core.traces.rows import TraceRow

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_origin_round_trips_and_old_rows_get_theirs_from_session_and_transport(pg_dsn, pg_table):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {pg_table} (id text PRIMARY KEY, session_id text, retrieval_details jsonb)")
        for rid, session, transport in [
            ("eval", "eval-milvus-20261201", "python"),
            ("mcp", "agent-1", "mcp-http"),
            ("lib", "agent-2", "python"),
            ("bare", None, None),
        ]:
            details = json.dumps({"transport": transport}) if transport else None
            conn.execute(f"INSERT INTO {pg_table} VALUES (%s, %s, %s)", (rid, session, details))
    store = TraceStore(pg_dsn, pg_table)
    try:
        store.ensure_schema()
        store.insert_many([TraceRow(id="new", origin="cli", input="q")])
        store.ensure_schema()  # the backfill runs once: a new row's origin is never rewritten
        origins = {r.id: r.origin for r in store.recent(10)}
    finally:
        store.close()
    assert origins == {"eval": "evaluation", "mcp": "mcp-http", "lib": "library", "bare": "library", "new": "cli"}
