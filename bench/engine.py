"""The Milvus main path on the embedded server (issue 14): ``flush`` (dense + BM25 store search
p50 on unflushed vs flushed rows, ms) and ``serving`` (``bench/serving.py``: 8-thread lookups while
another process runs `rag ingest`), plus issue 14's goals over figures measured elsewhere (lookup
p50 vs pgvector and the floor: ``latency.py``; 100k search, recall, BM25: ``scale.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from bench.common import RUNBOOKS, guarded, ratio
from bench.context import BenchContext
from bench.harness import Goal, Missing, Reading, Results, as_times, call_ms, section

LOOKUP_VS_PG_MAX = 1.2
LOOKUP_VS_FLOOR_MAX = 1.5
SCALE_VS_NUMPY_MAX = 5.0
BM25_P50_MAX_MS = 20.0


def flush_effect(ctx: BenchContext, repeats: int = 30) -> dict[str, Any]:
    """Dense + BM25 store search p50 on unflushed rows vs after flush (same process, same rows)."""
    from rag_core.stores import milvus_server
    from rag_core.stores.milvus import MilvusStore

    corpus = ctx.get_corpus()
    data = ctx.scratch.dir("engine-flush")
    store = MilvusStore("", "flush_bench", embedded_dir=data)
    store.ensure_schema(corpus.vectors.shape[1])
    store.upsert(corpus.chunks, np.asarray(corpus.vectors, dtype=np.float32))
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
    from bench.common import make_settings
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


def _on_lookup(r: Results) -> bool:
    return "milvus" in section(r, "latency", "vs_floor")


def _on_100k(r: Results) -> bool:
    return bool(section(r, "scale", "sizes", "100000"))


def _on_serving(r: Results) -> bool:
    return "failures" in section(r, "engine", "serving")


def _lookup_vs(other: str, limit: float, label: str) -> Goal:
    """Milvus lookup p50 over ``other``'s (``pgvector`` or ``floor``), measured interleaved."""

    def read(lk: dict[str, Any]) -> Reading:
        return Reading(f"Milvus {lk['milvus']['p50']} ms, {other} {lk[other]['p50']} ms", lk[f"milvus_vs_{other}_p50"])

    target = f"Runbook lookup p50, Milvus path vs {label}"
    source = ("latency", "vs_floor")
    return Goal(
        f"engine_lookup_vs_{other}", target, f"<= {limit}x", "<=", limit, source, read, as_times, False, _on_lookup
    )


def _flat_100k(
    read: Callable[[dict[str, Any], dict[str, Any]], Reading],
) -> Callable[[dict[str, Any]], Reading | Missing]:
    """A goal's reader: ``read(flat, numpy_best)`` on the scale benchmark's Milvus FLAT row and
    NumPy's best row at 100k chunks; Missing when either is absent."""

    def on(size: dict[str, Any]) -> Reading | Missing:
        milvus = size["stores"].get("milvus") or {}
        flat = next((c for c in milvus.get("configs", []) if c["config"] == "FLAT"), None)
        numpy_best = (size["stores"].get("numpy") or {}).get("best")
        if flat is None or numpy_best is None:
            return Missing(milvus.get("error", "not run"))
        return read(flat, numpy_best)

    return on


@_flat_100k
def _search_100k(flat: dict[str, Any], numpy_best: dict[str, Any]) -> Reading:
    flat_p50, numpy_p50 = flat["single_ms"]["p50"], numpy_best["single_ms"]["p50"]
    measured = f"Milvus {flat_p50} ms vs NumPy {numpy_p50} ms, recall@10 {flat['recall@10']}"
    return Reading(measured, ratio(flat_p50, numpy_p50, 2), also=flat["recall@10"] >= 0.99)


@_flat_100k
def _filtered_100k(flat: dict[str, Any], _numpy_best: dict[str, Any]) -> Reading:
    return Reading(f"filtered p50 {flat['filtered_single_ms']['p50']} ms", flat["filtered_recall@10"])


def _bm25_100k(milvus: dict[str, Any]) -> Reading:
    p50 = (milvus.get("bm25_ms") or {}).get("p50")
    return Reading(f"BM25 p50 {p50} ms", p50)


def _serving(sv: dict[str, Any]) -> Reading:
    measured = (
        f"{sv['lookups']} lookups ({sv['lookups_during_ingest']} during ingest), p50 {sv['latency_ms']['p50']} ms, "
        f"p95 {sv['latency_ms']['p95']} ms, {sv['failures']} failed, traces {sv['traces']}"
    )
    clean = sv["traces_equal_lookups"] and sv["hits_outside_old_and_new_index"] == 0
    return Reading(measured, sv["failures"], also=clean)


_100K = ("scale", "sizes", "100000")
# Issue 14's targets, rows of the report's targets table (``report.GOALS``).
GOALS: tuple[Goal, ...] = (
    _lookup_vs("pgvector", LOOKUP_VS_PG_MAX, "pgvector path (warm, after ingest in-process)"),
    _lookup_vs("floor", LOOKUP_VS_FLOOR_MAX, "floor (embedding + exact NumPy + BM25 in memory)"),
    Goal("engine_100k_search", "100k chunks: Milvus FLAT search p50 vs exact NumPy",
         f"<= {SCALE_VS_NUMPY_MAX}x, recall@10 >= 0.99", "<=", SCALE_VS_NUMPY_MAX, _100K, _search_100k, as_times,
         when=_on_100k),
    # recall is at most 1: >= 1.0 is = 1.0
    Goal("engine_100k_filtered", "100k chunks: filtered recall@10 (one category)", "= 1.0", ">=", 1.0, _100K,
         _filtered_100k, lambda v: f"{v:.3f}", borderline=False, when=_on_100k),
    Goal("engine_100k_bm25", "100k chunks: BM25 search p50", f"<= {BM25_P50_MAX_MS} ms", "<=", BM25_P50_MAX_MS,
         (*_100K, "stores", "milvus"), _bm25_100k, lambda v: f"{v:.2f} ms", when=_on_100k),
    Goal("engine_ingest_while_serving", "8-thread lookups while another process runs `rag ingest`", "0 failures",
         "<=", 0, ("engine", "serving"), _serving, lambda v: f"{v:g} failed", borderline=False, when=_on_serving),
)  # fmt: skip
