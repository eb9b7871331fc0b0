"""Serving many agents (issue 45): 1, 4, 16 and 64 concurrent agents, each calling lookup_knowledge
back to back for a fixed time, over HTTP (`POST /v1/lookup`), over MCP (the `mcp` SDK client over
streamable HTTP, one session per agent) and in process (``tool.lookup`` in threads, no admission
limit: the floor). Real stack as bench.serving_latency: default embedder, embedded Milvus, the
English runbooks, the real trace recorder and store.

The mix (seeded per agent): 5% maximum-size queries (RAG_SERVE_MAX_QUERY_CHARS characters of
emoji, 4 bytes each), the rest drawn evenly from pasted alerts, log lines and PromQL (the hard
golden cases), Chinese questions (the Chinese golden cases) and short questions (the paraphrases).
An agent told to back off (HTTP 429, MCP "overloaded" tool error) waits the Retry-After it was
given. Per cell: answered calls per second, p50/p95/p99 ms of the normal queries, p50 of the
maximum-size ones, errors (anything but an answer or a deliberate refusal: a non-200, a
``status="error"`` result), refusals, and trace rows against answered calls (error results
included: they are answers, and traced). At the largest agent
count the stage times of the trace rows say where the time goes.

    python -m bench.serving_load [--seconds 4] [--agents 1,4,16,64]
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import RUNBOOKS, SHARED, make_settings, parse_command_line, summarize
from bench.queries import PARAPHRASES, golden_queries
from bench.serving import ingested_tool
from bench.serving_latency import _serve
from rag_core.embedding import make_embedder
from rag_core.markdown import md_table
from rag_core.stores.milvus_server import stop_server
from rag_core.stores.pgserver import stop_embedded
from rag_core.traces.recorder import ToolInvocationRecorder

AGENTS = (1, 4, 16, 64)
MAX_SIZE_SHARE = 0.05
#: "ok", "error" (a ``status="error"`` result: answered and traced), "failed" (no result: a non-200
#: HTTP status other than 429) or "refused" (429 / overloaded), with the seconds to wait when refused.
Outcome = tuple[str, float]


class StageRecorder(ToolInvocationRecorder):
    """The real recorder, counting the rows the tool hands it and summing their stage times."""

    rows = 0
    stage_ms: dict[str, float]
    latency_ms = 0.0
    _count_lock = threading.Lock()

    def reset(self) -> None:
        with self._count_lock:
            self.rows, self.stage_ms, self.latency_ms = 0, {}, 0.0

    def record(self, row: Any) -> None:
        details = getattr(row, "retrieval_details", None) or {}
        with self._count_lock:
            self.rows += 1
            self.latency_ms += getattr(row, "latency_ms", None) or 0.0
            for stage, ms in (details.get("stage_ms") or {}).items():
                self.stage_ms[stage] = self.stage_ms.get(stage, 0.0) + (ms or 0.0)
        super().record(row)


def query_mix(max_chars: int) -> tuple[list[str], str]:
    """(normal queries: alerts, log lines and PromQL, Chinese, short questions, evenly; the
    maximum-size query)."""
    golden = SHARED / "golden"
    pasted = [q for q in golden_queries(golden / "runbooks-en-hard-visible.yaml") if "\n" in q or len(q) > 120]
    chinese = golden_queries(golden / "runbooks-zh-visible.yaml")
    short = [q for q in PARAPHRASES if len(q) < 80]
    kinds = [k for k in (pasted, chinese, short) if k]
    n = min(map(len, kinds))
    return [q for k in kinds for q in k[:n]], "🔥" * max_chars


@dataclass
class Cell:
    """Outcomes of one (way, agent count) run."""

    seconds: float
    normal_ms: list[float] = field(default_factory=list)
    max_ms: list[float] = field(default_factory=list)
    errors: int = 0
    failed: int = 0
    refused: int = 0
    trace_rows: int = 0

    def row(self, way: str, agents: int) -> list[Any]:
        answered = len(self.normal_ms) + len(self.max_ms) + self.errors
        s, m = summarize(self.normal_ms), summarize(self.max_ms)
        return [
            agents,
            way,
            f"{answered / self.seconds:.1f}",
            f"{s['p50']} / {s['p95']} / {s['p99']}",
            m["p50"],
            self.errors + self.failed,
            self.refused,
            f"{self.trace_rows} / {answered}",
        ]


async def _agents(
    call: Callable[[int, str], Awaitable[Outcome]], agents: int, seconds: float, normal: list[str], biggest: str
) -> Cell:
    """``agents`` closed-loop callers for ``seconds``; ``call(agent, query)``."""
    cell = Cell(seconds)
    began = time.monotonic()
    stop = began + seconds

    async def agent(i: int) -> None:
        rng = random.Random(i)
        while time.monotonic() < stop:
            big = rng.random() < MAX_SIZE_SHARE
            query = biggest if big else rng.choice(normal)
            start = time.perf_counter()
            try:
                kind, value = await call(i, query)
            except Exception:  # a transport failure counts, and the agent goes on
                kind, value = "failed", 0.0
            ms = (time.perf_counter() - start) * 1000
            if kind == "ok":
                (cell.max_ms if big else cell.normal_ms).append(ms)
            elif kind == "refused":
                cell.refused += 1
                await asyncio.sleep(min(value, max(stop - time.monotonic(), 0)))
            elif kind == "error":
                cell.errors += 1
            else:
                cell.failed += 1

    await asyncio.gather(*(agent(i) for i in range(agents)))
    cell.seconds = time.monotonic() - began  # calls under way at the stop are waited for
    return cell


async def _measure(
    tool: Any, recorder: StageRecorder, base: str, agent_counts: tuple[int, ...], seconds: float, retry_s: float
) -> tuple[list[list[Any]], dict[str, float]]:
    mix = query_mix(tool.settings.serve_max_query_chars)
    rows: list[list[Any]] = []
    where: dict[str, float] = {}
    limits = httpx.Limits(max_connections=max(agent_counts), max_keepalive_connections=max(agent_counts))
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as http:
        for agents in agent_counts:
            async with AsyncExitStack() as stack:
                calls = await _callers(stack, tool, http, base, agents, retry_s)
                for way, call in calls.items():
                    recorder.flush(60)
                    recorder.reset()
                    cell = await _agents(call, agents, seconds, *mix)
                    recorder.flush(60)
                    cell.trace_rows = recorder.rows
                    rows.append(cell.row(way, agents))
                    if agents == max(agent_counts) and way == "http":
                        where = _where(recorder, cell)
    return rows, where


async def _callers(
    stack: AsyncExitStack, tool: Any, http: httpx.AsyncClient, base: str, agents: int, retry_s: float
) -> dict[str, Callable[[int, str], Awaitable[Outcome]]]:
    """The three ways to call, for ``agents`` agents: a thread each in process, the shared HTTP
    client, an MCP session each (opened here, closed with ``stack``)."""
    from mcp import Client

    pool = stack.enter_context(ThreadPoolExecutor(agents, thread_name_prefix="agent"))
    sessions = [await stack.enter_async_context(Client(f"{base}/mcp")) for _ in range(agents)]

    async def in_process(_agent: int, query: str) -> Outcome:
        result = await asyncio.get_running_loop().run_in_executor(pool, tool.lookup, query)
        return ("error", 0.0) if result.status == "error" else ("ok", 0.0)

    async def over_http(_agent: int, query: str) -> Outcome:
        body = json.dumps({"query": query}, ensure_ascii=False).encode()
        response = await http.post("/v1/lookup", content=body, headers={"content-type": "application/json"})
        if response.status_code == 429:
            return "refused", float(response.headers.get("retry-after", retry_s))
        if response.status_code != 200:
            return "failed", 0.0
        return ("error", 0.0) if response.json()["status"] == "error" else ("ok", 0.0)

    async def over_mcp(agent: int, query: str) -> Outcome:
        answer = await sessions[agent].call_tool("lookup_knowledge", {"query": query})
        if answer.is_error and answer.content and "overloaded" in getattr(answer.content[0], "text", ""):
            return "refused", retry_s
        return ("error", 0.0) if answer.is_error else ("ok", 0.0)

    return {"in-process": in_process, "http": over_http, "mcp-http": over_mcp}


def _where(recorder: StageRecorder, cell: Cell) -> dict[str, float]:
    """Mean ms per answered call: each stage (from the trace rows), the tool's whole lookup and
    the rest of the client's latency (HTTP, waiting for a worker thread, the trace ack)."""
    n = max(recorder.rows, 1)
    client = (sum(cell.normal_ms) + sum(cell.max_ms)) / max(len(cell.normal_ms) + len(cell.max_ms), 1)
    out = {stage: round(ms / n, 1) for stage, ms in sorted(recorder.stage_ms.items(), key=lambda kv: -kv[1])}
    out["lookup_total"] = round(recorder.latency_ms / n, 1)
    out["outside_lookup"] = round(client - recorder.latency_ms / n, 1)
    return out


