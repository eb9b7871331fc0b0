"""Ensemble dense similarity: a second embedding model's cosine between the query and each
candidate chunk, one more rerank signal (``RerankWeights.ensemble_dense``).

Two bi-encoders trained differently make different mistakes: multilingual-e5-small (contrastive
web pairs) ranks hard English and the Chinese suite best, USE multilingual v3 (trained on
translation pairs) ranks cross-lingual paraphrases best. Averaging their normalised scores is the
classic ensemble of rankers (fusion of independent evidence; Fox & Shaw 1994, "Combination of
multiple searches", CombSUM). Measured on the golden suites and on 183 cross-lingual known-item
queries built from the two runbook corpora (closing note of issue 10): the second model only
re-scores candidates the stores already found, so it changes no index and costs no ingest time.

Chunk vectors of the second model are computed on first use and cached (:class:`PassageVectors`);
the query side embeds the query and its clause views like the main model
(:func:`rag_core.lookup.query_vector.query_vector`). Any failure drops the signal for that lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from rag_core.embedding.base import Embedder
from rag_core.ingest.passage_vectors import PassageVectors
from rag_core.lookup.query_transformer import TransformedQuery
from rag_core.lookup.query_vector import query_vector
from rag_core.lookup.retriever import Candidate
from rag_core.models import embed_text

log = logging.getLogger(__name__)

CACHE_CHUNKS = 100_000  # ~200 MB of 512-d float32 vectors at most
ENSEMBLE_LABEL = "ensemble: "


class EnsembleSimilarity:
    """The ensemble stage: ``annotate(tq, candidates)`` -> the candidates with
    ``ensemble_similarity`` set (``similarities``: chunk id -> cosine in [-1, 1] under
    ``embedder``, the second model). Thread-safe; never raises (a failure is logged and gives
    ``{}``, so the candidates come back unchanged)."""

    def __init__(self, embedder: Embedder, max_chunks: int = CACHE_CHUNKS) -> None:
        self.embedder = embedder
        self._vectors = PassageVectors(embedder, max_chunks, ENSEMBLE_LABEL)

    def annotate(self, tq: TransformedQuery, candidates: list[Candidate]) -> list[Candidate]:
        """``candidates`` with ``ensemble_similarity`` set; unchanged when the signal failed."""
        found = self.similarities(tq, candidates)
        return [replace(c, ensemble_similarity=found.get(c.hit.chunk_id)) for c in candidates] if found else candidates

    def similarities(self, tq: TransformedQuery, candidates: Sequence[Candidate]) -> dict[str, float]:
        if not candidates:
            return {}
        texts = {c.hit.chunk_id: embed_text(c.hit.breadcrumb, c.hit.text) for c in candidates}
        try:
            query = query_vector(self.embedder, tq)
            vectors = self._vectors.vectors(list(texts.values()))
        except Exception as exc:  # a missing signal must not cost the lookup
            log.warning("ensemble similarity skipped: %s: %s", type(exc).__name__, exc)
            return {}
        return {chunk_id: float(vectors[text] @ query) for chunk_id, text in texts.items()}
