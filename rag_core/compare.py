"""Side-by-side candidates of the main store (Milvus) and the sidecar (pgvector) for one query."""

from __future__ import annotations

from typing import Any

from rag_core.l0 import L0Index
from rag_core.lookup.query_transformer import KnowledgeQueryTransformer
from rag_core.lookup.retriever import Candidate, KnowledgeDocumentRetriever
from rag_core.settings import RagSettings


def candidate_row(rank: int, c: Candidate) -> dict[str, Any]:
    """A store-neutral candidate: doc id, chunk, breadcrumb, category, rank, similarity in
    [0, 1] and the raw score with its label."""
    return {
        "rank": rank,
        "doc_id": c.hit.doc_id,
        "chunk_id": c.hit.chunk_id,
        "title": c.hit.title,
        "breadcrumb": c.hit.breadcrumb,
        "category": c.hit.category,
        "content_preview": c.hit.text[:300],
        "raw_score": round(c.hit.raw_score, 4),
        "score_label": c.hit.score_label,
        "similarity": round(c.similarity, 4),
        "channels": sorted(c.channels),
        "attempts": sorted(c.attempts),
    }


def _doc_rows(cands: list[Candidate], k: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for c in cands:
        if c.hit.doc_id not in seen:
            seen.add(c.hit.doc_id)
            rows.append(candidate_row(len(rows) + 1, c))
        if len(rows) == k:
            break
    return rows


def compare_stores(settings: RagSettings, query: str, k: int = 5) -> dict[str, Any]:
    """Both stores on the same query vector. The sidecar's failure is reported, never raised."""
    from rag_core.components import make_embedder, make_main_store, make_sidecar_store

    try:
        l0 = L0Index.load(settings.l0_index_path)
    except FileNotFoundError:
        l0 = None
    tq = KnowledgeQueryTransformer(l0, settings.max_query_chars).transform(query)
    vector = make_embedder(settings).embed_query(tq.rewritten)
    main_store = make_main_store(settings)
    main = KnowledgeDocumentRetriever(main_store, settings).retrieve(tq, vector)
    main_store.close()
    status, reason, side_rows = "available", None, []
    try:
        side_store = make_sidecar_store(settings)
        side = KnowledgeDocumentRetriever(side_store, settings).retrieve(tq, vector)
        side_store.close()
        if side.error:
            status, reason = "error", side.error
        side_rows = _doc_rows(side.candidates, k)
    except Exception as exc:
        status, reason = "unavailable", f"{type(exc).__name__}: {exc}"
    main_rows = _doc_rows(main.candidates, k)
    rows = []
    for i in range(max(len(main_rows), len(side_rows))):
        m = main_rows[i] if i < len(main_rows) else None
        s = side_rows[i] if i < len(side_rows) else None
        rows.append({"rank": i + 1, "main": m, "sidecar": s, "same_doc": bool(m and s and m["doc_id"] == s["doc_id"])})
    # Over the ranks both stores could fill: a filtered query may find fewer than k documents.
    depth = min(k, max(len(main_rows), len(side_rows)))
    shared = {r["doc_id"] for r in main_rows} & {r["doc_id"] for r in side_rows}
    overlap = len(shared) / depth if side_rows and depth else 0.0
    labels = sorted({r["score_label"] for r in main_rows + side_rows})
    return {
        "query": query,
        "sidecar_status": status,
        "sidecar_reason": reason,
        "rows": rows,
        "overlap_at_5": overlap,
        "score_labels": labels,
        "main_error": main.error,
    }