def run(seconds: float = 4.0, agent_counts: tuple[int, ...] = AGENTS) -> dict[str, Any]:
    """Measure and print the table; returns its rows and where the time goes at the largest count."""
    if not RUNBOOKS.is_dir():
        print(f"serving_load: skipped, {RUNBOOKS} is absent (the shared corpora live in ../shared)")
        return {}
    with tempfile.TemporaryDirectory(prefix="rag-serving-load-") as tmp:
        data = Path(tmp)
        settings = make_settings(data, ensemble_backend="none", sidecar_enabled=False, trace_enabled=True)
        recorder = StageRecorder.from_settings(settings)
        recorder.reset()
        normal, _ = query_mix(settings.serve_max_query_chars)
        tool = ingested_tool(settings, make_embedder(settings), recorder, normal)  # warm: not counted
        server, thread, base = _serve(tool)
        # getattr: the same bench runs on code from before the setting (the "before" figures)
        retry_s = float(getattr(settings, "serve_retry_after_s", 1))
        try:
            load_before = os.getloadavg()[0]
            rows, where = asyncio.run(_measure(tool, recorder, base, agent_counts, seconds, retry_s))
            load_after = os.getloadavg()[0]
        finally:
            server.should_exit = True
            thread.join(30)
            tool.close()
            stop_server(data)
            stop_embedded(data)
    head = ["agents", "way", "answered/s", "normal p50 / p95 / p99 ms", "max-size p50 ms", "errors", "429s"]
    print(md_table([*head, "trace rows / answered"], rows))
    share, load = f"{MAX_SIZE_SHARE:.0%}", f"{load_before:.1f} -> {load_after:.1f}"
    print(f"{seconds:g} s per cell, {share} maximum-size queries; 1-min load average {load}")
    print(f"mean ms per answered HTTP call at {max(agent_counts)} agents: {where}")
    return {"rows": rows, "where": where, "load": [load_before, load_after]}


def main(argv: list[str] | None = None) -> int:
    options: dict[str, dict[str, Any]] = {
        "--seconds": dict(type=float, default=4.0, help="seconds each (way, agent count) cell runs"),
        "--agents": dict(default="1,4,16,64", help="concurrent agent counts, comma-separated"),
    }
    args = parse_command_line(__doc__, options, argv, prog="python -m bench.serving_load")
    run(args.seconds, tuple(int(a) for a in args.agents.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
