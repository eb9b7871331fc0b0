"""Records one ``tool_invocation`` row per lookup without ever failing or slowing the lookup.

``record`` only puts a :class:`~rag_core.traces.rows.TraceRow` (cleaned when it was built) on
a bounded in-memory queue. A daemon writer thread drains it in batches into the
:class:`~rag_core.traces.store.TraceStore`. When the store is down (or its factory raises, e.g.
the embedded server cannot start), batches are appended to a JSONL spool file (one
``TraceRow`` JSON per line, fsync'd per batch, under a file lock because several processes
may share it).
Once the store answers again the writer replays the spool and removes what it replayed.
Row ids are assigned at ``record`` time and inserts skip existing ids, so a replay that is
interrupted and repeated never duplicates a row.

Spool replay claims the file by renaming it to ``<spool>.<pid>.<nonce>.replay`` under the
lock, so appends from other processes go to a fresh spool meanwhile; a claimed file whose
process died is picked up by the next replayer.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout
from pydantic import ValidationError
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from rag_core.breaker import CircuitBreaker
from rag_core.secrets import scrub_secrets
from rag_core.settings import RagSettings
from rag_core.stores.base import StoreError
from rag_core.traces.rows import TraceRow

if TYPE_CHECKING:
    from rag_core.traces.store import TraceStore

log = logging.getLogger(__name__)

_REPLAY_BATCH = 500
_OVERFLOW_MAX = 100_000  # rows kept in memory when even the spool cannot be written


def trace_row(row: TraceRow | Mapping[str, Any]) -> dict[str, Any]:
    """``row`` as the spool holds it: the JSON-safe dict of ``TraceRow.coerce(row)`` (id and
    ``created_at`` as ISO-8601 text). For callers that keep rows as plain data (the benchmark's
    capturing recorder); the recorder itself keeps ``TraceRow`` objects."""
    return TraceRow.coerce(row).model_dump(mode="json")


class MemoryRecorder:
    """A recorder that keeps every row in memory, as the spool holds it (``trace_row``), instead of
    writing PostgreSQL: for benchmarks and tests that read back what the tool handed over. Does the
    caller-side work of ``ToolInvocationRecorder.record`` (the cleaning); thread-safe; ``closed``
    says whether ``close`` was called."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.closed = False
        self._lock = threading.Lock()

    def record(self, row: TraceRow | Mapping[str, Any]) -> None:
        clean = trace_row(row)
        with self._lock:
            self.rows.append(clean)

    def flush(self, timeout: float | None = None, reconnect: bool = True) -> bool:
        return True

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


