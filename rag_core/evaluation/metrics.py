"""Rank metrics over a document ranking: recall@K (hit rate), reciprocal rank, nDCG@K.

**The doc ranking.** The agent sees evidence blocks (one per source document, final order),
so the ranking starts with the evidence blocks' doc ids in rank order, deduplicated (first
occurrence wins). Post-processing usually keeps fewer blocks than the retriever returned, so
to make K up to 10 meaningful the doc ids of the chunk-level candidates not already present
are appended in candidate rank order. Within each list, ties on rank are broken by doc id,
so the result is deterministic.

A missing or empty doc id keeps its position (the agent saw that block) but never matches
an expected doc; it is represented as ``None``.

Relevance is binary: every expected doc is relevant, nothing else is.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from typing import Protocol, TypeVar

__all__ = [
    "Ranked",
    "doc_ranking",
    "first_hit_rank",
    "ndcg_at_k",
    "normalize_doc_id",
    "rank_overlap_at_k",
    "ranked_docs",
    "recall_at_k",
    "reciprocal_rank",
]


class Ranked(Protocol):
    """Anything with a 1-based ``rank`` and an optional ``doc_id`` (candidates, blocks)."""

    rank: int
    doc_id: str | None


R = TypeVar("R", bound=Ranked)


def normalize_doc_id(doc_id: str | None) -> str | None:
    """Strip whitespace and a leading ``./``; empty -> ``None`` (never a hit)."""
    if doc_id is None:
        return None
    doc_id = doc_id.strip().removeprefix("./")
    return doc_id or None


def _in_rank_order(items: Iterable[R]) -> list[R]:
    return sorted(items, key=lambda item: (item.rank, item.doc_id or ""))


def ranked_docs(evidence_blocks: Iterable[R], candidates: Iterable[R]) -> list[R]:
    """The items behind each position of the doc ranking (see module docstring).

    Returns evidence blocks (deduplicated by doc id) in rank order, then candidates whose doc
    is not yet present. Items without a doc id each keep their own position.
    """
    seen: set[str] = set()
    out: list[R] = []
    for group in (_in_rank_order(evidence_blocks), _in_rank_order(candidates)):
        for item in group:
            doc_id = normalize_doc_id(item.doc_id)
            if doc_id is not None:
                if doc_id in seen:
                    continue
                seen.add(doc_id)
            out.append(item)
    return out


def doc_ranking(evidence_blocks: Iterable[Ranked], candidates: Iterable[Ranked]) -> list[str | None]:
    """Doc ids in ranking order (position 0 = rank 1); ``None`` where a doc id is missing."""
    return [normalize_doc_id(item.doc_id) for item in ranked_docs(evidence_blocks, candidates)]


def _relevant_set(relevant: Collection[str]) -> set[str]:
    return {d for d in (normalize_doc_id(r) for r in relevant) if d is not None}


def first_hit_rank(ranking: Sequence[str | None], relevant: Collection[str]) -> int | None:
    """1-based rank of the first relevant doc in ``ranking``, or ``None`` if none is there."""
    wanted = _relevant_set(relevant)
    for position, doc_id in enumerate(ranking, start=1):
        if doc_id is not None and doc_id in wanted:
            return position
    return None


def recall_at_k(ranking: Sequence[str | None], relevant: Collection[str], k: int) -> float:
    """Hit rate at K for one query: 1.0 if any relevant doc is in the top ``k``, else 0.0.

    This is the "any expected doc is a hit" recall of DESIGN.md; averaged over queries it is
    the hit rate (ranx ``hits@k > 0``), not the fraction of relevant docs retrieved.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    rank = first_hit_rank(ranking, relevant)
    return 1.0 if rank is not None and rank <= k else 0.0


def reciprocal_rank(ranking: Sequence[str | None], relevant: Collection[str]) -> float:
    """1 / (rank of the first relevant doc) over the whole ranking; 0.0 when none is found.

    Its mean over queries is MRR (Voorhees, TREC-8 QA track, 1999).
    """
    rank = first_hit_rank(ranking, relevant)
    return 0.0 if rank is None else 1.0 / rank


def ndcg_at_k(ranking: Sequence[str | None], relevant: Collection[str], k: int) -> float:
    """nDCG@K with binary relevance (Järvelin & Kekäläinen 2002), in [0, 1].

    DCG@K = sum over positions i = 1..K of rel_i / log2(i + 1), rel_i in {0, 1}; the ideal
    DCG puts min(|relevant|, K) relevant docs first. A doc counts once (the ranking is
    deduplicated). 0.0 when there are no relevant docs.
    """
    if k < 1:
        raise ValueError("k must be >= 1")
    wanted = _relevant_set(relevant)
    if not wanted:
        return 0.0
    dcg = sum(
        1.0 / math.log2(position + 1)
        for position, doc_id in enumerate(ranking[:k], start=1)
        if doc_id is not None and doc_id in wanted
    )
    ideal = sum(1.0 / math.log2(position + 1) for position in range(1, min(len(wanted), k) + 1))
    return dcg / ideal


def rank_overlap_at_k(ranking_a: Sequence[str | None], ranking_b: Sequence[str | None], k: int) -> float:
    """|top-k docs of a ∩ top-k docs of b| / k, in [0, 1] (missing doc ids never overlap)."""
    if k < 1:
        raise ValueError("k must be >= 1")
    top_a = {d for d in ranking_a[:k] if d is not None}
    top_b = {d for d in ranking_b[:k] if d is not None}
    return len(top_a & top_b) / k
