"""One writer per index: the exclusive lock an ingest holds on its data dir from plan to apply.

Every writer of an index (``rag ingest``, a rebuild, a model change, the Dagster ingest assets)
takes ``index_lock`` on ``<data_dir>/ingest.lock`` (:class:`filelock.FileLock`, released by the
OS when the holder dies) before it reads the stores to plan and keeps it until the L0 index and
the index state are written: no other writer can change a store between the stale-plan check and
the writes. The holder (pid, start time, command) is written beside it in ``ingest.lock.json``,
so a second writer that cannot get the lock names it. A second writer waits up to
``RAG_INGEST_LOCK_WAIT`` seconds (saying so), or refuses at once when it is 0 (the default).

The lock covers the processes that share the data dir (the L0 index and the index state live
there); two data dirs pointed at one production Milvus collection are not covered.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from filelock import FileLock, Timeout

from rag_core.fileio import write_text_atomic
from rag_core.ingest.index_state import describe_pending
from rag_core.secrets import scrub_secrets
from rag_core.settings import RagSettings

log = logging.getLogger(__name__)

LOCK_NAME = "ingest.lock"
HOLDER_NAME = "ingest.lock.json"


class IndexBusyError(RuntimeError):
    """Another writer holds the index lock of the data dir (past the wait, if any); nothing was
    read or written. The message names the holder: pid, start time, command."""


def describe_holder(data_dir: Path) -> str:
    """``pid N, started <UTC time>, command <cmd>`` of the lock's holder, from its holder file
    (``an unknown writer`` when missing or unreadable: it is written just after locking)."""
    try:
        return describe_pending(json.loads((data_dir / HOLDER_NAME).read_text()))
    except (OSError, ValueError):
        return "an unknown writer"


def writer_command(command: str | None = None) -> str:
    """``command``, or this process's command line; secrets scrubbed (it is written to files)."""
    return scrub_secrets(command or shlex.join(sys.argv))


@contextmanager
def index_lock(settings: RagSettings, command: str | None = None, wait_s: float | None = None) -> Iterator[None]:
    """Hold the index lock of ``settings.data_dir`` for the ``with`` body.

    ``command`` describes this writer for a refused second one (default: this process's command
    line, secrets scrubbed). ``wait_s`` (default ``settings.ingest_lock_wait``) is how long to wait
    for a holder to finish; 0 refuses at once. Raises IndexBusyError naming the holder and the
    setting; OSError when the data dir cannot be created (e.g. read-only).
    """
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    wait = settings.ingest_lock_wait if wait_s is None else wait_s
    lock = FileLock(str(data_dir / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = describe_holder(data_dir)
        if wait <= 0:
            raise IndexBusyError(
                f"another ingest is writing the index of {data_dir} ({holder}): try again when it has "
                "finished, or set RAG_INGEST_LOCK_WAIT=<seconds> to wait for it"
            ) from None
        log.warning("waiting up to %gs for another ingest of %s to finish (%s)", wait, data_dir, holder)
        try:
            lock.acquire(timeout=wait)
        except Timeout:
            raise IndexBusyError(
                f"another ingest still writes the index of {data_dir} after {wait:g}s "
                f"(RAG_INGEST_LOCK_WAIT; {describe_holder(data_dir)}): try again when it has finished"
            ) from None
    holder_file = data_dir / HOLDER_NAME
    try:
        me = {"pid": os.getpid(), "started": time.time(), "command": writer_command(command)}
        with suppress(OSError):  # a full disk: the lock still holds, only the holder is unnamed
            write_text_atomic(holder_file, json.dumps(me))
        yield
    finally:
        with suppress(OSError):
            holder_file.unlink()
        lock.release()
