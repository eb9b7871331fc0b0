"""Sidecar store: PostgreSQL with pgvector (cosine HNSW) and full-text search.

One table per store: chunk columns, a ``lexical`` column (``rag_core.text.lexical_string`` of
the chunk's embed text, the same tokens the Milvus BM25 column holds, scored with the same
BM25), ``embedding vector(dim)``. Indexes: HNSW ``vector_cosine_ops``, btree on category and
doc_id, GIN on ``lexical_tsv`` (``to_tsvector('simple', lexical)``, a stored generated column).

Dense search plans (measured on 10,000 random 384-d unit vectors, see tests):

* When at most ``exact_scan_max_rows`` rows can match (the category's rows, or the whole
  table), the search is an exact scan (``enable_indexscan = off``): same ids as brute force,
  a few milliseconds, and the same ranking as Milvus' FLAT index on the main store.
* Otherwise HNSW with pgvector 0.8 iterative index scans (``hnsw.iterative_scan =
  relaxed_order``, re-sorted in an outer query). HNSW filters after the index scan, so without
  iterative scans a selective category returns fewer rows than LIMIT (pgvector #259, #719);
  if a filtered search still comes back short (``hnsw.max_scan_tuples`` reached) it is re-run
  exactly. Either way a filtered search returns min(top_k, matching rows).

Document centroids (``rag_core.ingest.centroids``) live in ``<table>__centroids`` (doc id primary
key, ``embedding vector(dim)``): one row read per candidate document, whatever its size.

A rebuild (``PgVectorStore.rebuild``) fills ``<table>__rebuild`` (and its centroid table) and
swaps them in under the table's names in one transaction, so a lookup in another process sees the
old tables or the new ones, whole (a query waiting on the swap's lock resolves the name again and
reads the new table).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql

from rag_core.embedding.base import ModelIdentity
from rag_core.models import Chunk, StoreHit
from rag_core.secrets import redacted
from rag_core.settings import RagSettings
from rag_core.stores.base import (
    BulkLoad,
    DimensionMismatchError,
    MissingCentroidsError,
    StoredChunk,
    StoreError,
    check_vectors,
    cosine_to_similarity,
)
from rag_core.stores.pgserver import PgPool, one_row, resolve_dsn, store_error
from rag_core.stores.vectors import check_query_vector, finite_score
from rag_core.text import lexical_string, lexical_terms

log = logging.getLogger(__name__)

T = TypeVar("T")

SCORE_LABEL = "pgvector_cosine_distance[0,2]"
MAX_HNSW_DIM = 2000  # pgvector's HNSW limit for the vector type
_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_BATCH = 500
_BULK_MIN_ROWS = 1000  # into an empty table, build the HNSW index after the load (5x faster)
_MAX_TERMS = 64
# BM25 as Milvus computes it (rag_core.stores.milvus); the pool bounds the rows scored exactly.
BM25_K1 = 1.2
BM25_B = 0.75
BM25_POOL_FACTOR = 20
BM25_POOL_MIN = 400
# Rows the first cut may read: the rarest query lexemes whose document frequencies sum to at
# most this (``_first_cut_lexemes``). 10k-document benchmark (56k rows, 56 golden lexical
# searches, top-20 overlap with exact BM25 over every match): 1,000 -> 0.71, 2,000 -> 0.89,
# 5,000 -> 0.97, 10,000 -> 0.98, every match -> 0.97; p50 22 ms at 5,000 vs 259 ms exact.
BM25_SCAN_ROWS = 5_000
BM25_STATS_TTL_S = 30.0
EXACT_SCAN_MAX_ROWS = 20_000
# 100 -> 200: on the 10k-document benchmark's 58k real vectors recall@10 0.877 -> 0.959 at 0.96 -> 2.07 ms
# p50 (bench/kb_scale.py); below EXACT_SCAN_MAX_ROWS the search is exact anyway.
EF_SEARCH = 200
MAX_SCAN_TUPLES = 20_000
REBUILD_SUFFIX = "__rebuild"
CENTROID_SUFFIX = "__centroids"
_INDEX_SUFFIXES = ("embedding_hnsw", "category", "doc_id", "lexical_tsv_gin")
# The tsvector of ``lexical``, stored: BM25 ranks every matching row, and parsing each one's
# text again per query cost 0.45 s at 17k rows (bench/kb_scale.py).
_TSV = "lexical_tsv"
# The distinct lexemes of the query terms, normalised as the column is.
_LEXEMES_SQL = (
    "SELECT DISTINCT u.lexeme FROM unnest(%(terms)s::text[]) AS x(t), unnest(to_tsvector('simple', x.t)) AS u"
)
_TSV_COLUMNS = (  # and its length in tokens (BM25's dl), stored too
    sql.SQL("{c} tsvector GENERATED ALWAYS AS (to_tsvector('simple', lexical)) STORED").format(c=sql.Identifier(_TSV)),
    sql.SQL("lexical_len integer GENERATED ALWAYS AS (cardinality(string_to_array(lexical, ' '))) STORED"),
)
_COLUMNS = ("chunk_id", "doc_id", "title", "breadcrumb", "category", "text", "content_hash", "lexical", "embedding")
_HIT_COLUMNS = ("chunk_id", "doc_id", "title", "breadcrumb", "category", "text")


class PgVectorStore:
    """Chunks in one PostgreSQL table with pgvector; implements ``VectorStore``.

    ``dsn`` is any libpq DSN/URI (see ``rag_core.stores.pgserver.resolve_dsn``); ``table`` a
    lower-case identifier. Thread-safe: operations borrow connections from a pool of
    ``pool_size``. Dense searches over at most ``exact_scan_max_rows`` candidate rows are
    exact; larger ones use HNSW with ``ef_search`` (see the module docstring). ``raw_score``
    of every hit is the cosine distance ``<=>`` in [0, 2]; ``similarity`` is
    ``1 - distance`` clipped to [0, 1]. Every method raises StoreError (no
    password in the message) when PostgreSQL is unreachable, the pgvector extension is
    missing, or the table does not exist yet (run ``ensure_schema`` / ingestion first).
    """

    name = "pgvector"
    score_label = SCORE_LABEL

    def __init__(
        self,
        dsn: str,
        table: str = "knowledge_chunks",
        *,
        pool_size: int = 8,
        connect_timeout: float = 5.0,
        exact_scan_max_rows: int = EXACT_SCAN_MAX_ROWS,
        ef_search: int = EF_SEARCH,
        statement_timeout_ms: int = 0,
    ):
        if not _TABLE_NAME.match(table):
            raise ValueError(f"table name {table!r} must match {_TABLE_NAME.pattern}")
        self.table = table
        self._dsn = dsn
        self._ident = sql.Identifier(table)
        self._dim: int | None = None
        self._iterative_scan = True
        self._exact_max = exact_scan_max_rows
        self._ef_search = ef_search
        self._stats: tuple[float, int, float, bool] | None = None  # (taken at, rows, mean tokens, stored tsv)
        self._df: dict[str, int] = {}  # lexeme -> rows holding it, while the table has _df_of's (rows, mean tokens)
        self._df_of: tuple[int, float] | None = None
        self._pool = PgPool(
            dsn,
            max_size=pool_size,
            connect_timeout=connect_timeout,
            configure=self._configure,
            statement_timeout_ms=statement_timeout_ms,
        )

    @classmethod
    def from_settings(cls, settings: RagSettings) -> PgVectorStore:
        """The store for ``settings.pg_dsn`` (or the embedded server) and ``settings.pg_table``."""
        return cls(resolve_dsn(settings), settings.pg_table)

    def __repr__(self) -> str:
        return f"PgVectorStore({redacted(self._dsn)!r}, table={self.table!r})"

    # --- plumbing ---------------------------------------------------------------------------

    def _configure(self, conn: psycopg.Connection) -> None:
        """Per new connection: make sure the extension exists, then register the vector type."""
        try:
            with conn.transaction():
                # Concurrent CREATE EXTENSION IF NOT EXISTS can still collide on the catalog.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('rag_core:create_extension'))")
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
            register_vector(conn)
        except psycopg.Error as exc:
            cause = store_error("CREATE EXTENSION vector", self._dsn, exc)
            raise StoreError(
                f"the pgvector extension is not available: {cause}; a superuser must "
                "install pgvector and run CREATE EXTENSION vector"
            ) from None
        self._iterative_scan = _version(row[0]) >= (0, 8) if row else False

    def _run(self, action: str, fn: Callable[[psycopg.Connection], T]) -> T:
        return self._pool.run(
            f"pgvector {action} on {self.table!r}",
            fn,
            f"pgvector table {self.table!r} does not exist in {redacted(self._dsn)}: "
            "run ingestion (ensure_schema) first",
        )

    def _sql(self, template: str) -> sql.Composed:
        return sql.SQL(template).format(t=self._ident)

    def _has_stored_tsv(self, conn: psycopg.Connection) -> bool:
        """Whether the table has the stored ``lexical_tsv`` column (tables made before it do not)."""
        found = conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s AND NOT attisdropped",
            (self._ident.as_string(conn), _TSV),
        ).fetchone()
        return found is not None

    def _stored_dim(self, conn: psycopg.Connection) -> int | None:
        """Dimension of the table's embedding column; None when the table does not exist."""
        exists, typmod = one_row(
            conn.execute(
                "SELECT c.oid IS NOT NULL, a.atttypmod FROM (SELECT to_regclass(%s) AS oid) c"
                " LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'embedding'"
                " AND NOT a.attisdropped",
                (self._ident.as_string(conn),),
            )
        )
        if not exists:
            return None
        if typmod is None or typmod < 1:
            raise StoreError(
                f"table {self.table!r} exists but has no fixed-dimension "
                "'embedding vector(n)' column; drop it or use another table name"
            )
        return int(typmod)

    def _lock_table(self, conn: psycopg.Connection) -> None:
        """Serialise schema changes and writes to this table (held until the transaction ends)."""
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"rag_core:pgvector:{self.table}",))

    def _require_dim(self) -> int:
        if self._dim is None:
            dim = self._run("read schema", self._stored_dim)
            if dim is None:
                raise StoreError(
                    f"pgvector table {self.table!r} does not exist in "
                    f"{redacted(self._dsn)}: run ingestion (ensure_schema) first"
                )
            self._dim = dim
        return self._dim

    def _query_vector(self, vector: np.ndarray) -> np.ndarray:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        dim = self._require_dim()
        if q.shape[0] != dim:
            raise DimensionMismatchError(f"pgvector table {self.table!r}", dim, q.shape[0])
        return check_query_vector(q)

    # --- schema -----------------------------------------------------------------------------

    def ensure_schema(self, dim: int) -> None:
        """Create the table and its indexes if missing (``dim`` in 1..2000).

        Raises DimensionMismatchError, naming both dimensions, before any write when the table
        exists with another dimension. Safe to run from several processes at once.
        """
        if not 1 <= dim <= MAX_HNSW_DIM:
            raise ValueError(f"dimension {dim} outside 1..{MAX_HNSW_DIM} (pgvector HNSW limit)")

        def create(conn: psycopg.Connection) -> None:
            with conn.transaction():
                self._lock_table(conn)
                stored = self._stored_dim(conn)
                if stored is not None and stored != dim:
                    raise DimensionMismatchError(f"pgvector table {self.table!r}", stored, dim)
                if stored is not None and not self._has_stored_tsv(conn):
                    # A table made before the stored tsvector: added once (a table rewrite).
                    adds = sql.SQL(", ").join(sql.SQL("ADD COLUMN {c}").format(c=c) for c in _TSV_COLUMNS)
                    conn.execute(sql.SQL("ALTER TABLE {t} {adds}").format(t=self._ident, adds=adds))
                    conn.execute(sql.SQL("DROP INDEX IF EXISTS {i}").format(i=self._index("lexical_gin")))
                for statement in self._ddl(dim):
                    conn.execute(statement)

        self._run("ensure_schema", create)
        self._dim = dim
        self._forget_stats()

    def _index(self, suffix: str) -> sql.Identifier:
        return sql.Identifier(f"{self.table}_{suffix}"[:63])

    def _hnsw_sql(self) -> sql.Composed:
        return sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} USING hnsw (embedding vector_cosine_ops)").format(
            i=self._index("embedding_hnsw"), t=self._ident
        )

    @property
    def centroid_table(self) -> str:
        """The table of this table's document centroids (``<table>__centroids``, shortened with a
        hash of the table name past PostgreSQL's 63-byte identifiers)."""
        name = f"{self.table}{CENTROID_SUFFIX}"
        if len(name) <= 63:
            return name
        digest = hashlib.blake2b(self.table.encode(), digest_size=4).hexdigest()
        return f"{self.table[: 63 - len(CENTROID_SUFFIX) - 9]}_{digest}{CENTROID_SUFFIX}"

    def _ddl(self, dim: int) -> list[sql.Composed]:
        t = self._ident
        return [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {c} (doc_id text PRIMARY KEY, embedding vector({dim}) NOT NULL)"
            ).format(c=sql.Identifier(self.centroid_table), dim=sql.Literal(dim)),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {t} (chunk_id text PRIMARY KEY, doc_id text NOT NULL, "
                "title text NOT NULL, breadcrumb text NOT NULL, category text NOT NULL, "
                "text text NOT NULL, content_hash text NOT NULL, lexical text NOT NULL, "
                "embedding vector({dim}) NOT NULL, {tsv})"
            ).format(t=t, dim=sql.Literal(dim), tsv=sql.SQL(", ").join(_TSV_COLUMNS)),
            self._hnsw_sql(),
            sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (category)").format(i=self._index("category"), t=t),
            sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (doc_id)").format(i=self._index("doc_id"), t=t),
            sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} USING gin ({c})").format(
                i=self._index("lexical_tsv_gin"), t=t, c=sql.Identifier(_TSV)
            ),
        ]

    def flush(self) -> None:
        """Nothing to do: every write is committed (autocommit) and indexed when it returns."""

    def drop(self) -> None:
        """Drop the table (its indexes and centroid table); a missing table is fine."""
        statement = sql.SQL("DROP TABLE IF EXISTS {t}, {c}").format(
            t=self._ident, c=sql.Identifier(self.centroid_table)
        )
        self._run("drop", lambda conn: conn.execute(statement))
        self._dim = None
        self._forget_stats()

    @property
    def rebuild_table(self) -> str:
        """The table a rebuild fills before it is swapped in (``<table>__rebuild``)."""
        return f"{self.table[: 63 - len(REBUILD_SUFFIX)]}{REBUILD_SUFFIX}"

    @contextmanager
    def rebuild(self) -> Iterator[PgVectorStore]:
        """An empty ``rebuild_table`` to fill whole; on a normal exit one transaction drops the
        old table and renames the new one (and its indexes) to ``table``, so a lookup sees the
        old index or the new one, never a part. On an exception the new table is dropped and
        the old one stays served; one left by a killed run is dropped when the next starts.

        StoreError when another rebuild of this table is running (a session advisory lock on a
        connection of its own, held until the end).
        """
        build = PgVectorStore(self._dsn, self.rebuild_table, pool_size=2, exact_scan_max_rows=self._exact_max)
        try:
            guard = psycopg.connect(self._dsn, autocommit=True, connect_timeout=5)
        except psycopg.Error as exc:
            raise store_error(f"pgvector rebuild of {self.table!r}", self._dsn, exc) from None
        try:
            key = f"rag_core:pgvector-rebuild:{self.table}"
            if not one_row(guard.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)))[0]:
                raise StoreError(f"another rebuild of pgvector table {self.table!r} is running: try again later")
            build.drop()  # a leftover of a killed rebuild
            try:
                yield build
                self._run("rebuild swap", lambda conn: self._swap_in(conn, build))
            except BaseException:
                try:
                    build.drop()
                except StoreError as exc:  # the next rebuild drops it
                    log.warning("could not drop the unfinished %r: %s", build.table, exc)
                raise
        finally:
            build.close()
            guard.close()
        self._dim = build._dim
        self._forget_stats()

    def _swap_in(self, conn: psycopg.Connection, build: PgVectorStore) -> None:
        """In one transaction: drop ``table`` and its centroid table, rename ``build``'s tables and
        indexes to them."""
        centroids, built = sql.Identifier(self.centroid_table), sql.Identifier(build.centroid_table)
        with conn.transaction():
            self._lock_table(conn)
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {t}, {c}").format(t=self._ident, c=centroids))
            conn.execute(sql.SQL("ALTER TABLE {b} RENAME TO {t}").format(b=build._ident, t=self._ident))
            conn.execute(sql.SQL("ALTER TABLE IF EXISTS {b} RENAME TO {c}").format(b=built, c=centroids))
            _rename_pkey(conn, self.centroid_table, f"{self.centroid_table}_pkey"[:63])
            for suffix in _INDEX_SUFFIXES:
                conn.execute(
                    sql.SQL("ALTER INDEX IF EXISTS {a} RENAME TO {b}").format(
                        a=build._index(suffix), b=self._index(suffix)
                    )
                )
            _rename_pkey(conn, self.table, f"{self.table}_pkey"[:63])

    # --- writes -----------------------------------------------------------------------------

    def check_chunk(self, chunk: Chunk) -> None:
        """Nothing to check: text columns hold up to 1 GB, and NUL bytes are removed on write."""

    def upsert(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None:
        """Insert or replace ``chunks`` by chunk id in one transaction.

        ``vectors`` is (n, dim) float32, L2-normalised. ValueError names the first chunk with a
        NaN/inf/all-zero vector and DimensionMismatchError reports a wrong width, both before
        any write. Writers of one table are serialised (advisory lock) and the primary key
        keeps concurrent upserts of the same chunks free of duplicates. A large first load
        into an empty table builds the HNSW index after inserting, which is much faster.
        """
        if not chunks:
            return
        vectors = np.asarray(vectors, dtype=np.float32)
        dim = self._require_dim()
        check_vectors([c.chunk_id for c in chunks], vectors, dim)
        latest = {c.chunk_id: (c, v) for c, v in zip(chunks, vectors, strict=True)}
        rows = [_row(c, v) for _, (c, v) in sorted(latest.items())]
        statement = self._upsert_sql()

        def write(conn: psycopg.Connection) -> None:
            with conn.transaction(), conn.cursor() as cur:
                self._lock_table(conn)
                bulk = len(rows) >= _BULK_MIN_ROWS and self._is_empty(conn)
                if bulk:
                    conn.execute(sql.SQL("DROP INDEX IF EXISTS {i}").format(i=self._index("embedding_hnsw")))
                for start in range(0, len(rows), _BATCH):
                    cur.executemany(statement, rows[start : start + _BATCH])
                if bulk:
                    conn.execute(self._hnsw_sql())
            if len(rows) >= _BATCH:  # fresh statistics keep the planner's choices sound
                conn.execute(self._sql("ANALYZE {t}"))

        self._run("upsert", write)
        self._forget_stats()

    def bulk_load(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> BulkLoad:
        """Fill the empty table by binary COPY with its HNSW and full-text indexes dropped, then
        ANALYZE and rebuild both (pgvector's default HNSW parameters, as ``ensure_schema`` makes
        it; ``maintenance_work_mem`` raised to 1 GB for the build so the graph stays in memory)
        in one transaction (``VectorStore.bulk_load``). Chunks sharing an embed text share one
        lexical string. ValueError / DimensionMismatchError name a bad vector and StoreError
        reports a non-empty table, both before any write."""
        vectors = np.asarray(vectors, dtype=np.float32)
        check_vectors([c.chunk_id for c in chunks], vectors, self._require_dim())
        lexical: dict[str, str] = {}
        copy_sql = sql.SQL("COPY {t} ({cols}) FROM STDIN WITH (FORMAT BINARY)").format(
            t=self._ident, cols=sql.SQL(", ").join(sql.Identifier(c) for c in _COLUMNS)
        )
        rebuilt = (self._index("embedding_hnsw"), self._index("lexical_tsv_gin"))

        def load(conn: psycopg.Connection) -> BulkLoad:
            with conn.transaction():
                self._lock_table(conn)
                if not self._is_empty(conn):
                    raise StoreError(f"bulk_load needs an empty table; pgvector table {self.table!r} holds rows")
                for index in rebuilt:
                    conn.execute(sql.SQL("DROP INDEX IF EXISTS {i}").format(i=index))
                t0 = time.perf_counter()
                with conn.cursor() as cur, cur.copy(copy_sql) as copy:
                    copy.set_types(["text"] * (len(_COLUMNS) - 1) + ["vector"])
                    for c, v in zip(chunks, vectors, strict=True):
                        text = c.embed_text
                        if text not in lexical:
                            lexical[text] = lexical_string(text)
                        copy.write_row(_row(c, v, lexical[text]))
                conn.execute(self._sql("ANALYZE {t}"))
                write_s = time.perf_counter() - t0
                _set_local(conn, {"maintenance_work_mem": "1GB"})
                for statement in self._ddl(self._require_dim()):
                    conn.execute(statement)  # IF NOT EXISTS: builds the two dropped indexes only
            return BulkLoad(len(chunks), write_s, time.perf_counter() - t0 - write_s)

        done = self._run("bulk_load", load)
        self._forget_stats()
        return done

    def _is_empty(self, conn: psycopg.Connection) -> bool:
        return not one_row(conn.execute(self._sql("SELECT EXISTS (SELECT 1 FROM {t})")))[0]

    def _upsert_sql(self) -> sql.Composed:
        cols = [sql.Identifier(c) for c in _COLUMNS]
        updates = [sql.SQL("{c} = EXCLUDED.{c}").format(c=c) for c in cols[1:]]
        return sql.SQL(
            "INSERT INTO {t} ({cols}) VALUES ({vals}) ON CONFLICT (chunk_id) DO UPDATE SET {updates}"
        ).format(
            t=self._ident,
            cols=sql.SQL(", ").join(cols),
            vals=sql.SQL(", ").join(sql.Placeholder() * len(cols)),
            updates=sql.SQL(", ").join(updates),
        )

    def delete_documents(self, doc_ids: Sequence[str]) -> None:
        """Remove every chunk of the given documents (unknown ids are ignored)."""
        if doc_ids:
            statement = self._sql("DELETE FROM {t} WHERE doc_id = ANY(%s)")
            self._run("delete", lambda conn: conn.execute(statement, (list(doc_ids),)))
            self._forget_stats()

    def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        """Remove chunks by id (unknown ids are ignored)."""
        if chunk_ids:
            statement = self._sql("DELETE FROM {t} WHERE chunk_id = ANY(%s)")
            self._run("delete", lambda conn: conn.execute(statement, (list(chunk_ids),)))
            self._forget_stats()

    # --- reads ------------------------------------------------------------------------------

    def exists(self) -> bool:
        """True when the table exists."""
        return self._run("read schema", self._stored_dim) is not None

    def chunk_hashes(self) -> dict[str, tuple[str, str]]:
        """``{chunk_id: (doc_id, content_hash)}``; empty when the table does not exist."""
        if not self.exists():
            return {}
        statement = self._sql("SELECT chunk_id, doc_id, content_hash FROM {t}")
        rows = self._run("read", lambda conn: conn.execute(statement).fetchall())
        return {r[0]: (r[1], r[2]) for r in rows}

    def fetch(self, chunk_ids: Sequence[str]) -> dict[str, StoredChunk]:
        """The stored rows of ``chunk_ids`` (absent ids are left out; {} without a table)."""
        if not chunk_ids or not self.exists():
            return {}
        statement = self._sql(
            "SELECT chunk_id, doc_id, title, breadcrumb, category, text, content_hash, "
            "embedding FROM {t} WHERE chunk_id = ANY(%s)"
        )
        rows = self._run("fetch", lambda conn: conn.execute(statement, (list(chunk_ids),), binary=True).fetchall())
        return {
            r[0]: StoredChunk(
                chunk_id=r[0],
                doc_id=r[1],
                title=r[2],
                breadcrumb=r[3],
                category=r[4],
                text=r[5],
                content_hash=r[6],
                vector=_as_array(r[7]),
            )
            for r in rows
        }

    def _centroid_rows(self, action: str, statement: sql.SQL, *params: Any) -> list[tuple[Any, ...]] | None:
        """Rows of ``statement`` on the centroid table (``{c}``); None when that table is missing."""
        name = self.centroid_table
        query = statement.format(c=sql.Identifier(name))

        def read(conn: psycopg.Connection) -> list[tuple[Any, ...]] | None:
            if one_row(conn.execute("SELECT to_regclass(%s)", (sql.Identifier(name).as_string(conn),)))[0] is None:
                return None
            return conn.execute(query, params, binary=True).fetchall()

        return self._run(action, read)

    def document_centroids(self, doc_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Doc id -> stored centroid, one row per document (absent docs left out);
        MissingCentroidsError for a table built before centroids were stored."""
        # Asked once per lookup: the schema read only until the table's dimension is known.
        if not doc_ids or (self._dim is None and not self.exists()):
            return {}
        statement = sql.SQL("SELECT doc_id, embedding FROM {c} WHERE doc_id = ANY(%s)")
        rows = self._centroid_rows("document centroids", statement, list(doc_ids))
        if rows is None:
            raise MissingCentroidsError(f"pgvector table {self.table!r}")
        return {r[0]: _as_array(r[1]) for r in rows}

    def centroid_doc_ids(self) -> set[str]:
        """Doc ids with a stored centroid (empty without a table or centroids)."""
        rows = self._centroid_rows("read", sql.SQL("SELECT doc_id FROM {c}"))
        return {r[0] for r in rows or ()}

    def put_centroids(self, centroids: Mapping[str, np.ndarray]) -> None:
        """Insert or replace document centroids in one transaction (after ``ensure_schema``)."""
        if not centroids:
            return
        rows = [(d.replace("\x00", ""), np.asarray(v, dtype=np.float32)) for d, v in sorted(centroids.items())]
        statement = sql.SQL(
            "INSERT INTO {c} (doc_id, embedding) VALUES (%s, %s) "
            "ON CONFLICT (doc_id) DO UPDATE SET embedding = EXCLUDED.embedding"
        ).format(c=sql.Identifier(self.centroid_table))

        def write(conn: psycopg.Connection) -> None:
            with conn.transaction(), conn.cursor() as cur:
                self._lock_table(conn)
                for start in range(0, len(rows), _BATCH):
                    cur.executemany(statement, rows[start : start + _BATCH])

        self._run("put centroids", write)

    def delete_centroids(self, doc_ids: Sequence[str]) -> None:
        """Remove the centroids of ``doc_ids`` (unknown ids and a missing table are fine)."""
        if doc_ids:
            self._centroid_rows(
                "delete centroids", sql.SQL("DELETE FROM {c} WHERE doc_id = ANY(%s) RETURNING doc_id"), list(doc_ids)
            )

    def count(self) -> int:
        """Number of stored chunks; 0 when the table does not exist."""
        if not self.exists():
            return 0
        statement = self._sql("SELECT count(*) FROM {t}")
        return int(self._run("count", lambda conn: one_row(conn.execute(statement))[0]))

    def search(self, vector: np.ndarray, top_k: int, category: str | None = None) -> list[StoreHit]:
        """Top-k chunks by cosine distance (best first), only of ``category`` when given.

        Returns min(top_k, matching rows) hits; exact when few rows can match, else HNSW with
        iterative scans (see the module docstring). ``raw_score`` is the distance in [0, 2].
        Raises DimensionMismatchError / ValueError for a wrong-width or NaN/zero ``vector``.
        """
        if top_k < 1:
            return []
        q = self._query_vector(vector)
        params: dict[str, Any] = {"q": q, "k": top_k, "cat": category}
        statement = self._dense_sql(category is not None)

        def query(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
            with conn.transaction():
                exact = self._candidate_rows(conn, category) <= self._exact_max
                if exact:
                    _set_local(conn, {"enable_indexscan": "off"})
                else:
                    self._tune_hnsw(conn, top_k)
                rows = conn.execute(statement, params).fetchall()
                if not exact and category is not None and len(rows) < top_k:
                    # The iterative scan stopped at max_scan_tuples: finish exactly.
                    _set_local(conn, {"enable_indexscan": "off"})
                    rows = conn.execute(statement, params).fetchall()
            return rows

        rows = self._run("search", query)
        return [self._hit(r, "dense") for r in rows]

    def _candidate_rows(self, conn: psycopg.Connection, category: str | None) -> float:
        """Rows a search could return, counted up to exact_scan_max_rows + 1.

        Unfiltered: the planner's row estimate (no scan); filtered: a bounded count that the
        category btree answers cheaply.
        """
        if category is None:
            row = conn.execute(
                "SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)", (self._ident.as_string(conn),)
            ).fetchone()
            if row is not None and row[0] >= 0:
                return float(row[0])
            statement = self._sql("SELECT count(*) FROM (SELECT 1 FROM {t} LIMIT %s) s")
            return float(one_row(conn.execute(statement, (self._exact_max + 1,)))[0])
        statement = self._sql("SELECT count(*) FROM (SELECT 1 FROM {t} WHERE category = %s LIMIT %s) s")
        return float(one_row(conn.execute(statement, (category, self._exact_max + 1)))[0])

    def _tune_hnsw(self, conn: psycopg.Connection, top_k: int) -> None:
        settings: dict[str, Any] = {"hnsw.ef_search": min(1000, max(self._ef_search, 2 * top_k))}
        if self._iterative_scan:
            settings |= {"hnsw.iterative_scan": "relaxed_order", "hnsw.max_scan_tuples": MAX_SCAN_TUPLES}
        _set_local(conn, settings)

    def _dense_sql(self, filtered: bool) -> sql.Composed:
        where = sql.SQL("WHERE category = %(cat)s") if filtered else sql.SQL("")
        # MATERIALIZED + outer ORDER BY: relaxed_order may return rows slightly out of order.
        return sql.SQL(
            "WITH candidates AS MATERIALIZED ("
            " SELECT {cols}, embedding <=> %(q)s AS distance FROM {t} {where}"
            " ORDER BY embedding <=> %(q)s LIMIT %(k)s)"
            " SELECT * FROM candidates ORDER BY distance + 0, chunk_id"
        ).format(cols=sql.SQL(", ").join(map(sql.Identifier, _HIT_COLUMNS)), t=self._ident, where=where)

    def search_lexical(
        self, terms: Sequence[str], vector: np.ndarray, top_k: int, category: str | None = None
    ) -> list[StoreHit]:
        """Top-k chunks by BM25 over the lexical column, matching any of ``terms``.

        ``terms`` are ``rag_core.text.tokenize`` tokens (Chinese tokens are encoded like the
        stored column). ``lexical_score`` is Okapi BM25 with Milvus' parameters and statistics
        over the whole table (see ``_lexical_sql``), so both paths rank and weigh lexical hits
        alike; ``raw_score`` is the cosine distance to ``vector`` and ``similarity`` its
        normalised similarity.
        """
        words = list(dict.fromkeys(t for t in lexical_terms([str(t) for t in terms]) if t.strip()))
        if top_k < 1 or not words:
            return []
        q = self._query_vector(vector)

        def query(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
            n, avgdl, stored_tsv = self._bm25_stats(conn)
            df = self._document_frequencies(conn, words[:_MAX_TERMS], stored_tsv)
            if not df:
                return []
            params: dict[str, Any] = {
                "ws": list(df),
                "idfs": [math.log(1 + (n - d + 0.5) / (d + 0.5)) for d in df.values()],
                "scan": _first_cut_lexemes(df, BM25_SCAN_ROWS),
                "q": q,
                "k": top_k,
                "cat": category,
                "pool": max(top_k * BM25_POOL_FACTOR, BM25_POOL_MIN),
                "avgdl": avgdl or 1.0,
                "k1": BM25_K1,
                "b": BM25_B,
            }
            return conn.execute(self._lexical_sql(category is not None, stored_tsv), params).fetchall()

        rows = self._run("lexical search", query)
        return [self._hit(r[:-1], "lexical", lexical_score=finite_score(r[-1])) for r in rows]

    def _document_frequencies(self, conn: psycopg.Connection, words: list[str], stored_tsv: bool) -> dict[str, int]:
        """lexeme -> rows containing it, for the lexemes of ``words`` (``to_tsvector('simple')``,
        as the column). Counted on the GIN index once per lexeme while the table's row count and
        mean length (``_bm25_stats``) stay the same: counting a common word's rows was ~40 % of a
        search on 58k rows (bench/kb_scale.py), and agents' queries repeat them."""
        lexemes = [r[0] for r in conn.execute(_LEXEMES_SQL, {"terms": words}).fetchall()]
        shape = self._stats[1:3] if self._stats is not None else None
        if self._df_of != shape:  # the table changed (another process wrote): count again
            self._df, self._df_of = {}, shape
        known = self._df  # this call's dict: another thread may swap in a fresh one meanwhile
        missing = [w for w in lexemes if w not in known]
        if missing:
            tsv = sql.Identifier(_TSV) if stored_tsv else sql.SQL("to_tsvector('simple', lexical)")
            count = sql.SQL(
                "SELECT w, (SELECT count(*) FROM {t} WHERE {tsv} @@ plainto_tsquery('simple', w))"
                " FROM unnest(%(ws)s::text[]) AS w"
            ).format(t=self._ident, tsv=tsv)
            known.update((str(w), int(df)) for w, df in conn.execute(count, {"ws": missing}).fetchall())
        return {w: known[w] for w in lexemes}

    def _bm25_stats(self, conn: psycopg.Connection) -> tuple[int, float, bool]:
        """(rows, mean lexical tokens per row, whether ``lexical_tsv`` is stored) of the table,
        cached ``BM25_STATS_TTL_S`` seconds (a full scan of the stored ``lexical_len``: 39 ms at 56k
        rows, 170 ms counting tokens from the text; this process's own writes reset the cache)."""
        cached = self._stats
        if cached is not None and time.monotonic() - cached[0] < BM25_STATS_TTL_S:
            return cached[1], cached[2], cached[3]
        stored_tsv = self._has_stored_tsv(conn)
        dl = "lexical_len" if stored_tsv else "cardinality(string_to_array(lexical, ' '))"
        n, avgdl = one_row(conn.execute(self._sql(f"SELECT count(*), avg({dl}) FROM {{t}}")))
        self._stats = (time.monotonic(), int(n), float(avgdl or 0.0), stored_tsv)
        return self._stats[1], self._stats[2], self._stats[3]

    def _forget_stats(self) -> None:
        """After this process's own write: BM25's statistics and document frequencies are read again."""
        self._stats, self._df, self._df_of = None, {}, None

    def _lexical_sql(self, filtered: bool, stored_tsv: bool = True) -> sql.Composed:
        """BM25 in SQL: score = sum over query terms t in the chunk of
        idf(t) * tf (k1 + 1) / (tf + k1 (1 - b + b dl / avgdl)), idf(t) = ln(1 + (N - df + 0.5) /
        (df + 0.5)) (Robertson & Zaragoza 2009; the formula and defaults of Milvus' BM25 function).

        Terms are normalised by ``to_tsvector('simple')`` exactly as the column is and re-enter
        SQL only through ``plainto_tsquery`` (no term can inject tsquery operators); the idf of
        each lexeme comes in as a parameter. The first cut reads the rows that contain one of
        the ``scan`` lexemes (``_first_cut_lexemes``: all of them unless their rows add up past
        ``BM25_SCAN_ROWS``), takes the ``pool`` best of them by ``ts_rank`` over every query
        lexeme (exact whenever fewer rows match), and the exact score re-sorts those.
        ``ts_rank``, not ``ts_rank_cd``: its top 400 held 0.97 of exact BM25's top 20 on the
        10k-document benchmark where ``ts_rank_cd``'s held 0.69, at a quarter of the cost.
        ``stored_tsv``: read the stored ``lexical_tsv`` column; else (a table not yet migrated by
        ``ensure_schema``, served by a reader) parse ``lexical`` per row as before.
        """
        where = sql.SQL("AND category = %(cat)s") if filtered else sql.SQL("")
        tsv = sql.Identifier(_TSV) if stored_tsv else sql.SQL("to_tsvector('simple', lexical)")
        dl = sql.SQL("lexical_len" if stored_tsv else "cardinality(string_to_array(lexical, ' '))")
        t = self._ident
        return sql.SQL(
            "WITH idf AS MATERIALIZED (SELECT * FROM unnest(%(ws)s::text[], %(idfs)s::float8[]) AS i(w, idf)),"
            " q AS MATERIALIZED (SELECT to_tsquery('simple',"
            " string_agg('(' || plainto_tsquery('simple', w)::text || ')', ' | ')) AS query FROM idf),"
            " m AS MATERIALIZED (SELECT to_tsquery('simple',"
            " string_agg('(' || plainto_tsquery('simple', w)::text || ')', ' | ')) AS query"
            " FROM unnest(%(scan)s::text[]) AS w),"
            " pool AS MATERIALIZED (SELECT chunk_id, {tsv} AS v, {dl} AS dl"
            " FROM {t}, q, m WHERE {tsv} @@ m.query {where}"
            " ORDER BY ts_rank({tsv}, q.query, 1) DESC, chunk_id LIMIT %(pool)s),"
            " scored AS (SELECT p.chunk_id, sum(idf.idf * cardinality(u.positions) * (%(k1)s + 1)"
            " / (cardinality(u.positions) + %(k1)s * (1 - %(b)s + %(b)s * p.dl / %(avgdl)s))) AS score"
            " FROM pool p, unnest(p.v) AS u JOIN idf ON idf.w = u.lexeme GROUP BY p.chunk_id)"
            " SELECT {cols}, embedding <=> %(q)s AS distance, s.score"
            " FROM scored s JOIN {t} USING (chunk_id) ORDER BY s.score DESC, chunk_id LIMIT %(k)s"
        ).format(
            tsv=tsv,
            dl=dl,
            cols=sql.SQL(", ").join(
                sql.SQL("{t}.{c}").format(t=self._ident, c=sql.Identifier(c)) for c in _HIT_COLUMNS
            ),
            t=t,
            where=where,
        )

    def _hit(self, row: Sequence[Any], channel: str, lexical_score: float | None = None) -> StoreHit:
        # A non-finite distance claims nothing: the far end of the scale, similarity 0.
        distance = float(row[6]) if math.isfinite(float(row[6])) else 2.0
        return StoreHit(
            chunk_id=row[0],
            doc_id=row[1],
            title=row[2],
            breadcrumb=row[3],
            category=row[4],
            text=row[5],
            raw_score=distance,
            score_label=SCORE_LABEL,
            similarity=cosine_to_similarity(1.0 - distance),
            channel=channel,
            lexical_score=lexical_score,
        )

    def close(self) -> None:
        """Close pooled connections; the store can not be used afterwards."""
        self._pool.close()

    # --- the model the table was built with (a JSON table comment) ---------------------------

    def recorded_model(self) -> ModelIdentity | None:
        """The embedding model recorded in the table's comment; None when the table is missing
        or unrecorded. The comment lives and dies with the table, so a drop forgets it too."""

        def read(conn: psycopg.Connection) -> str | None:
            row = conn.execute(
                "SELECT obj_description(to_regclass(%s), 'pg_class')", (self._ident.as_string(conn),)
            ).fetchone()
            return row[0] if row else None

        raw = self._run("read model", read)
        if not raw:
            return None
        try:
            return ModelIdentity.from_dict(json.loads(raw)["embedding_model"])
        except (ValueError, KeyError, TypeError):
            log.warning("table %r has a comment that is not a model record: treating it as unrecorded", self.table)
            return None

    def record_model(self, identity: ModelIdentity) -> None:
        """Record ``identity`` as the table's model (``COMMENT ON TABLE``, value quoted by psycopg)."""
        value = json.dumps({"embedding_model": identity.to_dict()}, sort_keys=True)
        self._run(
            "record model",
            lambda conn: conn.execute(
                sql.SQL("COMMENT ON TABLE {t} IS {v}").format(t=self._ident, v=sql.Literal(value))
            ),
        )


def _row(chunk: Chunk, vector: np.ndarray, lexical: str | None = None) -> tuple[Any, ...]:
    values = (
        chunk.chunk_id,
        chunk.doc_id,
        chunk.title,
        chunk.breadcrumb,
        chunk.category,
        chunk.text,
        chunk.content_hash,
        lexical_string(chunk.embed_text) if lexical is None else lexical,
    )
    # PostgreSQL text cannot hold NUL bytes; they carry no meaning in Markdown.
    return (*(v.replace("\x00", "") for v in values), vector)


def _rename_pkey(conn: psycopg.Connection, table: str, name: str) -> None:
    """Give ``table``'s primary key constraint the name ``name`` (a swapped-in table keeps its
    build's, which the next build would collide with)."""
    pkey = conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype = 'p'",
        (sql.Identifier(table).as_string(conn),),
    ).fetchone()
    if pkey is not None:
        conn.execute(
            sql.SQL("ALTER TABLE {t} RENAME CONSTRAINT {a} TO {b}").format(
                t=sql.Identifier(table), a=sql.Identifier(pkey[0]), b=sql.Identifier(name)
            )
        )


def _first_cut_lexemes(df: dict[str, int], budget: int) -> list[str]:
    """The lexemes whose rows BM25's first cut reads: all of ``df`` (lexeme -> rows) when their
    rows add up to at most ``budget``; else the rarest ones that fit (at least the rarest one).

    Rare lexemes carry the high idf, so rows holding only common ones seldom reach the top; and
    the rows read stay bounded however large the table (a common word matches most of it).
    """
    if sum(df.values()) <= budget:
        return list(df)
    taken: list[str] = []
    for lexeme in sorted(df, key=lambda w: (df[w], w)):
        budget -= df[lexeme]
        if taken and budget < 0:
            break
        taken.append(lexeme)
    return taken


def _set_local(conn: psycopg.Connection, settings: dict[str, Any]) -> None:
    """SET LOCAL through set_config(..., true): values stay parameters, scope is the transaction."""
    for name, value in settings.items():
        conn.execute("SELECT set_config(%s, %s, true)", (name, str(value)))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _as_array(value: Any) -> np.ndarray:
    """A pgvector value (``pgvector.Vector`` from the loader, or a sequence) as float32."""
    if hasattr(value, "to_numpy"):
        value = value.to_numpy()
    return np.asarray(value, dtype=np.float32)
