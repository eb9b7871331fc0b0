"""Lookup latency (ms), end to end and per stage, on the runbook corpus (warm), Milvus and pgvector.

Each lookup is timed around ``LookupKnowledgeTool.lookup``; stages come from the trace row it hands
its recorder, ``store`` is the longest L1 attempt (``common.STORE_MS_MEANS``); the derived stages
are in :func:`_sample`. Interleaved query by query with the Milvus path's ``VARIANTS``
(``milvus-single-model``, ``milvus-learned``: issue 25's rerank cost, ``rerank_cost``) and the
``floor`` (:func:`floor`, issue 14: ``vs_floor``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from bench.common import STORE_MS_MEANS, log, profile_top, progress, ratio, store_ms, summarize, timed
from bench.context import BenchContext
from bench.harness import Target, call_ms, measure
from rag_core.traces.recorder import MemoryRecorder

TARGET_OVERHEAD = 0.20
TARGET_RERANK_COST = 1.1  # issue 25: the learned ranker's post-processing p50 over the hand weights'
VARIANTS = {  # path suffix -> the settings it changes on the Milvus path
    "-single-model": {"ensemble_backend": "none"},  # the rerank without its second model
    "-learned": {"rerank_model": "auto"},  # the shipped learned ranker instead of the hand weights
}
PATHS = ("milvus", *(f"milvus{v}" for v in VARIANTS), "pgvector")  # the lookup paths, in the report's order
TRACED = ("l0", "embed", "ensemble", "documents", "search", "postprocess", "pack")  # stage_ms, without "_ms"
STAGES = {  # each figure of a lookup (ms), in the report's table order: its label there
    "e2e": "end to end (`lookup` call)",
    "l0": "L0 hints (query transform)",
    "embed": "query embedding",
    "ensemble": "second model (query + chunks on first sight)",
    "documents": "document similarity (title + centroid)",
    "search": "L1 retrieval (attempts, store calls + fusion)",
    "store": "&nbsp;&nbsp;store calls (wall time: the longest L1 attempt)",
    "fusion": "&nbsp;&nbsp;RRF fusion + attempt logic",
    "postprocess": "post-processing + rerank",
    "pack": "context packing",
    "assemble": "result assembly (relevance, session, trace object)",
    "trace_handoff": "trace hand-off (row build + recorder)",
    "pipeline_overhead": "**pipeline overhead** (all but embedding, second model, store search and document vectors)",
}
# The overhead profile: rag_core functions outside the embedding and the store calls, without the
# wrappers whose cumulative time includes them.
WRAPPERS = ("lookup", "lookup_with_candidates", "_lookup", "_retrieve", "retrieve", "search_once", "one_round")
PROFILED = dict(include=("rag_core",), exclude=("rag_core/embedding/", "rag_core/stores/"), exclude_functions=WRAPPERS)


def build_tool(settings, store, embedder, recorder=None, *, warm=(), **update):
    """A LookupKnowledgeTool on ``store`` (no sidecar) handing trace rows to ``recorder``, with the
    settings ``update`` (e.g. a ``VARIANTS`` entry), after one untimed lookup of each ``warm`` query."""
    from rag_core.lookup.tool import LookupKnowledgeTool

    update |= {"sidecar_enabled": False, "trace_enabled": recorder is not None}
    tool = LookupKnowledgeTool(settings.model_copy(update=update), store=store, embedder=embedder, recorder=recorder)
    for q in warm:
        tool.lookup(q)
    return tool


def _sample(e2e_ms: float, row: dict[str, Any], store: float) -> dict[str, Any]:
    """One lookup's figures (ms): the traced stages, ``store``, and derived: ``fusion`` = search - store,
    ``assemble`` = ``latency_ms`` - the stages, ``trace_handoff`` = end to end - ``latency_ms``,
    ``pipeline_overhead`` = end to end - embedding - second model - store - ``documents``."""
    details = row["retrieval_details"]
    ms = {s: details["stage_ms"].get(f"{s}_ms", 0.0) for s in TRACED}
    inner = float(row["latency_ms"])
    return ms | {
        "e2e": e2e_ms,
        "store": store,
        "fusion": max(0.0, ms["search"] - store),
        "assemble": max(0.0, inner - sum(details["stage_ms"].values())),
        "trace_handoff": max(0.0, e2e_ms - inner),
        "pipeline_overhead": max(0.0, e2e_ms - ms["embed"] - ms["ensemble"] - store - ms["documents"]),
        "attempts": len(details["attempts"]),
        "filtered": bool(details["attempts"] and details["attempts"][0].get("filter")),
        "layer": row["retrieval_layer"],
        "status": row["status"],
    }


def _open(ctx: BenchContext, path: str, opened: dict[str, Any]) -> tuple[Any, MemoryRecorder]:
    """The tool of a lookup ``path`` (kept in ``opened``) and its capturing recorder."""
    store, dash, variant = path.partition("-")
    recorder = MemoryRecorder()
    update = VARIANTS.get(dash + variant, {})
    opened[path] = build_tool(ctx.kb_settings, ctx.store(store), ctx.embedder, recorder, **update)
    return opened[path], recorder


def _handed_over(handle: tuple[Any, MemoryRecorder], result: Any) -> tuple[dict[str, Any], float]:
    """The trace row and the store ms of the lookup just made (untimed)."""
    assert len(handle[1].rows) == 1, "the tool did not hand over a trace row"
    return handle[1].rows.pop(), store_ms(result)


def floor(ctx: BenchContext, queries: list[str]) -> Callable[[str], float]:
    """Query embedding + exact NumPy top-k + in-memory BM25 over the corpus (``InMemoryStore``, the
    floor the stores are compared with): the least a lookup must do (no L0, no fusion, no
    post-processing, no store round trip). Each query's lexical terms are computed up front
    (untimed), as the lookup's L0 step makes them. The returned call gives the embedding's share in ms."""
    from rag_core.l0 import L0Index
    from rag_core.lookup.query_transformer import KnowledgeQueryTransformer
    from rag_core.stores.memory import InMemoryStore

    settings, k, store = ctx.kb_settings, ctx.kb_settings.top_k, InMemoryStore()
    transform = KnowledgeQueryTransformer(L0Index.load(settings.l0_index_path), settings.max_query_chars).transform
    terms = {q: transform(q).lexical_terms for q in queries}
    store.upsert(ctx.corpus.chunks, ctx.corpus.vectors)

    def run(query: str) -> float:
        q, embed_s = timed(lambda: ctx.embedder.embed_query(query))
        store.search(q, k)
        store.search_lexical(terms[query], q, k)  # nothing without terms
        return embed_s * 1000

    return run


def vs_floor(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Issue 14's lookup figures from the interleaved samples of the Milvus and pgvector paths and the
    floor: p50 (ms) of the lookups that answered, without the query embedding, the store calls alone."""
    ok = {name: [x for x in samples[name] if x["status"] == "ok"] for name in ("milvus", "pgvector", "floor")}
    out: dict[str, Any] = {name: summarize([x["e2e"] for x in xs]) for name, xs in ok.items()}
    out["without_embedding"] = {name: summarize([x["e2e"] - x["embed"] for x in xs]) for name, xs in ok.items()}
    out["store"] = {name: summarize([x["store"] for x in ok[name]]) for name in ("milvus", "pgvector")}
    out |= {"store_means": STORE_MS_MEANS, "lookups_per_path": len(ok["floor"])}
    for a, b in (("milvus", "pgvector"), ("milvus", "floor"), ("pgvector", "floor")):
        out[f"{a}_vs_{b}_p50"] = ratio(out[a]["p50"], out[b]["p50"], 2)
    return out


