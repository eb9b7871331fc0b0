"""Trace of every ``lookup_knowledge`` call: the ``tool_invocation`` table and its recorder.

Nothing is imported eagerly: the recorder works without the ``pg`` extra (rows wait in the
spool), and ``TraceStore`` needs psycopg.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TRACE_COLUMNS", "ToolInvocationRecorder", "TraceStore"]


def __getattr__(name: str) -> Any:
    if name == "ToolInvocationRecorder":
        from rag_core.traces.recorder import ToolInvocationRecorder

        return ToolInvocationRecorder
    if name in ("TraceStore", "TRACE_COLUMNS"):
        from rag_core.traces import store

        return getattr(store, name)
    raise AttributeError(name)
