"""KnowledgeDocumentRetriever: L1 attempts against one store, dense + lexical fused by RRF.

Attempt 1 uses the L0 category filter when there is one; attempt 2 (raw query, no filter)
runs when attempt 1 is low quality: no candidates, no candidate that would survive
post-processing (similarity >= ``min_block_similarity``), or top similarity below
``reference_threshold``.

Fusion: reciprocal rank fusion, score = sum over channels of 1 / (k + rank), k = 60
(Cormack, Clarke & Büttcher, SIGIR 2009).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from rag_core.lookup.contracts import RetrievalAttempt
from rag_core.lookup.query_transformer import TransformedQuery
from rag_core.models import StoreHit
from rag_core.settings import RagSettings
from rag_core.stores.base import VectorStore

RRF_K = 60


@dataclass
class Candidate:
    """A chunk found by L1: its best hit, fused RRF score, channels and attempt numbers."""

    hit: StoreHit
    rrf: float
    channels: set[str] = field(default_factory=set)
    attempts: set[int] = field(default_factory=set)
    filtered: bool = False
    dense_rank: int | None = None
    lexical_rank: int | None = None
    lexical_score: float | None = None

    @property
    def similarity(self) -> float:
        return self.hit.similarity


@dataclass
class RetrievalOutcome:
    """All candidates (best first by RRF), the attempts made and why attempt 2 ran."""

    candidates: list[Candidate]
    attempts: list[RetrievalAttempt]
    fallback_reason: str | None = None
    error: str | None = None


def fuse(dense: list[StoreHit], lexical: list[StoreHit], attempt: int, filtered: bool,
         k: int = RRF_K) -> dict[str, Candidate]:
    """RRF-fuse two ranked hit lists into candidates keyed by chunk id."""
    out: dict[str, Candidate] = {}
    for channel, hits in (("dense", dense), ("lexical", lexical)):
        for rank, hit in enumerate(hits, start=1):
            c = out.get(hit.chunk_id)
            if c is None:
                c = out[hit.chunk_id] = Candidate(hit=hit, rrf=0.0, filtered=filtered)
            c.rrf += 1.0 / (k + rank)
            c.channels.add(channel)
            c.attempts.add(attempt)
            if channel == "dense":
                c.dense_rank, c.hit = rank, hit  # the dense hit carries the store's own raw score
            else:
                c.lexical_rank, c.lexical_score = rank, hit.lexical_score
    return out


def low_quality_reason(cands: list[Candidate], settings: RagSettings) -> str | None:
    """Why a set of candidates is low quality, or None when it is good enough."""
    if not cands:
        return "no_candidates"
    top = max(c.similarity for c in cands)
    if top < settings.min_block_similarity:
        return "no_evidence_survives_postprocessing"
    if top < settings.reference_threshold:
        return f"top_similarity_below_reference_threshold({top:.3f}<{settings.reference_threshold})"
    return None


class KnowledgeDocumentRetriever:
    """Runs the L1 attempts on ``store`` for a transformed query and its query vector."""

    def __init__(self, store: VectorStore, settings: RagSettings):
        self.store = store
        self.settings = settings

    def search_once(self, tq: TransformedQuery, vector: np.ndarray, category: str | None,
                    attempt: int) -> tuple[dict[str, Candidate], RetrievalAttempt]:
        """One attempt: dense and lexical search with the same filter, fused. Never raises:
        a store error is recorded in the attempt."""
        k = self.settings.top_k
        t0 = time.perf_counter()
        error, cands = None, {}
        try:
            dense = self.store.search(vector, k, category)
            lexical = self.store.search_lexical(tq.lexical_terms, vector, k, category)
            cands = fuse(dense, lexical, attempt, filtered=category is not None)
        except Exception as exc:  # the tool must answer even when the store is down
            error = f"{type(exc).__name__}: {exc}"
        ranked = sorted(cands.values(), key=lambda c: -c.rrf)
        rec = RetrievalAttempt(
            attempt=attempt, query=tq.rewritten[:200], filter=category, top_k=k,
            candidate_count=len(ranked),
            top_score=round(max((c.similarity for c in ranked), default=0.0), 4) if ranked else None,
            duration_ms=round((time.perf_counter() - t0) * 1000, 2), error=error,
            low_quality_reason=None if error else low_quality_reason(ranked, self.settings),
        )
        return cands, rec

    def retrieve(self, tq: TransformedQuery, vector: np.ndarray) -> RetrievalOutcome:
        """Attempt 1 (filtered when L0 gave one domain), then attempt 2 when it was low quality."""
        cands, first = self.search_once(tq, vector, tq.category_filter, 1)
        attempts, fallback = [first], None
        if tq.category_filter is not None and (first.error or first.low_quality_reason):
            fallback = first.error and "attempt_1_failed" or first.low_quality_reason
            more, second = self.search_once(tq, vector, None, 2)
            attempts.append(second)
            for cid, c in more.items():
                if cid in cands:
                    cands[cid].attempts |= c.attempts
                    cands[cid].channels |= c.channels
                else:
                    cands[cid] = c
        ranked = sorted(cands.values(), key=lambda c: (-c.rrf, -c.similarity, c.hit.chunk_id))
        errors = [a.error for a in attempts if a.error]
        error = errors[-1] if len(errors) == len(attempts) else None
        return RetrievalOutcome(ranked, attempts, fallback, error)