def rerank_cost(hand: list[dict[str, Any]], learned: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 25: post-processing (the rerank) and end-to-end p50 (ms), hand weights vs the learned
    ranker, on the interleaved Milvus lookups, and their ratios (learned over hand)."""
    stats = {k: {"hand": summarize([x[k] for x in hand]), "learned": summarize([x[k] for x in learned])}
             for k in ("postprocess", "e2e")}  # fmt: skip
    ratios = {f"{k}_learned_vs_hand_p50": ratio(v["learned"]["p50"], v["hand"]["p50"], 2) for k, v in stats.items()}
    return {f"{k}_ms": v for k, v in stats.items()} | ratios


def _summary(path: str, tool: Any, samples: list[dict[str, Any]], queries: list[str], rounds: int) -> dict[str, Any]:
    stages = {s: summarize([x[s] for x in samples]) for s in STAGES}
    e2e_p50 = stages["e2e"]["p50"]
    out: dict[str, Any] = {
        "path": path,
        "store": type(tool.store).__name__,
        "queries": len(queries),
        "rounds": rounds,
        "lookups": len(samples),
        "stages_ms": stages,
        "overhead_share_p50": ratio(stages["pipeline_overhead"]["p50"], e2e_p50),
        "overhead_share_mean": ratio(stages["pipeline_overhead"]["mean"], stages["e2e"]["mean"]),
        "embed_share_p50": ratio(stages["embed"]["p50"], e2e_p50),
        "store_share_p50": ratio(stages["store"]["p50"], e2e_p50),
        "lookups_with_retry": sum(x["attempts"] > 1 for x in samples),
        "lookups_filtered": sum(x["filtered"] for x in samples),
        "layers": {k: sum(x["layer"] == k for x in samples) for k in sorted({x["layer"] for x in samples})},
        "errors": sum(x["status"] != "ok" for x in samples),
    }
    if out["overhead_share_p50"] is not None:  # always: the target is close on the pgvector path
        log(f"latency {path}: profiling the pipeline overhead")

        def one_round():
            for q in queries:
                tool.lookup(q, session_id=f"bench-prof-{path}")

        out["overhead_profile"] = profile_top(one_round, sort="cumtime", top=16, per=len(queries), **PROFILED)
    return out


def embedding_threads(ctx: BenchContext) -> dict[str, Any]:
    """Query embedding latency with torch's default intra-op threads and with one thread (a
    diagnostic: on a busy machine spinning OpenMP threads can make the default much slower);
    empty without torch (the default set-up's backends do not use it)."""
    try:
        import torch
    except ImportError:
        return {}

    default = torch.get_num_threads()
    out: dict[str, Any] = {}
    try:
        for threads in dict.fromkeys((default, 1)):
            torch.set_num_threads(threads)
            out[f"torch_threads_{threads}"] = call_ms(ctx.embedder.embed_query, ctx.queries, ctx.queries[:3])
    finally:
        torch.set_num_threads(default)
    out["default_threads"] = default
    return out


def run(ctx: BenchContext, paths: tuple[str, ...] = PATHS) -> dict[str, Any]:
    """The paths' lookups and the floor are interleaved (query by query), so they see the same machine load."""
    rounds, queries = (1 if ctx.quick else 3), ctx.queries
    out: dict[str, Any] = {"queries": queries, "target_overhead_share_max": TARGET_OVERHEAD, "paths": {}}
    out["store_means"] = STORE_MS_MEANS
    tools: dict[str, Any] = {}  # the paths' tools opened (by ``measure``), closed here after the profiles

    def lookup(handle: tuple[Any, MemoryRecorder], x: tuple[str, str], path: str) -> Any:
        return handle[0].lookup(x[1], session_id=f"bench-{path}-{x[0]}")

    targets: list[Target[Any, tuple[str, str], Any]] = [
        Target(p, partial(lookup, path=p), open=partial(_open, ctx, p, tools), after=_handed_over) for p in paths
    ]
    targets.append(Target("floor", lambda fl, x: fl(x[1]), open=partial(floor, ctx, queries), after=lambda _f, e: e))
    bar = progress(total=rounds * len(queries) * len(targets), enabled=ctx.show_progress, desc="latency", unit="call")
    log(f"latency: {', '.join(paths)} and the floor: {rounds} round(s) x {len(queries)} queries, interleaved")
    # warm-up: L0 index, collection/table, caches; one path failing must not lose the other's numbers
    inputs = [(str(r), q) for r in range(rounds) for q in queries]
    timings = measure(targets, inputs, warmup=[("warm", q) for q in queries], keep_going=True, tick=bar.update)
    bar.close()
    samples: dict[str, list[dict[str, Any]]] = {}
    for path, t in timings.items():
        if t.error is not None:
            log(f"latency: {path} failed: {t.error}")
            out["paths"][path] = {"error": t.error}
        elif path == "floor":
            samples[path] = [{"e2e": ms, "embed": e, "status": "ok"} for ms, e in zip(t.ms, t.notes, strict=True)]
        else:
            samples[path] = [_sample(ms, row, store) for ms, (row, store) in zip(t.ms, t.notes, strict=True)]
            out["paths"][path] = _summary(path, tools[path], samples[path], queries, rounds)
    if {"milvus", "milvus-learned"} <= samples.keys():
        out["rerank_cost"] = rerank_cost(samples["milvus"], samples["milvus-learned"])
        out["rerank_cost"]["ranker"] = tools["milvus-learned"].ranker.name  # "hand": none for these models
    for tool in tools.values():
        tool.close()
    if {"milvus", "pgvector", "floor"} <= samples.keys():
        out["vs_floor"] = vs_floor(samples)
    out["query_embedding_threads"] = embedding_threads(ctx)
    return out
