"""Lookup latency, end to end and per stage, on the runbook corpus (warm), Milvus and pgvector.

Each lookup is timed around ``LookupKnowledgeTool.lookup``. Stages come from the trace row the
tool hands to its recorder (``retrieval_details.stage_ms``: l0, embed, search, postprocess,
pack; a capturing recorder does the recorder's caller-side work and keeps the row) and from a
timing proxy around the store (dense and lexical store calls, so ``search`` splits into store
time and fusion/attempt logic). Derived stages:

* ``assemble`` = the tool's own ``latency_ms`` minus its stage timings (result assembly,
  relevance assessment, session update, retrieval trace);
* ``trace_handoff`` = end to end minus ``latency_ms`` (building the trace row and handing it
  to the recorder);
* ``pipeline_overhead`` = end to end minus query embedding minus store search (dense + lexical).
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import CapturingRecorder, TimedStore, log, profile_top, progress, ratio, summarize
from bench.context import BenchContext

TARGET_OVERHEAD = 0.20
STAGES = (
    "e2e",
    "l0",
    "embed",
    "search",
    "store_dense",
    "store_lexical",
    "fusion",
    "postprocess",
    "pack",
    "assemble",
    "trace_handoff",
    "pipeline_overhead",
)


def build_tool(settings, store, embedder, recorder=None):
    """A LookupKnowledgeTool on ``store`` (no sidecar) handing trace rows to ``recorder``."""
    from rag_core.lookup.tool import LookupKnowledgeTool

    quiet = settings.model_copy(update={"sidecar_enabled": False, "trace_enabled": recorder is not None})
    return LookupKnowledgeTool(quiet, store=store, embedder=embedder, recorder=recorder)


def open_store(ctx: BenchContext, path: str):
    if path == "milvus":
        from rag_core.stores.milvus import MilvusStore

        return MilvusStore.from_settings(ctx.get_kb_settings())
    return ctx.pg_store()


def _sample(e2e_ms: float, row: dict[str, Any], store_ms: dict[str, float]) -> dict[str, Any]:
    stage = row["retrieval_details"]["stage_ms"]
    inner = float(row["latency_ms"])
    search = stage.get("search_ms", 0.0)
    dense, lexical = store_ms["dense_ms"], store_ms["lexical_ms"]
    embed = stage.get("embed_ms", 0.0)
    return {
        "e2e": e2e_ms,
        "l0": stage.get("l0_ms", 0.0),
        "embed": embed,
        "search": search,
        "store_dense": dense,
        "store_lexical": lexical,
        "fusion": max(0.0, search - dense - lexical),
        "postprocess": stage.get("postprocess_ms", 0.0),
        "pack": stage.get("pack_ms", 0.0),
        "assemble": max(0.0, inner - sum(stage.values())),
        "trace_handoff": max(0.0, e2e_ms - inner),
        "pipeline_overhead": max(0.0, e2e_ms - embed - dense - lexical),
        "attempts": len(row["retrieval_details"]["attempts"]),
        "filtered": bool(
            row["retrieval_details"]["attempts"] and row["retrieval_details"]["attempts"][0].get("filter")
        ),
        "layer": row["retrieval_layer"],
        "status": row["status"],
    }


def measure_path(ctx: BenchContext, path: str, rounds: int) -> dict[str, Any]:
    queries = ctx.queries
    store = TimedStore(open_store(ctx, path))
    recorder = CapturingRecorder()
    tool = build_tool(ctx.get_kb_settings(), store, ctx.embedder, recorder)
    for q in queries:  # warm-up: L0 index, collection/table, caches
        tool.lookup(q, session_id=f"bench-warm-{path}")
    store.take()
    samples = []
    bar = progress(total=rounds * len(queries), enabled=ctx.show_progress, desc=f"latency {path}", unit="lookup")
    for r in range(rounds):
        for q in queries:
            n_rows = len(recorder.rows)
            t0 = time.perf_counter()
            tool.lookup(q, session_id=f"bench-{path}-{r}")
            e2e = (time.perf_counter() - t0) * 1000
            assert len(recorder.rows) == n_rows + 1, "the tool did not hand over a trace row"
            samples.append(_sample(e2e, recorder.rows[-1], store.take()))
            bar.update(1)
    bar.close()
    stages = {s: summarize([x[s] for x in samples]) for s in STAGES}
    e2e_p50 = stages["e2e"]["p50"]
    out: dict[str, Any] = {
        "path": path,
        "store": type(store._store).__name__,
        "queries": len(queries),
        "rounds": rounds,
        "lookups": len(samples),
        "stages_ms": stages,
        "overhead_share_p50": ratio(stages["pipeline_overhead"]["p50"], e2e_p50),
        "overhead_share_mean": ratio(stages["pipeline_overhead"]["mean"], stages["e2e"]["mean"]),
        "embed_share_p50": ratio(stages["embed"]["p50"], e2e_p50),
        "store_share_p50": ratio(summarize([x["store_dense"] + x["store_lexical"] for x in samples])["p50"], e2e_p50),
        "lookups_with_retry": sum(x["attempts"] > 1 for x in samples),
        "lookups_filtered": sum(x["filtered"] for x in samples),
        "layers": {k: sum(x["layer"] == k for x in samples) for k in sorted({x["layer"] for x in samples})},
        "errors": sum(x["status"] != "ok" for x in samples),
    }
    if out["overhead_share_p50"] is not None and out["overhead_share_p50"] > TARGET_OVERHEAD:
        log(f"latency {path}: profiling the pipeline overhead")
        per = len(queries)

        def one_round():
            for q in queries:
                tool.lookup(q, session_id=f"bench-prof-{path}")

        out["overhead_profile"] = profile_top(
            one_round,
            sort="cumtime",
            top=16,
            per=per,
            include=("rag_core",),
            exclude=("rag_core/embedding.py", "rag_core/stores/"),
            # wrappers whose cumulative time includes the embedding and the store calls
            exclude_functions=(
                "lookup",
                "lookup_with_candidates",
                "_lookup",
                "_retrieve",
                "retrieve",
                "search_once",
                "one_round",
            ),
        )
    tool.close()
    return out


def run(
    ctx: BenchContext, paths: tuple[str, ...] = ("milvus", "pgvector"), rounds: int | None = None
) -> dict[str, Any]:
    rounds = rounds or (1 if ctx.quick else 3)
    out: dict[str, Any] = {"queries": ctx.queries, "target_overhead_share_max": TARGET_OVERHEAD, "paths": {}}
    for path in paths:
        log(f"latency: {path} path, {rounds} round(s) x {len(ctx.queries)} queries")
        try:
            out["paths"][path] = measure_path(ctx, path, rounds)
        except Exception as exc:  # one path failing must not lose the other's numbers
            log(f"latency: {path} failed: {exc}")
            out["paths"][path] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return out
