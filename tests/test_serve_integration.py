"""`rag serve` as its own process on the real stack (the sample knowledge base in the embedded
Milvus, the default embedder), reached by clients this project did not write: the MCP Python
SDK's client over stdio and over streamable HTTP, the MCP TypeScript SDK's client (node, from
npm: tests/js) over both, and plain HTTP. Each answer's evidence docIds equal the same lookup
called in process."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("mcp", reason="the serve extra (mcp, fastapi) is not installed")

from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402
from test_serve import holds_uncarriable, nasty_queries  # noqa: E402

from rag_core.lookup.tool import LookupKnowledgeTool  # noqa: E402
from rag_core.serve.mcp_server import server_version  # noqa: E402

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
QUERIES = ["RedisMemoryHigh fired on redis-main", "kafka consumer lag keeps growing", "checkout pod OOMKilled"]
RAG = [sys.executable, "-c", "from rag_core.cli import main; main()"]
JS_DIR = REPO / "tests" / "js"


def _env(settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(
        RAG_DATA_DIR=str(settings.data_dir),
        RAG_KNOWLEDGE_DIR=str(settings.knowledge_dir),
        RAG_TRACE_ENABLED="false",
        **extra,
    )
    return env


def _doc_ids(result_json: dict) -> list[str]:
    return [b["docId"] for b in result_json["evidenceBlocks"]]


@pytest.fixture(scope="module")
def python_answers(sample_kb, embedder):
    tool = LookupKnowledgeTool(sample_kb, embedder=embedder)
    try:
        return {q: _doc_ids(tool.lookup(q).to_json()) for q in QUERIES}
    finally:
        tool.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_server(sample_kb):
    port = _free_port()
    process = subprocess.Popen(
        [*RAG, "serve"], cwd=REPO, env=_env(sample_kb, RAG_SERVE_PORT=str(port)), stderr=subprocess.PIPE, text=True
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        process.kill()
        pytest.fail(f"rag serve did not become ready: {process.stderr.read()[-2000:] if process.stderr else ''}")
    yield base
    process.terminate()
    process.wait(60)


async def _mcp_doc_ids(target) -> tuple[list[str], dict[str, list[str]]]:
    async with Client(target) as client:
        tools = [t.name for t in (await client.list_tools()).tools]
        answers = {}
        for query in QUERIES:
            result = await client.call_tool("lookup_knowledge", {"query": query})
            assert not result.is_error, result.content
            answers[query] = _doc_ids(result.structured_content)
        return tools, answers


def test_mcp_sdk_client_over_stdio_answers_like_python(sample_kb, python_answers):
    params = StdioServerParameters(command=RAG[0], args=[*RAG[1:], "serve", "--stdio"], env=_env(sample_kb), cwd=REPO)
    tools, answers = asyncio.run(_mcp_doc_ids(params))
    assert tools == ["lookup_knowledge"]
    assert answers == python_answers and all(answers.values())


READY_LINE = "lookup_knowledge ready"


def test_stdio_answers_initialize_and_tools_list_while_the_models_warm_up(sample_kb, python_answers, tmp_path):
    """`rag -v serve --stdio` logs READY_LINE once its warm-up (model, L0 index, stores) is done:
    the MCP SDK client's initialize and tools/list complete before it, and a tools/call then
    waits for it and answers like Python."""
    stderr = tmp_path / "stderr.txt"
    params = StdioServerParameters(
        command=RAG[0], args=[*RAG[1:], "-v", "serve", "--stdio"], env=_env(sample_kb), cwd=REPO
    )

    async def run():
        with stderr.open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                tools = [t.name for t in (await client.list_tools()).tools]
                warm_at_list = READY_LINE in stderr.read_text()
                result = await client.call_tool("lookup_knowledge", {"query": QUERIES[0]})
                return tools, warm_at_list, result

    tools, warm_at_list, result = asyncio.run(run())
    assert tools == ["lookup_knowledge"] and not warm_at_list
    assert READY_LINE in stderr.read_text()
    assert not result.is_error and _doc_ids(result.structured_content) == python_answers[QUERIES[0]]


class StdioLines:
    """`rag serve --stdio` spoken to line by line: ``send(bytes)``, ``answer(timeout)`` -> the
    next JSON line on stdout (None when none came in time)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [*RAG, "serve", "--stdio"], cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line)

    def send(self, line: bytes) -> None:
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def answer(self, timeout: float = 120) -> dict | None:
        try:
            return json.loads(self._lines.get(timeout=timeout))
        except queue.Empty:
            return None

    def close(self) -> int:
        self.process.stdin.close()
        return self.process.wait(60)


