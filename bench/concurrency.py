"""Concurrency: lookups/s with 1, 2, 4 and 8 threads sharing one LookupKnowledgeTool object.

Each configuration runs the same number of lookups (the benchmark queries in turn) through a
thread pool and reports throughput, per-call latency and the process CPU time per wall second
(about 1.0 means the work is serialised: the GIL, the embedder's lock or the in-process
Milvus Lite server)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from bench.common import guarded, log, ratio, summarize, timed
from bench.context import BenchContext
from bench.latency import build_tool
from rag_core.traces.recorder import MemoryRecorder

PATHS, THREADS = ("milvus", "pgvector"), (1, 2, 4, 8)


def measure(tool: Any, queries: list[str], threads: int, lookups: int) -> dict[str, Any]:
    """``lookups`` lookups (``queries`` in turn) on ``threads`` threads: lookups/s, latency (ms), CPU s per wall s."""

    def one(i: int) -> float:
        result, seconds = timed(lambda: tool.lookup(queries[i % len(queries)], session_id=f"bench-conc-{i % 16}"))
        if result.status != "ok":
            raise RuntimeError(result.message or "lookup failed")
        return seconds * 1000

    cpu0, t0 = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bench") as pool:
        latencies = list(pool.map(one, range(lookups)))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    return {
        "threads": threads,
        "lookups": lookups,
        "wall_s": round(wall, 3),
        "lookups_per_s": round(lookups / wall, 2),
        "latency_ms": summarize(latencies),
        "cpu_per_wall": round(cpu / wall, 2),
    }


def run(ctx: BenchContext) -> dict[str, Any]:
    """:func:`measure` per path and thread count (``THREADS``), on one tool per path."""
    lookups = 16 if ctx.quick else 48

    def rows(path: str) -> list[dict[str, Any]]:
        log(f"concurrency: {path} path, threads {THREADS}, {lookups} lookups each")
        tool = build_tool(ctx.kb_settings, ctx.store(path), ctx.embedder, MemoryRecorder(), warm=ctx.queries[:8])
        out = [measure(tool, ctx.queries, t, lookups) for t in THREADS]
        for r in out:
            r["speedup_vs_1"] = ratio(r["lookups_per_s"], out[0]["lookups_per_s"], 2)
        tool.close()
        return out

    by_path = {path: guarded(f"concurrency: {path}", partial(rows, path)) for path in PATHS}
    return {"threads": list(THREADS), "lookups_per_config": lookups, "paths": by_path}
