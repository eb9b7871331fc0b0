"""Document similarity: how well the query fits each candidate document as a whole, the cosine
of the query vector with the document's title plus its cosine with the document's centroid (the
normalised mean of the stored vectors of all its chunks). One rerank signal,
``RerankWeights.document_similarity``.

A chunk matches one section; a vague symptom ("no new pods showed up, deleted pods aren't
replaced") is often described by a runbook as a whole, spread over its meaning, impact and
diagnosis sections, or named by its title in other words ("Kube Controller Manager Down"). The
title and the centroid are two views of the document in the chunk embedding space, summed like
fields of one document (``q.t + q.c = q.(t + c)``; the dense counterpart of BM25F's field
combination, Robertson, Zaragoza & Taylor 2004; the centroid is the mean-of-passages document
representation of Dai & Callan 2019, SIGIR). Measured on the in-memory floor
(``bench.quality_floor``; closing note of issue 10): the centroid alone ranked documents better
than their best chunk on every same-language set (runbooks-en-hard MRR 0.757 against 0.679,
held-out English impact sections 0.327 against 0.270), and title + centroid at weight 0.3
raised runbooks-en-hard MRR from 0.785 to 0.810 and runbooks-zh from 0.855 to 0.880, where the
title alone at 0.3 lost a Chinese case.

Centroids are computed at ingest and stored with the index (``rag_core.ingest.centroids``); a
lookup reads them from the store that found the candidates, one row per candidate document in one
query, so its cost does not depend on a document's size (issue 44) and they always match what is
indexed. When a centroid is missing (the store failed, now or earlier in the lookup, a
sidecar-only document, or an index built before centroids were stored: the warning names
`rag ingest`), every document is scored by its title alone, so the scores stay comparable; any
failure drops that part of the signal for that lookup, never the lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from rag_core.embedding.base import Embedder, Vector
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.title_similarity import TitleSimilarity
from rag_core.lookup.retriever import Candidate, RetrievalOutcome
from rag_core.stores.base import VectorStore

log = logging.getLogger(__name__)


def centroid_similarities(
    store: VectorStore, query_vector: Vector, doc_ids: Sequence[str]
) -> tuple[dict[str, float], str | None]:
    """Doc id -> cosine in [-1, 1] of ``query_vector`` (unit, (dim,)) and the document's stored
    centroid, for the ``doc_ids`` ``store`` holds one for, and None. Never raises: a store failure
    is logged and gives ({}, the failure in one line), so the lookup can say it lost the signal."""
    if not doc_ids:
        return {}, None
    try:
        stored = store.document_centroids(doc_ids)
    except Exception as exc:  # a missing signal must not cost the lookup
        error = f"document centroids skipped: {type(exc).__name__}: {exc}"
        log.warning("%s", error)
        return {}, error
    return {doc_id: float(center @ query_vector) for doc_id, center in stored.items()}, None


class DocumentSimilarity:
    """The document-similarity stage: ``annotate(outcome, store)`` -> the retrieved candidates with
    ``document_similarity`` set (``similarities``: doc id -> title cosine + centroid cosine, in
    [-2, 2]) and the store failure that cost the centroids (None when none). Thread-safe; never
    raises."""

    def __init__(self, embedder: Embedder, disk: EmbeddingCache | None = None) -> None:
        self._titles = TitleSimilarity(embedder, disk=disk)

    def similarities(
        self, store: VectorStore | None, query_vector: Vector, titles: Mapping[str, str]
    ) -> tuple[dict[str, float], str | None]:
        """``store`` None (it failed during this lookup: do not wait on it twice): titles alone.
        The second item is the store failure of ``centroid_similarities`` (None when none)."""
        by_title = self._titles.similarities(query_vector, titles)
        centroids, error = centroid_similarities(store, query_vector, list(titles)) if store is not None else ({}, None)
        if not all(doc_id in centroids for doc_id in by_title):
            return by_title, error
        return {doc_id: cosine + centroids[doc_id] for doc_id, cosine in by_title.items()}, error

    def annotate(self, outcome: RetrievalOutcome, store: VectorStore | None) -> tuple[list[Candidate], str | None]:
        """``outcome``'s candidates, each with ``document_similarity`` set when known (None when
        the outcome has no query vector), and the store failure that dropped the centroids (None
        when none). ``store`` None: titles alone (see ``similarities``)."""
        if outcome.query_vector is None or not outcome.candidates:
            return outcome.candidates, None
        titles = {c.hit.doc_id: c.hit.title for c in outcome.candidates}
        found, error = self.similarities(store, outcome.query_vector, titles)
        return [replace(c, document_similarity=found.get(c.hit.doc_id)) for c in outcome.candidates], error