def test_stdio_answers_every_line_a_client_can_send(sample_kb, python_answers):
    """The seeded corpus of nasty queries (lone surrogates escaped and raw, NUL, overlong
    UTF-8), a batch, a non-JSON line and a non-message over one stdio session: each line gets
    exactly one JSON-RPC answer (a result for every tools/call that is JSON, lone surrogates
    read as U+FFFD and said so; a parse error for one with a raw control character), and the
    session keeps serving."""
    stdio = StdioLines(_env(sample_kb))
    try:
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "1"}}
        stdio.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}).encode())
        assert stdio.answer()["result"]["serverInfo"]["version"]
        stdio.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        for line, code in [
            (b"etcd is down", -32700),
            (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', -32600),
            (b'{"id": 2}', -32600),
        ]:
            stdio.send(line)
            answer = stdio.answer()
            assert answer is not None and answer["error"]["code"] == code, (line, answer)
        for i, query in enumerate(nasty_queries(40), 10):
            rpc = b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": ' % i
            stdio.send(rpc + b'{"name": "lookup_knowledge", "arguments": {"query": "' + query + b'"}}}')
            answer = stdio.answer()
            assert answer is not None, query
            try:  # what the server reads: the line as UTF-8, undecodable bytes as U+FFFD
                json.loads('"' + query.decode("utf-8", "replace") + '"')
            except ValueError:  # a raw control character: not JSON
                assert answer["error"]["code"] == -32700, (query, answer)
                continue
            assert answer["id"] == i and "result" in answer, (query, answer)
            if holds_uncarriable(query):
                assert "U+FFFD" in answer["result"]["structuredContent"]["message"]
        stdio.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 99,
                    "method": "tools/call",
                    "params": {"name": "lookup_knowledge", "arguments": {"query": QUERIES[0]}},
                }
            ).encode()
        )
        last = stdio.answer()
        assert _doc_ids(last["result"]["structuredContent"]) == python_answers[QUERIES[0]]
    finally:
        assert stdio.close() == 0


def test_mcp_sdk_client_over_streamable_http_answers_like_python(http_server, python_answers):
    tools, answers = asyncio.run(_mcp_doc_ids(f"{http_server}/mcp"))
    assert tools == ["lookup_knowledge"]
    assert answers == python_answers


def test_plain_http_answers_like_python(http_server, python_answers):
    with httpx.Client(base_url=http_server, timeout=60) as http:
        answers = {q: _doc_ids(http.post("/v1/lookup", json={"query": q}).json()) for q in QUERIES}
        ready = http.get("/readyz").json()
    assert answers == python_answers
    assert ready["ready"] and ready["mainStore"] == "up"


def _node() -> str:
    """The node binary, with the TypeScript SDK installed in tests/js (skip otherwise)."""
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        pytest.skip("node/npm not on PATH: the MCP TypeScript SDK client test needs Node.js >= 18")
    if not (JS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.skip("tests/js/node_modules is absent: run `npm ci --prefix tests/js` (CI does, in .ci/run)")
    return node


def _run_js_client(args: list[str], env: dict[str, str] | None = None) -> dict:
    done = subprocess.run(
        [_node(), str(JS_DIR / "lookup_client.mjs"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_typescript_sdk_client_over_streamable_http_answers_like_python(http_server, python_answers):
    # at /mcp/: served as /mcp, no 307 (the AI SDK refuses one)
    out = _run_js_client(["--http", f"{http_server}/mcp/", *QUERIES])
    assert out["tools"] == ["lookup_knowledge"] and out["templates"] == ["knowledge://{docId}"]
    assert out["server"]["version"] == server_version()
    assert out["errors"] == {}
    assert out["answers"] == python_answers and all(out["answers"].values())


def test_typescript_sdk_client_over_stdio_answers_like_python(sample_kb, python_answers):
    out = _run_js_client(["--stdio", *RAG, "serve", "--stdio", "--", *QUERIES], env=_env(sample_kb))
    assert out["tools"] == ["lookup_knowledge"] and out["templates"] == ["knowledge://{docId}"]
    assert out["server"]["version"] == server_version()
    assert out["errors"] == {}
    assert out["answers"] == python_answers
