"""Shared plumbing of the in-process backends: batching, locking and the vector check."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from rag_core.embedding.base import Matrix, ModelIdentity, Vector, check_vectors, default_labels, fingerprint


class BaseEmbedder(ABC):
    """Implements the ``Embedder`` protocol around two raw encoders (query side, passage side).

    Subclasses give ``backend``, ``model_id``, ``dimension``, ``max_tokens``, ``count_tokens``,
    ``_settings()`` (what goes into the fingerprint) and ``_encode(texts, is_query)``. Calls are
    serialised by a lock: the CPU backends gain nothing from concurrent forward passes on a
    small machine, and not all of them are re-entrant.
    """

    backend: str = ""

    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = batch_size
        self._lock = threading.Lock()

    @property
    @abstractmethod
    def model_id(self) -> str: ...

    @property
    @abstractmethod
    def dimension(self) -> int: ...

    @property
    @abstractmethod
    def max_tokens(self) -> int: ...

    @abstractmethod
    def count_tokens(self, text: str) -> int: ...

    @abstractmethod
    def _settings(self) -> dict[str, Any]:
        """Everything that changes the vectors (goes into the fingerprint)."""

    @abstractmethod
    def _encode(self, texts: list[str], is_query: bool) -> Any:
        """Raw ``(n, dim)`` array-like for ``texts``."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(
            {"backend": self.backend, "model_id": self.model_id, "dimension": self.dimension, **self._settings()}
        )

    def identity(self) -> ModelIdentity:
        return ModelIdentity(self.backend, self.model_id, self.dimension, self.fingerprint)

    def embed_query(self, text: str) -> Vector:
        """``(dimension,)`` float32, unit norm. BadVectorError when the model gives no direction."""
        with self._lock:
            raw = self._encode([text], True)
        vector: Vector = check_vectors(np.asarray(raw).reshape(1, -1), ["query"], self.dimension)[0]
        return vector

    def embed_queries(self, texts: Sequence[str]) -> Matrix:
        """``(len(texts), dimension)`` float32 unit rows, query side, in one call to the model."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._lock:
            raw = self._encode(list(texts), True)
        labels = [f"query view {i}" for i in range(len(texts))]
        return check_vectors(np.asarray(raw, dtype=np.float32).reshape(len(texts), -1), labels, self.dimension)

    def embed_passages(self, texts: Sequence[str], ids: Sequence[str] | None = None) -> Matrix:
        """``(len(texts), dimension)`` float32, unit rows; BadVectorError names the bad row's id."""
        labels = list(ids) if ids is not None else default_labels(len(texts))
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        parts = []
        for i in range(0, len(texts), self.batch_size):
            with self._lock:
                parts.append(
                    np.asarray(self._encode(list(texts[i : i + self.batch_size]), False), dtype=np.float32).reshape(
                        -1, self.dimension
                    )
                )
        return check_vectors(np.concatenate(parts), labels, self.dimension)
