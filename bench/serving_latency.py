"""Serving overhead of `rag serve` (issue 24): lookup p50/p95 (ms) in process, over HTTP (`POST
/v1/lookup`) and over MCP (streamable HTTP) at 1, 4 and 16 concurrent clients, on the real stack
(default embedder, no second model, embedded Milvus, the English runbooks, traces to the real
recorder and trace store), with errors and trace rows against calls. Each round runs the three
ways on the same queries (at one client call by call in turn); read the served/in-process ratio:
the p50 ratio over all rounds and the median of the per-round ratios.

    python -m bench.serving_latency [--rounds 3] [--queries 24] [--clients 1,4,16]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from bench.common import RUNBOOKS, make_settings, parse_command_line, ratio, summarize
from bench.queries import benchmark_queries
from bench.serving import ingested_tool
from rag_core.embedding import make_embedder
from rag_core.markdown import md_table
from rag_core.stores.milvus_server import stop_server
from rag_core.stores.pgserver import stop_embedded
from rag_core.traces.recorder import ToolInvocationRecorder

CLIENTS = (1, 4, 16)


class CountingRecorder(ToolInvocationRecorder):
    """The real recorder (trace store + spool), counting in ``rows`` the rows the tool hands it."""

    rows = 0
    _count_lock = threading.Lock()

    def record(self, row: Any) -> None:
        with self._count_lock:
            self.rows += 1
        super().record(row)


async def _timed(call: Callable[[str], Awaitable[bool]], queries: list[str], clients: int) -> tuple[list[float], int]:
    """Run ``queries`` through ``clients`` concurrent callers; per-call ms and the error count."""
    gate = asyncio.Semaphore(clients)

    async def one(query: str) -> tuple[float, bool]:
        async with gate:
            start = time.perf_counter()
            ok = await call(query)
            return (time.perf_counter() - start) * 1000, ok

    done = await asyncio.gather(*map(one, queries))
    return [ms for ms, _ in done], sum(not ok for _, ok in done)


async def _measure(
    tool: Any, base: str, queries: list[str], rounds: int, client_counts: tuple[int, ...]
) -> dict[str, Any]:
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
        for clients in client_counts:
            # One client: the ways take turns call by call (the order rotating), so each query is
            # timed the three ways within the same fraction of a second; more: way after way.
            names = list(ways)
            if clients == 1:
                steps = [(way, [q]) for i, q in enumerate(queries) for way in names[i % 3 :] + names[: i % 3]]
            else:
                steps = [(way, queries) for way in names]
            times: dict[str, list[list[float]]] = {way: [[] for _ in range(rounds)] for way in ways}  # per round
            errors = dict.fromkeys(ways, 0)
            for r in range(rounds):
                for way, batch in steps:
                    got, failed = await _timed(ways[way], batch, clients)
                    times[way][r] += got
                    errors[way] += failed
            results[str(clients)] = {
                way: {**summarize([ms for done in per_round for ms in done]), "errors": errors[way]}
                for way, per_round in times.items()
            }
            in_process_p50 = [statistics.median(done) for done in times["in-process"]]
            for way in ("http", "mcp-http"):  # median over rounds of the round's served/in-process p50
                ratios = [statistics.median(done) / b for done, b in zip(times[way], in_process_p50, strict=True)]
                results[str(clients)][way]["median_round_ratio"] = round(statistics.median(ratios), 3)
    return results


def _serve(tool: Any) -> tuple[Any, threading.Thread, str]:
    """`rag serve`'s app on ``tool`` in a thread, on a free port: (server, thread, base URL)."""
    import uvicorn

    from rag_core.serve.http_app import served_app
    from rag_core.serve.service import LookupService

    app = served_app(LookupService(tool))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


def _table(results: dict[str, Any]) -> str:
    head = ["clients", "in-process p50 / p95 ms", "HTTP p50 / p95 ms", "MCP p50 / p95 ms"]
    head += ["HTTP / in-process p50 (median of rounds)", "MCP / in-process p50 (median of rounds)", "errors"]
    rows = []
    for clients, ways in results.items():
        base, http, mcp = ways["in-process"], ways["http"], ways["mcp-http"]
        cells = [f"{w['p50']:.1f} / {w['p95']:.1f}" for w in (base, http, mcp)]
        ratios = [f"{ratio(w['p50'], base['p50'])}x ({w['median_round_ratio']}x)" for w in (http, mcp)]
        rows.append([clients, *cells, *ratios, sum(w["errors"] for w in ways.values())])
    return md_table(head, rows)


def run(rounds: int = 3, n_queries: int = 24, clients: tuple[int, ...] = CLIENTS) -> dict[str, Any]:
    """Measure and print the table; returns the figures (ms, per client count and way)."""
    if not RUNBOOKS.is_dir():
        print(f"serving_latency: skipped, {RUNBOOKS} is absent (the shared corpora live in ../shared)")
        return {}
    with tempfile.TemporaryDirectory(prefix="rag-serving-latency-") as tmp:
        data = Path(tmp)
        settings = make_settings(data, ensemble_backend="none", sidecar_enabled=False, trace_enabled=True)
        recorder = CountingRecorder.from_settings(settings)
        queries = benchmark_queries(n_queries)
        tool = ingested_tool(settings, make_embedder(settings), recorder, queries)  # warm: not counted
        server, thread, base = _serve(tool)
        try:
            recorder.flush(60)
            recorder.rows = 0
            load_before = os.getloadavg()[0]
            results = asyncio.run(_measure(tool, base, queries, rounds, clients))
            load_after = os.getloadavg()[0]
        finally:
            server.should_exit = True
            thread.join(30)
            tool.close()
            stop_server(data)
            stop_embedded(data)
        calls = len(queries) * rounds * len(clients) * 3
        print(_table(results))
        print(f"trace rows {recorder.rows} / calls {calls}; 1-min load average {load_before:.1f} -> {load_after:.1f}")
        return {"clients": results, "trace_rows": recorder.rows, "calls": calls, "load": [load_before, load_after]}


def main(argv: list[str] | None = None) -> int:
    options: dict[str, dict[str, Any]] = {
        "--rounds": dict(type=int, default=3, help="interleaved rounds per client count"),
        "--queries": dict(type=int, default=24, help="queries per round"),
        "--clients": dict(default="1,4,16", help="concurrent client counts, comma-separated"),
    }
    args = parse_command_line(__doc__, options, argv, prog="python -m bench.serving_latency")
    run(args.rounds, args.queries, tuple(int(c) for c in args.clients.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
