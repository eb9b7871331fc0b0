"""One vector check for every store, for stored and for query vectors, and finite scores.

Every store (Milvus, pgvector, the in-memory one) searches by cosine on L2-normalised vectors,
so a vector that is not finite or not of unit length is a bug upstream (a broken model, a
corrupted file), never something to search with: an infinite query gave similarity 1.0 on
Milvus, and a unit vector scaled by 1e-29 ranked first on pgvector (issue 12, row 5). Scores
read back from a store are made finite here too, so results always serialise to strict JSON.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rag_core.stores.errors import DimensionMismatchError

# Embedders normalise in float32 (error ~1e-7); anything further from 1 is not a unit vector.
NORM_TOLERANCE = 0.01


class VectorCheckError(ValueError):
    """A stored or query vector is not finite, of the wrong width, or not of unit length."""


def _norm_problem(row: np.ndarray) -> str | None:
    if not np.isfinite(row).all():
        return "non-finite"
    norm = float(np.linalg.norm(row.astype(np.float64)))
    if norm == 0.0:
        return "all-zero"
    if abs(norm - 1.0) > NORM_TOLERANCE:
        return f"not unit length (norm {norm:.3g}, expected 1±{NORM_TOLERANCE})"
    return None


def check_stored_vectors(chunk_ids: Sequence[str], vectors: np.ndarray, dim: int) -> None:
    """Check an ``(n, dim)`` batch before any write.

    Raises ``VectorCheckError`` naming the first offending chunk id (non-finite, all-zero or a
    norm outside ``1 ± NORM_TOLERANCE``) or the shape, and ``DimensionMismatchError`` when the width is not ``dim``.
    """
    if vectors.ndim != 2 or vectors.shape[0] != len(chunk_ids):
        raise VectorCheckError(f"expected {len(chunk_ids)} vectors of shape (n, {dim}), got {vectors.shape}")
    if vectors.shape[1] != dim:
        raise DimensionMismatchError("the batch", vectors.shape[1], dim)
    for chunk_id, row in zip(chunk_ids, vectors, strict=True):
        problem = _norm_problem(row)
        if problem:
            raise VectorCheckError(f"chunk {chunk_id}: {problem} embedding vector rejected")


def check_query_vector(vector: np.ndarray, dim: int | None = None) -> np.ndarray:
    """The query vector as a flat float32 array, checked like a stored one.

    Raises ``VectorCheckError`` for a non-finite, all-zero or non-unit vector, and
    ``DimensionMismatchError`` when ``dim`` is given and differs.
    """
    q = np.asarray(vector, dtype=np.float32).reshape(-1)
    if dim is not None and q.shape[0] != dim:
        raise DimensionMismatchError("the index", dim, q.shape[0])
    problem = _norm_problem(q)
    if problem:
        raise VectorCheckError(f"query vector rejected: {problem}")
    return q


def finite_score(value: float) -> float:
    """``value`` as a float, with NaN and ±inf replaced by 0.0 (no claim of similarity)."""
    number = float(value)
    return number if math.isfinite(number) else 0.0


def cosine_to_similarity(cosine: float) -> float:
    """Normalised similarity in [0, 1] from a cosine similarity in [-1, 1] (negatives and
    non-finite values -> 0)."""
    return float(min(1.0, max(0.0, finite_score(cosine))))
