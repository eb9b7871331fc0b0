"""`rag serve` on small fakes (hash embedder, in-memory store, two folders of the sample knowledge
base): the real MCP server and the real FastAPI app in process, reached by the MCP SDK's client
(in-memory transport, and streamable HTTP against uvicorn on a free port) and by Starlette's
TestClient. Each answer is compared with the same tool called from Python."""

from __future__ import annotations

import asyncio
import copy
import json
import random
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from conftest import make_settings
from fakes import HashEmbedder

pytest.importorskip("mcp", reason="the serve extra (mcp, fastapi) is not installed")

import uvicorn  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from jsonschema import Draft202012Validator  # noqa: E402
from mcp import Client  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from rag_core.ingest.pipeline import ingest  # noqa: E402
from rag_core.lookup.contracts import LookupResult  # noqa: E402
from rag_core.lookup.tool import LookupKnowledgeTool, tool_definition  # noqa: E402
from rag_core.serve.http_app import result_json_bytes, served_app  # noqa: E402
from rag_core.serve.mcp_server import build_mcp_server, output_schema, server_version  # noqa: E402
from rag_core.serve.runner import ServeConfigError, bound_socket, check_bind  # noqa: E402
from rag_core.serve.service import LookupService, check_arguments  # noqa: E402
from rag_core.stores.memory import InMemoryStore  # noqa: E402
from rag_core.traces.recorder import MemoryRecorder  # noqa: E402

DIM = 16
QUERY = "RedisMemoryHigh fired on redis-main"


@pytest.fixture
def indexed(tmp_path, kb_copy):
    settings = make_settings(tmp_path / "data", kb_copy, ensemble_backend="none")
    store, embedder = InMemoryStore(), HashEmbedder(DIM)
    ingest(settings, embedder, [store], progress=False)
    return settings, store, embedder


@pytest.fixture
def make_service(indexed):
    settings, store, embedder = indexed
    made = []

    def make(**overrides):
        tool_settings = settings.model_copy(update={"trace_enabled": True, **overrides})
        recorder = MemoryRecorder()
        tool = LookupKnowledgeTool(tool_settings, embedder=embedder, store=store, recorder=recorder)
        service = LookupService(tool)
        service.recorder = recorder
        made.append(tool)
        return service

    yield make
    for tool in made:
        tool.sidecar_search.close()


def _doc_ids(result_json):
    return [b["docId"] for b in result_json["evidenceBlocks"]]


def _python_answer(service, query=QUERY):
    """The same tool called from Python (its own row removed from the capture afterwards)."""
    result = service.tool.lookup(query).to_json()
    service.recorder.rows.pop()
    return result


# --- argument checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({}, "query: required"),
        ({"query": ""}, "query: empty"),
        ({"query": "   \n"}, "query: empty"),
        ({"query": 42}, "query: must be a string (got int)"),
        ({"query": "x" * 101}, "query: 101 characters, at most 100"),
        ({"query": "ok", "topK": 3}, "topK: unknown argument"),
        ({"query": "ok", "sessionId": 7}, "sessionId: must be a string"),
        (["query"], "arguments: expected an object"),
    ],
)
def test_bad_arguments_are_one_line_naming_the_argument(arguments, named):
    rejection = check_arguments(arguments, 100)
    assert named in rejection.error and "\n" not in rejection.error


def test_lone_surrogates_and_nul_are_read_as_replacement_characters():
    checked = check_arguments({"query": "etcd \ud800 down\x00now \udfff", "sessionId": "c\udc80"}, 100)
    assert (checked.query, checked.session_id) == ("etcd \ufffd down\ufffdnow \ufffd", "c\ufffd")
    checked.query.encode("utf-8")  # what failed the HTTP answer's encoding (a 500)


def test_good_arguments_pass():
    checked = check_arguments({"query": "why is redis slow", "sessionId": "s1"}, 100)
    assert (checked.query, checked.session_id) == ("why is redis slow", "s1")


def test_non_loopback_bind_without_token_is_refused_naming_the_setting(tmp_path):
    with pytest.raises(ServeConfigError, match="RAG_SERVE_HOST=0.0.0.0 .*RAG_SERVE_TOKEN"):
        check_bind(make_settings(tmp_path, serve_host="0.0.0.0"))
    check_bind(make_settings(tmp_path, serve_host="0.0.0.0", serve_token=SecretStr("t0ken")))
    check_bind(make_settings(tmp_path, serve_host="::1"))


