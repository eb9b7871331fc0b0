"""The MCP server (official ``mcp`` SDK, low-level ``Server``): one tool, ``lookup_knowledge``,
and one resource per document (``knowledge://<docId>``, also listed as the resource template
``knowledge://{docId}``); ``serverInfo.version`` is the package version.

The tool's input schema is ``service.served_input_schema()`` (``tool_definition()``'s plus an
optional ``sessionId``); its output schema is ``LookupResult``'s JSON schema (camelCase). A call
returns the ``LookupResult`` JSON as structured content plus one text part (the message and the
packed context, for a model that reads only text); ``isError`` is set when the result's status
is ``error`` (refused arguments included), or when the call is refused because too many are in
flight (text only: ``overloaded: ...; retry after N s``). Malformed requests are the SDK's JSON-RPC
errors; over stdio (``run_stdio``) a line the SDK drops gets one: a non-JSON line -32700, a batch or
another non-message -32600, and a message whose strings hold lone surrogates is read with them
replaced by U+FFFD (``service.carriable``), as every door does.
"""

from __future__ import annotations

import json
import uuid
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final
from urllib.parse import quote, unquote

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from rag_core.lookup.contracts import LookupResult
from rag_core.lookup.definition import TOOL_DESCRIPTION, TOOL_NAME
from rag_core.serve.service import LookupService, Overloaded, carriable, served_input_schema

RESOURCE_SCHEME: Final = "knowledge://"
RESOURCE_TEMPLATE: Final = RESOURCE_SCHEME + "{docId}"
SERVER_NAME: Final = "rag-knowledge"
PACKAGE: Final = "rag-retrieval"
BATCH_ERROR: Final = (
    "Invalid Request: a JSON-RPC batch; MCP has none since protocol 2025-06-18, send one message at a time"
)


def server_version() -> str:
    """The installed package's version (``serverInfo.version``); "0" when it is not installed."""
    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return "0"


def carriable_json(value: Any) -> Any:
    """``value`` (parsed JSON) with ``carriable`` applied to every string, keys included."""
    if isinstance(value, str):
        return carriable(value)
    if isinstance(value, list):
        return [carriable_json(v) for v in value]
    if isinstance(value, dict):
        return {carriable(k): carriable_json(v) for k, v in value.items()}
    return value


