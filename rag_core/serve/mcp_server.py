"""The MCP server (official ``mcp`` SDK, low-level ``Server``): one tool, ``lookup_knowledge``,
and one resource per document (``knowledge://<docId>``).

The tool's input schema is ``service.served_input_schema()`` (``tool_definition()``'s plus an
optional ``sessionId``); its output schema is ``LookupResult``'s JSON schema (camelCase). A call
returns the ``LookupResult`` JSON as structured content plus one text part (the message and the
packed context, for a model that reads only text); ``isError`` is set when the result's status
is ``error`` (refused arguments included), or when the call is refused because too many are in
flight (text only: ``overloaded: ...; retry after N s``). Malformed requests are the SDK's
JSON-RPC errors.
"""

from __future__ import annotations

import uuid
from typing import Any, Final
from urllib.parse import quote, unquote

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from rag_core.lookup.contracts import LookupResult
from rag_core.lookup.tool import TOOL_DESCRIPTION, TOOL_NAME
from rag_core.serve.service import LookupService, Overloaded, served_input_schema

RESOURCE_SCHEME: Final = "knowledge://"
SERVER_NAME: Final = "rag-knowledge"


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

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/markdown", text=_document_text(service, uri))]
        )

    input_schema = tool_entry.input_schema

    def tool_input_schema(name: str) -> dict[str, Any] | None:
        # Given to the SDK so that checking a call's Mcp-Param-* headers does not run (and
        # serialise) the whole tools/list handler on every tools/call.
        return input_schema if name == TOOL_NAME else None

    return Server(
        SERVER_NAME,
        instructions=TOOL_DESCRIPTION,
        get_tool_input_schema=tool_input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
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