def test_busy_port_is_refused_naming_the_port_and_the_setting(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServeConfigError, match=f"port {port} on 127.0.0.1 is already in use.*RAG_SERVE_PORT"):
            bound_socket(make_settings(tmp_path, serve_port=port))


def test_rag_serve_on_a_busy_port_exits_2_before_it_says_it_serves(tmp_path, monkeypatch, caplog):
    from typer.testing import CliRunner

    from rag_core.cli.commands import app

    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = CliRunner().invoke(app, ["serve", "--port", str(port)])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"port {port}" in lines[0] and "--port or RAG_SERVE_PORT" in lines[0]
    assert "serving" not in caplog.text + res.output


# --- MCP, in-memory transport of the SDK ------------------------------------------------------


async def _mcp_calls(server, calls):
    async with Client(server) as client:
        tools = await client.list_tools()
        results = [await client.call_tool("lookup_knowledge", args) for args in calls]
        resources = await client.list_resources()
        return tools, results, resources, client


def test_mcp_lists_the_tool_with_the_definitions_schema_and_answers_like_python(make_service):
    service = make_service()
    service.start()
    tools, [result, again], resources, _ = asyncio.run(
        _mcp_calls(build_mcp_server(service), [{"query": QUERY}, {"query": "kafka consumer lag"}])
    )
    [tool] = tools.tools
    definition = tool_definition()["function"]
    assert tool.name == definition["name"] and tool.description == definition["description"]
    assert tool.input_schema["required"] == ["query"]
    assert tool.input_schema["properties"]["query"] == definition["parameters"]["properties"]["query"]
    assert "sessionId" in tool.input_schema["properties"]
    assert not result.is_error
    served = result.structured_content
    assert _doc_ids(served) == _doc_ids(_python_answer(service)) and served["found"]
    assert served["evidenceBlocks"][0]["docId"] == "cache/RedisMemoryHigh.md"
    [text] = result.content
    assert served["contextPack"]["packedText"] in text.text and "relevanceLevel=" in text.text
    # one MCP connection = one session: domains accumulate across its calls
    assert again.structured_content["sessionId"] == served["sessionId"] and served["sessionId"].startswith("mcp-")
    assert set(served["retrievedDomainsThisSession"]) <= set(again.structured_content["retrievedDomainsThisSession"])
    rows = service.recorder.rows
    assert len(rows) == 2 and {r["retrieval_details"]["transport"] for r in rows} == {"mcp-stdio"}
    assert rows[0]["session_id"] == served["sessionId"]
    assert "knowledge://cache/RedisMemoryHigh.md" in {str(r.uri) for r in resources.resources}


def _mutated(doc, rng):
    """``doc`` with one value somewhere replaced by a value of a random JSON type."""
    doc = copy.deepcopy(doc)
    slots = []

    def walk(node):
        for key, value in node.items() if isinstance(node, dict) else enumerate(node):
            slots.append((node, key))
            if isinstance(value, dict | list):
                walk(value)

    walk(doc)
    node, key = rng.choice(slots)
    node[key] = rng.choice([None, 3, -1.5, "x", True, [], {}, ["x"]])
    return doc


def test_output_schema_accepts_and_refuses_what_the_models_schema_does(make_service):
    service = make_service()
    results = [service.tool.lookup(q) for q in (QUERY, "kafka consumer lag", "zzqx nothing here")]
    results.append(service.tool.rejected("", None, "query: empty"))
    flat = output_schema()
    assert "$ref" not in json.dumps(flat) and "$defs" not in flat
    model, served = (
        Draft202012Validator(LookupResult.model_json_schema(by_alias=True, mode="serialization")),
        Draft202012Validator(flat),
    )
    rng, refused = random.Random(24), 0
    for result in results:
        doc = result.to_json()
        assert model.is_valid(doc) and served.is_valid(doc)
        # the HTTP body is the same JSON
        assert json.loads(result_json_bytes(result)) == doc
        for _ in range(150):
            bad = _mutated(doc, rng)
            assert model.is_valid(bad) == served.is_valid(bad), bad
            refused += not model.is_valid(bad)
    assert refused > 200  # the mutations do reach validated fields