def repair_line(exc: Exception) -> SessionMessage | types.JSONRPCError | None:
    """What a stdio line the SDK could not read (``exc``, its ValidationError) becomes: the
    message itself when Python's JSON reader takes the line (the SDK's refuses lone surrogates;
    they become U+FFFD), else the JSON-RPC error to answer (-32700 not JSON, -32600 a batch or
    no message); None for a blank line or another exception (ignored, as the SDK does)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if not errors:
        return None
    value = errors[0].get("input")
    if errors[0].get("type") == "json_invalid":
        if not isinstance(value, str) or not value.strip():
            return None
        try:
            value = carriable_json(json.loads(value))
        except ValueError:
            return _error(None, types.PARSE_ERROR, "Parse error: the line is not JSON")
        try:
            return SessionMessage(types.jsonrpc_message_adapter.validate_python(value, by_name=False))
        except ValidationError:
            pass
    if isinstance(value, list):
        return _error(None, types.INVALID_REQUEST, BATCH_ERROR)
    given = value.get("id") if isinstance(value, dict) else None
    request_id = given if isinstance(given, str | int) and not isinstance(given, bool) else None
    return _error(request_id, types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 request or notification")


def _error(request_id: str | int | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message))


async def run_stdio(server: Server[Any]) -> None:
    """Serve ``server`` on stdin/stdout (the SDK's stdio transport) until stdin closes; lines the
    SDK drops are answered or repaired by ``repair_line`` on their way to the server."""
    async with stdio_server() as (read, write):
        inbox_writer, inbox = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def pump() -> None:
            async with inbox_writer:
                async for item in read:
                    repaired = repair_line(item) if isinstance(item, Exception) else item
                    if isinstance(repaired, types.JSONRPCError):
                        await write.send(SessionMessage(repaired))
                    elif repaired is not None:
                        await inbox_writer.send(repaired)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(pump)
            await server.run(inbox, write, server.create_initialization_options())


def result_content(result: LookupResult) -> types.CallToolResult:
    """The MCP tool result of one ``LookupResult``: structured content = its JSON, one text part
    (status, relevance, message and the packed context), ``isError`` when status is ``error``."""
    head = f"status={result.status} relevanceLevel={result.relevance_level.value}: {result.message}"
    text = head + ("\n\n" + result.context_pack.packed_text if result.context_pack.packed_text else "")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=result.to_json(),
        is_error=result.status == "error",
    )


def output_schema() -> dict[str, Any]:
    """``LookupResult``'s JSON schema (camelCase, serialisation mode) with every ``$ref``
    inlined and each ``anyOf`` of a type and null written as one ``type`` list: the same
    documents are valid, but a client checking each result against it (the MCP SDKs do, on
    every call) walks no references (the Python SDK's check took about a tenth of a lookup)."""
    schema = LookupResult.model_json_schema(by_alias=True, mode="serialization")
    defs = schema.pop("$defs", {})

    def inline(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [inline(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            if name in seen:  # a recursive model: keep it as it is (never the case today)
                raise RecursionError(name)
            target = inline(defs[name], (*seen, name))
            extra = {k: inline(v, seen) for k, v in node.items() if k != "$ref"}
            # Siblings of $ref are annotations (description, default) in pydantic's output.
            return (
                {**target, **extra}
                if not (extra.keys() & target.keys() - _ANNOTATIONS)
                else {"allOf": [target], **extra}
            )
        out = {k: inline(v, seen) for k, v in node.items()}
        branches = out.get("anyOf")
        if (
            isinstance(branches, list)
            and len(branches) == 2
            and all(isinstance(b, dict) and b.keys() == {"type"} and isinstance(b["type"], str) for b in branches)
            and "type" not in out
        ):
            out.pop("anyOf")
            out["type"] = [b["type"] for b in branches]
        return out

    try:
        return inline(schema, ())  # type: ignore[no-any-return]
    except RecursionError:
        return LookupResult.model_json_schema(by_alias=True, mode="serialization")


_ANNOTATIONS: Final = frozenset({"title", "description", "default", "examples", "deprecated", "readOnly"})


def _session_of(ctx: ServerRequestContext[Any, Any], process_session: str) -> str | None:
    """The MCP session a call belongs to: the streamable-HTTP ``Mcp-Session-Id``; over stdio
    (or in process: no HTTP request) the connection, which is this process's one; None for a
    stateless HTTP call (the caller passes ``sessionId``)."""
    request = ctx.request
    if request is None:
        return process_session
    headers = getattr(request, "headers", None)
    value = headers.get("mcp-session-id") if headers is not None else None
    return f"mcp-{value}" if value else None


def build_mcp_server(service: LookupService, transport: str = "mcp-stdio") -> Server[Any]:
    """The MCP server over ``service``. ``transport`` names the trace rows of calls that come
    without an HTTP request (stdio, in process); calls over HTTP are named ``mcp-http``."""
    process_session = f"mcp-{uuid.uuid4()}"
    tool_entry = types.Tool(
        name=TOOL_NAME,
        description=TOOL_DESCRIPTION,
        input_schema=served_input_schema(),
        output_schema=output_schema(),
    )

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool_entry])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name != TOOL_NAME:
            raise MCPError(types.INVALID_PARAMS, f"name: unknown tool {params.name!r} (this server has {TOOL_NAME})")
        channel = transport if ctx.request is None else "mcp-http"
        arguments = params.arguments if params.arguments is not None else {}
        try:
            return await service.call_rendered(arguments, channel, result_content, _session_of(ctx, process_session))
        except Overloaded as exc:  # a tool error the model can read and act on (HTTP says 429)
            return types.CallToolResult(content=[types.TextContent(type="text", text=str(exc))], is_error=True)

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        l0 = service.tool.l0
        entries = sorted(l0.entries.values(), key=lambda e: e.doc_id) if l0 is not None else []
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name=e.doc_id,
                    title=e.title,
                    uri=RESOURCE_SCHEME + quote(e.doc_id),
                    mime_type="text/markdown",
                    description=e.summary[:200] or None,
                )
                for e in entries
            ]
        )

    async def list_resource_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/markdown", text=_document_text(service, uri))]
        )

    template = types.ResourceTemplate(
        name="knowledge document",
        uri_template=RESOURCE_TEMPLATE,
        mime_type="text/markdown",
        description="A document of the knowledge base by its docId (the evidence blocks' docId, URL-encoded).",
    )
    input_schema = tool_entry.input_schema

    def tool_input_schema(name: str) -> dict[str, Any] | None:
        # Given to the SDK so that checking a call's Mcp-Param-* headers does not run (and
        # serialise) the whole tools/list handler on every tools/call.
        return input_schema if name == TOOL_NAME else None

    return Server(
        SERVER_NAME,
        version=server_version(),
        instructions=TOOL_DESCRIPTION,
        get_tool_input_schema=tool_input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
    )


def _document_text(service: LookupService, uri: str) -> str:
    """The Markdown of the document ``knowledge://<docId>`` names; MCPError (invalid params,
    naming the uri) for another scheme, a doc id the L0 index does not know, or an unreadable file."""
    if not uri.startswith(RESOURCE_SCHEME):
        raise MCPError(types.INVALID_PARAMS, f"uri: expected {RESOURCE_SCHEME}<docId> (got {uri[:200]!r})")
    doc_id = unquote(uri[len(RESOURCE_SCHEME) :])
    l0 = service.tool.l0
    # Only documents the index knows: a doc id is never used as a free path (no ../ escapes).
    if l0 is None or doc_id not in l0.entries:
        raise MCPError(types.INVALID_PARAMS, f"uri: no document {doc_id[:200]!r} in the knowledge base")
    root = service.settings.knowledge_dir.resolve()
    path = (root / doc_id).resolve()
    if not path.is_relative_to(root):
        raise MCPError(types.INVALID_PARAMS, f"uri: {doc_id[:200]!r} is outside the knowledge root")
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise MCPError(types.INVALID_PARAMS, f"uri: cannot read {doc_id[:200]!r}: {exc.strerror or exc}") from None
