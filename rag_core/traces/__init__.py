"""Trace of every ``lookup_knowledge`` call: the ``tool_invocation`` table and its recorder."""

from rag_core.traces.recorder import ToolInvocationRecorder
from rag_core.traces.store import TRACE_COLUMNS, TraceStore

__all__ = ["TRACE_COLUMNS", "ToolInvocationRecorder", "TraceStore"]
