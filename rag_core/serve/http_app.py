"""The one ASGI app of `rag serve` over HTTP (FastAPI): ``POST /v1/lookup``, ``GET /healthz``,
``GET /readyz``, and the MCP streamable-HTTP endpoint at ``/mcp`` (the SDK's session manager).

* ``POST /v1/lookup`` takes ``{"query": "...", "sessionId": "..."}`` and answers 200 with the
  ``LookupResult`` JSON whatever the lookup's ``status`` (an empty or oversized query is the
  tool's structured error result); a body that is not JSON, not an object, lacks ``query`` or has
  a field of the wrong type is 422 ``{"error": "<argument>: <reason>"}``; too large a body 413;
  past ``RAG_SERVE_MAX_IN_FLIGHT`` lookups in flight 429 with ``Retry-After``.
* When ``RAG_SERVE_TOKEN`` is set, ``/v1/*`` and ``/mcp`` require ``Authorization: Bearer
  <token>`` (401 otherwise); health and readiness stay open (they carry no knowledge).
* The model and stores load in the background at start: ``/readyz`` answers 503 until they have
  (and while the main store fails its check), ``/healthz`` 200 as soon as the process serves.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag_core.lookup.contracts import LookupResult
from rag_core.serve.mcp_server import BATCH_ERROR, build_mcp_server, carriable_json, server_version
from rag_core.serve.service import MAX_SESSION_ID_CHARS, LookupService, Overloaded, is_loopback

log = logging.getLogger(__name__)

PROTECTED_PREFIXES = ("/v1/", "/mcp")
MCP_PATHS = ("/mcp", "/mcp/")
#: RFC 6750's challenge with an error code: a client reads a token problem, not an invitation to
#: start OAuth discovery (no ``resource_metadata``: this server has no authorization server).
CHALLENGE = b'Bearer realm="rag", error="invalid_token", error_description="RAG_SERVE_TOKEN bearer token required"'
#: Lone surrogates in a body: as a JSON escape (\udXXX, X in 800-fff) or as raw (CESU-8) bytes.
SURROGATE_BYTES = re.compile(rb"\\[uU][dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")


class LookupRequest(BaseModel):
    """Body of ``POST /v1/lookup``: ``query`` (the question or alert text) and an optional
    ``sessionId`` (the conversation: ``retrievedDomainsThisSession`` accumulates per id)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    query: str = Field(description="The question or alert text to find evidence for.")
    session_id: str | None = Field(None, alias="sessionId", max_length=MAX_SESSION_ID_CHARS)


class ErrorBody(BaseModel):
    """A refused request: one line naming the argument or header."""

    error: str


