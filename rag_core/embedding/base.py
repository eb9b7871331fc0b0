"""The embedder protocol every backend implements, and the one vector check all their output passes.

Query and passage sides are separate methods because asymmetric models (e5: ``query: `` /
``passage: `` prefixes) embed them differently; symmetric models simply use the same path.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

Vector = NDArray[np.float32]
"""``(dimension,)`` float32, L2 norm 1."""
Matrix = NDArray[np.float32]
"""``(n, dimension)`` float32, every row L2 norm 1."""

# A vector this short carries no direction: cosine against it is noise (or a division by zero).
MIN_RAW_NORM = 1e-6
# Backends that normalise themselves land within float32 rounding of 1; anything further off
# is renormalised here so thresholds (cosine = dot product) mean the same for every backend.
NORM_TOLERANCE = 1e-3


class EmbedderLoadError(RuntimeError):
    """The configured model cannot be used (missing package, unsupported CPU, bad path).

    The message is one line naming the setting and the reason.
    """


class BadVectorError(ValueError):
    """A backend returned a NaN/infinite or (near-)zero vector.

    ``index`` is the row in the batch, ``label`` what it was (``chunk <id> of document <doc>``
    or ``query``).
    """

    def __init__(self, index: int, label: str, reason: str) -> None:
        super().__init__(f"{label}: {reason} embedding vector rejected")
        self.index = index
        self.label = label


INCOMPLETE_PREFIX = "incomplete:"


@dataclass(frozen=True)
class ModelIdentity:
    """What a vector store records about the model that filled it.

    ``fingerprint`` covers everything that changes the vectors (backend, model, dimension,
    prefixes, package/model file version), so a same-dimension model change is detected.
    """

    backend: str
    model_id: str
    dimension: int
    fingerprint: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelIdentity:
        """Raises KeyError/ValueError on a malformed record."""
        return cls(str(data["backend"]), str(data["model_id"]), int(data["dimension"]), str(data["fingerprint"]))

    def describe(self) -> str:
        return f"{self.backend}:{self.model_id} ({self.dimension}-d, fingerprint {self.fingerprint})"

    def incomplete(self) -> ModelIdentity:
        """The marker an ingest records while it writes a new store or re-embeds one for this
        model: it equals no model, so a store left half-written (rows of two models, or
        unrecorded ones) is rewritten whole by the next ingest and refused by lookups meanwhile."""
        return ModelIdentity(self.backend, self.model_id, self.dimension, INCOMPLETE_PREFIX + self.fingerprint)

    @property
    def is_incomplete(self) -> bool:
        return self.fingerprint.startswith(INCOMPLETE_PREFIX)


def fingerprint(settings: dict[str, Any]) -> str:
    """16 hex chars of sha256 over the canonical JSON of the embedding settings."""
    blob = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors.

    ``embed_query(text) -> (dimension,)``; ``embed_queries(texts) -> (len(texts), dimension)``
    (the query side, one batch); ``embed_passages(texts, ids) -> (len(texts), dimension)`` where
    ``ids`` label the rows in errors (``BadVectorError``). ``count_tokens`` counts what the
    model sees of a passage (prefix and special tokens included) and ``max_tokens`` is its window:
    chunks are sized with both. Implementations must be safe to call from several threads.
    """

    @property
    def backend(self) -> str: ...

    @property
    def model_id(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def max_tokens(self) -> int: ...

    def count_tokens(self, text: str) -> int: ...

    def identity(self) -> ModelIdentity: ...

    def embed_query(self, text: str) -> Vector: ...

    def embed_queries(self, texts: Sequence[str]) -> Matrix: ...

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> Matrix: ...


def check_vectors(vectors: Any, labels: Sequence[str], dimension: int | None = None) -> Matrix:
    """The shared check of every backend's output: returns ``(n, dim)`` float32 with unit rows.

    Rows whose norm is off by more than ``NORM_TOLERANCE`` are renormalised. Raises
    ``BadVectorError`` for the first NaN/infinite or (near-)zero row (norm < ``MIN_RAW_NORM``),
    ValueError for a wrong shape or dimension.
    """
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[0] != len(labels):
        raise ValueError(f"embedding backend returned shape {arr.shape}, expected ({len(labels)}, dim)")
    if dimension is not None and arr.shape[1] != dimension:
        raise ValueError(f"embedding backend returned {arr.shape[1]}-d vectors, expected {dimension}")
    finite: NDArray[np.bool_] = np.asarray(np.isfinite(arr).all(axis=1))
    norms = np.linalg.norm(np.where(finite[:, None], arr, 0.0), axis=1)
    for i in np.flatnonzero(~finite | (norms < MIN_RAW_NORM)).tolist():
        raise BadVectorError(i, labels[i], "non-finite" if not finite[i] else "near-zero")
    off = np.abs(norms - 1.0) > NORM_TOLERANCE
    if off.any():
        arr = arr.copy() if not arr.flags.writeable else arr
        arr[off] /= norms[off, None]
    return arr


def default_labels(n: int) -> list[str]:
    return [f"text #{i}" for i in range(n)]
