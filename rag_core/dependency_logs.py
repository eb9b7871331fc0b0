"""Log records of the store clients (pymilvus, milvus_lite, psycopg, psycopg_pool, grpc) go to the
caller's logging at DEBUG, never straight to stderr.

pymilvus installs its own stderr handler (``pymilvus.settings.init_log``, a ``dictConfig`` run when
pymilvus is imported) and logs every failed RPC at ERROR with the whole traceback in the message:
an in-process caller saw 62 tracebacks where our store error said one line (issue 44). Our
``StoreError`` is the message; the dependency's record is detail, re-emitted at DEBUG through the
root logger's handlers when the root logger is enabled for DEBUG (the embedded Milvus server's own
output stays in ``milvus_server.log``). Idempotent; run again after importing pymilvus, whose
``dictConfig`` replaces the handlers.
"""

from __future__ import annotations

import logging

__all__ = ["DEPENDENCIES", "route_dependency_logs"]

#: Top-level logger names of the dependencies whose records are routed at DEBUG.
DEPENDENCIES = ("pymilvus", "milvus_lite", "psycopg", "psycopg_pool", "grpc")


class _AtDebug(logging.Handler):
    """Re-emits a record at DEBUG through the root logger when it is enabled for DEBUG."""

    def emit(self, record: logging.LogRecord) -> None:
        root = logging.getLogger()
        if root.isEnabledFor(logging.DEBUG):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            root.handle(record)


_HANDLER = _AtDebug()


def route_dependency_logs() -> None:
    """Give each dependency logger (and each of their sub-loggers that has handlers of its own or
    does not propagate, as pymilvus configures some) the one DEBUG-forwarding handler."""
    names = [n for n in list(logging.root.manager.loggerDict) if n.split(".")[0] in DEPENDENCIES]
    for name in {*DEPENDENCIES, *names}:
        logger = logging.getLogger(name)
        if name in DEPENDENCIES or logger.handlers or not logger.propagate:
            logger.handlers = [_HANDLER]
            logger.propagate = False
