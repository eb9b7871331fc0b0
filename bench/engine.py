"""The Milvus main path on the embedded server (issue 14): ``flush`` (dense + BM25 store search
p50 on unflushed vs flushed rows, ms) and ``serving`` (``bench/serving.py``: 8-thread lookups while
another process runs `rag ingest`), plus issue 14's goals over figures measured elsewhere (lookup
p50 vs pgvector and the floor: ``latency.py``; 100k search, recall, BM25: ``scale.py``), whose limits
are below (the goals: ``report.GOALS``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from bench.common import RUNBOOKS, guarded, make_settings, ratio
from bench.context import BenchContext
from bench.harness import call_ms

LOOKUP_VS_PG_MAX = 1.2
LOOKUP_VS_FLOOR_MAX = 1.5
BM25_P50_MAX_MS = 20.0


def flush_effect(ctx: BenchContext, repeats: int = 30) -> dict[str, Any]:
    """Dense + BM25 store search p50 on unflushed rows vs after flush (same process, same rows)."""
    from rag_core.stores import milvus_server
    from rag_core.stores.milvus import MilvusStore

    corpus = ctx.corpus
    data = ctx.scratch.dir("engine-flush")
    store = MilvusStore("", "flush_bench", embedded_dir=data)
    store.ensure_schema(corpus.vectors.shape[1])
    store.upsert(corpus.chunks, corpus.vectors)
    Q = ctx.query_vectors
    inputs = [Q[i % len(Q)] for i in range(repeats + 2)]

    def attempt(q: np.ndarray) -> None:  # the two store calls of one lookup attempt
        store.search(q, 10)
        store.search_lexical(["pod", "restart", "memory"], q, 10)

    out = {"rows": len(corpus.chunks), "unflushed_ms": call_ms(attempt, inputs[2:], inputs[:2])}
    store.flush()
    out["flushed_ms"] = call_ms(attempt, inputs[2:], inputs[:2])
    out["unflushed_vs_flushed_p50"] = ratio(out["unflushed_ms"]["p50"], out["flushed_ms"]["p50"], 2)
    store.close()
    milvus_server.stop_server(data)
    return out


def serving(ctx: BenchContext) -> dict[str, Any]:
    """Ingest while serving: 8 lookup threads here, `rag ingest` in another process."""
    from bench import serving as serving_run
    from rag_core.stores import milvus_server

    work = ctx.scratch.dir("engine-serving")
    settings = make_settings(work / "data", RUNBOOKS)
    run = serving_run.run(settings, ctx.embedder, ctx.queries, RUNBOOKS, work / "kb-states", threads=8)
    milvus_server.stop_server(work / "data")
    return run.summary()


def run(ctx: BenchContext) -> dict[str, Any]:
    """The flush effect and ingest while serving, each an error entry when it fails."""
    return {
        name: guarded(f"engine: {name}", partial(fn, ctx))
        for name, fn in (("flush", flush_effect), ("serving", serving))
    }