def test_mcp_interop_nullable_session_resource_template_and_version(make_service):
    """A strict-schema client passes every property (sessionId null); resources/templates/list
    names knowledge://{docId}; serverInfo.version is the package's."""
    service = make_service()

    async def run():
        async with Client(build_mcp_server(service)) as client:
            [tool] = (await client.list_tools()).tools
            result = await client.call_tool("lookup_knowledge", {"query": QUERY, "sessionId": None})
            templates = await client.list_resource_templates()
            return tool, result, templates, client.server_info

    tool, result, templates, info = asyncio.run(run())
    assert "null" in tool.input_schema["properties"]["sessionId"]["type"]
    assert Draft202012Validator(tool.input_schema).is_valid({"query": QUERY, "sessionId": None})
    assert not result.is_error and result.structured_content["sessionId"].startswith("mcp-")
    assert [t.uri_template for t in templates.resource_templates] == ["knowledge://{docId}"]
    assert info.version == server_version() and info.version not in ("", "0")


def test_calls_wait_for_the_background_warm_up_within_their_deadline(make_service, monkeypatch):
    """While the warm-up runs, tools/list answers and a call waits; past ``READY_WAIT_S`` the call
    gets the structured "still loading" error; once warm, calls answer."""
    import rag_core.serve.service as service_module

    service, release = make_service(), threading.Event()
    warm_up = service.tool.warm_up
    monkeypatch.setattr(service.tool, "warm_up", lambda: release.wait(30) and warm_up())
    monkeypatch.setattr(service_module, "READY_WAIT_S", 0.3)
    service.start_in_background()

    async def run():
        async with Client(build_mcp_server(service)) as client:
            listed = await client.list_tools()
            early = await client.call_tool("lookup_knowledge", {"query": QUERY})
            monkeypatch.setattr(service_module, "READY_WAIT_S", 60.0)
            waiting = asyncio.create_task(client.call_tool("lookup_knowledge", {"query": QUERY}))
            await asyncio.sleep(0.1)
            release.set()
            return listed, early, await waiting

    listed, early, late = asyncio.run(run())
    assert [t.name for t in listed.tools] == ["lookup_knowledge"]
    assert early.is_error and "still loading the model and stores" in early.structured_content["message"]
    assert not late.is_error and late.structured_content["found"] and service.ready


def test_mcp_bad_query_is_the_tools_error_result_and_traced(make_service):
    service = make_service(serve_max_query_chars=50)
    calls = [{}, {"query": ""}, {"query": "y" * 51}, {"query": "ok", "sessionId": "conv-1", "extra": 1}]
    _, results, _, _ = asyncio.run(_mcp_calls(build_mcp_server(service), calls))
    for result, named in zip(
        results, ["query: required", "query: empty", "query: 51 characters", "extra:"], strict=True
    ):
        assert result.is_error and result.structured_content["status"] == "error"
        assert named in result.structured_content["message"] and named in result.content[0].text
    rows = service.recorder.rows
    assert [r["status"] for r in rows] == ["error"] * 4 and "query: required" in rows[0]["error"]
    assert rows[3]["session_id"] == "conv-1"  # the caller's sessionId wins over the MCP session


def test_mcp_reads_a_cited_document_and_refuses_paths_outside_the_index(make_service):
    from mcp.shared.exceptions import MCPError

    service = make_service()

    async def run():
        async with Client(build_mcp_server(service)) as client:
            doc = await client.read_resource("knowledge://cache/RedisMemoryHigh.md")
            with pytest.raises(MCPError, match="uri: no document"):
                await client.read_resource("knowledge://../../etc/passwd")
            return doc

    doc = asyncio.run(run())
    assert "RedisMemoryHigh" in doc.contents[0].text


def test_mcp_store_down_gives_the_librarys_degraded_result(make_service):
    class Down(InMemoryStore):
        def search(self, *a, **k):
            from rag_core.stores.base import StoreError

            raise StoreError("Milvus search failed: connection refused")

        search_lexical = search

    service = make_service()
    service.tool._store = Down()
    _, [result], _, _ = asyncio.run(_mcp_calls(build_mcp_server(service), [{"query": QUERY}]))
    served = result.structured_content
    assert served["status"] == "degraded" and served["retrievalTrace"]["layer"] == "L0"
    assert not result.is_error and served["evidenceBlocks"][0]["docId"] == "cache/RedisMemoryHigh.md"
    assert service.recorder.rows[0]["status"] == "degraded"


# --- HTTP/JSON, FastAPI TestClient ------------------------------------------------------------


