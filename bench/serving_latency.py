"""Serving overhead of `rag serve` (issue 24): lookup p50/p95 in process, over HTTP
(`POST /v1/lookup`) and over MCP (streamable HTTP, the SDK's client) at 1, 4 and 16 concurrent
clients, side by side in one run on the real stack (default embedder, no second model, embedded Milvus, the
English runbook corpus), with errors and trace rows against calls.

Every round runs the three ways one after another on the same queries, so machine load moves
them together; the ratio served/in-process is the figure to read, not the milliseconds.

    python -m bench.serving_latency [--rounds 3] [--queries 24]
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from bench.common import RUNBOOKS, make_settings, parse_command_line, ratio, summarize
from bench.queries import benchmark_queries
from rag_core.components import make_embedder, make_main_store
from rag_core.ingest.pipeline import ingest
from rag_core.lookup.tool import LookupKnowledgeTool
from rag_core.markdown import md_table
from rag_core.stores.milvus_server import stop_server
from rag_core.traces.recorder import MemoryRecorder

CLIENTS = (1, 4, 16)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _timed(call: Callable[[str], Awaitable[bool]], queries: list[str], clients: int) -> tuple[list[float], int]:
    """Run ``queries`` through ``clients`` concurrent workers; per-call ms and the error count."""
    todo = list(queries)
    times: list[float] = []
    errors = 0

    async def worker() -> None:
        nonlocal errors
        while todo:
            query = todo.pop()
            start = time.perf_counter()
            ok = await call(query)
            times.append((time.perf_counter() - start) * 1000)
            errors += not ok

    await asyncio.gather(*[worker() for _ in range(clients)])
    return times, errors


async def _measure(tool: LookupKnowledgeTool, base: str, queries: list[str], rounds: int) -> dict[str, Any]:
    from mcp import Client

    async def in_process(query: str) -> bool:
        result = await asyncio.to_thread(tool.lookup, query)
        return result.status != "error"

    results: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=base, timeout=60) as http, Client(f"{base}/mcp") as mcp:

        async def over_http(query: str) -> bool:
            response = await http.post("/v1/lookup", json={"query": query})
            return response.status_code == 200 and response.json()["status"] != "error"

        async def over_mcp(query: str) -> bool:
            answer = await mcp.call_tool("lookup_knowledge", {"query": query})
            return not answer.is_error

        ways = {"in-process": in_process, "http": over_http, "mcp-http": over_mcp}
        for clients in CLIENTS:
            per_way: dict[str, list[float]] = {way: [] for way in ways}
            errors = dict.fromkeys(ways, 0)
            for _ in range(rounds):
                for way, call in ways.items():
                    times, failed = await _timed(call, queries, clients)
                    per_way[way] += times
                    errors[way] += failed
            results[str(clients)] = {way: {**summarize(per_way[way]), "errors": errors[way]} for way in ways}
    return results


def _serve(tool: LookupKnowledgeTool, port: int) -> tuple[Any, threading.Thread]:
    import uvicorn

    from rag_core.serve.http_app import served_app
    from rag_core.serve.service import LookupService

    app = served_app(LookupService(tool))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return server, thread


def _table(results: dict[str, Any]) -> str:
    head = ["clients", "in-process p50 / p95 ms", "HTTP p50 / p95 ms", "MCP p50 / p95 ms"]
    head += ["HTTP / in-process p50", "MCP / in-process p50", "errors"]
    rows = []
    for clients, ways in results.items():
        base, http, mcp = ways["in-process"], ways["http"], ways["mcp-http"]
        cells = [f"{w['p50']:.1f} / {w['p95']:.1f}" for w in (base, http, mcp)]
        ratios = [f"{ratio(w['p50'], base['p50'])}x" for w in (http, mcp)]
        rows.append([clients, *cells, *ratios, sum(w["errors"] for w in ways.values())])
    return md_table(head, rows)


def run(rounds: int = 3, n_queries: int = 24) -> dict[str, Any]:
    """Measure and print the table; returns the figures (ms, per client count and way)."""
    if not RUNBOOKS.is_dir():
        print(f"serving_latency: skipped, {RUNBOOKS} is absent (the shared corpora live in ../shared)")
        return {}
    with tempfile.TemporaryDirectory(prefix="rag-serving-latency-") as tmp:
        data = Path(tmp)
        port = _free_port()
        settings = make_settings(data, serve_port=port, ensemble_backend="none", sidecar_enabled=False)
        embedder = make_embedder(settings)
        store = make_main_store(settings)
        ingest(settings, embedder, [store], progress=False)
        recorder = MemoryRecorder()
        tool = LookupKnowledgeTool(
            settings.model_copy(update={"trace_enabled": True}), embedder=embedder, store=store, recorder=recorder
        )
        server, thread = _serve(tool, port)
        try:
            queries = benchmark_queries(n_queries)
            for query in queries[:4]:  # warm-up, not counted
                tool.lookup(query)
            recorder.rows.clear()
            results = asyncio.run(_measure(tool, f"http://127.0.0.1:{port}", queries, rounds))
        finally:
            server.should_exit = True
            thread.join(30)
            store.close()
            stop_server(data)
        calls = len(queries) * rounds * len(CLIENTS) * 3
        print(_table(results))
        print(f"trace rows {len(recorder.rows)} / calls {calls}")
        return {"clients": results, "trace_rows": len(recorder.rows), "calls": calls}


def main(argv: list[str] | None = None) -> int:
    options: dict[str, dict[str, Any]] = {
        "--rounds": dict(type=int, default=3, help="interleaved rounds per client count"),
        "--queries": dict(type=int, default=24, help="queries per round"),
    }
    args = parse_command_line(__doc__, options, argv, prog="python -m bench.serving_latency")
    run(args.rounds, args.queries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
