"""Ingestion throughput (chunks/s): a full ``ingest`` of the runbook corpus into a fresh Milvus Lite
beside the raw ``embed_passages`` of the same chunk texts (mean of a run before and after), the
per-stage seconds, a diagnostic encode in the pipeline's 256-chunk steps, and an unchanged
re-ingest as a fraction of the first. The model is warm before anything is timed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.common import log, make_settings, profile_top, ratio, timed
from bench.context import BenchContext
from bench.scale import BaseData
from rag_core.ingest.embed import MIN_STEP

TARGET_RATIO = 0.85
TARGET_REINGEST = 0.05


def run(ctx: BenchContext) -> dict[str, Any]:
    from rag_core.ingest.pipeline import ingest
    from rag_core.stores.milvus import MilvusStore

    embedder = ctx.embedder
    settings = make_settings(ctx.scratch.dir("ingest"), ctx.knowledge_dir)
    chunks = ctx.chunk_corpus()
    texts = [c.embed_text for c in chunks]
    batch = settings.embedding_batch_size

    def ingest_again() -> Any:
        return ingest(settings, embedder, [MilvusStore.from_settings(settings)], progress=False)

    # raw encode: one call over every text, the backend's own batching, no pipeline around it
    log(f"ingestion: raw encode of {len(texts)} chunk texts")
    vectors, raw_before = timed(lambda: embedder.embed_passages(texts))
    ctx.corpus = BaseData(np.asarray(vectors, dtype=np.float32), chunks)

    log("ingestion: full ingest into a fresh Milvus Lite")
    store = MilvusStore.from_settings(settings)
    first, ingest_s = timed(lambda: ingest(settings, embedder, [store], progress=ctx.show_progress))

    raw_after = stepped_s = None
    if not ctx.quick:
        # Diagnostic: the ingest embeds in steps of max(batch, MIN_STEP) chunks (embed.embed_plan)
        log("ingestion: encode in the pipeline's steps (diagnostic), then raw encode again")
        step = max(batch, MIN_STEP)
        _, stepped_s = timed(lambda: [embedder.embed_passages(texts[i : i + step]) for i in range(0, len(texts), step)])
        _, raw_after = timed(lambda: embedder.embed_passages(texts))
    raw_s = raw_before if raw_after is None else (raw_before + raw_after) / 2

    log("ingestion: unchanged re-ingest")
    second, reingest_s = timed(ingest_again)
    ctx.kb_settings = settings

    n = first.chunks_embedded
    raw_cps = len(texts) / raw_s
    ingest_cps = n / ingest_s
    embed_s = first.stage_seconds.get("embed", 0.0)
    result: dict[str, Any] = {
        "corpus": str(ctx.knowledge_dir),
        "documents": first.documents_ingested,
        "documents_skipped": len(first.skipped),
        "chunks": first.chunks_total,
        "chunks_embedded": n,
        "batch_size": batch,
        "model_load_s": ctx.notes.get("model_load_s"),
        "raw_encode_s": round(raw_s, 3),
        "raw_encode_runs_s": [round(x, 3) for x in (raw_before, raw_after) if x is not None],
        "raw_encode_chunks_per_s": round(raw_cps, 2),
        "ingest_s": round(ingest_s, 3),
        "ingest_chunks_per_s": round(ingest_cps, 2),
        "ingest_vs_raw": ratio(ingest_cps, raw_cps),
        "embed_stage_chunks_per_s": round(n / embed_s, 2) if embed_s else None,
        "stepped_encode_s": round(stepped_s, 3) if stepped_s else None,
        "stepped_vs_raw_time": ratio(stepped_s, raw_s),
        "non_embed_s": round(ingest_s - embed_s, 3),
        "stage_seconds": first.stage_seconds,
        "reingest_s": round(reingest_s, 3),
        "reingest_fraction": ratio(reingest_s, ingest_s, 4),
        "reingest_stage_seconds": second.stage_seconds,
        "reingest_chunks_embedded": second.chunks_embedded,
        "reingest_unchanged": second.main.unchanged,
        "targets": {"ingest_vs_raw_min": TARGET_RATIO, "reingest_fraction_max": TARGET_REINGEST},
    }
    if result["reingest_fraction"] is not None and result["reingest_fraction"] > TARGET_REINGEST:
        log("ingestion: profiling the unchanged re-ingest")
        include = ("rag_core", "pymilvus", "milvus_lite", "markdown_it", "tokenizers")
        result["reingest_profile"] = profile_top(ingest_again, sort="cumtime", top=18, include=include)
    return result
