"""Dense title similarity: the cosine between the query vector and each candidate document's
title, embedded on the passage side (CamelCase alert names written out as words).

A runbook's title names what the whole document is about in a few words; a symptom described
in other words ("容器组个数逼近上限", "no new pods showed up") can be closer to the title
("Kubelet Too Many Pods", "Kube Controller Manager Down") than to any one section. It is the
semantic counterpart of the title field in fielded BM25 (BM25F; Robertson, Zaragoza & Taylor
2004) and enters the rerank with the document centroid
(:mod:`rag_core.lookup.document_similarity`). Title vectors are embedded at ingest into the
data dir's embedding cache and read from it (or embedded on first use) per model, so the cost
is paid once per title, not once per process.
Titles are embedded on the passage side: on the query side (e5's "query: " for symmetric
pairs) the Chinese suite's MRR fell from 0.842 to 0.775.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from rag_core.embedding.base import Embedder, Vector
from rag_core.ingest.embed_cache import EmbeddingCache
from rag_core.ingest.passage_vectors import PassageVectors
from rag_core.text import split_camel_words

log = logging.getLogger(__name__)

CACHE_TITLES = 50_000  # ~75 MB of 384-d float32 vectors at most
# Row labels of title embeddings (in BadVectorError messages; tells them from chunk passages).
TITLE_LABEL = "title: "


class TitleSimilarity:
    """``similarities(query_vector, titles)`` -> doc id -> cosine in [-1, 1]. Thread-safe.

    ``titles`` maps doc id -> title. Title vectors come from a :class:`PassageVectors` cache
    (``max_titles`` entries, keyed by the model fingerprint; backed by ``disk`` when given). An
    embedding failure is logged and gives ``{}`` (the rerank then goes without the signal); it
    never raises.
    """

    def __init__(self, embedder: Embedder, max_titles: int = CACHE_TITLES, disk: EmbeddingCache | None = None) -> None:
        self._vectors = PassageVectors(embedder, max_titles, TITLE_LABEL, disk)

    def embed_titles(self, titles: Sequence[str]) -> int:
        """Embed ``titles`` not yet cached (ingest does, so lookups find them on disk); returns
        how many were embedded. Raises what the embedder raises."""
        texts = [split_camel_words(t) for t in titles if t.strip()]
        before = self._vectors.embedded
        self._vectors.vectors(texts, store_new=True)
        return self._vectors.embedded - before

    def similarities(self, query_vector: Vector, titles: Mapping[str, str]) -> dict[str, float]:
        texts = {doc_id: split_camel_words(title) for doc_id, title in titles.items() if title.strip()}
        try:
            vectors = self._vectors.vectors(list(texts.values()))
        except Exception as exc:  # a missing signal must not cost the lookup
            log.warning("title similarity skipped: %s: %s", type(exc).__name__, exc)
            return {}
        return {doc_id: float(np.dot(vectors[text], query_vector)) for doc_id, text in texts.items()}
