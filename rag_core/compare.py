"""Side-by-side candidates of the main store (Milvus) and the sidecar (pgvector) for one query."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from rag_core.l0 import L0Index
from rag_core.lookup.query_transformer import KnowledgeQueryTransformer
from rag_core.lookup.query_vector import query_vector
from rag_core.lookup.retriever import Candidate, KnowledgeDocumentRetriever
from rag_core.settings import RagSettings

__all__ = ["CandidateRow", "ComparisonRow", "StoreComparison", "candidate_row", "compare_stores"]


class CandidateRow(BaseModel):
    """One ranked candidate, store-neutral (rank 1 = best): ``similarity`` is the normalised
    cosine similarity in [0, 1]; ``raw_score`` is in the store's own unit (``score_label``);
    ``channels`` are ``dense`` / ``lexical``; ``attempts`` the L1 attempts (1, 2) that found it.
    Scores are rounded to 4 decimals, ``content_preview`` is the first 300 characters."""

    rank: int
    doc_id: str
    chunk_id: str
    title: str
    breadcrumb: str
    category: str
    content_preview: str
    raw_score: float
    score_label: str
    similarity: float
    channels: list[str]
    attempts: list[int]


class ComparisonRow(BaseModel):
    """One rank of the side-by-side: each store's document at that rank (None past its last),
    ``same_doc`` when both hold the same doc id."""

    rank: int
    main: CandidateRow | None
    sidecar: CandidateRow | None
    same_doc: bool


class StoreComparison(BaseModel):
    """Both stores on one query (``rag compare``): the first ``k`` distinct documents of each.

    ``sidecar_status`` is ``error`` when the sidecar answered with an error and
    ``unavailable`` when it could not be reached (``sidecar_reason`` says why);
    ``overlap_at_5`` is |shared doc ids| / the ranks either store filled (0-1); raw scores are
    in each store's unit (``score_labels``) and not comparable; ``main_error`` is the main
    store's retrieval error, if any.
    """

    query: str
    sidecar_status: Literal["available", "unavailable", "error"]
    sidecar_reason: str | None
    rows: list[ComparisonRow]
    overlap_at_5: float
    score_labels: list[str]
    main_error: str | None


def candidate_row(rank: int, c: Candidate) -> CandidateRow:
    """``c`` as the store-neutral ``CandidateRow`` at ``rank``."""
    return CandidateRow(
        rank=rank,
        doc_id=c.hit.doc_id,
        chunk_id=c.hit.chunk_id,
        title=c.hit.title,
        breadcrumb=c.hit.breadcrumb,
        category=c.hit.category,
        content_preview=c.hit.text[:300],
        raw_score=round(c.hit.raw_score, 4),
        score_label=c.hit.score_label,
        similarity=round(c.similarity, 4),
        channels=sorted(c.channels),
        attempts=sorted(c.attempts),
    )


def _doc_rows(cands: list[Candidate], k: int) -> list[CandidateRow]:
    """The best candidate of each of the first ``k`` distinct documents, ranked 1..k."""
    rows: list[CandidateRow] = []
    seen: set[str] = set()
    for c in cands:
        if c.hit.doc_id not in seen:
            seen.add(c.hit.doc_id)
            rows.append(candidate_row(len(rows) + 1, c))
        if len(rows) == k:
            break
    return rows


def _side_by_side(main_rows: list[CandidateRow], side_rows: list[CandidateRow]) -> list[ComparisonRow]:
    rows = []
    for i in range(max(len(main_rows), len(side_rows))):
        m = main_rows[i] if i < len(main_rows) else None
        s = side_rows[i] if i < len(side_rows) else None
        rows.append(ComparisonRow(rank=i + 1, main=m, sidecar=s, same_doc=bool(m and s and m.doc_id == s.doc_id)))
    return rows


def compare_stores(settings: RagSettings, query: str, k: int = 5) -> StoreComparison:
    """Both stores on the same query vector. The sidecar's failure is reported, never raised;
    the main store's raises (StoreError) when it cannot be opened."""
    from rag_core.components import make_embedder, make_main_store, make_sidecar_store

    try:
        l0 = L0Index.load(settings.l0_index_path)
    except FileNotFoundError:
        l0 = None
    tq = KnowledgeQueryTransformer(l0, settings.max_query_chars).transform(query)
    vector = query_vector(make_embedder(settings), tq)
    main_store = make_main_store(settings)
    main = KnowledgeDocumentRetriever(main_store, settings).retrieve(tq, vector)
    main_store.close()
    status: Literal["available", "unavailable", "error"] = "available"
    reason: str | None = None
    side_rows: list[CandidateRow] = []
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
    # Over the ranks both stores could fill: a filtered query may find fewer than k documents.
    depth = min(k, max(len(main_rows), len(side_rows)))
    shared = {r.doc_id for r in main_rows} & {r.doc_id for r in side_rows}
    return StoreComparison(
        query=query,
        sidecar_status=status,
        sidecar_reason=reason,
        rows=_side_by_side(main_rows, side_rows),
        overlap_at_5=len(shared) / depth if side_rows and depth else 0.0,
        score_labels=sorted({r.score_label for r in main_rows + side_rows}),
        main_error=main.error,
    )
