"""Starting `rag serve`: the bind check, uvicorn for HTTP (JSON endpoint + MCP streamable HTTP),
and the MCP stdio loop."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rag_core.serve.http_app import is_loopback, served_app
from rag_core.serve.mcp_server import build_mcp_server
from rag_core.serve.service import LookupService

if TYPE_CHECKING:
    from rag_core.lookup.tool import LookupKnowledgeTool
    from rag_core.settings import RagSettings

log = logging.getLogger(__name__)


class ServeConfigError(ValueError):
    """A setting that makes serving unsafe or impossible; the message is one line naming it."""


def check_bind(settings: RagSettings) -> None:
    """Refuse a non-loopback ``RAG_SERVE_HOST`` without ``RAG_SERVE_TOKEN`` (ServeConfigError)."""
    if not is_loopback(settings.serve_host) and not settings.serve_token:
        raise ServeConfigError(
            f"RAG_SERVE_HOST={settings.serve_host} is not a loopback address and RAG_SERVE_TOKEN is not set: "
            "set a bearer token (clients then send 'Authorization: Bearer <token>') or bind 127.0.0.1"
        )


def serve_http(settings: RagSettings, tool: LookupKnowledgeTool | None = None) -> None:
    """Serve ``POST /v1/lookup``, ``/healthz``, ``/readyz`` and MCP at ``/mcp`` on
    ``RAG_SERVE_HOST:RAG_SERVE_PORT`` until SIGINT/SIGTERM (then: in-flight requests finish
    within ``RAG_SERVE_SHUTDOWN_GRACE_S``, traces are flushed). Raises ServeConfigError."""
    import uvicorn

    from rag_core.lookup.tool import LookupKnowledgeTool

    check_bind(settings)
    service = LookupService(tool or LookupKnowledgeTool(settings))
    log.warning(
        "serving lookup_knowledge on http://%s:%d (POST /v1/lookup, MCP at /mcp)%s",
        settings.serve_host,
        settings.serve_port,
        ", bearer token required" if settings.serve_token else "",
    )
    uvicorn.run(
        served_app(service),
        host=settings.serve_host,
        port=settings.serve_port,
        log_level="warning",
        access_log=False,  # one log call less per request; the trace row records every call
        timeout_graceful_shutdown=int(settings.serve_shutdown_grace_s) or None,
    )


def serve_stdio(settings: RagSettings, tool: LookupKnowledgeTool | None = None) -> None:
    """Serve MCP on stdin/stdout until the client closes stdin (the model and stores load
    first; logs go to stderr). Then in-flight calls drain and traces are flushed."""
    import anyio
    from mcp.server.stdio import stdio_server

    from rag_core.lookup.tool import LookupKnowledgeTool

    service = LookupService(tool or LookupKnowledgeTool(settings))
    server = build_mcp_server(service, "mcp-stdio")

    async def run() -> None:
        await anyio.to_thread.run_sync(service.start)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        anyio.run(run)
    finally:
        service.close()
