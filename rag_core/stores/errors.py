"""The errors every store raises; below ``stores.base`` and ``stores.vectors``, which both raise them."""

from __future__ import annotations

__all__ = ["DimensionMismatchError", "StoreError"]


class StoreError(RuntimeError):
    """A store could not be reached or refused an operation (message never holds secrets)."""


class DimensionMismatchError(StoreError):
    """The embedding dimension differs from the one the collection/table was created with.

    ``store_dim`` is None when the store exists without a readable vector dimension.
    """

    def __init__(self, where: str, store_dim: int | None, model_dim: int):
        super().__init__(
            f"{where} holds {store_dim}-dimensional vectors but the embedding model gives "
            f"{model_dim}; rebuild the index (rag ingest --rebuild) or use the original model"
        )
        self.store_dim = store_dim
        self.model_dim = model_dim
