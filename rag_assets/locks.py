"""Inter-process locks around the embedded stores.

Milvus Lite lets one process open a ``milvus.db`` file at a time, and two ingests into the same
collection or table would interleave their diffs. The run queue (``dagster.local.yaml``,
``max_concurrent_runs: 1``) serialises Dagster runs; these file locks also cover runs started
outside the queue (``python -m rag_assets.run``, ``dagster asset materialize``), which then wait
instead of failing or corrupting the store.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

log = logging.getLogger(__name__)


class StoreBusyError(RuntimeError):
    """Another process held a store lock for longer than the timeout."""


@contextmanager
def store_lock(lock_file: Path, timeout_s: float, logger: logging.Logger | None = None) -> Iterator[None]:
    """Hold the file lock ``lock_file`` for the ``with`` body.

    Waits up to ``timeout_s`` seconds (logging that it waits), then raises StoreBusyError.
    The lock is released when the process dies, so a killed run never leaves it stuck.
    """
    logger = logger or log
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_file))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("waiting up to %gs for %s (another run uses the store)", timeout_s, lock_file)
        try:
            lock.acquire(timeout=timeout_s)
        except Timeout:
            raise StoreBusyError(
                f"{lock_file} is still held by another process after {timeout_s:g}s; "
                "another run is using the store: retry when it has finished"
            ) from None
    try:
        yield
    finally:
        lock.release()
