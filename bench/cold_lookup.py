"""A one-shot ``rag lookup`` (issue 26): seconds from spawning ``rag lookup --json QUERY`` to its
exit on the runbook corpus' data dir (imports, models, L0, store connection), beside the warm
in-process p50 (ms) of the same queries in the same run, and seconds of a ``rag --help`` (issue
46.5). Goals on a quiet machine: cold lookup <= 2 s, help <= 1 s.
Beside it (issue 45): ms from spawning `rag serve --stdio` to its answer to ``initialize`` (goal
<= 1 s: the models warm up in the background) and to its first ``tools/call`` answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from bench.common import load_average, log, ratio, summarize, timed
from bench.context import BenchContext
from bench.harness import call_ms
from bench.latency import build_tool
from bench.serving import RAG_CLI, rebuild_env

COLD_GOAL_S = 2.0
HELP_GOAL_S = 1.0
STDIO_INITIALIZE_GOAL_MS = 1000.0
_INITIALIZE = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}


def help_seconds(env: dict[str, str]) -> float:
    """Seconds from spawning ``rag --help`` to its exit. Raises CalledProcessError."""
    cmd = [sys.executable, "-c", RAG_CLI, "--help"]
    return timed(lambda: subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=120))[1]


def cold_seconds(env: dict[str, str], query: str) -> float:
    """Seconds from spawning ``rag lookup --json query`` to its exit. Raises CalledProcessError,
    and RuntimeError when the answer did not come from the store (a failed lookup is no sample)."""
    cmd = [sys.executable, "-c", RAG_CLI, "lookup", "--json", query]
    done, seconds = timed(lambda: subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=300))
    result = json.loads(done.stdout)
    if result["status"] != "ok" or result["retrievalTrace"]["store"] != "milvus":
        raise RuntimeError(f"cold lookup of {query!r} did not answer from Milvus: {result['message']}")
    return seconds


def stdio_start_ms(env: dict[str, str], query: str) -> tuple[float, float]:
    """ms from spawning `rag serve --stdio` to its ``initialize`` answer, and to its answer to a
    first ``tools/call`` of ``query`` sent right after (raw JSON-RPC lines). RuntimeError when
    an answer is missing or an error."""
    cmd = [sys.executable, "-c", RAG_CLI, "serve", "--stdio"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": _INITIALIZE},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "lookup_knowledge", "arguments": {"query": query}},
        },
    ]
    try:
        proc.stdin.write("".join(json.dumps(line) + "\n" for line in lines))
        proc.stdin.flush()
        stamps = []
        for _ in range(2):
            answer = json.loads(proc.stdout.readline() or "{}")
            stamps.append((time.perf_counter() - t0) * 1000)
            if "result" not in answer or answer["result"].get("isError"):
                raise RuntimeError(f"rag serve --stdio: no result: {str(answer)[:300]}")
    finally:
        proc.stdin.close()
        proc.wait(60)
    return stamps[0], stamps[1]


def run(ctx: BenchContext) -> dict[str, Any]:
    """Fresh ``rag --help`` and lookups (3 each, 2 with --quick), then the warm latency (ms) of one
    tool on the same queries after a warm-up pass. The first lookup of a data dir builds the
    prepared model files (``<data_dir>/model_cache``): it is timed apart, before the others."""
    queries = ctx.queries[: 2 if ctx.quick else 3]
    env = rebuild_env(ctx.kb_settings) | {"RAG_TRACE_ENABLED": "false"}
    log(f"cold start: {len(queries)} fresh `rag --help` and 1 + {len(queries)} `rag lookup` processes")
    help_s = summarize([help_seconds(env) for _ in queries])
    first_cold_s = round(cold_seconds(env, queries[0]), 3)
    cold_s = summarize([cold_seconds(env, q) for q in queries])
    log(f"stdio start: {len(queries)} fresh `rag serve --stdio` processes")
    initialize_ms, first_call_ms = zip(*(stdio_start_ms(env, q) for q in queries), strict=True)
    tool = build_tool(ctx.kb_settings, ctx.store("milvus"), ctx.embedder)  # untraced, as the cold runs
    try:
        warm_s = call_ms(tool.lookup, queries, warmup=queries)
    finally:
        tool.close()
    log(
        f"cold lookup p50 {cold_s['p50']} s (goal {COLD_GOAL_S} s; the data dir's first {first_cold_s} s) "
        f"beside warm p50 {warm_s['p50']} ms"
    )
    log(f"rag --help p50 {help_s['p50']} s (goal {HELP_GOAL_S} s)")
    stdio = {"stdio_initialize_ms": summarize(initialize_ms), "stdio_first_call_ms": summarize(first_call_ms)}
    log(
        f"stdio initialize ms after process start p50 {stdio['stdio_initialize_ms']['p50']} "
        f"(goal {STDIO_INITIALIZE_GOAL_MS:g}), first tools/call answered at {stdio['stdio_first_call_ms']['p50']} ms"
    )
    return {
        "queries": queries,
        "help_s": help_s,
        "help_goal_s": HELP_GOAL_S,
        "first_cold_s": first_cold_s,
        "cold_s": cold_s,
        "warm_ms": warm_s,
        "cold_over_warm_p50": ratio(cold_s["p50"] * 1000 if cold_s["p50"] else None, warm_s["p50"], 1),
        "cold_goal_s": COLD_GOAL_S,
        **stdio,
        "stdio_initialize_goal_ms": STDIO_INITIALIZE_GOAL_MS,
        "load_average": load_average(),
    }
