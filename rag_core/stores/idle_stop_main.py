"""The idle watchdog's process: ``python -m rag_core.stores.idle_stop_main KIND DATA_DIR PID SECONDS``.

Started by ``idle_stop.spawn_watchdog``; it joins the watch loop (``idle_stop.watch``) to the
server's stop function, so ``idle_stop`` imports neither server module (they import it).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from rag_core.stores.idle_stop import watch

log = logging.getLogger(__name__)


def stopper(kind: str, data_dir: Path, pid: int) -> Callable[[], None]:
    """Stops server ``pid`` of ``kind`` in ``data_dir``, and only that one (not a newer server)."""
    if kind == "milvus":
        from rag_core.stores.milvus_server import stop_server

        def stop_milvus() -> None:
            stop_server(data_dir, expect_pid=pid)

        return stop_milvus
    from rag_core.stores.pgserver import running_pid, stop_embedded

    def stop_postgres() -> None:
        if running_pid(data_dir) == pid:  # not a newer server started after this one died
            stop_embedded(data_dir)

    return stop_postgres


def main(argv: list[str]) -> int:
    """Entry point: ``KIND DATA_DIR PID SECONDS``."""
    kind, data_dir, pid, seconds = argv[0], Path(argv[1]), int(argv[2]), float(argv[3])
    try:
        watch(kind, pid, seconds, stopper(kind, data_dir, pid))
    except Exception:  # a watchdog failure must never touch the server; it just ends
        log.exception("idle watchdog for %s %s failed", kind, data_dir)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