def test_http_lookup_equals_python_and_is_traced_as_http(make_service):
    service = make_service()
    with TestClient(served_app(service)) as http:
        deadline = time.monotonic() + 30
        while http.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        ready = http.get("/readyz").json()
        response = http.post("/v1/lookup", json={"query": QUERY, "sessionId": "conv-9"})
        openapi = http.get("/openapi.json").json()
    assert ready["ready"] and ready["traceStore"] == "up" and ready["sidecar"] == "disabled"
    assert response.status_code == 200
    body = response.json()
    assert _doc_ids(body) == _doc_ids(_python_answer(service)) and body["sessionId"] == "conv-9"
    row = service.recorder.rows[0]
    assert row["retrieval_details"]["transport"] == "http" and row["session_id"] == "conv-9"
    assert "LookupResult" in openapi["components"]["schemas"] and "/v1/lookup" in openapi["paths"]
    assert service.recorder.closed  # shutdown closed the tool (trace queue flushed)


def test_http_bad_requests_are_one_line_errors_never_tracebacks(make_service):
    service = make_service(serve_max_request_bytes=2048, serve_max_query_chars=100)
    service.start()
    cases = [
        (b"{not json", 422, "body: not valid JSON"),
        (b"[1, 2]", 422, "body: expected a JSON object"),
        (b'{"sessionId": "s"}', 422, "query: Field required"),
        (b'{"query": 5}', 422, "query:"),
        (b'{"query": "a", "topK": 3}', 422, "topK:"),
        (b'{"query": "' + b"z" * 3000 + b'"}', 413, "RAG_SERVE_MAX_REQUEST_BYTES"),
    ]
    with TestClient(served_app(service, start=False), raise_server_exceptions=False) as http:
        for body, status, named in cases:
            r = http.post("/v1/lookup", content=body, headers={"content-type": "application/json"})
            assert r.status_code == status and named in r.json()["error"], (body[:30], r.text)
            assert "Traceback" not in r.text
        empty = http.post("/v1/lookup", json={"query": "  "})
        long = http.post("/v1/lookup", json={"query": "q" * 101})
    assert empty.status_code == 200 and empty.json()["status"] == "error" and "query: empty" in empty.json()["message"]
    assert long.json()["status"] == "error" and "at most 100" in long.json()["message"]
    assert [r["status"] for r in service.recorder.rows] == ["error", "error"]  # refused calls are traced too


