"""The ``tool_invocation`` trace table in PostgreSQL (embedded server by default).

The code owns the schema: ``ensure_schema`` creates the table when missing and adds any
column an older table lacks (``ALTER TABLE ... ADD COLUMN IF NOT EXISTS``), so upgrading the
library never needs a manual migration. Inserts are idempotent by ``id``, so a spool replay
after a partial failure never duplicates a row.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from rag_core.secrets import redacted
from rag_core.settings import RagSettings
from rag_core.stores.pgserver import PgPool, one_row, resolve_dsn
from rag_core.traces.rows import TraceRow

T = TypeVar("T")

# Column -> SQL type, in table order: the fields of TraceRow (tests hold them equal). ``id`` is the
# primary key (a uuid as text).
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
    "origin": "text",
}
_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_BATCH = 500


class TraceStore:
    """Rows of the ``tool_invocation`` table (or ``table``) in the PostgreSQL at ``dsn``.

    Rows are :class:`~rag_core.traces.rows.TraceRow` both ways: their fields are bound as the
    SQL parameters as they are (cleaned when the row was built; ``created_at`` an aware
    datetime, ``retrieval_details`` jsonb), and rows read back are validated into it.
    Thread-safe (connection pool). Every method raises StoreError, without passwords, when
    PostgreSQL is unreachable.
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
        self._pool = PgPool(
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
        return self._pool.run(
            f"trace {action} on {self.table!r}",
            fn,
            f"trace table {self.table!r} does not exist in {redacted(self._dsn)}: call ensure_schema() first",
        )

    def ensure_schema(self) -> None:
        """Create the table and its indexes, adding columns an older table lacks.

        Idempotent and safe from several processes at once; existing rows are kept (a new
        ``created_at`` column is filled with the migration time; a new ``origin`` column from
        what older rows said: the evaluation's ``eval-`` session prefix, else the details'
        ``transport``, ``python`` meaning ``library``).
        """

        def migrate(conn: psycopg.Connection) -> None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"rag_core:traces:{self.table}",))
                had_origin = conn.execute(
                    "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = 'origin'",
                    (self.table,),
                ).fetchone()
                for statement in self._ddl():
                    conn.execute(statement)
                if not had_origin:
                    conn.execute(self._origin_backfill())

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

    def _origin_backfill(self) -> sql.Composed:
        return sql.SQL(
            "UPDATE {t} SET origin = CASE WHEN session_id LIKE 'eval-%' THEN 'evaluation' "
            "WHEN retrieval_details->>'transport' IS NULL OR retrieval_details->>'transport' = 'python' "
            "THEN 'library' ELSE retrieval_details->>'transport' END WHERE origin IS NULL"
        ).format(t=self._ident)

    def insert_many(self, rows: Sequence[TraceRow]) -> None:
        """Insert ``rows`` in one transaction; a row whose ``id`` exists is skipped (so a
        repeated spool replay never duplicates a row)."""
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

    def recent(self, limit: int = 50) -> list[TraceRow]:
        """The ``limit`` newest rows, newest first."""
        statement = sql.SQL("SELECT * FROM {t} ORDER BY created_at DESC, id LIMIT %s").format(t=self._ident)
        return self._select(statement, (max(0, int(limit)),))

    def rows_between(self, start: datetime, end: datetime) -> list[TraceRow]:
        """Rows with ``start <= created_at < end``, oldest first (naive datetimes are UTC).

        Half-open, so consecutive daily partitions never share a row.
        """
        statement = sql.SQL(
            "SELECT * FROM {t} WHERE created_at >= %s AND created_at < %s ORDER BY created_at, id"
        ).format(t=self._ident)
        return self._select(statement, (_aware(start), _aware(end)))

    def _select(self, statement: sql.Composed, params: tuple[Any, ...]) -> list[TraceRow]:
        def query(conn: psycopg.Connection) -> list[dict[str, Any]]:
            with conn.cursor(row_factory=dict_row) as cur:
                return cur.execute(statement, params).fetchall()

        return [TraceRow.from_stored(values) for values in self._run("select", query)]

    def count(self) -> int:
        """Number of rows in the table."""
        statement = sql.SQL("SELECT count(*) FROM {t}").format(t=self._ident)
        return int(self._run("count", lambda conn: one_row(conn.execute(statement))[0]))

    def close(self) -> None:
        """Close pooled connections."""
        self._pool.close()


# --- row conversion ---------------------------------------------------------------------------


def _params(row: TraceRow) -> tuple[Any, ...]:
    """``row``'s fields in ``TRACE_COLUMNS`` order; details wrapped for jsonb, the rest as is."""
    values = dict(row)  # field -> value; nothing is copied or cleaned again
    if row.retrieval_details is not None:
        values["retrieval_details"] = Jsonb(row.retrieval_details)
    return tuple(values[column] for column in TRACE_COLUMNS)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
