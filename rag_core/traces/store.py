"""The ``tool_invocation`` trace table in PostgreSQL (embedded server by default).

The code owns the schema: ``ensure_schema`` creates the table when missing and adds any
column an older table lacks (``ALTER TABLE ... ADD COLUMN IF NOT EXISTS``), so upgrading the
library never needs a manual migration. Inserts are idempotent by ``id``, so a spool replay
after a partial failure never duplicates a row.
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from rag_core.secrets import redacted, scrub_secrets
from rag_core.settings import RagSettings
from rag_core.stores.pgserver import PgConnectionPool, one_row, resolve_dsn
from rag_core.traces.rows import json_safe, safe_text

log = logging.getLogger(__name__)

T = TypeVar("T")

# Column -> SQL type, in table order. ``id`` is the primary key (a uuid as text).
TRACE_COLUMNS: dict[str, str] = {
    "id": "text",
    "session_id": "text",
    "tool_name": "text",
    "input": "text",
    "output_preview": "text",
    "retrieval_layer": "text",
    "retrieval_details": "jsonb",
    "status": "text",
    "error": "text",
    "latency_ms": "double precision",
    "created_at": "timestamptz NOT NULL DEFAULT now()",
}
_TEXT_COLUMNS = ("session_id", "tool_name", "input", "output_preview", "retrieval_layer", "status", "error")
_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_BATCH = 500


class TraceStore:
    """Rows of the ``tool_invocation`` table (or ``table``) in the PostgreSQL at ``dsn``.

    A row is a dict with the keys of ``TRACE_COLUMNS`` (unknown keys are ignored, missing
    ones stored as NULL). ``created_at`` is a datetime or ISO string (naive = UTC; default
    now); ``retrieval_details`` any JSON-able value. Thread-safe (connection pool). Every
    method raises StoreError, without passwords, when PostgreSQL is unreachable.
    """

    def __init__(
        self,
        dsn: str,
        table: str = "tool_invocation",
        *,
        pool_size: int = 4,
        connect_timeout: float = 5.0,
        statement_timeout_ms: int = 0,
    ):
        if not _TABLE_NAME.match(table):
            raise ValueError(f"table name {table!r} must match {_TABLE_NAME.pattern}")
        self.table = table
        self._dsn = dsn
        self._ident = sql.Identifier(table)
        self._pool = PgConnectionPool(
            dsn, max_size=pool_size, connect_timeout=connect_timeout, statement_timeout_ms=statement_timeout_ms
        )

    @classmethod
    def from_settings(cls, settings: RagSettings) -> TraceStore:
        """The trace store on ``settings.pg_dsn`` or the embedded server (which this may start;
        StoreError when it cannot)."""
        return cls(
            resolve_dsn(settings),
            connect_timeout=settings.pg_connect_timeout_s,
            statement_timeout_ms=settings.pg_statement_timeout_ms,
        )

    def __repr__(self) -> str:
        return f"TraceStore({redacted(self._dsn)!r}, table={self.table!r})"

    def _run(self, action: str, fn: Callable[[psycopg.Connection], T]) -> T:
        return self._pool.run_mapped(
            f"trace {action} on {self.table!r}",
            fn,
            f"trace table {self.table!r} does not exist in {redacted(self._dsn)}: call ensure_schema() first",
        )

    def ensure_schema(self) -> None:
        """Create the table and its indexes, adding columns an older table lacks.

        Idempotent and safe from several processes at once; existing rows are kept (a new
        ``created_at`` column is filled with the migration time).
        """

        def migrate(conn: psycopg.Connection) -> None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"rag_core:traces:{self.table}",))
                for statement in self._ddl():
                    conn.execute(statement)

        self._run("ensure_schema", migrate)

    def _ddl(self) -> list[sql.Composed]:
        t = self._ident
        statements = [sql.SQL("CREATE TABLE IF NOT EXISTS {t} (id text PRIMARY KEY)").format(t=t)]
        for name, kind in TRACE_COLUMNS.items():
            if name != "id":
                statements.append(
                    sql.SQL("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {c} {k}").format(
                        t=t, c=sql.Identifier(name), k=sql.SQL(kind)
                    )
                )
        for column in ("created_at", "session_id"):
            statements.append(
                sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} ({c})").format(
                    i=sql.Identifier(f"{self.table}_{column}"[:63]), t=t, c=sql.Identifier(column)
                )
            )
        return statements

    def insert_many(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert ``rows`` in one transaction; a row whose ``id`` exists is skipped.

        Rows without ``id`` get a fresh uuid (then a retry could duplicate them: the recorder
        always assigns ids first). Secrets in ``error`` are scrubbed.
        """
        if not rows:
            return
        params = [_params(r) for r in rows]
        cols = sql.SQL(", ").join(map(sql.Identifier, TRACE_COLUMNS))
        statement = sql.SQL("INSERT INTO {t} ({cols}) VALUES ({vals}) ON CONFLICT (id) DO NOTHING").format(
            t=self._ident, cols=cols, vals=sql.SQL(", ").join(sql.Placeholder() * len(TRACE_COLUMNS))
        )

        def write(conn: psycopg.Connection) -> None:
            with conn.transaction(), conn.cursor() as cur:
                for start in range(0, len(params), _BATCH):
                    cur.executemany(statement, params[start : start + _BATCH])

        self._run("insert", write)

    def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        """The ``limit`` newest rows, newest first (``created_at`` as aware datetimes)."""
        statement = sql.SQL("SELECT * FROM {t} ORDER BY created_at DESC, id LIMIT %s").format(t=self._ident)
        return self._select(statement, (max(0, int(limit)),))

    def rows_between(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """Rows with ``start <= created_at < end``, oldest first (naive datetimes are UTC).

        Half-open, so consecutive daily partitions never share a row.
        """
        statement = sql.SQL(
            "SELECT * FROM {t} WHERE created_at >= %s AND created_at < %s ORDER BY created_at, id"
        ).format(t=self._ident)
        return self._select(statement, (_aware(start), _aware(end)))

    def _select(self, statement: sql.Composed, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        def query(conn: psycopg.Connection) -> list[dict[str, Any]]:
            with conn.cursor(row_factory=dict_row) as cur:
                return cur.execute(statement, params).fetchall()

        return self._run("select", query)

    def count(self) -> int:
        """Number of rows in the table."""
        statement = sql.SQL("SELECT count(*) FROM {t}").format(t=self._ident)
        return int(self._run("count", lambda conn: one_row(conn.execute(statement))[0]))

    def close(self) -> None:
        """Close pooled connections."""
        self._pool.close()


# --- row conversion ---------------------------------------------------------------------------


def _params(row: Mapping[str, Any]) -> tuple[Any, ...]:
    # Never raises for a dict: a row PostgreSQL would reject could block a spool replay forever.
    values: dict[str, Any] = {c: None for c in TRACE_COLUMNS}
    values["id"] = str(row.get("id") or uuid.uuid4())
    for name in _TEXT_COLUMNS:
        if row.get(name) is not None:
            values[name] = _clean_text(row[name])
    if values["error"]:
        values["error"] = scrub_secrets(values["error"])
    if row.get("retrieval_details") is not None:
        values["retrieval_details"] = Jsonb(json_safe(row["retrieval_details"]))
    values["latency_ms"] = _float_or_none(row.get("latency_ms"))
    values["created_at"] = _aware(_to_datetime(row.get("created_at")) or datetime.now(UTC))
    return tuple(values.values())


def _clean_text(value: Any) -> str:
    if isinstance(value, str):
        return safe_text(value)
    return json.dumps(json_safe(value), ensure_ascii=False)


def _float_or_none(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _to_datetime(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        log.warning("trace row has an unreadable created_at %r; using now", value)
        return None


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