def test_openapi_declares_the_bearer_scheme_and_the_readiness_body(make_service):
    with TestClient(served_app(make_service(), start=False)) as http:
        openapi = http.get("/openapi.json").json()
        not_ready = http.get("/readyz")
    assert openapi["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "RAG_SERVE_TOKEN, when it is set",
    }
    assert {"bearer": []} in openapi["paths"]["/v1/lookup"]["post"]["security"]
    schema = openapi["paths"]["/readyz"]["get"]["responses"]["503"]["content"]["application/json"]["schema"]
    body_schema = openapi["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    assert not_ready.status_code == 503 and set(body_schema["required"]) <= set(not_ready.json())
    assert Draft202012Validator({**body_schema, "components": openapi["components"]}).is_valid(not_ready.json())
    assert openapi["info"]["version"] == server_version()


def test_token_protects_lookup_and_mcp_but_not_health(make_service, caplog):
    secret = "s3cr3t-t0ken-value"
    service = make_service(serve_token=SecretStr(secret), serve_host="0.0.0.0")
    service.start()
    with caplog.at_level("DEBUG"), TestClient(served_app(service, start=False)) as http:
        assert http.get("/healthz").status_code == 200
        no = http.post("/v1/lookup", json={"query": QUERY})
        wrong = http.post("/v1/lookup", json={"query": QUERY}, headers={"Authorization": "Bearer nope"})
        mcp = http.post("/mcp", json={}, headers={"Authorization": "Bearer nope"})
        ok = http.post("/v1/lookup", json={"query": QUERY}, headers={"Authorization": f"Bearer {secret}"})
    assert no.status_code == wrong.status_code == mcp.status_code == 401
    # RFC 6750 with an error code: a token problem, not an OAuth discovery challenge
    challenge = no.headers["www-authenticate"]
    assert challenge.startswith("Bearer realm=") and 'error="invalid_token"' in challenge
    assert "resource_metadata" not in challenge and mcp.headers["www-authenticate"] == challenge
    assert "authorization:" in no.json()["error"] and "RAG_SERVE_TOKEN" in no.json()["error"]
    assert ok.status_code == 200 and ok.json()["found"]
    assert secret not in caplog.text and secret not in str(service.readiness())


# --- MCP over streamable HTTP: the SDK's client against uvicorn on a real socket ---------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def live_server(make_service):
    port = _free_port()
    service = make_service(serve_port=port)
    server = uvicorn.Server(uvicorn.Config(served_app(service), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield service, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_mcp_streamable_http_client_and_http_agree_under_concurrency(live_server):
    service, base = live_server

    async def run():
        async with Client(f"{base}/mcp") as client:
            listed = await client.list_tools()
            results = await asyncio.gather(*[client.call_tool("lookup_knowledge", {"query": QUERY}) for _ in range(4)])
        async with httpx.AsyncClient(base_url=base) as http:
            posted = await asyncio.gather(*[http.post("/v1/lookup", json={"query": QUERY}) for _ in range(4)])
        return listed, results, posted

    listed, results, posted = asyncio.run(run())
    python = _doc_ids(_python_answer(service))
    assert [t.name for t in listed.tools] == ["lookup_knowledge"]
    assert all(_doc_ids(r.structured_content) == python and not r.is_error for r in results)
    assert all(p.status_code == 200 and _doc_ids(p.json()) == python for p in posted)
    transports = [r["retrieval_details"]["transport"] for r in service.recorder.rows]
    assert sorted(transports) == ["http"] * 4 + ["mcp-http"] * 4  # trace count = call count


def _malformed_requests(n: int, seed: int = 24) -> list[tuple[str, bytes, str]]:
    """``n`` seeded malformed requests ``(path, body, content type)``: random bytes, cut JSON,
    wrong types, deep nesting, oversized bodies, JSON-RPC frames with bad methods or params."""
    rng = np.random.default_rng(seed)
    good = b'{"query": "' + QUERY.encode() + b'"}'
    rpc = [
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "lookup_knowledge"}}',
        b'{"jsonrpc": "2.0", "id": 1, "method": "no/such/method"}',
        b'{"jsonrpc": "1.0", "method": 5}',
        b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "tools/list", "params": []}',
        b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "other", "arguments": 3}}',
    ]
    kinds = [
        lambda: ("/v1/lookup", rng.bytes(int(rng.integers(1, 400))), "application/json"),
        lambda: ("/v1/lookup", good[: int(rng.integers(1, len(good) - 1))], "application/json"),
        lambda: (
            "/v1/lookup",
            b'{"query": ' + [b"null", b"[]", b"{}", b"1e999", b"true"][int(rng.integers(5))] + b"}",
            "application/json",
        ),
        lambda: ("/v1/lookup", b"[" * 5000 + b"]" * 5000, "application/json"),
        lambda: ("/v1/lookup", b'{"query": "' + b"x" * 70_000 + b'"}', "application/json"),
        lambda: ("/v1/lookup", good, ["text/plain", "application/xml", ""][int(rng.integers(3))]),
        lambda: ("/mcp", rpc[int(rng.integers(len(rpc)))], "application/json"),
        lambda: ("/mcp", rng.bytes(int(rng.integers(1, 200))), "application/json"),
    ]
    return [kinds[int(rng.integers(len(kinds)))]() for _ in range(n)]


def test_a_thousand_malformed_requests_crash_nothing(live_server):
    service, base = live_server
    statuses = []
    with httpx.Client(base_url=base, timeout=30) as http:
        for path, body, content_type in _malformed_requests(1000):
            headers = {"content-type": content_type, "accept": "application/json, text/event-stream"}
            response = http.post(path, content=body, headers=headers)
            statuses.append(response.status_code)
            assert response.status_code < 500 and "Traceback" not in response.text, (
                path,
                body[:60],
                response.text[:200],
            )
        after = http.post("/v1/lookup", json={"query": QUERY})
    assert after.status_code == 200 and _doc_ids(after.json()) == _doc_ids(_python_answer(service))
    assert {413, 422} <= set(statuses)  # the mix reached the size and the validation refusals


def test_mcp_sdk_client_at_mcp_with_a_slash_and_batches_over_http(live_server):
    """``/mcp/`` is served as ``/mcp`` (no 307); a JSON-RPC batch gets one JSON-RPC error."""
    _, base = live_server

    async def run():
        async with Client(f"{base}/mcp/") as client:
            return await client.call_tool("lookup_knowledge", {"query": QUERY})

    result = asyncio.run(run())
    assert not result.is_error and result.structured_content["found"]
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "ping"}]
    with httpx.Client(base_url=base, timeout=30) as http:
        slash = http.post("/mcp/", json=batch, headers={"accept": "application/json, text/event-stream"})
        plain = http.post("/mcp", json=batch, headers={"accept": "application/json, text/event-stream"})
    for response in (slash, plain):
        body = response.json()
        assert response.status_code == 400 and body["jsonrpc"] == "2.0" and body["id"] is None
        assert body["error"]["code"] == -32600 and "batch" in body["error"]["message"]
        assert len(response.text) < 300  # one line, no validation dump