class Readiness(BaseModel):
    """``GET /readyz`` (200 ready, 503 not yet or the main store failing): ``LookupService.readiness``."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel)

    ready: bool
    loaded: bool = Field(description="model, L0 index and stores loaded")
    main_store: str = Field(description="'up', 'not checked', or the main store's problems")
    index_state: str
    sidecar: str = Field(description="'disabled', 'up', 'down: <error>' or 'problem: <...>'")
    trace_store: str = Field(description="'up', 'down: rows spooled for replay', 'disabled' or 'not started'")
    in_flight: int


def create_app(service: LookupService, *, start: bool = True) -> FastAPI:
    """The app serving ``service``. ``start``: warm the tool up in a background thread when the
    app starts (tests that started the service themselves pass False). On shutdown the MCP
    sessions end, in-flight lookups drain (``RAG_SERVE_SHUTDOWN_GRACE_S``) and the tool closes
    (the trace queue is flushed or spooled)."""
    settings = service.settings
    mcp = build_mcp_server(service, "mcp-http")
    # DNS-rebinding protection (Host/Origin checks) on loopback, as the SDK does by default; a
    # non-loopback bind is protected by the bearer token instead (required there).
    security = (
        None if is_loopback(settings.serve_host) else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )
    [mcp_route] = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        # One JSON body per tool call instead of an SSE stream per POST (the spec allows either;
        # the answer is one message, and the SSE machinery cost more than the JSON encoding).
        json_response=True,
        host=settings.serve_host,
        transport_security=security,
        max_request_body_size=settings.serve_max_request_bytes,
    ).routes
    assert isinstance(mcp_route, Route)
    # The same endpoint at /mcp/: Starlette would redirect it (307), which some clients refuse.
    mcp_routes = [mcp_route, Route("/mcp/", endpoint=mcp_route.endpoint)]

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if start:
            service.start_in_background()
        try:
            async with mcp.session_manager.run():
                yield
        finally:
            await anyio.to_thread.run_sync(service.close)

    app = FastAPI(
        title="rag_core lookup_knowledge",
        description="Evidence from the team's knowledge base for agents (the lookup_knowledge tool over HTTP).",
        version=server_version(),
        lifespan=lifespan,
    )
    app.router.routes.extend(mcp_routes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": validation_line(exc.errors())}, status_code=422)

    @app.post(
        "/v1/lookup",
        summary="lookup_knowledge",
        responses={
            200: {"model": LookupResult, "description": "The LookupResult (camelCase), any status"},
            401: {"model": ErrorBody},
            413: {"model": ErrorBody},
            422: {"model": ErrorBody},
            429: {"model": ErrorBody, "description": "Too many lookups in flight; retry after Retry-After seconds"},
        },
    )
    async def lookup(body: LookupRequest) -> Response:
        arguments = (
            {"query": body.query} if body.session_id is None else {"query": body.query, "sessionId": body.session_id}
        )
        try:
            payload = await service.call_rendered(arguments, "http", result_json_bytes)
        except Overloaded as exc:
            return JSONResponse({"error": str(exc)}, status_code=429, headers={"Retry-After": str(exc.retry_after_s)})
        return Response(payload, media_type="application/json")

    @app.get("/healthz", summary="The process serves")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        summary="Model and stores loaded; Milvus, sidecar and trace store state",
        responses={200: {"model": Readiness}, 503: {"model": Readiness, "description": "Not ready (yet)"}},
    )
    async def readyz() -> JSONResponse:
        state = service.readiness()
        return JSONResponse(state, status_code=200 if state["ready"] else 503)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer", "description": "RAG_SERVE_TOKEN, when it is set"}
            }
            # Optional ({} = no token) on loopback without RAG_SERVE_TOKEN; required once it is set.
            schema["paths"]["/v1/lookup"]["post"]["security"] = [{"bearer": []}, {}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    token = settings.serve_token.get_secret_value() if settings.serve_token else ""
    wrapped: Any = BodyLimit(McpFraming(app), settings.serve_max_request_bytes)
    if token:
        wrapped = BearerGuard(wrapped, token)
    app.state.asgi = wrapped  # what the server runs: the app behind its guards
    return app


def served_app(service: LookupService, *, start: bool = True) -> ASGIApp:
    """``create_app`` behind its guards (bearer token, body size): the ASGI app to run."""
    app = create_app(service, start=start)
    return app.state.asgi  # type: ignore[no-any-return]


def result_json_bytes(result: LookupResult) -> bytes:
    """The body of ``POST /v1/lookup``: ``result.to_json()`` as UTF-8 JSON, encoded by pydantic
    in one pass (no dict in between; the same JSON, ``to_json`` equal once parsed)."""
    return result.model_dump_json(by_alias=True).encode()


def validation_line(errors: Any) -> str:
    """One line for pydantic/FastAPI validation errors: ``<argument>: <reason>``."""
    first = next(iter(errors), None) if errors else None
    if not isinstance(first, dict):
        return "body: invalid request"
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    where = ".".join(loc) or "body"
    if first.get("type") == "json_invalid":
        return f"body: not valid JSON ({first.get('ctx', {}).get('error', first.get('msg', ''))})"
    if first.get("type") == "model_attributes_type" or (not loc and first.get("type") == "dict_type"):
        return "body: expected a JSON object with 'query'"
    return f"{where}: {first.get('msg', 'invalid')}"


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
            + headers,
        }
    )
    await send({"type": "http.response.body", "body": payload})


class BearerGuard:
    """ASGI middleware: ``/v1/*`` and ``/mcp`` need ``Authorization: Bearer <token>`` (compared in
    constant time); 401 naming the header otherwise. The token is never logged."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self._token = app, token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith(PROTECTED_PREFIXES):
            given = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization" and value[:7].lower() == b"bearer ":
                    given = value[7:].strip()
            if not hmac.compare_digest(given, self._token):
                error = "authorization: a valid 'Bearer <token>' header is required (RAG_SERVE_TOKEN)"
                await _send_json(send, 401, {"error": error}, [(b"www-authenticate", CHALLENGE)])
                return
        await self.app(scope, receive, send)


class McpFraming:
    """ASGI middleware on ``POST /mcp``: a JSON-RPC batch gets the JSON-RPC error -32600 (400)
    instead of the SDK's validation dump, and a body whose strings hold lone surrogates (which
    the SDK's JSON reader refuses) is passed on with them replaced by U+FFFD (``carriable``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in MCP_PATHS:
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if body.lstrip()[:1] == b"[":
            error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": BATCH_ERROR}}
            await _send_json(send, 400, error, [])
            return
        if SURROGATE_BYTES.search(body):
            try:
                body = json.dumps(carriable_json(json.loads(body))).encode()
            except ValueError:
                pass  # not JSON: the SDK answers its parse error
            headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send)


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413 before the app sees it (by
    Content-Length, or counted while read when it is chunked)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        too_large = {"error": f"body: larger than {self.max_bytes} bytes (RAG_SERVE_MAX_REQUEST_BYTES)"}
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _send_json(send, 413, too_large, [])
                return
        # Read the body here (it is small), then hand it on; later receives (disconnects) pass through.
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_json(send, 413, too_large, [])
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
