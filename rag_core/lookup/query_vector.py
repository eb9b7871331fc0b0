"""Query embedding: the transformed query (and its clause views) -> one query vector.

A query of several clauses is embedded whole and clause by clause, in one batch; the vector is
``normalise((1 - VIEW_WEIGHT) * whole + VIEW_WEIGHT * mean(clauses))``. Averaging the clause
vectors is the multi-view form of query expansion (Rocchio 1971; the mean of several query
embeddings, as in multi-query retrieval): a clause that names the symptom is not drowned by
the context around it. ``VIEW_WEIGHT`` was set on the golden suites (closing note of issue 10).
"""

from __future__ import annotations

import numpy as np

from rag_core.embedding.base import Embedder, Vector
from rag_core.lookup.query_transformer import TransformedQuery

VIEW_WEIGHT = 0.5


def query_vector(embedder: Embedder, tq: TransformedQuery) -> Vector:
    """The ``(dimension,)`` float32 unit query vector of ``tq``; raises what the embedder
    raises (EmbedderLoadError, BadVectorError, endpoint errors)."""
    if not tq.views:
        return embedder.embed_query(tq.rewritten)
    rows = embedder.embed_queries([tq.rewritten, *tq.views])
    mixed = (1.0 - VIEW_WEIGHT) * rows[0] + VIEW_WEIGHT * rows[1:].mean(axis=0)
    norm = float(np.linalg.norm(mixed))
    whole: Vector = rows[0]
    if not np.isfinite(norm) or norm < 1e-6:  # views that cancel out: the whole query alone
        return whole
    out: Vector = (mixed / norm).astype(np.float32)
    return out