# --- every door answers cleanly: a seeded corpus of what a client can send ------------------

#: Pieces of a JSON string literal (bytes as sent): lone surrogates as escapes and as raw
#: (CESU-8) bytes, NUL escaped and raw, overlong and invalid UTF-8, a valid pair, controls.
NASTY_PIECES = [
    rb"\ud800",
    rb"\udfff",
    rb"\udc00\ud800",
    rb"\uDBFF x",
    b"\xed\xa0\x80",
    b"\xed\xbf\xbf",
    rb"\u0000",
    b"\x00",
    b"\xc0\xaf",
    b"\xe0\x80\xaf",
    b"\xf8\x88\x80\x80\x80",
    b"\xff\xfe",
    b"\x80",
    rb"\ud83d\ude00",
    "\u00e9t\u00e9 \u202e \ufeff \ufffd".encode(),
    rb"\u001b[31m",
    b"\t",
    rb"\\ud800",
]


def nasty_queries(n: int, seed: int = 45) -> list[bytes]:
    """``n`` seeded JSON string bodies (without quotes): 1-4 nasty pieces among words."""
    rng = random.Random(seed)
    words = [b"etcd", b"down", b"RedisMemoryHigh", b"kafka", b"lag", b"\xe6\x9c\x8d\xe5\x8a\xa1"]
    out = []
    for _ in range(n):
        parts = [rng.choice(words) for _ in range(rng.randint(1, 3))]
        for _ in range(rng.randint(1, 4)):
            parts.insert(rng.randint(0, len(parts)), rng.choice(NASTY_PIECES))
        out.append(b" ".join(parts))
    return out


def holds_uncarriable(query: bytes) -> bool:
    """True when the JSON string, read as Python reads it, holds a lone surrogate or NUL (the note is for)."""
    try:
        text = json.loads(b'"' + query + b'"')
    except ValueError:
        return False
    return any("\ud800" <= ch <= "\udfff" or ch == "\x00" for ch in text)


def test_every_http_door_answers_nasty_queries_cleanly_on_one_connection(live_server):
    """POST /v1/lookup and MCP tools/call over streamable HTTP, on one keep-alive connection
    each: every nasty query gets a 4xx or a structured result (never a 5xx), a query holding
    lone surrogates or NUL answers with them read as U+FFFD and says so, and the connection
    keeps serving."""
    service, base = live_server
    queries = nasty_queries(120)
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=base, timeout=60, headers=headers) as http:
        init = http.post(
            "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "fuzz", "version": "1"},
                },
            },
        )
        session = {"mcp-session-id": init.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        statuses = {"http": [], "mcp": []}
        for i, query in enumerate(queries, 1):
            plain = http.post("/v1/lookup", content=b'{"query": "' + query + b'"}')
            rpc = b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": ' % i
            rpc += b'{"name": "lookup_knowledge", "arguments": {"query": "' + query + b'"}}}'
            mcp = http.post("/mcp", content=rpc, headers=session)
            statuses["http"].append(plain.status_code)
            statuses["mcp"].append(mcp.status_code)
            for response in (plain, mcp):
                assert response.status_code < 500 and "Traceback" not in response.text, (query, response.text[:300])
            if plain.status_code == 200 and holds_uncarriable(query):
                assert "\ufffd" in plain.json()["query"] and "U+FFFD" in plain.json()["message"]
            if mcp.status_code == 200:
                answer = mcp.json()
                assert answer["id"] == i and "result" in answer, answer
                if holds_uncarriable(query):
                    assert "U+FFFD" in answer["result"]["structuredContent"]["message"]
        after = http.post("/v1/lookup", json={"query": QUERY})
    assert after.status_code == 200 and _doc_ids(after.json()) == _doc_ids(_python_answer(service))
    # the corpus reached both outcomes on both doors: answered, and refused as not JSON
    assert {200} < set(statuses["http"]) and {200} < set(statuses["mcp"])
    assert sum(s == 200 for s in statuses["mcp"]) >= sum(holds_uncarriable(q) for q in queries) > 10