class ToolInvocationRecorder:
    """Asynchronous, loss-free writer of trace rows.

    ``store_factory`` returns a ready-to-use TraceStore (it may raise; it is called again
    later, with exponential back-off from ``retry_interval`` up to ``max_retry_interval``
    seconds); ``None`` keeps every row in the spool. ``spool_path`` is the JSONL spool file.
    ``record`` never raises and never waits on the database; when the queue
    (``queue_size`` rows) is full it appends to the spool directly.
    """

    def __init__(
        self,
        store_factory: Callable[[], TraceStore] | None,
        spool_path: Path,
        *,
        queue_size: int = 10_000,
        batch_size: int = 200,
        retry_interval: float = 2.0,
        max_retry_interval: float = 60.0,
        poll_interval: float = 0.2,
    ):
        self._factory = store_factory
        self._spool = JsonlSpool(Path(spool_path))
        self._queue: queue.Queue[TraceRow] = queue.Queue(maxsize=max(1, queue_size))
        self._batch_size = max(1, batch_size)
        self._poll = poll_interval
        self._retry_interval = retry_interval
        # Shared implementation with the sidecar (rag_core.breaker): skip the store while down.
        self.breaker = CircuitBreaker(retry_interval, max_retry_interval)
        self._store: TraceStore | None = None
        self._overflow: collections.deque[TraceRow] = collections.deque()
        self._overflow_retry_at = 0.0
        self._spool_error: str | None = None
        self._closing = False
        self._cond = threading.Condition()
        self._submitted = 0
        self._settled = 0
        self._flush_requests = 0
        self._flush_served = 0
        self._closed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trace-recorder", daemon=True)
        self._thread.start()
        atexit.register(self._close_at_exit)

    @classmethod
    def from_settings(cls, settings: RagSettings) -> ToolInvocationRecorder:
        """A recorder writing to ``TraceStore.from_settings(settings)`` (connected lazily, in the
        writer thread) with its spool at ``settings.trace_spool_path``."""
        return cls(lambda: _trace_store(settings), settings.trace_spool_path)

    # --- caller side ----------------------------------------------------------------------

    def record(self, row: TraceRow | Mapping[str, Any]) -> None:
        """Queue one trace row (a ``TraceRow``, or a mapping of its fields, validated into one).
        Never raises: a row that cannot be validated is logged and dropped."""
        try:
            self._record(TraceRow.coerce(row))
        except Exception:  # tracing must never fail a lookup
            log.exception("trace row dropped")

    def _record(self, clean: TraceRow) -> None:
        if self._closed:
            self._spill([clean])
            return
        try:
            self._queue.put_nowait(clean)
        except queue.Full:
            self._spill([clean])
            return
        with self._cond:
            self._submitted += 1

    def flush(self, timeout: float = 10.0, reconnect: bool = True) -> bool:
        """Wait until every row recorded so far is in the store or the spool, and (when
        ``reconnect``) the writer has tried to replay the spool (forcing a reconnect). True when
        that happened within ``timeout`` seconds and no row is held only in memory."""
        with self._cond:
            target = self._submitted
            if reconnect:
                self._flush_requests += 1
            request = self._flush_requests
            done = self._cond.wait_for(
                lambda: (self._settled >= target and self._flush_served >= request) or not self._thread.is_alive(),
                timeout,
            )
        return bool(done) and self._settled >= target and not self._overflow

    def close(self, timeout: float = 5.0) -> None:
        """Flush, stop the writer, spool whatever is left; later ``record`` calls spool."""
        if self._closed:
            return
        # A store known to be down is not dialled again: close stays fast (rows go to the spool);
        # at most a connect already in progress is waited for.
        self._closing = True
        self.flush(timeout, reconnect=not self.breaker.is_open)
        self._closed = True
        self._stop.set()
        self._thread.join(timeout)
        leftover = list(self._overflow)
        self._overflow.clear()
        with contextlib.suppress(queue.Empty):
            while True:
                leftover.append(self._queue.get_nowait())
        if leftover:
            self._spill(leftover)
        if self._overflow:
            # Once, loudly: these rows exist only in this process and are about to be lost.
            log.error(
                "%d trace row(s) LOST at exit: the trace store is unavailable and the spool %s "
                "cannot be written (%s); check RAG_DATA_DIR permissions",
                len(self._overflow),
                self._spool.path,
                self._spool_error,
            )
        self._drop_store()
        with contextlib.suppress(Exception):
            atexit.unregister(self._close_at_exit)

    def _close_at_exit(self) -> None:
        self.close(timeout=2.0)

    def _spill(self, rows: list[TraceRow]) -> None:
        try:
            self._spool.append(rows)
        except (OSError, Timeout, ValueError) as exc:  # ValueError: a row that will not serialise
            if self._spool_error is None:  # reported once, not per row
                log.error(
                    "trace spool %s not writable (%s); keeping trace rows in memory until it is", self._spool.path, exc
                )
            self._spool_error = str(exc)
            self._keep_in_memory(rows)
            return
        if self._spool_error is not None:
            log.warning("trace spool %s writable again", self._spool.path)
            self._spool_error = None

    def _keep_in_memory(self, rows: list[TraceRow]) -> None:
        self._overflow_retry_at = time.monotonic() + self._retry_interval
        self._overflow.extend(rows)
        while len(self._overflow) > _OVERFLOW_MAX:
            self._overflow.popleft()
            log.error("trace row lost: spool unwritable and in-memory overflow full")

    # --- writer thread --------------------------------------------------------------------

    def _run(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            try:
                self._step()
            except Exception:  # the writer must outlive any bug in one step
                log.exception("trace writer step failed")
                time.sleep(self._poll)

    def _step(self) -> None:
        batch = self._take_batch()
        if batch:
            try:
                self._write(batch)
            finally:
                with self._cond:
                    self._settled += len(batch)
                    self._cond.notify_all()
        if self._overflow and time.monotonic() >= self._overflow_retry_at:
            rows = list(self._overflow)
            self._overflow.clear()
            self._spill(rows)
        with self._cond:
            request = self._flush_requests
        forced = request > self._flush_served
        # Closing: a store that failed meanwhile is not dialled again (close stays fast).
        self._replay(force=forced and not (self._closing and self.breaker.is_open))
        if forced:
            with self._cond:
                self._flush_served = request
                self._cond.notify_all()

    def _take_batch(self) -> list[TraceRow]:
        try:
            batch = [self._queue.get(timeout=self._poll)]
        except queue.Empty:
            return []
        with contextlib.suppress(queue.Empty):
            while len(batch) < self._batch_size:
                batch.append(self._queue.get_nowait())
        return batch

    def _write(self, batch: list[TraceRow]) -> None:
        store = self._get_store(force=False)
        if store is not None:
            try:
                _insert(store, batch)
                return
            except StoreError as exc:
                self._mark_down(exc)
        self._spill(batch)

    def _replay(self, force: bool) -> None:
        if not self._spool.pending():
            return
        store = self._get_store(force=force)
        if store is None:
            return
        try:
            for path in self._spool.claim():
                rows = self._spool.read(path)
                for start in range(0, len(rows), _REPLAY_BATCH):
                    _insert(store, rows[start : start + _REPLAY_BATCH])
                path.unlink(missing_ok=True)
                log.info("replayed %d trace rows from the spool", len(rows))
        except StoreError as exc:
            # The claimed file stays; this process retries it on the next replay.
            self._mark_down(exc)

    # --- store state ----------------------------------------------------------------------

    def _get_store(self, force: bool) -> TraceStore | None:
        if self._store is not None or self._factory is None:
            return self._store
        if self._closing and not force:
            return None
        if not self.breaker.allow(force):
            return None
        store = None
        try:
            store = self._factory()
            store.ensure_schema()
        except Exception as exc:  # noqa: BLE001 - a failing factory means "store down"
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
            self._mark_down(exc)
            return None
        if self.breaker.success():
            log.info("trace store reachable again")
        self._store = store
        return store

    def _mark_down(self, exc: BaseException) -> None:
        message = scrub_secrets(str(exc))[:300]
        level = logging.WARNING if self.breaker.failure(message) else logging.DEBUG
        log.log(level, "trace store unavailable, spooling to %s: %s", self._spool.path, message)
        self._drop_store()

    def _drop_store(self) -> None:
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()
            self._store = None


@retry(
    retry=retry_if_exception_type(StoreError),
    stop=stop_after_attempt(2),
    wait=wait_exponential(multiplier=0.1, max=0.5),
    reraise=True,
)
def _insert(store: TraceStore, rows: list[TraceRow]) -> None:
    """One retry for a blip (e.g. a connection reset); then the caller spools."""
    store.insert_many(rows)


class JsonlSpool:
    """An append-only JSONL file of trace rows shared by threads and processes.

    One line per row, ``TraceRow.model_dump_json()``; lines written before rows were typed
    (the same keys as a dict, ``created_at`` ISO text) load too. ``append`` writes whole lines
    and fsyncs under ``<path>.lock``; ``claim`` renames the file away for replay (see the
    module docstring). Raises OSError / ``filelock.Timeout``.
    """

    def __init__(self, path: Path, lock_timeout: float = 10.0):
        self.path = path
        self._flock = FileLock(str(path) + ".lock", timeout=lock_timeout)
        self._tlock = threading.Lock()

    def append(self, rows: Iterable[TraceRow]) -> None:
        """Append rows as JSON lines and fsync."""
        data = "".join(r.model_dump_json() + "\n" for r in rows).encode("utf-8")
        if not data:
            return
        with self._tlock, self._flock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # A writer that crashed mid-line must not glue its fragment to our first row.
            torn = self.path.exists() and self.path.stat().st_size > 0 and not _ends_with_newline(self.path)
            with open(self.path, "ab") as fh:
                fh.write((b"\n" if torn else b"") + data)
                fh.flush()
                os.fsync(fh.fileno())

    def pending(self) -> bool:
        """True when there are spooled rows (or claimed files this process may replay)."""
        try:
            if self.path.stat().st_size > 0:
                return True
        except FileNotFoundError:
            pass
        return bool(self._claimable())

    def claim(self) -> list[Path]:
        """Rename the spool for replay; return it plus orphaned claimed files, oldest first."""
        with self._tlock, self._flock:
            if self.path.exists() and self.path.stat().st_size > 0:
                claimed = self.path.with_name(f"{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.replay")
                os.replace(self.path, claimed)
            return sorted(self._claimable(), key=lambda p: p.stat().st_mtime)

    def _claimable(self) -> list[Path]:
        out = []
        for path in self.path.parent.glob(f"{self.path.name}.*.replay"):
            pid = path.name[len(self.path.name) + 1 :].split(".")[0]
            if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
                out.append(path)
        return out

    def read(self, path: Path) -> list[TraceRow]:
        """Rows of one spool file; torn or corrupt lines (not a JSON object) are logged and skipped."""
        rows = []
        with open(path, encoding="utf-8", errors="replace") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(TraceRow.from_spool_line(line))
                except ValidationError:
                    log.warning("%s:%d: unreadable spooled trace row skipped", path, number)
        return rows

    def rows(self) -> list[TraceRow]:
        """Every row currently spooled (spool plus claimed files), for inspection and tests."""
        paths = [p for p in [self.path, *self._claimable()] if p.exists()]
        return [row for p in paths for row in self.read(p)]


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def _alive(pid: int) -> bool:
    # PID reuse could make a dead claimer look alive; its file then waits for a restart.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _trace_store(settings: RagSettings) -> TraceStore:
    """``TraceStore.from_settings``; StoreError naming the ``pg`` extra when its driver is not
    installed (a core-only install: rows then stay in the spool until it is)."""
    try:
        from rag_core.traces.store import TraceStore
    except ImportError as exc:
        raise StoreError(
            f"the trace store needs the pg extra (pip install 'rag-retrieval[pg]'; {exc}); "
            "RAG_TRACE_ENABLED=false turns traces off"
        ) from None
    return TraceStore.from_settings(settings)
