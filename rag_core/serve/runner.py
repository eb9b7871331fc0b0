"""Starting `rag serve`: the bind checks, uvicorn for HTTP (JSON endpoint + MCP streamable HTTP),
and the MCP stdio loop. Transport modules are imported by the function that serves them: the
stdio start does not pay for FastAPI, nor HTTP for the stdio loop."""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from typing import TYPE_CHECKING

from rag_core.serve.service import LookupService, is_loopback

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


def bound_socket(settings: RagSettings) -> socket.socket:
    """A listening-ready socket bound to ``RAG_SERVE_HOST:RAG_SERVE_PORT``, handed to uvicorn (so
    the port checked is the port served). ServeConfigError naming the port and the setting when
    it is taken or cannot be bound."""
    host, port = settings.serve_host.strip("[]"), settings.serve_port
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a host name such as localhost
        family = socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound: {exc.strerror or exc}"
        raise ServeConfigError(
            f"port {port} on {host} {reason}: choose another with --port or RAG_SERVE_PORT (0 = any free port)"
        ) from None
    return sock


def serve_http(settings: RagSettings, tool: LookupKnowledgeTool | None = None) -> None:
    """Serve ``POST /v1/lookup``, ``/healthz``, ``/readyz`` and MCP at ``/mcp`` on
    ``RAG_SERVE_HOST:RAG_SERVE_PORT`` until SIGINT/SIGTERM (then: in-flight requests finish
    within ``RAG_SERVE_SHUTDOWN_GRACE_S``, traces are flushed). Raises ServeConfigError (a
    non-loopback bind without token, a busy port) before anything is served or logged."""
    import uvicorn

    from rag_core.lookup.tool import LookupKnowledgeTool
    from rag_core.serve.http_app import served_app

    check_bind(settings)
    sock = bound_socket(settings)
    service = LookupService(tool or LookupKnowledgeTool(settings))
    log.warning(
        "serving lookup_knowledge on http://%s:%d (POST /v1/lookup, MCP at /mcp)%s",
        settings.serve_host,
        sock.getsockname()[1],
        ", bearer token required" if settings.serve_token else "",
    )
    config = uvicorn.Config(
        served_app(service),
        log_level="warning",
        access_log=False,  # one log call less per request; the trace row records every call
        timeout_graceful_shutdown=int(settings.serve_shutdown_grace_s) or None,
    )
    uvicorn.Server(config).run(sockets=[sock])


def serve_stdio(settings: RagSettings, tool: LookupKnowledgeTool | None = None) -> None:
    """Serve MCP on stdin/stdout until the client closes stdin (logs go to stderr). ``initialize``
    and ``tools/list`` are answered at once while the model and stores load in the background;
    a ``tools/call`` waits for them (``service.READY_WAIT_S``). Then in-flight calls drain and
    traces are flushed."""
    import anyio

    from rag_core.lookup.tool import LookupKnowledgeTool
    from rag_core.serve.mcp_server import build_mcp_server, run_stdio

    service = LookupService(tool or LookupKnowledgeTool(settings))
    server = build_mcp_server(service, "mcp-stdio")
    service.start_in_background()
    try:
        anyio.run(run_stdio, server)
    finally:
        service.close()
